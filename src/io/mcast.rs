//! Multicast membership of an interface in the kernel: what makes the interface accept a
//! group's frames and tells the network about it.
//!
//! Contract: [`join_group`] opens a UDP socket of the calling thread's network namespace
//! and joins `group` on interface `ifindex` (`IP_ADD_MEMBERSHIP` with an `ip_mreqn`
//! naming the interface by index, or `IPV6_JOIN_GROUP`, man 7 ip / man 7 ipv6). The
//! kernel then adds the group's MAC to the interface's multicast filter (`dev_mc_add`,
//! what rxe's `rxe_mcast_add` does for an attach) and sends IGMP / MLD reports, so a
//! snooping switch forwards the group to the port (the kernel's cma sends IGMP for a
//! RoCE v2 join, `cma_igmp_send`). The membership lasts as long as the returned
//! [`GroupMembership`]: dropping it closes the socket, which leaves the group (IGMP
//! leave / MLD done). The socket is bound to no port and receives nothing: RoCE v2
//! frames to the group are redirected to AF_XDP by the XDP filter before the stack.

use std::io;
use std::net::IpAddr;
use std::os::fd::OwnedFd;

use rustix::net::{AddressFamily, SocketFlags, SocketType, ipproto, socket_with, sockopt};

/// A group joined on an interface (see the module's contract); dropping it leaves.
#[derive(Debug)]
pub struct GroupMembership {
    _socket: OwnedFd,
}

/// Join `group` (an IPv4 or IPv6 multicast address) on interface `ifindex` of the
/// calling thread's network namespace.
pub fn join_group(ifindex: u32, group: IpAddr) -> io::Result<GroupMembership> {
    if !group.is_multicast() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{group} is not a multicast address"),
        ));
    }
    let s = match group {
        IpAddr::V4(g) => {
            let s = udp_socket(AddressFamily::INET)?;
            sockopt::set_ip_add_membership_with_ifindex(
                &s,
                &g,
                &std::net::Ipv4Addr::UNSPECIFIED,
                ifindex,
            )?;
            s
        }
        IpAddr::V6(g) => {
            let s = udp_socket(AddressFamily::INET6)?;
            sockopt::set_ipv6_add_membership(&s, &g, ifindex)?;
            s
        }
    };
    Ok(GroupMembership { _socket: s })
}

fn udp_socket(family: AddressFamily) -> io::Result<OwnedFd> {
    Ok(socket_with(
        family,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        Some(ipproto::UDP),
    )?)
}

//! Interface, neighbour and route facts the driver needs to address frames: MAC, MTU,
//! link state and IPv4/IPv6 addresses of an interface, the kernel's neighbour table (with
//! resolution of a missing entry) and the route to a destination.
//!
//! Read over rtnetlink (`NETLINK_ROUTE`, man 7 rtnetlink) with the rust-netlink crates
//! (`netlink-packet-route` for the messages, `netlink-sys` for a plain blocking socket):
//! no external program runs, so xrnic works on minimal images without iproute2 (or with
//! busybox's `ip`, which has no JSON output). Pass `netns` to look inside a named
//! namespace (`/run/netns/NAME`, what `ip netns add` creates), or `None` for the calling
//! thread's own.
//!
//! Neighbour resolution ([`resolve_neighbour`]) does what the kernel does for rxe
//! (`rdma_resolve_addr` → `dst_neigh_lookup` → `neigh_event_send`): it asks the kernel to
//! resolve the entry with `RTM_NEWNEIGH` + `NTF_USE` (neigh_add in net/core/neighbour.c
//! calls `neigh_event_send`, which sends the ARP request / neighbour solicitation) and
//! waits for the kernel's `RTM_NEWNEIGH` notification on the `RTNLGRP_NEIGH` group, no
//! polling.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    LinkAttribute, LinkFlags, LinkMessage, LinkXdp, State, XdpAttached,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteType, RouteVia,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// What rtnetlink says about an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub ifname: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Addresses with their prefix length: IPv4 first, then IPv6, each in the kernel's
    /// order (what `ip addr` lists).
    pub addrs: Vec<(IpAddr, u8)>,
    /// The link is up: operstate UP, or UNKNOWN with the interface administratively up
    /// and its lower layer up (devices that do not report carrier), as `ip link` shows.
    pub up: bool,
    /// An XDP program is attached (another xrnic device, or another XDP user).
    pub xdp_attached: bool,
}

/// The route the kernel picks to a destination (`RTM_GETROUTE`, what `ip route get`
/// prints).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The interface the route leaves through.
    pub oif: u32,
    /// The next hop when the destination is behind a router; `None` when on-link.
    pub gateway: Option<IpAddr>,
    /// The route's preferred source address (`RTA_PREFSRC`).
    pub prefsrc: Option<IpAddr>,
    /// The route's hop-limit metric (`RTAX_HOPLIMIT`), when it has one.
    pub hop_limit: Option<u8>,
}

impl Route {
    /// Where frames to `dst` go on the link: the gateway, or `dst` itself.
    pub fn next_hop(&self, dst: IpAddr) -> IpAddr {
        self.gateway.unwrap_or(dst)
    }
}

/// Parse `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in mac.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Run `f` in the named namespace (on a fresh thread: setns(2) changes one thread), or
/// right here for `None`.
fn in_netns<T: Send>(
    netns: Option<&str>,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    let Some(ns) = netns else {
        return f();
    };
    let path = format!("/run/netns/{ns}");
    let file = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    std::thread::scope(|s| {
        let h = s.spawn(move || -> io::Result<T> {
            move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network)).map_err(
                |e| io::Error::new(io::Error::from(e).kind(), format!("setns {path}: {e}")),
            )?;
            f()
        });
        match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

/// `RTNLGRP_NEIGH` (include/uapi/linux/rtnetlink.h).
const RTNLGRP_NEIGH: u32 = 3;

/// A route netlink socket in the calling thread's network namespace.
struct Rtnl {
    sock: Socket,
    seq: u32,
}

impl Rtnl {
    fn open() -> io::Result<Rtnl> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| {
            io::Error::new(e.kind(), format!("opening a route netlink socket: {e}"))
        })?;
        sock.bind_auto()?;
        Ok(Rtnl { sock, seq: 0 })
    }

    fn send(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        Ok(self.seq)
    }

    /// One datagram's messages (a datagram may carry several).
    fn recv(&self) -> io::Result<Vec<NetlinkMessage<RouteNetlinkMessage>>> {
        let (buf, _) = self.sock.recv_from_full()?;
        let mut out = Vec::new();
        let mut off = 0;
        while off + 16 <= buf.len() {
            let len =
                u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
            if len < 16 || off + len > buf.len() {
                return Err(bad(format!(
                    "truncated netlink message ({len} bytes at {off})"
                )));
            }
            let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[off..off + len])
                .map_err(|e| bad(format!("netlink message: {e}")))?;
            out.push(m);
            off += (len + 3) & !3;
        }
        Ok(out)
    }

    /// Send a request and collect the replies of its sequence number: for a dump up to
    /// `NLMSG_DONE`, otherwise up to the reply (or the acknowledgement with `NLM_F_ACK`).
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        let seq = self.send(msg, flags)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        loop {
            for m in self.recv()? {
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(out),
                            Some(c) => Err(io::Error::from_raw_os_error(-c.get())),
                        };
                    }
                    NetlinkPayload::InnerMessage(i) => {
                        out.push(i);
                        if !dump && flags & NLM_F_ACK == 0 {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

fn mac_of_bytes(b: &[u8]) -> Option<[u8; 6]> {
    <[u8; 6]>::try_from(b).ok()
}

/// `RTNLGRP_LINK` (include/uapi/linux/rtnetlink.h).
const RTNLGRP_LINK: u32 = 1;

/// What [`LinkWatch::wait`] heard about the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkNews {
    /// Nothing within the timeout.
    Quiet,
    /// A notification: the link is up (as [`LinkInfo::up`]) or not.
    Up(bool),
    /// Notifications were lost (ENOBUFS): read the state again ([`link_info`]).
    Lost,
    /// The interface was deleted.
    Gone,
}

/// Notifications of one interface's link state: `RTM_NEWLINK` / `RTM_DELLINK` on the
/// `RTNLGRP_LINK` group (man 7 rtnetlink). The socket belongs to the network namespace
/// of the thread that created it, so the thread that waits may live anywhere.
pub struct LinkWatch {
    events: Rtnl,
    ifindex: u32,
}

impl std::fmt::Debug for LinkWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkWatch")
            .field("ifindex", &self.ifindex)
            .finish_non_exhaustive()
    }
}

impl LinkWatch {
    /// Subscribe to the changes of interface `ifindex` in the calling thread's network
    /// namespace.
    pub fn new(ifindex: u32) -> io::Result<LinkWatch> {
        let events = Rtnl::open()?;
        events.sock.add_membership(RTNLGRP_LINK)?;
        Ok(LinkWatch { events, ifindex })
    }

    /// Wait up to `timeout` for news of the interface (the last of a batch counts).
    pub fn wait(&self, timeout: Duration) -> io::Result<LinkNews> {
        if !wait_readable(self.events.sock.as_fd(), timeout)? {
            return Ok(LinkNews::Quiet);
        }
        let msgs = match self.events.recv() {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOBUFS.raw_os_error()) => {
                return Ok(LinkNews::Lost);
            }
            Err(e) => return Err(e),
        };
        let mut news = LinkNews::Quiet;
        for m in msgs {
            match m.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l))
                    if l.header.index == self.ifindex =>
                {
                    news = LinkNews::Up(link_up(&l));
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l))
                    if l.header.index == self.ifindex =>
                {
                    news = LinkNews::Gone;
                }
                _ => {}
            }
        }
        Ok(news)
    }
}

/// The link is up: operstate UP, or UNKNOWN with the interface administratively up and
/// its lower layer up (devices that do not report carrier), as `ip link` shows.
fn link_up(l: &LinkMessage) -> bool {
    let oper = l
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::OperState(s) => Some(*s),
            _ => None,
        })
        .unwrap_or(State::Unknown);
    let flags = l.header.flags;
    match oper {
        State::Up => true,
        State::Unknown => flags.contains(LinkFlags::Up) && flags.contains(LinkFlags::LowerUp),
        _ => false,
    }
}

/// MAC, MTU, index, state and addresses of `ifname`.
pub fn link_info(netns: Option<&str>, ifname: &str) -> io::Result<LinkInfo> {
    let ifname = ifname.to_string();
    in_netns(netns, move || link_info_here(&ifname))
}

fn link_info_here(ifname: &str) -> io::Result<LinkInfo> {
    let mut nl = Rtnl::open()?;
    let mut req = LinkMessage::default();
    req.attributes
        .push(LinkAttribute::IfName(ifname.to_string()));
    let reply = match nl.request(RouteNetlinkMessage::GetLink(req), 0) {
        Err(e) if e.raw_os_error() == Some(libc_enodev()) => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {ifname}"),
            ));
        }
        r => r?,
    };
    let Some(RouteNetlinkMessage::NewLink(l)) = reply.into_iter().next() else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {ifname}"),
        ));
    };
    let mut info = LinkInfo {
        ifname: ifname.to_string(),
        ifindex: l.header.index,
        mac: [0; 6],
        mtu: 0,
        addrs: Vec::new(),
        up: false,
        xdp_attached: false,
    };
    let mut have_mac = false;
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => info.ifname = n.clone(),
            LinkAttribute::Address(b) => {
                if let Some(m) = mac_of_bytes(b) {
                    info.mac = m;
                    have_mac = true;
                }
            }
            LinkAttribute::Mtu(m) => info.mtu = *m,
            LinkAttribute::Xdp(x) => {
                info.xdp_attached = x
                    .iter()
                    .any(|x| matches!(x, LinkXdp::Attached(a) if !matches!(a, XdpAttached::None)));
            }
            _ => {}
        }
    }
    if !have_mac {
        return Err(bad(format!("{ifname} has no Ethernet address")));
    }
    info.up = link_up(&l);
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for m in nl.request(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        NLM_F_DUMP,
    )? {
        let RouteNetlinkMessage::NewAddress(a) = m else {
            continue;
        };
        if a.header.index != info.ifindex {
            continue;
        }
        // IFA_LOCAL is the interface's own address (IFA_ADDRESS the peer's on a
        // point-to-point link); IPv6 has only IFA_ADDRESS.
        let mut local = None;
        let mut address = None;
        for attr in &a.attributes {
            match attr {
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Address(ip) => address = Some(*ip),
                _ => {}
            }
        }
        if let Some(ip) = local.or(address) {
            match ip {
                IpAddr::V4(_) => v4.push((ip, a.header.prefix_len)),
                IpAddr::V6(_) => v6.push((ip, a.header.prefix_len)),
            }
        }
    }
    info.addrs = v4.into_iter().chain(v6).collect();
    Ok(info)
}

fn libc_enodev() -> i32 {
    rustix::io::Errno::NODEV.raw_os_error()
}

/// The Ethernet address of `ifname`.
pub fn mac_of(netns: &str, ifname: &str) -> io::Result<[u8; 6]> {
    link_info(Some(netns), ifname).map(|l| l.mac)
}

fn family(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn neigh_addr(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v) => NeighbourAddress::Inet(v),
        IpAddr::V6(v) => NeighbourAddress::Inet6(v),
    }
}

/// The usable MAC of a neighbour message for `dst` on `ifindex`: `Some(None)` when the
/// message is about that entry but it has no usable address (INCOMPLETE, FAILED, ...),
/// `None` when it is about another entry.
fn neigh_entry(n: &NeighbourMessage, ifindex: u32, dst: IpAddr) -> Option<Option<[u8; 6]>> {
    if n.header.ifindex != ifindex {
        return None;
    }
    let mut is_dst = false;
    let mut mac = None;
    for a in &n.attributes {
        match a {
            NeighbourAttribute::Destination(d) => is_dst = *d == neigh_addr(dst),
            NeighbourAttribute::LinkLayerAddress(b) => mac = mac_of_bytes(b),
            _ => {}
        }
    }
    if !is_dst {
        return None;
    }
    let usable = matches!(
        n.header.state,
        NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
            | NeighbourState::Noarp
    );
    Some(if usable { mac } else { None })
}

fn ifindex_here(ifname: &str) -> io::Result<u32> {
    link_info_here(ifname).map(|l| l.ifindex)
}

fn neighbour_here(nl: &mut Rtnl, ifindex: u32, dst: IpAddr) -> io::Result<Option<[u8; 6]>> {
    let mut req = NeighbourMessage::default();
    req.header.family = family(dst);
    req.header.ifindex = ifindex;
    let entries = nl.request(RouteNetlinkMessage::GetNeighbour(req), NLM_F_DUMP)?;
    Ok(entries.iter().find_map(|m| match m {
        RouteNetlinkMessage::NewNeighbour(n) => neigh_entry(n, ifindex, dst).flatten(),
        _ => None,
    }))
}

/// The kernel's neighbour-table entry (ARP for IPv4, ND for IPv6) for `dst` on `ifname`:
/// `Ok(None)` when there is none or it is not usable (INCOMPLETE / FAILED).
pub fn neighbour(netns: Option<&str>, ifname: &str, dst: IpAddr) -> io::Result<Option<[u8; 6]>> {
    let ifname = ifname.to_string();
    in_netns(netns, move || {
        let ifindex = ifindex_here(&ifname)?;
        let mut nl = Rtnl::open()?;
        neighbour_here(&mut nl, ifindex, dst)
    })
}

/// How long [`resolve_neighbour`] waits by default: ARP and ND send 3 requests one second
/// apart (`mcast_solicit`, `retrans_time_ms`) before the entry goes FAILED.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// Ask the kernel to resolve `dst` on `ifindex` in the calling thread's namespace:
/// `RTM_NEWNEIGH` with `NTF_USE` (`neigh_event_send`, which creates the entry when missing
/// and sends the ARP request / neighbour solicitation). An error is the kernel's refusal.
pub fn request_resolution(ifindex: u32, dst: IpAddr) -> io::Result<()> {
    let mut nl = Rtnl::open()?;
    request_resolution_on(&mut nl, ifindex, dst)
}

fn request_resolution_on(nl: &mut Rtnl, ifindex: u32, dst: IpAddr) -> io::Result<()> {
    let mut req = NeighbourMessage::default();
    req.header.family = family(dst);
    req.header.ifindex = ifindex;
    req.header.flags = NeighbourFlags::Use;
    req.header.kind = RouteType::Unicast;
    req.attributes
        .push(NeighbourAttribute::Destination(neigh_addr(dst)));
    nl.request(
        RouteNetlinkMessage::NewNeighbour(req),
        NLM_F_CREATE | NLM_F_ACK,
    )
    .map(|_| ())
}

/// [`request_resolution`]; when the kernel refuses that, a datagram to the peer's discard
/// port makes it resolve the address to send it.
fn trigger_resolution(nl: &mut Rtnl, ifindex: u32, dst: IpAddr) {
    if let Err(e) = request_resolution_on(nl, ifindex, dst) {
        tracing::debug!(%dst, error = %e, "RTM_NEWNEIGH NTF_USE refused; resolving through a UDP datagram");
        poke(ifindex, dst);
    }
}

fn poke(ifindex: u32, ip: IpAddr) {
    let (bind, dst): (SocketAddr, SocketAddr) = match ip {
        IpAddr::V4(v4) => ((Ipv4Addr::UNSPECIFIED, 0).into(), SocketAddr::from((v4, 9))),
        IpAddr::V6(v6) => {
            // A link-local destination needs the interface as its scope.
            let scope = if v6.segments()[0] & 0xffc0 == 0xfe80 {
                ifindex
            } else {
                0
            };
            (
                (Ipv6Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(SocketAddrV6::new(v6, 9, 0, scope)),
            )
        }
    };
    if let Ok(s) = UdpSocket::bind(bind) {
        let _ = s.send_to(&[0], dst);
    }
}

fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let ts = Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    match poll(&mut fds, Some(&ts)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The MAC of `ip` on `ifname` (index `ifindex`) from the neighbour table of the calling
/// thread's namespace, resolving it through the kernel when missing (see the module
/// doc), for at most `timeout`.
pub fn resolve_neighbour(
    ifname: &str,
    ifindex: u32,
    ip: IpAddr,
    timeout: Duration,
) -> io::Result<[u8; 6]> {
    // Subscribe before looking, so that an answer arriving between the look-up and the
    // wait is not missed.
    let events = Rtnl::open()?;
    events.sock.add_membership(RTNLGRP_NEIGH)?;
    let mut nl = Rtnl::open()?;
    if let Some(mac) = neighbour_here(&mut nl, ifindex, ip)? {
        return Ok(mac);
    }
    let start = Instant::now();
    trigger_resolution(&mut nl, ifindex, ip);
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        if !wait_readable(events.sock.as_fd(), left)? {
            continue;
        }
        let msgs = match events.recv() {
            Ok(m) => m,
            // ENOBUFS: notifications were lost; read the table again.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOBUFS.raw_os_error()) => {
                if let Some(mac) = neighbour_here(&mut nl, ifindex, ip)? {
                    return Ok(mac);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        for m in msgs {
            let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) = m.payload
            else {
                continue;
            };
            match neigh_entry(&n, ifindex, ip) {
                Some(Some(mac)) => return Ok(mac),
                // The kernel gave up (no answer to its requests): ask once more while
                // time is left.
                Some(None) if n.header.state == NeighbourState::Failed => {
                    trigger_resolution(&mut nl, ifindex, ip)
                }
                _ => {}
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "no neighbour entry for {ip} on {ifname} after {timeout:?}: is the peer up and on this link?"
        ),
    ))
}

/// The kernel's usable neighbour entry for `dst` on `ifindex` in the calling thread's
/// namespace, without resolving a missing one (a look-up the kernel answers at once).
pub fn neighbour_on(ifindex: u32, dst: IpAddr) -> io::Result<Option<[u8; 6]>> {
    let mut nl = Rtnl::open()?;
    neighbour_here(&mut nl, ifindex, dst)
}

/// What [`NeighbourWatch::news`] heard about one neighbour entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighbourNews {
    /// The entry of `ip` on `ifindex` is usable, with this MAC.
    Usable(u32, IpAddr, [u8; 6]),
    /// The kernel gave up resolving `ip` on `ifindex` (FAILED).
    Failed(u32, IpAddr),
    /// Notifications were lost (ENOBUFS): look the entries up again.
    Lost,
}

/// Many resolutions at once, none waited for: what [`resolve_neighbour`] does for one
/// address, split so that a caller with its own poll loop (the device service's
/// resolver, src/service/resolver.rs) asks ([`NeighbourWatch::trigger`]), waits for
/// [`NeighbourWatch::fd`] with everything else, and reads what the kernel says
/// ([`NeighbourWatch::news`]). Both sockets belong to the namespace of the thread that
/// opened the watch.
pub struct NeighbourWatch {
    events: Rtnl,
    nl: Rtnl,
}

impl NeighbourWatch {
    /// Subscribe to `RTNLGRP_NEIGH` in the calling thread's namespace.
    pub fn open() -> io::Result<NeighbourWatch> {
        let events = Rtnl::open()?;
        events.sock.add_membership(RTNLGRP_NEIGH)?;
        Ok(NeighbourWatch {
            events,
            nl: Rtnl::open()?,
        })
    }

    /// Readable when the kernel has news of neighbour entries.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.events.sock.as_fd()
    }

    /// The usable entry of `ip` on `ifindex`, if there is one now.
    pub fn lookup(&mut self, ifindex: u32, ip: IpAddr) -> io::Result<Option<[u8; 6]>> {
        neighbour_here(&mut self.nl, ifindex, ip)
    }

    /// Ask the kernel to resolve `ip` on `ifindex` (ARP request / neighbour
    /// solicitation), as [`resolve_neighbour`] does; the answer comes as news.
    pub fn trigger(&mut self, ifindex: u32, ip: IpAddr) {
        trigger_resolution(&mut self.nl, ifindex, ip);
    }

    /// The notifications of one datagram (call when [`NeighbourWatch::fd`] is readable).
    pub fn news(&mut self) -> io::Result<Vec<NeighbourNews>> {
        let msgs = match self.events.recv() {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOBUFS.raw_os_error()) => {
                return Ok(vec![NeighbourNews::Lost]);
            }
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for m in msgs {
            let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) = m.payload
            else {
                continue;
            };
            let ip = n.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => Some(IpAddr::V4(*v)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => Some(IpAddr::V6(*v)),
                _ => None,
            });
            let Some(ip) = ip else { continue };
            let ifindex = n.header.ifindex;
            match neigh_entry(&n, ifindex, ip) {
                Some(Some(mac)) => out.push(NeighbourNews::Usable(ifindex, ip, mac)),
                Some(None) if n.header.state == NeighbourState::Failed => {
                    out.push(NeighbourNews::Failed(ifindex, ip))
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

/// The route the kernel picks for packets to `dst` from `src` (the source GID's address)
/// out of `oif`, in the calling thread's namespace (`RTM_GETROUTE`, like
/// `ip route get DST from SRC oif IF`).
pub fn route_to(dst: IpAddr, src: Option<IpAddr>, oif: Option<u32>) -> io::Result<Route> {
    let mut req = RouteMessage::default();
    req.header.address_family = family(dst);
    let addr = |ip: IpAddr| match ip {
        IpAddr::V4(v) => RouteAddress::Inet(v),
        IpAddr::V6(v) => RouteAddress::Inet6(v),
    };
    req.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    req.attributes.push(RouteAttribute::Destination(addr(dst)));
    if let Some(s) = src.filter(|s| s.is_ipv4() == dst.is_ipv4()) {
        req.header.source_prefix_length = if s.is_ipv4() { 32 } else { 128 };
        req.attributes.push(RouteAttribute::Source(addr(s)));
    }
    if let Some(i) = oif {
        req.attributes.push(RouteAttribute::Oif(i));
    }
    let mut nl = Rtnl::open()?;
    let reply = nl
        .request(RouteNetlinkMessage::GetRoute(req), 0)
        .map_err(|e| io::Error::new(e.kind(), format!("no route to {dst}: {e}")))?;
    let Some(RouteNetlinkMessage::NewRoute(r)) = reply.into_iter().next() else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no route to {dst}"),
        ));
    };
    Ok(parse_route(&r))
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn parse_route(r: &RouteMessage) -> Route {
    let mut route = Route {
        oif: 0,
        gateway: None,
        prefsrc: None,
        hop_limit: None,
    };
    for a in &r.attributes {
        match a {
            RouteAttribute::Oif(i) => route.oif = *i,
            RouteAttribute::Gateway(g) => route.gateway = route_ip(g),
            // An IPv4 route with an IPv6 next hop (RFC 5549).
            RouteAttribute::Via(RouteVia::Inet6(v)) => route.gateway = Some(IpAddr::V6(*v)),
            RouteAttribute::Via(RouteVia::Inet(v)) => route.gateway = Some(IpAddr::V4(*v)),
            RouteAttribute::PrefSource(s) => route.prefsrc = route_ip(s),
            RouteAttribute::Metrics(ms) => {
                for m in ms {
                    if let RouteMetric::Hoplimit(h) = m {
                        route.hop_limit = u8::try_from(*h).ok().filter(|&h| h > 0);
                    }
                }
            }
            _ => {}
        }
    }
    route
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_mac_accepts_only_six_hex_pairs() {
        assert_eq!(
            parse_mac("02:fc:00:0a:ff:01"),
            Some([0x02, 0xfc, 0x00, 0x0a, 0xff, 0x01])
        );
        for bad in [
            "",
            "02:fc:00:0a:ff",
            "02:fc:00:0a:ff:01:02",
            "2:fc:00:0a:ff:01",
            "zz:fc:00:0a:ff:01",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_route_with_a_gateway_and_a_hop_limit_is_read_from_its_attributes() {
        let mut r = RouteMessage::default();
        r.attributes = vec![
            RouteAttribute::Oif(7),
            RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(192, 0, 2, 65))),
            RouteAttribute::PrefSource(RouteAddress::Inet(Ipv4Addr::new(192, 0, 2, 66))),
            RouteAttribute::Metrics(vec![RouteMetric::Mtu(1400), RouteMetric::Hoplimit(9)]),
        ];
        let route = parse_route(&r);
        assert_eq!(route.oif, 7);
        assert_eq!(route.gateway, Some("192.0.2.65".parse().unwrap()));
        assert_eq!(route.prefsrc, Some("192.0.2.66".parse().unwrap()));
        assert_eq!(route.hop_limit, Some(9));
        let dst: IpAddr = "192.0.2.70".parse().unwrap();
        assert_eq!(route.next_hop(dst), "192.0.2.65".parse::<IpAddr>().unwrap());
        let on_link = parse_route(&RouteMessage::default());
        assert_eq!(on_link.next_hop(dst), dst);
        assert_eq!(on_link.hop_limit, None);
    }

    #[test]
    fn only_a_usable_entry_for_the_destination_gives_a_mac() {
        let dst: IpAddr = "192.0.2.2".parse().unwrap();
        let mk = |ifindex: u32, ip: Ipv4Addr, state: NeighbourState| {
            let mut n = NeighbourMessage::default();
            n.header.ifindex = ifindex;
            n.header.state = state;
            n.attributes = vec![
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)),
                NeighbourAttribute::LinkLayerAddress(vec![2, 0, 0, 0, 0, 2]),
            ];
            n
        };
        let ip = Ipv4Addr::new(192, 0, 2, 2);
        assert_eq!(
            neigh_entry(&mk(3, ip, NeighbourState::Reachable), 3, dst),
            Some(Some([2, 0, 0, 0, 0, 2]))
        );
        assert_eq!(
            neigh_entry(&mk(3, ip, NeighbourState::Stale), 3, dst),
            Some(Some([2, 0, 0, 0, 0, 2]))
        );
        assert_eq!(
            neigh_entry(&mk(3, ip, NeighbourState::Incomplete), 3, dst),
            Some(None)
        );
        assert_eq!(
            neigh_entry(&mk(3, ip, NeighbourState::Failed), 3, dst),
            Some(None)
        );
        assert_eq!(
            neigh_entry(&mk(4, ip, NeighbourState::Reachable), 3, dst),
            None
        );
        assert_eq!(
            neigh_entry(
                &mk(3, Ipv4Addr::new(192, 0, 2, 3), NeighbourState::Reachable),
                3,
                dst
            ),
            None
        );
    }
}

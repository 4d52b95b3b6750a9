//! Packet I/O below the transport: the frame port interface and its two ports, AF_XDP and
//! an in-process socket pair ([`frame`]); AF_XDP sockets ([`afxdp`]); the interface, neighbour and
//! route look-ups the driver needs over rtnetlink ([`link`]), the kernel multicast memberships
//! of UD multicast groups ([`mcast`]), and captures: pcap/pcapng
//! reading ([`capture`]) and commented pcapng writing ([`pcap_out`]). The network-namespace
//! harness of the tests and the demo, which runs `ip`, is the `xrnic-netns` crate
//! (src/netns): nothing here runs a program.
//!
//! Contract: nothing here knows RoCE beyond "UDP port 4791" (the XDP filter); frames go in
//! and out as byte slices. All `unsafe` of the crate lives in [`afxdp`].

pub mod afxdp;
pub mod capture;
pub mod frame;
pub mod link;
pub mod mcast;
pub mod pcap_out;
pub mod shm;

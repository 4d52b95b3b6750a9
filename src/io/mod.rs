//! Packet I/O below the transport: AF_XDP ports ([`afxdp`]), the network-namespace test
//! harness ([`netns`]), the interface/neighbour look-ups the driver needs ([`link`]), and
//! captures: pcap/pcapng reading ([`capture`]) and commented pcapng writing ([`pcap_out`]).
//!
//! Contract: nothing here knows RoCE beyond "UDP port 4791" (the XDP filter); frames go in
//! and out as byte slices. All `unsafe` of the crate lives in [`afxdp`].

pub mod afxdp;
pub mod capture;
pub mod link;
pub mod netns;
pub mod pcap_out;
pub mod shm;

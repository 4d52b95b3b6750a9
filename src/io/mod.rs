//! Packet I/O below the transport: AF_XDP ports ([`afxdp`]), the network-namespace test
//! harness ([`netns`]) and the interface/neighbour look-ups the driver needs ([`link`]).
//!
//! Contract: nothing here knows RoCE beyond "UDP port 4791" (the XDP filter); frames go in
//! and out as byte slices. All `unsafe` of the crate lives in [`afxdp`].

pub mod afxdp;
pub mod link;
pub mod netns;
pub mod shm;

//! The device service: one xrnic device shared by many processes (`xrnic up IF`,
//! docs/rnic.md "One device, many processes").
//!
//! The service process owns the device (engine, driver thread, AF_XDP socket, XDP
//! program: the only privileged part) and serves clients on the abstract Unix socket
//! `@xrnic/<IF>` of its network namespace ([`crate::ipc::socket_name`]). A client is any process
//! that opens `xrnic_<IF>` through the Rust API or the drop-in libibverbs while the service
//! runs ([`crate::verbs::Device::open_with`]); it needs no privilege.
//!
//! - [`crate::ipc`]: what the service and its clients say to each other (the control
//!   messages and the ring slot layouts), below both this module and `verbs`.
//! - [`server`]: the service loop; `client_verbs.rs`: a client's PD, MR, CQ and QP
//!   verbs; `client_mem`: how it reaches a client's memory; `objects`: its address
//!   handles and SRQs; [`gsi`] and
//!   `gsi_port`: the GSI relay that lets clients' rdma_cm share QP1.
//! - The rings themselves are [`crate::io::shm`]; the client side is `src/verbs/remote.rs`.

mod client_mem;
pub mod gsi;
mod objects;
pub mod server;

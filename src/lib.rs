//! xrnic: a RoCE v2 software RNIC.
//!
//! Layers, with one direction of dependency: [`wire`] (packet formats) ← `proto` (the
//! sans-IO transport) ← `verbs` / driver → `io` (AF_XDP, simulated link, captures).

// Every `unsafe` block says why it is sound (a `// SAFETY:` line), checked by clippy.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod cm;
pub mod driver;
pub mod io;
pub mod ipc;
pub mod oob;
pub mod proto;
pub mod service;
pub mod sim;
pub mod trace_out;
pub mod verbs;
pub mod wire;

//! xrnic: a RoCE v2 software RNIC.
//!
//! Layers, with one direction of dependency, bottom first: [`wire`] (packet formats);
//! [`io`] and [`proto`] (the sans-IO transport); the driver, [`sim`], [`cm`], [`oob`],
//! [`trace_out`] and [`ipc`] (the protocol between a process and the device service);
//! [`verbs`]; [`service`] (tests/layering.rs `LAYERS`, docs/README.md "The layers").

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

//! AF_XDP packet I/O: the XDP filter that steers RoCE v2 to user space ([`RoceFilter`])
//! and a socket with its UMEM and four rings behind a small safe API ([`XskPort`]).
//!
//! Contract:
//! - An [`XskPort`] moves whole Ethernet frames: [`XskPort::send_batch`] /
//!   [`XskPort::tx`] copy them into the UMEM and kick the kernel;
//!   [`XskPort::recv_batch`] hands every received frame to a closure and recycles its
//!   chunks; [`XskPort::wait`] blocks until something arrives.
//! - No UMEM chunk is ever lost: [`XskPort::frame_counts`] accounts for each one.
//! - Every failure is an [`Error`] naming the cause (not root, no such interface, attach
//!   refused, ...); nothing here panics on what the network sends.
//! - This module holds all of xrnic's `unsafe` (the xsk-rs ring and UMEM calls); every
//!   block says why it is sound in a `// SAFETY:` comment.

mod error;
pub mod features;
pub mod filter;
mod port;
pub mod sys;

pub use error::Error;
pub use features::{KernelFeatures, Support, kernel_features};
pub use filter::{
    FilterStats, RoceFilter, XDP_FRAGS_ENV, XDP_MODE_ENV, XdpAction, XdpMode, XdpModeChoice,
};
pub use port::{
    BindMode, BufferMode, CHUNK_DATA, CHUNK_SIZE, FrameCounts, KernelStats, MAX_FRAME, PortOptions,
    PortStats, SINGLE_BUFFER_ENV, XskPort, ZERO_COPY_SINCE,
};

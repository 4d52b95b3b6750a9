//! `libibverbs.so.1` for xrnic: unmodified libibverbs programs (rdma-core's examples,
//! perftest, ...) run on an in-process xrnic device. docs/verbs-abi.md is the map.
//!
//! - exports.rs binds every default-version symbol of rdma-core 44's libibverbs to its
//!   version node (libibverbs.map declares the nodes, build.rs sets the SONAME).
//! - types.rs: the C structures, checked against the system's verbs.h by layout.rs.
//! - device.rs: the device list, open/close, the queries; misc.rs: the pure helpers
//!   (strings, rates); stubs.rs: entry points xrnic does not implement (documented errors).
//!
//! At the boundary: every entry point runs its body under [`guard`] (a panic becomes an
//! error return with errno, never an unwind into C), and every `unsafe` block says why
//! the pointer it follows is valid.

mod device;
mod exports;
#[cfg(test)]
mod layout;
mod misc;
mod ops;
#[cfg(not(test))]
mod stderr;
mod stubs;
// The QP, CQ and MR structures are declared (and their layout tested) ahead of the
// verbs that fill them.
#[allow(dead_code)]
mod types;

use core::ffi::c_int;

/// Present in this library and in no real libibverbs: the offload backend
/// (src/verbs/ibv) refuses a `libibverbs.so.1` exporting it, so that xrnic never loads
/// itself as "the real libibverbs".
#[unsafe(no_mangle)]
pub static xrnic_verbs_abi_marker: u32 = 1;

/// Set the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Run an entry point's body; a panic (a bug) returns `on_panic` with errno EIO instead
/// of unwinding into the C caller, and says so on stderr (the panic hook prints it).
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// An errno-style result: `Ok` is 0, `Err(e)` returns `e` and sets errno to it too
/// (libibverbs verbs return the errno value; some callers read errno instead).
pub(crate) fn ret(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    }
}

//! `libibverbs.so.1` for xrnic: unmodified libibverbs programs (rdma-core's examples,
//! perftest, ...) run on an in-process xrnic device. docs/verbs-abi.md is the map.
//!
//! - exports.rs binds every default-version symbol of rdma-core 44's libibverbs to its
//!   version node (libibverbs.map declares the nodes, build.rs sets the SONAME).
//! - types.rs: the C structures (defined once in the xrnic crate, src/verbs/ibv/abi.rs,
//!   for this library and the offload backend), checked against the system's verbs.h by
//!   layout.rs.
//! - device.rs: the device list, open/close, the queries; misc.rs: the pure helpers
//!   (strings, rates); stubs.rs: entry points xrnic does not implement (documented errors).
//! - mr.rs (PDs, MRs), cq.rs (CQs, channels, poll), qp.rs (RC, UC, UD QPs and the post
//!   ops), ah.rs (address handles, AHs from a UD receive), srq.rs (shared receive
//!   queues), events.rs (the async fd), ops.rs (the `ibv_context.ops` table).
//!
//! At the boundary: every entry point runs its body under `guard` (a panic becomes an
//! error return with errno, never an unwind into C), and every `unsafe` block says why
//! the pointer it follows is valid.

// Every `unsafe` block says why it is sound (a `// SAFETY:` line), checked by clippy.
#![warn(clippy::undocumented_unsafe_blocks)]

mod ah;
mod context;
mod cq;
mod device;
mod events;
mod exports;
#[cfg(test)]
mod layout;
mod mcast;
mod misc;
mod mr;
mod opened;
mod ops;
mod qp;
mod rdmacm;
mod rdmacm_port;
mod srq;
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

/// Live objects handed to C, by address and kind, so that a destroy or a control verb
/// refuses a pointer that is not (or no longer) one of ours instead of freeing it twice.
///
/// The table is this process's: a child of `fork()` starts with an empty one
/// ([`generation`]), so every object it inherited is "not one of ours" there (EINVAL),
/// and nothing the child does reaches its parent's objects (docs/verbs-abi.md "fork").
pub(crate) mod live {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        Pd,
        Mr,
        Cq,
        Channel,
        Qp,
        Ah,
        Srq,
    }

    /// How many `fork()`s lie between the first process that loaded this library and
    /// this one: 0 in it, one more in each child (the `pthread_atfork` child handler).
    static GENERATION: AtomicU32 = AtomicU32::new(0);
    static AT_FORK: std::sync::Once = std::sync::Once::new();

    /// pthread_atfork(3)'s child handler: runs in the child, its only thread, right after
    /// fork(); an atomic increment is all it does (async-signal-safe).
    extern "C" fn forked_child() {
        GENERATION.fetch_add(1, Ordering::Relaxed);
    }

    /// This process's generation: the tables (this one, the open contexts, the open
    /// devices, librdmacm's ports) hold entries tagged with the generation that made
    /// them, and a process uses only its own. The handler is registered on the first
    /// call, before any object exists, so before any fork that could inherit one.
    pub fn generation() -> u32 {
        AT_FORK.call_once(|| {
            // SAFETY: registers a child handler of this library that takes no argument
            // and touches only an atomic. glibc's pthread_atfork (libc_nonshared.a)
            // passes this object's __dso_handle, so the handler goes when the library
            // is unloaded.
            let r = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
            if r != 0 {
                eprintln!(
                    "xrnic: pthread_atfork failed ({r}): a fork child would see its \
                     parent's objects"
                );
            }
        });
        GENERATION.load(Ordering::Relaxed)
    }

    static LIVE: Mutex<Option<(u32, HashMap<usize, Kind>)>> = Mutex::new(None);

    /// The table of this process: an inherited one is emptied (its objects are the
    /// parent's; their memory here is a copy nobody frees).
    fn table(t: &mut Option<(u32, HashMap<usize, Kind>)>) -> &mut HashMap<usize, Kind> {
        let g = generation();
        if t.as_ref().is_some_and(|(tg, _)| *tg != g) {
            *t = None;
        }
        &mut t.get_or_insert_with(|| (g, HashMap::new())).1
    }

    pub fn add<T>(p: *const T, k: Kind) {
        table(&mut LIVE.lock().unwrap_or_else(|e| e.into_inner())).insert(p as usize, k);
    }

    pub fn is<T>(p: *const T, k: Kind) -> bool {
        table(&mut LIVE.lock().unwrap_or_else(|e| e.into_inner())).get(&(p as usize)) == Some(&k)
    }

    /// The first live `k` for which `f` holds (the table stays locked meanwhile, so the
    /// object cannot be removed and freed under `f`).
    pub fn find(k: Kind, mut f: impl FnMut(usize) -> bool) -> Option<usize> {
        let mut g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        table(&mut g)
            .iter()
            .find(|&(&p, &kind)| kind == k && f(p))
            .map(|(&p, _)| p)
    }

    /// The live objects of kind `k` made in context `ctx` (`ibv_context *` as usize).
    pub fn of_context<C>(k: Kind, ctx: *mut C) -> Vec<usize> {
        let mut g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        table(&mut g)
            .iter()
            .filter(|&(_, &kind)| kind == k)
            .map(|(&p, _)| p)
            .filter(|&p| {
                // SAFETY: `p` is live (the table is locked; a destroy removes its entry
                // before freeing): a leaked box whose first field is the verbs.h
                // structure, and every one of those (ibv_pd, ibv_mr, ibv_cq,
                // ibv_comp_channel, ibv_qp, ibv_ah, ibv_srq) starts with its
                // `struct ibv_context *context`.
                unsafe { *(p as *const usize) == ctx as usize }
            })
            .collect()
    }

    /// Remove `p` if it is a live `k`; false otherwise.
    pub fn remove<T>(p: *const T, k: Kind) -> bool {
        let mut g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        let m = table(&mut g);
        if m.get(&(p as usize)) == Some(&k) {
            m.remove(&(p as usize));
            true
        } else {
            false
        }
    }
}

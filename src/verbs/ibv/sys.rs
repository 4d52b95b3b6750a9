//! The loader of rdma-core's libibverbs and the functions xrnic calls in it, declared by
//! hand from `libibverbs/verbs.h` (v44, Debian 12). The structures are the one definition
//! in [`super::abi`] (shared with the drop-in library, src/abi; its layout test compares
//! them with the system header), re-exported here.
//!
//! Contract: nothing is linked at build time: [`Lib::load`] `dlopen`s `libibverbs.so.1`
//! and resolves every symbol once, so the crate builds and runs on machines without
//! rdma-core. `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send` and `ibv_post_recv` are
//! `static inline` in verbs.h (calls through the context's `ops` table, the provider's
//! fast path): they are read from [`ibv_context`]'s `ops` the same way.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub use super::abi::{
    PollCqFn, PostRecvFn, PostSendFn, ReqNotifyFn, SendWrRemote, ibv_ah_attr, ibv_comp_channel,
    ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid, ibv_global_route, ibv_mr, ibv_pd,
    ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr,
    ibv_sge, ibv_wc,
};

/// `IBV_LINK_LAYER_ETHERNET`.
pub const LINK_LAYER_ETHERNET: u8 = 2;

/// `IBV_WC_WITH_IMM`, `IBV_WC_WITH_INV` (`ibv_wc.wc_flags`).
pub const WC_WITH_IMM: c_uint = 1 << 1;
pub const WC_WITH_INV: c_uint = 1 << 3;
/// `IBV_WC_GRH`: the buffer starts with the 40-byte GRH.
pub const WC_GRH: c_uint = 1;

/// `IBV_QPT_RC`.
pub const QPT_RC: c_int = 2;

/// The exported functions, resolved from `libibverbs.so.1`.
#[derive(Debug)]
pub struct Fns {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
}

/// The loaded library: [`Fns`] stay valid while `_lib` lives (it is never unloaded).
#[derive(Debug)]
pub struct Lib {
    pub fns: Fns,
    _lib: libloading::Library,
}

/// The soname Debian (and every distribution) ships libibverbs under.
pub const SONAME: &str = "libibverbs.so.1";

/// The symbol only xrnic's own libibverbs exports (src/abi/lib.rs).
pub const XRNIC_MARKER: &[u8] = b"xrnic_verbs_abi_marker\0";

impl Lib {
    /// `dlopen` libibverbs (`$XRNIC_LIBIBVERBS` if set, else [`SONAME`] through the
    /// dynamic loader's search) and resolve the functions above. xrnic's own
    /// `libibverbs.so.1` (src/abi, found first under `xrnic exec` or an LD_LIBRARY_PATH
    /// that names it) is refused: it exports [`XRNIC_MARKER`], and the offload backend
    /// on top of it would be xrnic driving itself, not an RDMA device.
    pub fn load() -> Result<Lib, String> {
        let path = std::env::var_os("XRNIC_LIBIBVERBS").unwrap_or_else(|| SONAME.into());
        // SAFETY: loading libibverbs runs its ELF constructors, which only set up its
        // internal tables (rdma-core libibverbs/init.c; xrnic's library: none that act);
        // it has no other load-time effects.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| e.to_string())?;
        // SAFETY: only the symbol's presence is looked at, its value is never read.
        if unsafe { lib.get::<*const u8>(XRNIC_MARKER) }.is_ok() {
            return Err(format!(
                "{} is xrnic's own libibverbs (the C-ABI library), not rdma-core's: the \
                 offload backend needs the real one (unset LD_LIBRARY_PATH, or point \
                 XRNIC_LIBIBVERBS at /usr/lib/x86_64-linux-gnu/libibverbs.so.1)",
                path.to_string_lossy()
            ));
        }
        Self::resolve(lib).map_err(|e| e.to_string())
    }

    fn resolve(lib: libloading::Library) -> Result<Lib, libloading::Error> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the libibverbs function of that name, whose C
                // prototype in verbs.h (v44) is the Rust type of the field it fills; the
                // pointer is copied out and stays valid because `lib` is kept in `Lib`.
                unsafe { *lib.get(concat!($name, "\0").as_bytes())? }
            };
        }
        let fns = Fns {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_device: sym!("ibv_query_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_comp_channel: sym!("ibv_create_comp_channel"),
            destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            get_cq_event: sym!("ibv_get_cq_event"),
            ack_cq_events: sym!("ibv_ack_cq_events"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            query_qp: sym!("ibv_query_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
        };
        Ok(Lib { fns, _lib: lib })
    }
}

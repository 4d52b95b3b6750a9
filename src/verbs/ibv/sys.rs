//! The libibverbs ABI xrnic uses, written by hand from rdma-core's `libibverbs/verbs.h`
//! (v44, Debian 12; these structures have kept their layout since rdma-core 13), and the
//! loader that finds the library at run time.
//!
//! Contract: only the structures and functions the verbs backend calls are declared, with
//! the exact C layout (sizes and field offsets are checked by the tests below against the
//! values gcc computes for verbs.h v44). Nothing is linked at build time: [`Lib::load`]
//! `dlopen`s `libibverbs.so.1` and resolves every symbol once, so the crate builds and
//! runs on machines without rdma-core. `ibv_poll_cq`, `ibv_req_notify_cq`,
//! `ibv_post_send` and `ibv_post_recv` are `static inline` in verbs.h (calls through the
//! context's `ops` table, the provider's fast path): they are read from [`ibv_context`]
//! the same way.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `union ibv_gid`.
pub type ibv_gid = [u8; 16];

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `IBV_LINK_LAYER_ETHERNET`.
pub const LINK_LAYER_ETHERNET: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`, by `wc_flags`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

pub const WC_WITH_IMM: c_uint = 1 << 1;
pub const WC_WITH_INV: c_uint = 1 << 3;
/// `IBV_WC_GRH`: the buffer starts with the 40-byte GRH.
pub const WC_GRH: c_uint = 1;

#[repr(C)]
#[derive(Debug)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

// `union ibv_gid` holds two u64: the route (and so the address vector) is 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Debug)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `IBV_QPT_RC`.
pub const QPT_RC: c_uint = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `wr` union of `ibv_send_wr`, as its largest member (`atomic`); `rdma` uses the
/// first two fields' places (`remote_addr` at 0, `rkey` at 8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_wr {
    pub remote_addr: u64,
    /// `rdma.rkey` (low 32 bits) for RDMA; `atomic.compare_add` for atomics.
    pub word1: u64,
    pub swap: u64,
    pub atomic_rkey: u32,
}

#[repr(C)]
#[derive(Debug)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type: u32,
    /// The `bind_mw` / `tso` union (unused here).
    pub bind_mw: [u64; 6],
}

#[repr(C)]
#[derive(Debug)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// The head of `struct ibv_qp` (the fields read here).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// The head of `struct ibv_cq`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
}

#[repr(C)]
#[derive(Debug)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The head of `struct ibv_context` up to the `ops` entries verbs.h's inline functions
/// call: `device`, then `struct ibv_context_ops` (11 entries before `poll_cq`, 12
/// between `req_notify_cq` and `post_send`).
#[repr(C)]
#[derive(Debug)]
pub struct ibv_context {
    pub device: *mut c_void,
    _ops_head: [*mut c_void; 11],
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    _ops_mid: [*mut c_void; 12],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
}

/// Opaque `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    _private: [u8; 0],
}

/// Opaque `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    _private: [u8; 0],
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Sizes and offsets gcc computes for rdma-core v44's verbs.h on x86-64 (compiled
    /// once against the headers of the rdma-core repository at tag v44.0).
    #[test]
    fn layouts_match_verbs_h() {
        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(offset_of!(ibv_device_attr, atomic_cap), 164);
        assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);
        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(offset_of!(ibv_mr, lkey), 36);
        assert_eq!(size_of::<ibv_global_route>(), 24);
        assert_eq!(
            (size_of::<ibv_ah_attr>(), align_of::<ibv_ah_attr>()),
            (32, 8)
        );
        assert_eq!(offset_of!(ibv_ah_attr, port_num), 30);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(offset_of!(ibv_qp_attr, max_rd_atomic), 126);
        assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, imm_data), 36);
        assert_eq!(
            offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_wr, atomic_rkey),
            64
        );
        assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
        assert_eq!(offset_of!(ibv_send_wr, bind_mw), 80);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(offset_of!(ibv_comp_channel, fd), 8);
        assert_eq!(offset_of!(ibv_context, poll_cq), 96);
        assert_eq!(offset_of!(ibv_context, req_notify_cq), 104);
        assert_eq!(offset_of!(ibv_context, post_send), 208);
        assert_eq!(offset_of!(ibv_context, post_recv), 216);
    }
}

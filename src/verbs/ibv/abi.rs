//! The C structures of rdma-core 44's `<infiniband/verbs.h>` (x86-64), field for field:
//! the one definition both sides use, the drop-in libibverbs (src/abi, which fills them
//! for programs) and the offload backend (its FFI to the real libibverbs, [`super::sys`]).
//! The abi crate's `layout.rs` prints their sizes and offsets and a test compares them with
//! a C program compiled against the system header (src/abi/tests).
//!
//! Pointers to objects the library owns are typed; everything a program only passes
//! through (AHs, MWs, flows, ...) is `*mut c_void`.

#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_uint, c_void};
use libc::{pthread_cond_t, pthread_mutex_t};

pub const IBV_SYSFS_NAME_MAX: usize = 64;
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `union ibv_gid`: 16 bytes, network order, 8-byte aligned (its `global` view is two
/// `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

type Fp = Option<unsafe extern "C" fn()>;

#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: Fp,
    pub _dummy2: Fp,
}

#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type CompatQueryDeviceFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
pub type CompatQueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;

/// `struct ibv_context_ops`: the data-path ops programs call inline (poll_cq,
/// req_notify_cq, post_srq_recv, post_send, post_recv) and compat slots.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: Option<CompatQueryDeviceFn>,
    pub _compat_query_port: Option<CompatQueryPortFn>,
    pub _compat_alloc_pd: Fp,
    pub _compat_dealloc_pd: Fp,
    pub _compat_reg_mr: Fp,
    pub _compat_rereg_mr: Fp,
    pub _compat_dereg_mr: Fp,
    pub alloc_mw: Fp,
    pub bind_mw: Fp,
    pub dealloc_mw: Fp,
    pub _compat_create_cq: Fp,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub _compat_cq_event: Fp,
    pub _compat_resize_cq: Fp,
    pub _compat_destroy_cq: Fp,
    pub _compat_create_srq: Fp,
    pub _compat_modify_srq: Fp,
    pub _compat_query_srq: Fp,
    pub _compat_destroy_srq: Fp,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: Fp,
    pub _compat_query_qp: Fp,
    pub _compat_modify_qp: Fp,
    pub _compat_destroy_qp: Fp,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: Fp,
    pub _compat_destroy_ah: Fp,
    pub _compat_attach_mcast: Fp,
    pub _compat_detach_mcast: Fp,
    pub _compat_async_event: Fp,
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    /// `(void *)UINTPTR_MAX` marks a `verbs_context` in front (verbs.h `verbs_get_ctx`).
    pub abi_compat: *mut c_void,
}

pub type QueryPortExFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;

pub type QueryRtValuesFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;

/// `struct verbs_context`: the extended ops, `sz`, then the `ibv_context`. An op a
/// program finds NULL takes the documented fallback of verbs.h's inline helper.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortExFn>,
    pub advise_mr: Fp,
    pub alloc_null_mr: Fp,
    pub read_counters: Fp,
    pub attach_counters_point_flow: Fp,
    pub create_counters: Fp,
    pub destroy_counters: Fp,
    pub reg_dm_mr: Fp,
    pub alloc_dm: Fp,
    pub free_dm: Fp,
    pub modify_flow_action_esp: Fp,
    pub destroy_flow_action: Fp,
    pub create_flow_action_esp: Fp,
    pub modify_qp_rate_limit: Fp,
    pub alloc_parent_domain: Fp,
    pub dealloc_td: Fp,
    pub alloc_td: Fp,
    pub modify_cq: Fp,
    pub post_srq_ops: Fp,
    pub destroy_rwq_ind_table: Fp,
    pub create_rwq_ind_table: Fp,
    pub destroy_wq: Fp,
    pub modify_wq: Fp,
    pub create_wq: Fp,
    pub query_rt_values: Option<QueryRtValuesFn>,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: Fp,
    pub abi_placeholder2: Fp,
    pub ibv_create_flow: Fp,
    pub abi_placeholder1: Fp,
    pub open_qp: Fp,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Fp,
    pub create_srq_ex: Fp,
    pub open_xrcd: Fp,
    pub close_xrcd: Fp,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
#[derive(Clone, Copy)]
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
    pub atomic_cap: c_int,
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

impl Default for ibv_device_attr {
    fn default() -> Self {
        // SAFETY: plain integers and a char array: all-zero is a valid value.
        unsafe { core::mem::zeroed() }
    }
}

/// `struct ibv_rss_caps`: nested, because its tail padding places the next field.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_device_attr_ex`: the base attributes, then capabilities xrnic reports as
/// zero (no ODP, TSO, RSS, pacing, tag matching, device memory).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_general_caps: u64,
    pub odp_rc_caps: u32,
    pub odp_uc_caps: u32,
    pub odp_ud_caps: u32,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_max_tso: u32,
    pub tso_supported_qpts: u32,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub pp_qp_rate_limit_min: u32,
    pub pp_qp_rate_limit_max: u32,
    pub pp_supported_qpts: u32,
    pub raw_packet_caps: u32,
    pub tm_max_rndv_hdr_size: u32,
    pub tm_max_num_tags: u32,
    pub tm_flags: u32,
    pub tm_max_ops: u32,
    pub tm_max_sge: u32,
    pub cq_mod_max_cq_count: u16,
    pub cq_mod_max_cq_period: u16,
    pub max_dm_size: u64,
    pub pci_atomic_fetch_add: u16,
    pub pci_atomic_swap: u16,
    pub pci_atomic_compare_swap: u16,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
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

/// What the exported `ibv_query_port` (IBVERBS_1.1) fills: `ibv_port_attr` up to
/// `flags`, without `port_cap_flags2` (verbs.h `_compat_ibv_port_attr`).
pub const COMPAT_PORT_ATTR_LEN: usize = core::mem::offset_of!(ibv_port_attr, port_cap_flags2);

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` / `wr.atomic` / `wr.ud` of `struct ibv_send_wr`, as the atomic variant
/// (the largest); `rdma` uses `remote_addr` and `rkey` at offsets 0 and 8 (`compare_add`'s
/// place), read through [`ibv_send_wr::rdma_rkey`].
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct SendWrRemote {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: SendWrRemote,
    pub qp_type_xrc_remote_srqn: u32,
    /// `bind_mw` / `tso`: 48 bytes xrnic does not read.
    pub bind_mw_or_tso: [u64; 6],
}

impl ibv_send_wr {
    /// `wr.rdma.rkey`: the second field of `wr.rdma`, at offset 8 of the union.
    pub fn rdma_rkey(&self) -> u32 {
        self.wr.compare_add as u32
    }

    /// Where `wr.ud.remote_qkey` sits in the union: after `ah` (8) and `remote_qpn` (4).
    pub const UD_REMOTE_QKEY_OFFSET: usize = 12;

    /// `wr.ud.ah`: the first field of `wr.ud`.
    pub fn ud_ah(&self) -> *mut ibv_ah {
        self.wr.remote_addr as usize as *mut ibv_ah
    }

    /// `wr.ud.remote_qpn`: the low half of the union's second 8 bytes (x86-64).
    pub fn ud_remote_qpn(&self) -> u32 {
        self.wr.compare_add as u32
    }

    /// `wr.ud.remote_qkey`: the high half of the union's second 8 bytes (x86-64).
    pub fn ud_remote_qkey(&self) -> u32 {
        (self.wr.compare_add >> 32) as u32
    }
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
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
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
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
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_async_event {
    /// `element`: a CQ, QP, SRQ or WQ pointer, or the port number.
    pub element: *mut c_void,
    pub event_type: c_int,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_grh`: the 40 bytes at the start of a UD receive buffer (for RoCE v2
/// over IPv4: 20 bytes, then the IPv4 header).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_rx_hash_conf` (RSS QPs; xrnic refuses them, the field is carried for
/// the layout of [`ibv_qp_init_attr_ex`]).
#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`: [`ibv_qp_init_attr`]'s fields, then what `comp_mask`
/// (`enum ibv_qp_init_attr_mask`) says is present.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `struct ibv_data_buf`: one buffer of `ibv_wr_set_inline_data_list`.
#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

pub type QpExFn = unsafe extern "C" fn(*mut ibv_qp_ex);

/// `struct ibv_qp_ex`: an [`ibv_qp`], then the work-request builders and setters a
/// program calls through the `ibv_wr_*` inline helpers (verbs.h); `wr_id` and `wr_flags`
/// are written by the program before each builder.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u32, *const c_void)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<QpExFn>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Fp,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Fp,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<QpExFn>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<QpExFn>,
    pub wr_atomic_write: Fp,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

type CqRead<T> = Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> T>;

/// `struct ibv_cq_ex`: an [`ibv_cq`]'s fields (`ibv_cq_ex_to_cq` is a cast), then the
/// current completion's `status` and `wr_id` and the polling ops and accessors.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: CqRead<c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: CqRead<c_int>,
    pub read_vendor_err: CqRead<u32>,
    pub read_byte_len: CqRead<u32>,
    pub read_imm_data: CqRead<u32>,
    pub read_qp_num: CqRead<u32>,
    pub read_src_qp: CqRead<u32>,
    pub read_wc_flags: CqRead<c_uint>,
    pub read_slid: CqRead<u32>,
    pub read_sl: CqRead<u8>,
    pub read_dlid_path_bits: CqRead<u8>,
    pub read_completion_ts: CqRead<u64>,
    pub read_cvlan: CqRead<u16>,
    pub read_flow_tag: CqRead<u32>,
    pub read_tm_info: Fp,
    pub read_completion_wallclock_ns: CqRead<u64>,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_values_ex`: `ibv_query_rt_values_ex`'s answer.
#[repr(C)]
pub struct ibv_values_ex {
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

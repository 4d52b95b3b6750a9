//! The pure helpers of libibverbs (rdma-core libibverbs/enum_strs.c and verbs.c: the
//! enum strings and the rate conversions), fork support, and the provider registration
//! that xrnic accepts and ignores.

use core::ffi::{c_char, c_int, c_void};

/// A static C string.
macro_rules! cstr {
    ($s:literal) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

fn pick(table: &[*const c_char], i: c_int) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i).copied())
        .filter(|p| !p.is_null())
        .unwrap_or(cstr!("unknown"))
}

pub extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    let table = [
        core::ptr::null(),
        cstr!("InfiniBand channel adapter"),
        cstr!("InfiniBand switch"),
        cstr!("InfiniBand router"),
        cstr!("iWARP NIC"),
        cstr!("usNIC"),
        cstr!("usNIC UDP"),
        cstr!("unspecified"),
    ];
    pick(&table, t)
}

pub extern "C" fn ibv_port_state_str(s: c_int) -> *const c_char {
    let table = [
        cstr!("no state change (NOP)"),
        cstr!("down"),
        cstr!("init"),
        cstr!("armed"),
        cstr!("active"),
        cstr!("active defer"),
    ];
    pick(&table, s)
}

pub extern "C" fn ibv_event_type_str(e: c_int) -> *const c_char {
    let table = [
        cstr!("CQ error"),
        cstr!("local work queue catastrophic error"),
        cstr!("invalid request local work queue error"),
        cstr!("local access violation work queue error"),
        cstr!("communication established"),
        cstr!("send queue drained"),
        cstr!("path migrated"),
        cstr!("path migration request error"),
        cstr!("local catastrophic error"),
        cstr!("port active"),
        cstr!("port error"),
        cstr!("LID change"),
        cstr!("P_Key change"),
        cstr!("SM change"),
        cstr!("SRQ catastrophic error"),
        cstr!("SRQ limit reached"),
        cstr!("last WQE reached"),
        cstr!("client reregistration"),
        cstr!("GID table change"),
        cstr!("WQ fatal"),
    ];
    pick(&table, e)
}

pub extern "C" fn ibv_wc_status_str(s: c_int) -> *const c_char {
    let table = [
        cstr!("success"),
        cstr!("local length error"),
        cstr!("local QP operation error"),
        cstr!("local EE context operation error"),
        cstr!("local protection error"),
        cstr!("Work Request Flushed Error"),
        cstr!("memory management operation error"),
        cstr!("bad response error"),
        cstr!("local access error"),
        cstr!("remote invalid request error"),
        cstr!("remote access error"),
        cstr!("remote operation error"),
        cstr!("transport retry counter exceeded"),
        cstr!("RNR retry counter exceeded"),
        cstr!("local RDD violation error"),
        cstr!("remote invalid RD request"),
        cstr!("aborted error"),
        cstr!("invalid EE context number"),
        cstr!("invalid EE context state"),
        cstr!("fatal error"),
        cstr!("response timeout error"),
        cstr!("general error"),
        cstr!("TM error"),
        cstr!("TM software rendezvous"),
    ];
    pick(&table, s)
}

/// `enum ibv_wr_opcode` (verbs.h: 11 is `IBV_WR_DRIVER1`, 12 and 13 unused, 14 and 15
/// `IBV_WR_FLUSH`, `IBV_WR_ATOMIC_WRITE`), named as rdma-core's enum_strs.c names them.
/// rdma-core exports it at IBVERBS_PRIVATE_34 from v49 on; the unused values give
/// "unknown" here where rdma-core returns NULL.
pub extern "C" fn ibv_wr_opcode_str(op: c_int) -> *const c_char {
    let table = [
        cstr!("rdma-write"),
        cstr!("rdma-write-with-imm"),
        cstr!("send"),
        cstr!("send-with-imm"),
        cstr!("rdma-read"),
        cstr!("atomic-cmp-and-swp"),
        cstr!("atomic-fetch-and-add"),
        cstr!("local-inv"),
        cstr!("bind-mw"),
        cstr!("send-with-inv"),
        cstr!("tso"),
        cstr!("driver1"),
        core::ptr::null(),
        core::ptr::null(),
        cstr!("flush"),
        cstr!("atomic-write"),
    ];
    pick(&table, op)
}

/// `enum ibv_rate` value, multiple of 2.5 Gb/s, Mb/s (rdma-core libibverbs/verbs.c).
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
];
const IBV_RATE_MAX: c_int = 0;

pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// Succeeds: xrnic pins nothing in a kernel, so a fork child cannot corrupt a DMA target;
/// the child has no driver thread (its copy of the device does nothing).
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED` (verbs.h `enum ibv_fork_status`), for the same reason.
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// The constructors of providers a program links (perftest: libmlx5, libefa) register
/// their drivers here; xrnic is the only device, so the registration is ignored.
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// No `IBV_QUERY_QP_DATA_IN_ORDER_*` guarantee is claimed: 0 (verbs.h says the caller
/// must then not rely on the order of data placement).
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut c_void, _op: c_int, _flags: u32) -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ffi::CStr;

    /// The text `f(v)` returns (one of this file's string functions).
    fn s(f: extern "C" fn(c_int) -> *const c_char, v: c_int) -> &'static str {
        let p = f(v);
        // SAFETY: each of these functions returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn strings_and_rates_follow_rdma_core() {
        assert_eq!(s(ibv_wc_status_str, 4), "local protection error");
        assert_eq!(s(ibv_wc_status_str, 5), "Work Request Flushed Error");
        assert_eq!(s(ibv_wc_status_str, 99), "unknown");
        assert_eq!(s(ibv_wc_status_str, -1), "unknown");
        assert_eq!(s(ibv_wr_opcode_str, 0), "rdma-write");
        assert_eq!(s(ibv_wr_opcode_str, 11), "driver1");
        assert_eq!(s(ibv_wr_opcode_str, 12), "unknown");
        assert_eq!(s(ibv_wr_opcode_str, 15), "atomic-write");
        assert_eq!(s(ibv_wr_opcode_str, 16), "unknown");
        assert_eq!(s(ibv_port_state_str, 4), "active");
        assert_eq!(s(ibv_node_type_str, 0), "unknown");
        assert_eq!(s(ibv_node_type_str, 1), "InfiniBand channel adapter");
        assert_eq!(s(ibv_event_type_str, 19), "WQ fatal");
        assert_eq!(ibv_rate_to_mult(3), 4);
        assert_eq!(mult_to_ibv_rate(4), 3);
        assert_eq!(mult_to_ibv_rate(-1), IBV_RATE_MAX);
        assert_eq!(ibv_rate_to_mbps(16), 103125);
        assert_eq!(mbps_to_ibv_rate(25781), 15);
        assert_eq!(ibv_rate_to_mult(11), -1);
    }
}

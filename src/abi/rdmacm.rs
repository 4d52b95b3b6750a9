//! librdmacm for xrnic: the `rdma_*` entry points of rdma-core 44's librdmacm.so.1 in the
//! same library as libibverbs (one engine per process; `librdmacm.so.1` is a link to
//! this file, docs/verbs-abi.md). The CM itself is [`xrnic::cm`], one per device, run by
//! rdmacm_port.rs over the device's QP1.
//!
//! What librdmacm does in user space is done here the same way (librdmacm/cma.c): the
//! QP moves around a connection (`rdma_create_qp` → INIT; `rdma_accept` → RTR → RTS
//! before the REP; a REP → RTR → RTS → RTU before ESTABLISHED), and the private data a
//! program sees skips the 36-byte IP header of a REQ (kernel cma.c `cma_user_data_offset`).
//! Events reach `rdma_get_cm_event` through a queue per channel whose `fd` is an
//! eventfd in semaphore mode: readable while events wait.
//!
//! UD ids (RDMA_PS_UDP, SIDR) are in `ud`; the synchronous mode (NULL channel) and
//! `rdma_create_ep` / `rdma_get_request` in `sync`.
//!
//! Multicast joins of UD ids are in `mcast`.
//!
//! Not here (documented errors): rsockets (ENOSYS), ECE, and
//! `rdma_getaddrinfo` for names other than numeric addresses.

use core::ffi::{c_char, c_int, c_void};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xrnic::cm::{CmEvent, CmId, ConnParam, Path};
use xrnic::wire::mad::{CMA_HDR_LEN, CmaHdr, RDMA_PS_TCP, RDMA_PS_UDP, rej_reason, service_id};

use crate::rdmacm_port::{Port, Upcalls};
use crate::types::*;
use crate::{guard, set_errno};

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src: libc::sockaddr_storage,
    pub dst: libc::sockaddr_storage,
    pub ib: rdma_ib_addr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `enum rdma_cm_event_type`.
pub mod ev {
    pub const ADDR_RESOLVED: i32 = 0;
    pub const ADDR_ERROR: i32 = 1;
    pub const ROUTE_RESOLVED: i32 = 2;
    pub const ROUTE_ERROR: i32 = 3;
    pub const CONNECT_REQUEST: i32 = 4;
    pub const CONNECT_RESPONSE: i32 = 5;
    pub const CONNECT_ERROR: i32 = 6;
    pub const UNREACHABLE: i32 = 7;
    pub const REJECTED: i32 = 8;
    pub const ESTABLISHED: i32 = 9;
    pub const DISCONNECTED: i32 = 10;
    pub const DEVICE_REMOVAL: i32 = 11;
    pub const MULTICAST_JOIN: i32 = 12;
    pub const MULTICAST_ERROR: i32 = 13;
    pub const ADDR_CHANGE: i32 = 14;
    pub const TIMEWAIT_EXIT: i32 = 15;
}

/// An event and the bytes its private data points into (freed by rdma_ack_cm_event).
#[repr(C)]
struct XEvent {
    ev: rdma_cm_event,
    private: Vec<u8>,
}

#[repr(C)]
pub struct XChannel {
    ch: rdma_event_channel,
    q: Mutex<VecDeque<usize>>,
}

#[derive(Default)]
struct IdState {
    port: Option<Arc<Port>>,
    cm: Option<CmId>,
    /// Listening on this service ID (on every port in `listen_ports`).
    listen: Option<u64>,
    listen_ports: Vec<Arc<Port>>,
    /// The REP's private data, for the ESTABLISHED event of an active id.
    rep_private: Vec<u8>,
    /// The peer's REQ / REP numbers for the events.
    remote: Option<ConnNumbers>,
    /// A UD id's path (for the address handle of its ESTABLISHED event).
    ud_path: Option<Path>,
    /// Made with a NULL channel: calls wait for their event (`sync`).
    sync: bool,
    /// A sync listener's QP attributes for its requests (`rdma_create_ep`).
    qp_init: Option<ibv_qp_init_attr>,
    /// `rdma_create_qp` made the id's CQs and completion channels.
    own_cqs: bool,
    /// The multicast groups joined (`mcast`).
    mc: Vec<mcast::Join>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout at RTS instead of the
    /// CM's (the kernel's `rdma_set_ack_timeout`).
    ack_timeout: Option<u8>,
    /// `rdma_establish` sent the RTU: the CM's ESTABLISHED for it is not an event of the
    /// program's (the kernel's cma.c gives the active side none after
    /// CONNECT_RESPONSE).
    established_by_call: bool,
}

#[derive(Clone, Copy, Default)]
struct ConnNumbers {
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
}

/// An id: the C struct the program reads and writes (`context`, and the fields it reads
/// after events), then xrnic's state. The C struct is in an `UnsafeCell`: the program
/// and this library both write it (librdmacm's contract: not concurrently with the
/// program's own rdma_* calls on the same id).
#[repr(C)]
pub struct XId {
    id: core::cell::UnsafeCell<rdma_cm_id>,
    st: Mutex<IdState>,
    /// The id's starting PSN, drawn when it is made (the kernel's cma.c `seq_num`): the
    /// Starting PSN of its REQ or REP and the `rq_psn` that `rdma_init_qp_attr` gives
    /// for RTR, so a QP the program moves itself before `rdma_accept` agrees with the REP.
    seq_num: u32,
}

impl XId {
    /// The C struct, to write through (it lives in an `UnsafeCell`, see [`XId`]). A
    /// caller that makes a `&mut` of it must hold no other reference to it meanwhile, and
    /// the program does not use the id from another thread (librdmacm's own calls on
    /// one id are not thread-safe either): each such site says so in its `SAFETY` line.
    fn id_ptr(&self) -> *mut rdma_cm_id {
        self.id.get()
    }

    fn c(&self) -> &rdma_cm_id {
        // SAFETY: see the struct comment; reads of the C struct.
        unsafe { &*self.id.get() }
    }
}

/// Live ids and channels (addresses), and connection → id.
#[derive(Default)]
struct Reg {
    ids: std::collections::HashSet<usize>,
    channels: std::collections::HashSet<usize>,
    conns: HashMap<(usize, CmId), usize>,
}

static REG: Mutex<Option<Reg>> = Mutex::new(None);

fn reg<T>(f: impl FnOnce(&mut Reg) -> T) -> T {
    let mut g = REG.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Reg::default))
}

/// The id behind `id`, if it is registered.
///
/// # Safety
///
/// The lookup refuses a pointer that is not (or no longer) a live id, but the
/// reference it returns has no lifetime the compiler can check: it is valid only while the
/// id is not destroyed. The caller uses it within the call it serves and the program
/// does not call `rdma_destroy_id` on it meanwhile (a librdmacm program may not destroy an
/// id while another of its calls uses it).
unsafe fn xid<'a>(id: *mut rdma_cm_id) -> Option<&'a XId> {
    // SAFETY: a registered id is a leaked Box<XId> whose first field is the rdma_cm_id.
    reg(|r| r.ids.contains(&(id as usize))).then(|| unsafe { &*(id as *const XId) })
}

/// The event channel behind `ch`, if it is registered.
///
/// # Safety
///
/// As [`xid`]'s: the program does not call `rdma_destroy_event_channel` on it while the
/// reference is used.
unsafe fn xchan<'a>(ch: *mut rdma_event_channel) -> Option<&'a XChannel> {
    // SAFETY: a registered channel is a leaked Box<XChannel> starting with the C struct.
    reg(|r| r.channels.contains(&(ch as usize))).then(|| unsafe { &*(ch as *const XChannel) })
}

fn err<T>(e: c_int, v: T) -> T {
    set_errno(e);
    v
}

fn errno_ret(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(core::ptr::null_mut(), || {
        // SAFETY: eventfd has no memory arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return core::ptr::null_mut();
        }
        let c = Box::into_raw(Box::new(XChannel {
            ch: rdma_event_channel { fd },
            q: Mutex::new(VecDeque::new()),
        }));
        reg(|r| r.channels.insert(c as usize));
        c as *mut rdma_event_channel
    })
}

pub extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    guard((), || {
        if !reg(|r| r.channels.remove(&(ch as usize))) {
            return;
        }
        // SAFETY: it was registered: a Box<XChannel> from rdma_create_event_channel.
        let c = unsafe { Box::from_raw(ch as *mut XChannel) };
        // SAFETY: the fd is the channel's own eventfd.
        unsafe { libc::close(c.ch.fd) };
    })
}

fn push(ch: *mut rdma_event_channel, e: XEvent) {
    // SAFETY: the program does not destroy the event channel `ch` while this call uses it.
    let Some(c) = (unsafe { xchan(ch) }) else {
        return;
    };
    let mut b = Box::new(e);
    if !b.private.is_empty() {
        // The union's `conn` and `ud` both start with the private data pointer.
        b.ev.param.conn.private_data = b.private.as_ptr() as *const c_void;
    }
    c.q.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(Box::into_raw(b) as usize);
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live local to the channel's eventfd.
    unsafe { libc::write(c.ch.fd, &one as *const u64 as *const c_void, 8) };
}

fn event(id: &XId, kind: c_int, status: c_int) -> XEvent {
    // SAFETY: rdma_cm_event is C data; all-zero is valid (NULL pointers, zero numbers).
    let mut ev: rdma_cm_event = unsafe { core::mem::zeroed() };
    ev.id = id.id.get();
    ev.event = kind;
    ev.status = status;
    XEvent {
        ev,
        private: Vec::new(),
    }
}

fn conn_event(id: &XId, kind: c_int, p: Option<ConnNumbers>, private: &[u8]) -> XEvent {
    let mut e = event(id, kind, 0);
    if let Some(p) = p {
        e.ev.param.conn = rdma_conn_param {
            private_data: core::ptr::null(),
            private_data_len: private.len().min(255) as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            qp_num: p.qp_num,
        };
    }
    e.private = private.to_vec();
    e
}

pub extern "C" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the event channel `ch` while this call uses it.
        let Some(c) = (unsafe { xchan(ch) }) else {
            return err(libc::EINVAL, -1);
        };
        if out.is_null() {
            return err(libc::EINVAL, -1);
        }
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from the channel's eventfd (blocking
        // unless the program made the fd non-blocking: then EAGAIN, as librdmacm).
        let n = unsafe { libc::read(c.ch.fd, &mut v as *mut u64 as *mut c_void, 8) };
        if n != 8 {
            return -1;
        }
        let Some(e) = c.q.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
            return err(libc::EAGAIN, -1);
        };
        // SAFETY: `out` is the caller's pointer slot (librdmacm contract).
        unsafe { *out = e as *mut rdma_cm_event };
        0
    })
}

pub extern "C" fn rdma_ack_cm_event(e: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if e.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: events are Box<XEvent> handed out once by rdma_get_cm_event (the C
        // contract: acked once).
        drop(unsafe { Box::from_raw(e as *mut XEvent) });
        0
    })
}

pub extern "C" fn rdma_event_str(e: c_int) -> *const c_char {
    let s: &'static [u8] = match e {
        ev::ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        ev::ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        ev::ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        ev::ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        ev::CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        ev::CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        ev::CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        ev::UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        ev::REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        ev::ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        ev::DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        ev::DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        ev::MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        ev::MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        ev::ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        ev::TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr() as *const c_char
}

fn new_id(ch: *mut rdma_event_channel, context: *mut c_void, ps: c_int) -> *mut XId {
    // SAFETY: rdma_cm_id is C data; all-zero is valid (NULL pointers, AF 0 addresses).
    let mut id: rdma_cm_id = unsafe { core::mem::zeroed() };
    id.channel = ch;
    id.context = context;
    id.ps = ps;
    id.qp_type = if ps == c_int::from(RDMA_PS_UDP) {
        ud::QPT_UD
    } else {
        2 // IBV_QPT_RC
    };
    let x = Box::into_raw(Box::new(XId {
        id: core::cell::UnsafeCell::new(id),
        st: Mutex::new(IdState::default()),
        seq_num: conn::random_psn(),
    }));
    reg(|r| r.ids.insert(x as usize));
    x
}

pub extern "C" fn rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the event channel `ch` while this call uses it.
        if out.is_null() || (!ch.is_null() && unsafe { xchan(ch) }.is_none()) {
            return err(libc::EINVAL, -1);
        }
        if ps != c_int::from(RDMA_PS_TCP) && ps != c_int::from(RDMA_PS_UDP) {
            // RDMA_PS_IPOIB / RDMA_PS_IB: not here.
            return err(libc::EOPNOTSUPP, -1);
        }
        // A NULL channel: librdmacm's synchronous mode, a channel of the id's own.
        let sync = ch.is_null();
        let ch = if sync { sync::own_channel() } else { ch };
        if ch.is_null() {
            return -1;
        }
        let x = new_id(ch, context, ps);
        // SAFETY: just made and registered.
        unsafe { &*x }
            .st
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sync = sync;
        // SAFETY: `out` is the caller's pointer slot.
        unsafe { *out = x as *mut rdma_cm_id };
        0
    })
}

pub extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: no other call of the program uses `id` meanwhile; this one frees it
        // below, after its last use of `x`.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let st = std::mem::take(&mut *x.st.lock().unwrap_or_else(|e| e.into_inner()));
        if let (Some(p), Some(c)) = (&st.port, st.cm) {
            reg(|r| r.conns.remove(&(Arc::as_ptr(p) as usize, c)));
            p.with_cm(|cm, now| cm.destroy(now, c));
        }
        if let Some(p) = &st.port {
            // The last MADs of this id (a DREQ or DREP, a REJ) leave before the program
            // may exit.
            p.drain_sends(Duration::from_millis(500));
        }
        if let Some(sid) = st.listen {
            for p in &st.listen_ports {
                p.unlisten(sid);
            }
        }
        reg(|r| r.ids.remove(&(id as usize)));
        if st.sync {
            sync::release(x.c().channel, x.c().event);
        }
        // SAFETY: it was registered: a Box<XId> from new_id, now unreachable.
        drop(unsafe { Box::from_raw(id as *mut XId) });
        // The listing now, not at the port thread's next turn: a program exits right
        // after its last rdma_destroy_id, and its file must go with it.
        publish_ids();
        0
    })
}

/// Entry points xrnic does not implement: SRQs on ids, ECE, rsockets.
pub mod unsupported {
    use super::*;

    macro_rules! enosys {
        ($($name:ident),* $(,)?) => {$(
            pub extern "C" fn $name() -> c_int {
                set_errno(libc::ENOSYS);
                -1
            }
        )*};
    }
    enosys!(
        rdma_create_srq,
        rdma_create_srq_ex,
        rdma_destroy_srq,
        rdma_create_qp_ex,
        raccept,
        rbind,
        rclose,
        rconnect,
        rfcntl,
        rgetpeername,
        rgetsockname,
        rgetsockopt,
        rlisten,
        rpoll,
        rread,
        rreadv,
        rrecv,
        rrecvfrom,
        rrecvmsg,
        rselect,
        rsend,
        rsendmsg,
        rsendto,
        rsetsockopt,
        rshutdown,
        rsocket,
        rwrite,
        rwritev,
        riowrite,
        riounmap,
    );

    pub extern "C" fn riomap() -> isize {
        set_errno(libc::ENOSYS);
        -1
    }
}

mod addr;
pub use addr::*;
mod addrinfo;
mod conn;
pub use conn::*;
mod mcast;
mod qp;
pub use qp::*;
mod res;
pub use addrinfo::{rdma_addrinfo, rdma_freeaddrinfo, rdma_getaddrinfo};
pub use mcast::{rdma_join_multicast, rdma_join_multicast_ex, rdma_leave_multicast};
pub(crate) use res::publish as publish_ids;
mod sync;
#[cfg(test)]
mod tests;
mod ud;

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

/// The socket address at `sa` (AF_INET or AF_INET6).
fn sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller passes a sockaddr of the family it names (sockets API contract).
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    IpAddr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

fn store(dst: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: sockaddr_storage is large and aligned enough for either family.
    unsafe {
        *dst = core::mem::zeroed();
        match a {
            SocketAddr::V4(v) => {
                let s = &mut *(dst as *mut _ as *mut libc::sockaddr_in);
                s.sin_family = libc::AF_INET as u16;
                s.sin_port = v.port().to_be();
                s.sin_addr.s_addr = u32::from_be_bytes(v.ip().octets()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = &mut *(dst as *mut _ as *mut libc::sockaddr_in6);
                s.sin6_family = libc::AF_INET6 as u16;
                s.sin6_port = v.port().to_be();
                s.sin6_addr.s6_addr = v.ip().octets();
            }
        }
    }
}

fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The interface holding `ip` (getifaddrs).
fn ifname_of(ip: IpAddr) -> Option<String> {
    let mut ifa: *mut libc::ifaddrs = core::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifa` with a list freed below by freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned; names are NUL-terminated.
        let (addr, name, next) = unsafe { ((*p).ifa_addr, (*p).ifa_name, (*p).ifa_next) };
        if sockaddr(addr).is_some_and(|a| a.ip() == ip) {
            // SAFETY: as above.
            found = Some(
                unsafe { core::ffi::CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
            break;
        }
        p = next;
    }
    // SAFETY: frees the list from getifaddrs once.
    unsafe { libc::freeifaddrs(ifa) };
    found
}

/// The source address the kernel's routing would use towards `dst`.
fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        IpAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(dst, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

fn ephemeral_port() -> u16 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    32768 + (n % 28000) as u16
}

/// Attach `x` to the port of the interface holding `ip`.
fn attach(x: &XId, ip: IpAddr) -> Result<Arc<Port>, c_int> {
    let ifname = ifname_of(ip).ok_or(libc::EADDRNOTAVAIL)?;
    if !crate::device::netdevs().contains(&ifname) {
        return Err(libc::ENODEV);
    }
    let p = cm_port(&ifname)?;
    // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
    let id = unsafe { &mut *x.id_ptr() };
    id.verbs = p.ctx;
    id.port_num = 1;
    id.route.addr.ib.sgid.raw = gid_of(ip);
    id.route.addr.ib.pkey = 0xffff;
    x.st.lock().unwrap_or_else(|e| e.into_inner()).port = Some(p.clone());
    Ok(p)
}

pub extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let Some(mut a) = sockaddr(addr) else {
            return err(libc::EAFNOSUPPORT, -1);
        };
        if a.port() == 0 {
            a.set_port(ephemeral_port());
        }
        if !a.ip().is_unspecified() {
            if let Err(e) = attach(x, a.ip()) {
                return err(e, -1);
            }
        }
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        store(&mut unsafe { &mut *x.id_ptr() }.route.addr.src, a);
        0
    })
}

pub extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let Some(d) = sockaddr(dst) else {
            return err(libc::EAFNOSUPPORT, -1);
        };
        let bound = sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr);
        let s_ip = sockaddr(src)
            .map(|s| s.ip())
            .filter(|i| !i.is_unspecified())
            .or(bound.map(|b| b.ip()).filter(|i| !i.is_unspecified()))
            .or_else(|| route_source(d.ip()));
        let port_no = bound.map_or(0, |b| b.port());
        let r = s_ip
            .ok_or(libc::EADDRNOTAVAIL)
            .and_then(|ip| attach(x, ip).map(|_| ip));
        match r {
            Ok(ip) => {
                let sport = if port_no == 0 {
                    ephemeral_port()
                } else {
                    port_no
                };
                // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one
                // is used.
                let idm = unsafe { &mut *x.id_ptr() };
                store(&mut idm.route.addr.src, SocketAddr::new(ip, sport));
                store(&mut idm.route.addr.dst, d);
                idm.route.addr.ib.dgid.raw = gid_of(d.ip());
                push(x.c().channel, event(x, ev::ADDR_RESOLVED, 0));
            }
            Err(e) => push(x.c().channel, event(x, ev::ADDR_ERROR, -e)),
        }
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let p = x.st.lock().unwrap_or_else(|e| e.into_inner()).port.clone();
        let Some(p) = p else {
            return err(libc::EINVAL, -1);
        };
        // The next hop's MAC: resolving it now makes ROUTE_ERROR the event for a
        // neighbour that does not answer (as the kernel's rdma_resolve_route on RoCE).
        let dgid = x.c().route.addr.ib.dgid.raw;
        match p
            .dev
            .resolve_path(Some(&x.c().route.addr.ib.sgid.raw), &dgid)
        {
            Ok(_) => push(x.c().channel, event(x, ev::ROUTE_RESOLVED, 0)),
            Err(e) => push(x.c().channel, event(x, ev::ROUTE_ERROR, -e.errno())),
        }
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let Some(a) = sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr) else {
            return err(libc::EINVAL, -1);
        };
        let sid = service_id(x.c().ps as u16, a.port());
        let ports: Vec<Arc<Port>> =
            match x.st.lock().unwrap_or_else(|e| e.into_inner()).port.clone() {
                Some(p) => vec![p],
                None => crate::device::netdevs()
                    .iter()
                    .filter_map(|n| cm_port(n).ok())
                    .collect(),
            };
        if ports.is_empty() {
            return err(libc::ENODEV, -1);
        }
        for (i, p) in ports.iter().enumerate() {
            if let Err(e) = p.listen(sid, id as u64) {
                ports[..i].iter().for_each(|q| q.unlisten(sid));
                return err(e, -1);
            }
        }
        if x.c().verbs.is_null() {
            // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
            unsafe { &mut *x.id_ptr() }.verbs = ports[0].ctx;
        }
        let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        st.listen = Some(sid);
        st.listen_ports = ports;
        0
    })
}

fn attr_mask(bits: &[u32]) -> c_int {
    bits.iter().fold(0, |a, b| a | *b as c_int)
}

const QP_STATE: u32 = 1;
const QP_ACCESS_FLAGS: u32 = 1 << 3;
const QP_PKEY_INDEX: u32 = 1 << 4;
const QP_PORT: u32 = 1 << 5;
const QP_AV: u32 = 1 << 7;
const QP_PATH_MTU: u32 = 1 << 8;
const QP_TIMEOUT: u32 = 1 << 9;
const QP_RETRY_CNT: u32 = 1 << 10;
const QP_RNR_RETRY: u32 = 1 << 11;
const QP_RQ_PSN: u32 = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
const QP_MIN_RNR_TIMER: u32 = 1 << 15;
const QP_SQ_PSN: u32 = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
const QP_DEST_QPN: u32 = 1 << 20;

/// `rdma_init_qp_attr` for `state` (IBV_QPS_INIT 1, RTR 2, RTS 3).
fn init_qp_attr(x: &XId, state: c_int) -> Result<(ibv_qp_attr, c_int), c_int> {
    if ud::is_ud(x) {
        return ud::init_qp_attr(state);
    }
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    if state == 1 {
        a.port_num = 1;
        // cm.c `cm_init_qp_init_attr`: remote write, plus read and atomics when the
        // id offers responder resources (every rdma_cm consumer here does).
        a.qp_access_flags = 1 | 2 | 4 | 8; // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC
        return Ok((
            a,
            attr_mask(&[QP_STATE, QP_ACCESS_FLAGS, QP_PKEY_INDEX, QP_PORT]),
        ));
    }
    let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
    let (Some(p), Some(c)) = (&st.port, st.cm) else {
        return Err(libc::EINVAL);
    };
    let q =
        p.cm.lock()
            .unwrap_or_else(|e| e.into_inner())
            .qp_attr(c)
            .ok_or(libc::EINVAL)?;
    if state == 2 {
        a.path_mtu = c_int::from(q.path.mtu);
        a.dest_qp_num = q.dest_qpn;
        a.rq_psn = q.rq_psn;
        a.max_dest_rd_atomic = q.max_dest_rd_atomic;
        a.min_rnr_timer = q.min_rnr_timer;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid.raw = q.path.remote_gid;
        a.ah_attr.grh.sgid_index = p.gid_index(&q.path.local_gid).ok_or(libc::EADDRNOTAVAIL)?;
        a.ah_attr.grh.hop_limit = q.path.hop_limit;
        a.ah_attr.grh.traffic_class = q.path.traffic_class;
        a.ah_attr.grh.flow_label = q.path.flow_label;
        Ok((
            a,
            attr_mask(&[
                QP_STATE,
                QP_AV,
                QP_PATH_MTU,
                QP_DEST_QPN,
                QP_RQ_PSN,
                QP_MAX_DEST_RD_ATOMIC,
                QP_MIN_RNR_TIMER,
            ]),
        ))
    } else if state == 3 {
        a.sq_psn = q.sq_psn;
        a.timeout = q.timeout;
        a.retry_cnt = q.retry_cnt;
        a.rnr_retry = q.rnr_retry;
        a.max_rd_atomic = q.max_rd_atomic;
        Ok((
            a,
            attr_mask(&[
                QP_STATE,
                QP_TIMEOUT,
                QP_RETRY_CNT,
                QP_RNR_RETRY,
                QP_SQ_PSN,
                QP_MAX_QP_RD_ATOMIC,
            ]),
        ))
    } else {
        Err(libc::EINVAL)
    }
}

pub extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        if attr.is_null() || mask.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: the caller's attribute struct names the state it wants.
        let state = unsafe { (*attr).qp_state };
        match init_qp_attr(x, state) {
            Ok((a, m)) => {
                // SAFETY: both are the caller's out-parameters.
                unsafe {
                    *attr = a;
                    *mask = m;
                }
                0
            }
            Err(e) => err(e, -1),
        }
    })
}

fn move_qp(x: &XId, state: c_int) -> Result<(), c_int> {
    if x.c().qp.is_null() {
        return Ok(());
    }
    let (mut a, m) = init_qp_attr(x, state)?;
    match crate::qp::ibv_modify_qp(x.c().qp, &mut a, m) {
        0 => Ok(()),
        e => Err(e),
    }
}

fn qp_to_error(x: &XId) {
    if !x.c().qp.is_null() {
        let mut a = ibv_qp_attr {
            qp_state: 6, // IBV_QPS_ERR
            ..Default::default()
        };
        crate::qp::ibv_modify_qp(x.c().qp, &mut a, QP_STATE as c_int);
    }
}

pub extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        if init.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: the caller's attribute struct.
        let ia = unsafe { &mut *init };
        let pd = if pd.is_null() && !x.c().pd.is_null() {
            x.c().pd
        } else {
            pd
        };
        let pd = if pd.is_null() || ia.send_cq.is_null() || ia.recv_cq.is_null() {
            // librdmacm makes what is missing (cma.c `ucma_get_pd`, `ucma_create_cqs`).
            let made_cqs = ia.send_cq.is_null() || ia.recv_cq.is_null();
            match sync::complete_init(x, pd, ia) {
                Ok(p) => {
                    x.st.lock().unwrap_or_else(|e| e.into_inner()).own_cqs |= made_cqs;
                    p
                }
                Err(e) => {
                    sync::destroy_cqs(x);
                    return err(e, -1);
                }
            }
        } else {
            pd
        };
        let qp = crate::qp::ibv_create_qp(pd, init);
        if qp.is_null() {
            return -1;
        }
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        let idm = unsafe { &mut *x.id_ptr() };
        idm.qp = qp;
        // SAFETY: `init` is the caller's attribute struct, read after create filled it.
        unsafe {
            idm.send_cq = (*init).send_cq;
            idm.recv_cq = (*init).recv_cq;
        }
        // librdmacm `ucma_init_ud_qp`: a UD id's QP goes on to RTR and RTS at once.
        let moved = if ud::is_ud(x) {
            move_qp(x, 1)
                .and_then(|()| move_qp(x, 2))
                .and_then(|()| move_qp(x, 3))
        } else {
            move_qp(x, 1)
        };
        if let Err(e) = moved {
            crate::qp::ibv_destroy_qp(qp);
            // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
            unsafe { &mut *x.id_ptr() }.qp = core::ptr::null_mut();
            return err(e, -1);
        }
        0
    })
}

pub extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        if let Some(x) = unsafe { xid(id) } {
            if !x.c().qp.is_null() {
                crate::qp::ibv_destroy_qp(x.c().qp);
                // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one
                // is used.
                unsafe { &mut *x.id_ptr() }.qp = core::ptr::null_mut();
            }
            sync::destroy_cqs(x);
        }
    })
}

fn param_of(x: &XId, p: *const rdma_conn_param, psn: u32) -> ConnParam {
    let mut c = ConnParam {
        psn,
        qpn: if x.c().qp.is_null() {
            0
        } else {
            // SAFETY: a QP created by rdma_create_qp, live while the id holds it.
            unsafe { (*x.c().qp).qp_num }
        },
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    if !p.is_null() {
        // SAFETY: the caller's rdma_conn_param; private_data points to private_data_len bytes.
        let p = unsafe { &*p };
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.retry_count = p.retry_count;
        c.rnr_retry_count = p.rnr_retry_count;
        c.srq = p.srq != 0;
        if x.c().qp.is_null() {
            c.qpn = p.qp_num;
        }
        if !p.private_data.is_null() && p.private_data_len > 0 {
            // SAFETY: as above.
            c.private_data = unsafe {
                core::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len.into())
            }
            .to_vec();
        }
    }
    c
}

fn random_psn() -> u32 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.subsec_nanos());
    (n.wrapping_mul(2654435761) >> 4) & 0xff_ffff
}

pub extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let p = x.st.lock().unwrap_or_else(|e| e.into_inner()).port.clone();
        let Some(p) = p else {
            return err(libc::EINVAL, -1);
        };
        let (Some(src), Some(dst)) = (
            sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr),
            sockaddr(&x.c().route.addr.dst as *const _ as *const libc::sockaddr),
        ) else {
            return err(libc::EINVAL, -1);
        };
        if ud::is_ud(x) {
            return errno_ret(ud::connect(x, id, &p, param).and_then(|()| sync::complete(x)));
        }
        let psn = random_psn();
        let mut cp = param_of(x, param, psn);
        if cp.private_data.len() > 92 - CMA_HDR_LEN {
            return err(libc::EINVAL, -1);
        }
        // The IP header first (kernel cma.c `cma_format_hdr`), then the program's bytes.
        let mut pd = vec![0u8; CMA_HDR_LEN];
        CmaHdr { src, dst: dst.ip() }.emit(&mut pd);
        pd.extend_from_slice(&cp.private_data);
        cp.private_data = pd;
        let local_gid = x.c().route.addr.ib.sgid.raw;
        let remote_gid = x.c().route.addr.ib.dgid.raw;
        let mtu = p.dev.query_port().active_mtu as u8;
        let hop_limit = p.dev.route_hop_limit(&remote_gid);
        let path = Path {
            local_gid,
            remote_gid,
            mtu: xrnic::verbs::ibv::conv::mtu_to_ibv(p.dev.query_port().active_mtu) as u8,
            hop_limit,
            traffic_class: 0,
            flow_label: 0,
        };
        let _ = mtu;
        let sid = service_id(x.c().ps as u16, dst.port());
        let key = Arc::as_ptr(&p) as usize;
        // Register the id before the REQ can be answered.
        let c = {
            let mut cm = p.cm.lock().unwrap_or_else(|e| e.into_inner());
            let now = p.now();
            let c = cm.connect(now, sid, path, cp);
            reg(|r| r.conns.insert((key, c), id as usize));
            let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            st.cm = Some(c);
            c
        };
        let _ = c;
        p.with_cm(|_, _| ());
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let (p, c) = {
            let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm)
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        if ud::is_ud(x) {
            return errno_ret(ud::accept(x, &p, c, param));
        }
        let psn = random_psn();
        let cp = param_of(x, param, psn);
        {
            // The CM's view of our side, for the QP moves before the REP (librdmacm
            // rdma_accept: RTR then RTS, then the kernel sends the REP).
            let mut cm = p.cm.lock().unwrap_or_else(|e| e.into_inner());
            cm.set_local(c, cp.clone());
        }
        if let Err(e) = move_qp(x, 2).and_then(|()| move_qp(x, 3)) {
            return err(e, -1);
        }
        if !p.with_cm(|cm, now| cm.accept(now, c, cp)) {
            return err(libc::EINVAL, -1);
        }
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_reject(id: *mut rdma_cm_id, private: *const c_void, len: u8) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let (p, c) = {
            let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm.take())
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        let data = if private.is_null() {
            Vec::new()
        } else {
            // SAFETY: `private` points to `len` bytes (librdmacm contract).
            unsafe { core::slice::from_raw_parts(private as *const u8, len.into()) }.to_vec()
        };
        reg(|r| r.conns.remove(&(Arc::as_ptr(&p) as usize, c)));
        errno_ret(
            p.with_cm(|cm, _| cm.reject(c, rej_reason::CONSUMER_DEFINED, &data))
                .then_some(())
                .ok_or(libc::EINVAL),
        )
    })
}

pub extern "C" fn rdma_reject_ece(id: *mut rdma_cm_id, private: *const c_void, len: u8) -> c_int {
    rdma_reject(id, private, len)
}

pub extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let (p, c) = {
            let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm)
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        errno_ret(
            p.with_cm(|cm, _| cm.rtu(c))
                .then_some(())
                .ok_or(libc::EINVAL),
        )
    })
}

pub extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        // librdmacm: the QP to ERROR first (its WRs flush), then DREQ / DREP.
        qp_to_error(x);
        let (p, c) = {
            let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm)
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        let ok = p.with_cm(|cm, now| cm.disconnect(now, c));
        p.drain_sends(Duration::from_millis(200));
        errno_ret(ok.then_some(()).ok_or(libc::EINVAL))
    })
}

/// The id for CM connection `c` of port `p`, if it is still live.
///
/// # Safety
///
/// As [`xid`]'s: the program does not call `rdma_destroy_id` on the id while the
/// reference is used.
unsafe fn conn_id<'a>(p: &Port, c: CmId) -> Option<&'a XId> {
    let key = p as *const Port as usize;
    let ptr = reg(|r| r.conns.get(&(key, c)).copied())?;
    // SAFETY: this function's contract is xid's.
    unsafe { xid(ptr as *mut rdma_cm_id) }
}

/// What a port calls back into the ids: [`dispatch`] and the ids' publication.
static UPCALLS: Upcalls = Upcalls {
    dispatch,
    publish: publish_ids,
};

/// The CM port of `ifname` (rdmacm_port.rs), opened on first use.
fn cm_port(ifname: &str) -> Result<std::sync::Arc<Port>, i32> {
    crate::rdmacm_port::port(ifname, &UPCALLS)
}

/// A CM event of port `p`, turned into the `RDMA_CM_EVENT_*` its id's program sees
/// (called by the port with no lock held).
pub fn dispatch(p: &Port, e: CmEvent) {
    match e {
        CmEvent::ConnectRequest {
            listener,
            id: c,
            from: _,
            req,
        } => on_connect_request(p, listener, c, &req),
        CmEvent::ConnectResponse { id: c, rep } => on_connect_response(p, c, &rep),
        CmEvent::Established { id: c } => on_established(p, c),
        CmEvent::Rejected {
            id: c,
            reason,
            private_data,
        } => on_rejected(p, c, reason, &private_data),
        CmEvent::Unreachable { id: c } => notify(p, c, ev::UNREACHABLE, -libc::ETIMEDOUT),
        CmEvent::Disconnected { id: c } => notify(p, c, ev::DISCONNECTED, 0),
        // cma.c cma_ib_handler: IB_CM_DREQ_ERROR is DISCONNECTED with -ETIMEDOUT.
        CmEvent::DreqError { id: c } => notify(p, c, ev::DISCONNECTED, -libc::ETIMEDOUT),
        CmEvent::TimewaitExit { id: c } => on_timewait_exit(p, c),
        CmEvent::SidrRequest {
            listener,
            id: c,
            from,
            req,
        } => ud::on_request(p, listener, c, from, &req),
        CmEvent::SidrReply { id: c, rep } => ud::on_reply(p, c, &rep),
    }
}

/// A REQ for listener `listener`: a new child id on the listener's channel
/// (RDMA_CM_EVENT_CONNECT_REQUEST), or a REJ when the listener is gone or the REQ carries
/// no CMA header.
fn on_connect_request(p: &Port, listener: u64, c: CmId, req: &xrnic::wire::mad::Req) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(l) = (unsafe { xid(listener as *mut rdma_cm_id) }) else {
        p.with_cm(|cm, _| cm.reject(c, rej_reason::INVALID_SERVICE_ID, &[]));
        return;
    };
    let Some(h) = CmaHdr::parse(&req.private_data) else {
        p.with_cm(|cm, _| cm.reject(c, rej_reason::CONSUMER_DEFINED, &[]));
        return;
    };
    let lport = sockaddr(&l.c().route.addr.src as *const _ as *const libc::sockaddr)
        .map_or(0, |a| a.port());
    let child = new_child(l);
    // SAFETY: just made, registered, not yet visible to the program.
    let cx = unsafe { &*child };
    // SAFETY: no other reference to the rdma_cm_id of `cx` is live while this one is used.
    let ci = unsafe { &mut *cx.id_ptr() };
    ci.verbs = p.ctx;
    ci.port_num = 1;
    store(&mut ci.route.addr.src, SocketAddr::new(h.dst, lport));
    store(&mut ci.route.addr.dst, h.src);
    ci.route.addr.ib.sgid.raw = gid_of(h.dst);
    ci.route.addr.ib.dgid.raw = gid_of(h.src.ip());
    ci.route.addr.ib.pkey = 0xffff;
    {
        let mut st = cx.st.lock().unwrap_or_else(|e| e.into_inner());
        st.port = ports_arc(p);
        st.cm = Some(c);
    }
    reg(|r| {
        r.conns
            .insert((p as *const Port as usize, c), child as usize)
    });
    let mut ev = conn_event(
        cx,
        ev::CONNECT_REQUEST,
        Some(ConnNumbers {
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: u8::from(req.srq),
            qp_num: req.local_qpn,
        }),
        &req.private_data[CMA_HDR_LEN..],
    );
    ev.ev.listen_id = listener as *mut rdma_cm_id;
    push(l.c().channel, ev);
}

/// The REP of an active id: its QP to RTR and RTS and the RTU (librdmacm's
/// `ucma_process_conn_resp`), or, with no QP on the id, RDMA_CM_EVENT_CONNECT_RESPONSE.
fn on_connect_response(p: &Port, c: CmId, rep: &xrnic::wire::mad::Rep) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    let remote = ConnNumbers {
        responder_resources: rep.responder_resources,
        initiator_depth: rep.initiator_depth,
        retry_count: 0,
        rnr_retry_count: rep.rnr_retry_count,
        srq: u8::from(rep.srq),
        qp_num: rep.local_qpn,
    };
    {
        let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        st.rep_private = rep.private_data.to_vec();
        st.remote = Some(remote);
    }
    if x.c().qp.is_null() {
        // No QP on the id: the program moves its own and calls rdma_establish.
        push(
            x.c().channel,
            conn_event(x, ev::CONNECT_RESPONSE, Some(remote), &rep.private_data),
        );
        return;
    }
    match move_qp(x, 2).and_then(|()| move_qp(x, 3)) {
        Ok(()) => {
            p.with_cm(|cm, _| cm.rtu(c));
        }
        Err(e) => {
            // librdmacm: a QP that cannot move rejects the REP.
            p.with_cm(|cm, _| cm.reject(c, rej_reason::CONSUMER_DEFINED, &[]));
            push(x.c().channel, event(x, ev::CONNECT_ERROR, -e));
        }
    }
}

/// RDMA_CM_EVENT_ESTABLISHED, with the numbers and private data of the REP.
fn on_established(p: &Port, c: CmId) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    let (remote, private) = {
        let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        (st.remote, st.rep_private.clone())
    };
    push(
        x.c().channel,
        conn_event(x, ev::ESTABLISHED, remote, &private),
    );
}

/// A REJ (RDMA_CM_EVENT_REJECTED, its reason as the status), or a refused SIDR_REQ.
fn on_rejected(p: &Port, c: CmId, reason: u16, private_data: &[u8]) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    if ud::is_ud(x) {
        // A SIDR_REP with a status other than OK.
        ud::on_refused(p, c, reason);
        return;
    }
    let mut e = conn_event(x, ev::REJECTED, Some(Default::default()), private_data);
    e.ev.status = c_int::from(reason);
    push(x.c().channel, e);
}

/// An event with no connection data (`kind`, `status`) on the id of connection `c`.
fn notify(p: &Port, c: CmId, kind: c_int, status: c_int) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    push(x.c().channel, event(x, kind, status));
}

/// The connection's time-wait is over: the id leaves it (RDMA_CM_EVENT_TIMEWAIT_EXIT).
fn on_timewait_exit(p: &Port, c: CmId) {
    // SAFETY: as in `notify`.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    reg(|r| r.conns.remove(&(p as *const Port as usize, c)));
    x.st.lock().unwrap_or_else(|e| e.into_inner()).cm = None;
    push(x.c().channel, event(x, ev::TIMEWAIT_EXIT, 0));
}

fn ports_arc(p: &Port) -> Option<Arc<Port>> {
    crate::rdmacm_port::ports()
        .into_iter()
        .find(|q| core::ptr::eq(Arc::as_ptr(q), p))
}

pub extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        unsafe { xid(id) }
            .and_then(|x| sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr))
            .map_or(0, |a| a.port().to_be())
    })
}

pub extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        unsafe { xid(id) }
            .and_then(|x| sockaddr(&x.c().route.addr.dst as *const _ as *const libc::sockaddr))
            .map_or(0, |a| a.port().to_be())
    })
}

pub extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        // SAFETY: the program does not destroy the event channel `ch` while this call uses it.
        if unsafe { xchan(ch) }.is_none() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        unsafe { &mut *x.id_ptr() }.channel = ch;
        0
    })
}

pub use sync::{rdma_create_ep, rdma_destroy_ep, rdma_get_request};

/// A passive id for a request to listener `l`: on `l`'s channel, or, for a sync
/// listener, sync on a channel of its own (librdmacm `ucma_process_conn_req`).
fn new_child(l: &XId) -> *mut XId {
    if !sync::is_sync(l) {
        return new_id(l.c().channel, l.c().context, l.c().ps);
    }
    let ch = sync::own_channel();
    let child = new_id(ch, l.c().context, l.c().ps);
    // SAFETY: just made and registered.
    unsafe { &*child }
        .st
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .sync = true;
    child
}

pub extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    _level: c_int,
    _optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    // TOS, REUSEADDR, AFONLY, ACK_TIMEOUT: accepted and not applied (a log-free no-op
    // would be a silent fallback, so say it once).
    // SAFETY: the program does not destroy the id `id` while this call uses it.
    if unsafe { xid(id) }.is_none() {
        return err(libc::EINVAL, -1);
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("xrnic: rdma_set_option is accepted and ignored"));
    0
}

pub extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    // SAFETY: the program does not destroy the id `id` while this call uses it.
    if unsafe { xid(id) }.is_none() {
        return err(libc::EINVAL, -1);
    }
    0
}

pub extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(core::ptr::null_mut(), || {
        let ctxs: Vec<*mut ibv_context> = crate::device::netdevs()
            .iter()
            .filter_map(|n| cm_port(n).ok())
            .map(|p| p.ctx)
            .collect();
        if !num.is_null() {
            // SAFETY: caller's out-parameter.
            unsafe { *num = ctxs.len() as c_int };
        }
        let mut v = ctxs;
        v.push(core::ptr::null_mut());
        Box::into_raw(v.into_boxed_slice()) as *mut *mut ibv_context
    })
}

pub extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard((), || {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: a NULL-terminated list from rdma_get_devices.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: the boxed slice rdma_get_devices leaked, n + 1 entries.
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(list, n + 1)) });
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
        rdma_get_remote_ece,
        rdma_set_local_ece,
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

mod addrinfo;
mod mcast;
mod res;
pub use addrinfo::{rdma_addrinfo, rdma_freeaddrinfo, rdma_getaddrinfo};
pub use mcast::{rdma_join_multicast, rdma_join_multicast_ex, rdma_leave_multicast};
pub(crate) use res::publish as publish_ids;
mod sync;
#[cfg(test)]
mod tests;
mod ud;

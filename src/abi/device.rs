//! Devices: the list (`xrnic_IF` for each interface of `XRNIC_NETDEV`, or every up
//! Ethernet interface), open/close (an in-process xrnic device: driver thread and AF_XDP
//! socket, [`xrnic::verbs::Device::open`]), and the queries (device, port, GID, P_Key,
//! the sysfs files `ibv_devinfo` reads).
//!
//! Device structures are interned: one per interface name for the life of the process,
//! so an `ibv_device *` stays valid after `ibv_free_device_list` (rdma-core keeps
//! devices alive while a context uses them; a program may also keep the pointer).

use core::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Mutex;

use xrnic::verbs::{self as xv, PortState};

use xrnic::verbs::ibv::conv::mtu_to_ibv;

use crate::context::{Notify, XContext, XDevice, context, ctx_gone, gone};
use crate::types::*;
use crate::{guard, ret, set_errno};

/// Every device ever listed, in listing order (never freed, see the module comment).
static DEVICES: Mutex<Vec<&'static XDevice>> = Mutex::new(Vec::new());

/// The `ibdev_path` prefix of xrnic devices: not a real sysfs directory;
/// [`ibv_read_sysfs_file`] answers the files under it.
const IBDEV_DIR: &str = "/sys/class/infiniband/";

fn copy_cstr<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let n = s.len().min(N - 1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

fn intern(ifname: &str) -> &'static XDevice {
    let mut list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = list.iter().find(|d| d.ifname == ifname) {
        return d;
    }
    let index = list.len() as c_int;
    let mut ibv = ibv_device {
        _ops: _ibv_device_ops {
            _dummy1: None,
            _dummy2: None,
        },
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        name: [0; IBV_SYSFS_NAME_MAX],
        dev_name: [0; IBV_SYSFS_NAME_MAX],
        dev_path: [0; IBV_SYSFS_PATH_MAX],
        ibdev_path: [0; IBV_SYSFS_PATH_MAX],
    };
    let name = format!("xrnic_{ifname}");
    copy_cstr(&mut ibv.name, &name);
    copy_cstr(&mut ibv.dev_name, &format!("uverbs{index}"));
    copy_cstr(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{index}"),
    );
    copy_cstr(&mut ibv.ibdev_path, &format!("{IBDEV_DIR}{name}"));
    let d: &'static XDevice = Box::leak(Box::new(XDevice {
        ibv,
        ifname: ifname.to_string(),
        index,
    }));
    list.push(d);
    d
}

/// The interfaces to list, in order (their index is the device's `uverbsN`):
/// [`xv::netdev::listed_netdevs`], which `xrnic exec`'s sysfs view numbers alike.
pub fn netdevs() -> Vec<String> {
    xv::netdev::listed_netdevs()
}

/// The interned device behind `dev`, if it is one of ours.
fn xdevice(dev: *const ibv_device) -> Option<&'static XDevice> {
    let list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    list.iter().find(|d| core::ptr::eq(&d.ibv, dev)).copied()
}

pub extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(core::ptr::null_mut(), || {
        let mut v: Vec<*mut ibv_device> = netdevs()
            .iter()
            .map(|n| &intern(n).ibv as *const ibv_device as *mut ibv_device)
            .collect();
        let n = v.len() as c_int;
        v.push(core::ptr::null_mut());
        if !num.is_null() {
            // SAFETY: a non-NULL `num` points to the caller's int (verbs.h contract).
            unsafe { *num = n };
        }
        Box::into_raw(v.into_boxed_slice()) as *mut *mut ibv_device
    })
}

pub extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        if list.is_null() {
            return;
        }
        let mut len = 0;
        // SAFETY: `list` came from ibv_get_device_list: a boxed slice ending in NULL.
        while !unsafe { *list.add(len) }.is_null() {
            len += 1;
        }
        // SAFETY: as above; the slice is len + 1 long and freed once (verbs.h contract).
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(list, len + 1)) });
    })
}

pub extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    guard(core::ptr::null(), || match xdevice(dev) {
        Some(d) => d.ibv.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            core::ptr::null()
        }
    })
}

pub extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    guard(-1, || xdevice(dev).map_or(-1, |d| d.index))
}

/// The node GUID (network order) from the interface's MAC, as rxe derives it.
pub extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    guard(0, || {
        xdevice(dev)
            .and_then(|d| xv::query_netdev(&d.ifname).ok())
            .map_or(0, |i| i.attr.node_guid.to_be())
    })
}

/// The device's options from the environment: `XRNIC_FINAL_STAT_DIR=DIR` writes the
/// device's last stat snapshot (its counters and every QP's as it closes,
/// `crate::driver::Snapshot`, what `xrnic stat` prints) to `DIR/<IF>.<pid>.json` when the
/// program closes it, or exits with it open ([`write_final_stats_at_exit`]); the interop
/// harness keeps them beside each run's output.
fn options(ifname: &str) -> xv::DeviceOptions {
    let mut o = xv::DeviceOptions::default();
    if let Some(dir) = std::env::var_os("XRNIC_FINAL_STAT_DIR") {
        let file = format!("{ifname}.{}.json", std::process::id());
        o.final_stat = Some(std::path::Path::new(&dir).join(file));
    }
    o
}

/// Open the device with every signal blocked in this thread, so the driver thread
/// (which inherits the mask) never takes a signal meant for the program (perftest's
/// SIGALRM, a terminal's SIGINT); the caller's mask is restored after.
fn open_blocking_signals(ifname: &str) -> xv::Result<xv::Device> {
    // SAFETY: sigset_t is plain data that sigfillset initialises; pthread_sigmask reads
    // `all` and writes `old`, both live locals.
    let mut all: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above (all-zero bytes are a valid sigset_t).
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let opts = options(ifname);
    let r = xv::Device::open_with(ifname, &opts);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
    if r.is_ok() && opts.final_stat.is_some() {
        AT_EXIT.call_once(|| {
            // SAFETY: registers a function of this library that takes no argument and
            // returns nothing. glibc's atexit ties it to this object (__cxa_atexit with
            // its __dso_handle), so it runs at exit or when the library is unloaded,
            // whichever comes first, never after.
            if unsafe { libc::atexit(write_final_stats_at_exit) } != 0 {
                eprintln!("xrnic: atexit failed: a device left open at exit writes no final stats");
            }
        });
    }
    r
}

/// Registers [`write_final_stats_at_exit`] once, when the first device that writes a
/// final stat snapshot opens.
static AT_EXIT: std::sync::Once = std::sync::Once::new();

/// How long [`ibv_close_device`] waits for each lock of the device (another thread
/// holds it) to write the final stat snapshot.
const CLOSE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long the exit handler waits for each lock another thread holds (the open
/// contexts, then each device's port and engine) before it gives up on it.
const EXIT_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// The atexit(3) handler: a program that exits (exit(), a return from main) with its
/// devices open never closes them (perftest's clients do so), so each device still open
/// writes its last stat snapshot now, as [`ibv_close_device`] would have
/// (`XRNIC_FINAL_STAT_DIR`, [`options`]): the same file, `running: false`, the counters
/// at this moment. A device closed before wrote its own ([`ibv_close_device`]) and is no
/// longer listed.
/// Other threads still run (the driver threads, the program's) and may hold the locks:
/// every wait is bounded ([`EXIT_PATIENCE`]), then the handler gives up quietly. Not
/// run for `_exit()` or a fatal signal.
extern "C" fn write_final_stats_at_exit() {
    guard((), || {
        // The list held while writing: a close on another thread meanwhile waits, and
        // its driver then finds the snapshot written (the driver writes it once).
        crate::context::each_open(EXIT_PATIENCE, |x| {
            x.dev.write_final_stat_now(EXIT_PATIENCE);
        });
    })
}

/// `ibv_open_device`: a new context. The first context of an interface opens its device
/// (driver thread, AF_XDP socket, XDP program); a later one shares it (crate::opened),
/// with its own objects, completion channels and async events.
pub extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard(core::ptr::null_mut(), || {
        let Some(xdev) = xdevice(dev) else {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        let r = crate::opened::add_context(
            &xdev.ifname,
            || open_blocking_signals(&xdev.ifname),
            |d| new_context(xdev, d),
        );
        match r {
            Ok(Some(ptr)) => {
                crate::context::register(ptr as *mut ibv_context);
                ptr as *mut ibv_context
            }
            // errno set by new_context.
            Ok(None) => core::ptr::null_mut(),
            Err(e) => {
                eprintln!("xrnic: cannot open {}: {e}", xdev.ifname);
                set_errno(e.errno());
                core::ptr::null_mut()
            }
        }
    })
}

/// A context on device `d`: its `verbs_context`, async fd and completion state; the
/// context's address and its [`Notify`], or `None` with errno set.
fn new_context(xdev: &'static XDevice, d: xv::Device) -> Option<(usize, std::sync::Arc<Notify>)> {
    // SAFETY: eventfd has no memory arguments.
    let async_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if async_fd < 0 {
        return None;
    }
    // SAFETY: verbs_context is C data for which all-zero is valid: NULL pointers,
    // absent (None) ops, a PTHREAD_MUTEX_INITIALIZER mutex (glibc: all zero).
    let vctx: verbs_context = unsafe { core::mem::zeroed() };
    let notify = std::sync::Arc::new(Notify::default());
    let mut x = Box::new(XContext {
        vctx,
        dev: d,
        xdev,
        notify: notify.clone(),
        ops: &crate::ops::OPS,
    });
    let v = &mut x.vctx;
    v.query_port = Some(query_port_ex);
    v.query_device_ex = Some(query_device_ex);
    crate::ops::install_ex(v);
    v.sz = core::mem::size_of::<verbs_context>();
    let c = &mut v.context;
    c.device = &xdev.ibv as *const ibv_device as *mut ibv_device;
    // A descriptor where the kernel's uverbs fd would be: programs dup it or hand it to
    // ibv_import_device (EOPNOTSUPP here), and a -1 makes their dup fail EBADF. It is
    // /dev/null: nothing is ever sent through it.
    // SAFETY: a NUL-terminated path, no other memory arguments.
    c.cmd_fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    c.async_fd = async_fd;
    c.num_comp_vectors = 1;
    c.abi_compat = usize::MAX as *mut c_void;
    crate::ops::install(&mut c.ops);
    let x = Box::leak(x);
    let ptr = &mut x.vctx.context as *mut ibv_context;
    x.notify.async_q.attach(ptr, async_fd);
    Some((ptr as usize, notify))
}

/// `ibv_close_device`: the context's objects are destroyed (crate::opened
/// `destroy_objects`), the other contexts of the device go on; the last context's close
/// lets the device go.
pub extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        // A context this fork child inherited: the child lets go of its copy and
        // nothing else; the parent's context, objects and device are untouched (rdma-core:
        // the child's close drops its own descriptor of the shared uverbs file).
        if crate::context::forget_inherited(ctx) {
            return 0;
        }
        // librdmacm's own context (rdmacm_port.rs) stays open: the CM's QP1 and the ids
        // use it, and the program does not own it (with rdma-core the program never
        // closes `rdma_cm_id.verbs` either; librdmacm does, when it unloads).
        if crate::context::is_kept(ctx) {
            // SAFETY: the program does not close `ctx` while this call uses it.
            return if unsafe { context(ctx) }.is_some() {
                0
            } else {
                ret(Err(libc::EINVAL))
            };
        }
        // SAFETY: the program does not use `ctx` in another call while it closes it.
        let Some(x) = (unsafe { crate::context::unregister(ctx) }) else {
            return ret(Err(libc::EINVAL));
        };
        // Off the device's list first: the hook writes to the async fd and the
        // channels only of the contexts listed (under the list's lock).
        let last = crate::opened::remove_context(ctx as usize);
        // SAFETY: the async fd is ours and closed once.
        unsafe { libc::close(x.vctx.context.async_fd) };
        if x.vctx.context.cmd_fd >= 0 {
            // SAFETY: the command fd is ours (new_context) and closed once.
            unsafe { libc::close(x.vctx.context.cmd_fd) };
        }
        if last {
            // The final stat snapshot (XRNIC_FINAL_STAT_DIR), written now, with the QPs
            // as the program left them: the driver would write it only when it stops,
            // and a program may leave objects (perftest 4.5's ib_send_bw client leaves
            // its receive CQ, docs/verbs-abi.md). Once: the driver then writes none.
            x.dev.write_final_stat_now(CLOSE_PATIENCE);
        }
        // What the program left in this context goes, as the kernel's uverbs destroys
        // a closed context's objects; its channels wake up and fail EIO once drained.
        crate::opened::destroy_objects(ctx, x.ops);
        x.notify.wake_channels_if_dead(true);
        let dev = x.dev.clone();
        drop(x);
        // The last context gone, anything that still holds the device (not an object
        // of a context: those were destroyed) would keep its driver thread, AF_XDP
        // socket and XDP program past the close, and the next open of the interface
        // would find it taken: the device is made fatal and its port closed
        // (xv::Device `close_leaving_objects`).
        if last && dev.other_handles() > 0 {
            dev.close_leaving_objects();
        }
        0
    })
}

const IBV_NODE_CA: c_int = 1;
/// `max_ah` (rxe_param.h `RXE_MAX_AH`); AHs are not counted against it.
const MAX_AH: c_int = 0x3ffe;
const IBV_TRANSPORT_IB: c_int = 0;
const IBV_DEVICE_SYS_IMAGE_GUID: u32 = 1 << 11;
const IBV_DEVICE_RC_RNR_NAK_GEN: u32 = 1 << 12;
const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_GID_TYPE_ROCE_V2` of `enum ibv_gid_type` (the `ibv_gid_entry` one).
const GID_ENTRY_ROCE_V2: u32 = 2;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2` (the enum behind `ibv_query_gid_type`).
const GID_SYSFS_ROCE_V2: c_int = 1;

fn device_attr(d: &xv::Device) -> ibv_device_attr {
    let a = d.query_device();
    let mut o = ibv_device_attr::default();
    let mut fw = [0 as c_char; 64];
    copy_cstr(&mut fw, &a.fw_ver);
    o.fw_ver = fw;
    o.node_guid = a.node_guid.to_be();
    o.sys_image_guid = a.sys_image_guid.to_be();
    o.max_mr_size = a.max_mr_size;
    o.page_size_cap = a.page_size_cap;
    o.vendor_id = a.vendor_id;
    o.vendor_part_id = a.vendor_part_id;
    o.hw_ver = a.hw_ver;
    let int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    o.max_qp = int(a.max_qp);
    o.max_qp_wr = int(a.max_qp_wr);
    o.device_cap_flags = IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN;
    o.max_sge = int(a.max_sge);
    o.max_sge_rd = int(a.max_sge);
    o.max_cq = int(a.max_cq);
    o.max_cqe = int(a.max_cqe);
    o.max_mr = int(a.max_mr);
    o.max_pd = int(a.max_pd);
    o.max_qp_rd_atom = int(a.max_qp_rd_atom);
    o.max_res_rd_atom = int(a.max_res_rd_atom);
    o.max_qp_init_rd_atom = int(a.max_qp_init_rd_atom);
    o.atomic_cap = int(a.atomic_cap);
    o.max_pkeys = a.max_pkeys;
    // UD address handles and SRQs (rxe's limits: RXE_MAX_AH, RXE_MAX_SRQ_SGE; an SRQ
    // holds as many WQEs as a QP's receive queue).
    o.max_ah = MAX_AH;
    o.max_srq = o.max_qp;
    o.max_srq_wr = o.max_qp_wr;
    // The engine's limit (proto srq `MAX_SRQ_SGE`), and through the device service what
    // one ring slot carries (the device's max_sge there, docs/rnic.md).
    o.max_srq_sge = int(a.max_sge).min(27);
    // Multicast: rxe's limits, the engine's (src/proto/mcast.rs).
    {
        use xrnic::proto::mcast as m;
        o.max_mcast_grp = m::MAX_MCAST_GRP as c_int;
        o.max_mcast_qp_attach = m::MAX_MCAST_QP_ATTACH as c_int;
        o.max_total_mcast_qp_attach = m::MAX_TOTAL_MCAST_QP_ATTACH as c_int;
    }
    o.local_ca_ack_delay = a.local_ca_ack_delay;
    o.phys_port_cnt = a.phys_port_cnt;
    o
}

/// Copy the first `len` bytes of `src` to `dst`.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes, `len <= size_of::<T>()`.
unsafe fn copy_prefix<T>(src: &T, dst: *mut u8, len: usize) {
    // SAFETY: `src` is a whole T (len bytes readable), `dst` valid per the contract;
    // distinct objects (src is a local of the caller).
    unsafe { core::ptr::copy_nonoverlapping(src as *const T as *const u8, dst, len) };
}

/// `verbs_context.query_device_ex`; `ibv_query_device_ex` (verbs.h inline) calls it.
unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let Some(x) = (unsafe { context(ctx) }) else {
            return ret(Err(libc::EINVAL));
        };
        // SAFETY: a non-NULL input points to the caller's struct (verbs.h contract).
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return ret(Err(libc::EINVAL));
        }
        if attr.is_null() || attr_size < core::mem::size_of::<ibv_device_attr>() {
            return ret(Err(libc::EINVAL));
        }
        if gone(x) {
            return ret(Err(libc::EIO));
        }
        // The completion clock (crate::cq `ex`): nanoseconds, so 1 000 000 kHz, over
        // 64 bits.
        let ex = ibv_device_attr_ex {
            orig_attr: device_attr(&x.dev),
            completion_timestamp_mask: u64::MAX,
            hca_core_clock: 1_000_000,
            phys_port_cnt_ex: 1,
            ..Default::default()
        };
        let len = attr_size.min(core::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller gave `attr_size` writable bytes at `attr`.
        unsafe { copy_prefix(&ex, attr as *mut u8, len) };
        0
    })
}

pub extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let Some(x) = (unsafe { context(ctx) }) else {
            return ret(Err(libc::EINVAL));
        };
        if attr.is_null() {
            return ret(Err(libc::EINVAL));
        }
        if gone(x) {
            return ret(Err(libc::EIO));
        }
        // SAFETY: `attr` points to the caller's ibv_device_attr.
        unsafe { attr.write(device_attr(&x.dev)) };
        0
    })
}

/// Width and speed codes (`active_width`, `active_speed`) for an Ethernet speed in Mb/s:
/// one lane of the IB speed nearest below, as the kernel's `ib_get_eth_speed` reports
/// for a RoCE port.
fn width_speed(mbps: u64) -> (u8, u8) {
    // `xrnic exec`'s sysfs view (src/cli/devview.rs) shows the same rate.
    xv::netdev::ib_width_speed(mbps)
}

fn port_attr(x: &XContext) -> ibv_port_attr {
    let p = x.dev.query_port();
    let active = p.state == PortState::Active;
    let mbps = xv::netdev::link_speed_mbps(&x.xdev.ifname);
    let (active_width, active_speed) = width_speed(mbps);
    ibv_port_attr {
        state: p.state as c_int,
        max_mtu: mtu_to_ibv(p.max_mtu),
        active_mtu: mtu_to_ibv(p.active_mtu),
        gid_tbl_len: p.gid_tbl_len as c_int,
        max_msg_sz: p.max_msg_sz,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        max_vl_num: 1,
        active_width,
        active_speed,
        // LinkUp (5) or Disabled (3), IBTA vol. 1 §14.2.5.6 PortPhysicalState.
        phys_state: if active { 5 } else { 3 },
        link_layer: IBV_LINK_LAYER_ETHERNET,
        ..Default::default()
    }
}

/// `verbs_context.query_port`: `ibv_query_port` (verbs.h inline) calls it with the size
/// of the program's `ibv_port_attr`.
unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let Some(x) = (unsafe { context(ctx) }) else {
            return ret(Err(libc::EINVAL));
        };
        if port != 1 || attr.is_null() {
            return ret(Err(libc::EINVAL));
        }
        if gone(x) {
            return ret(Err(libc::EIO));
        }
        let a = port_attr(x);
        let len = len.min(core::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller gave `len` writable bytes at `attr`.
        unsafe { copy_prefix(&a, attr as *mut u8, len) };
        0
    })
}

/// The exported `ibv_query_port` (IBVERBS_1.1): fills the compat structure, without
/// `port_cap_flags2`.
pub extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the compat structure is COMPAT_PORT_ATTR_LEN bytes at `attr`.
    unsafe { query_port_ex(ctx, port, attr, COMPAT_PORT_ATTR_LEN) }
}

/// The GID entry at `index`, or the errno: EINVAL for a bad port or index.
fn gid_entry(x: &XContext, port: u8, index: u32) -> Result<ibv_gid_entry, c_int> {
    if port != 1 {
        return Err(libc::EINVAL);
    }
    // rdma-core asks the kernel (UVERBS_METHOD_QUERY_GID_ENTRY), which answers EIO for
    // a disassociated device (`gone`): ibv_query_gid(_ex), _table, _type all fail.
    if gone(x) {
        return Err(libc::EIO);
    }
    let gid = x.dev.query_gid(index as usize).ok_or(libc::EINVAL)?;
    let ifindex = xv::netdev::probe(&x.xdev.ifname).map_or(0, |n| n.ifindex);
    Ok(ibv_gid_entry {
        gid: ibv_gid { raw: gid },
        gid_index: index,
        port_num: 1,
        gid_type: GID_ENTRY_ROCE_V2,
        ndev_ifindex: ifindex,
    })
}

/// `ibv_query_gid`: 0, or -1 with errno (rdma-core libibverbs/verbs.c).
pub extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let r = unsafe { context(ctx) }
            .ok_or(libc::EINVAL)
            .and_then(|x| gid_entry(x, port, u32::try_from(index).map_err(|_| libc::EINVAL)?));
        match r {
            Ok(e) if !gid.is_null() => {
                // SAFETY: `gid` points to the caller's 16-byte union ibv_gid.
                unsafe { gid.write_unaligned(e.gid) };
                0
            }
            Ok(_) => {
                set_errno(libc::EINVAL);
                -1
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `_ibv_query_gid_ex` (what verbs.h's `ibv_query_gid_ex` calls): 0 or the errno.
pub extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        if flags != 0 || entry.is_null() || entry_size < core::mem::size_of::<ibv_gid_entry>() {
            return ret(Err(libc::EINVAL));
        }
        let port = u8::try_from(port).unwrap_or(0);
        // SAFETY: the program does not close `ctx` while this call uses it.
        let r = unsafe { context(ctx) }
            .ok_or(libc::EINVAL)
            .and_then(|x| gid_entry(x, port, index));
        match r {
            Ok(e) => {
                // SAFETY: the caller gave `entry_size` >= size_of bytes at `entry`.
                unsafe { entry.write_unaligned(e) };
                0
            }
            Err(e) => ret(Err(e)),
        }
    })
}

/// `_ibv_query_gid_table`: how many entries were written, or -errno.
pub extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let Some(x) = (unsafe { context(ctx) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entry_size < core::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        if gone(x) {
            return -(libc::EIO as isize);
        }
        let n = x.dev.gid_table().len();
        if n > max || (n > 0 && entries.is_null()) {
            return -(libc::EINVAL as isize);
        }
        for i in 0..n {
            let Ok(e) = gid_entry(x, 1, i as u32) else {
                return -(libc::EINVAL as isize);
            };
            // SAFETY: entry i lies within the caller's array of `max` entries of
            // `entry_size` bytes (i < n <= max).
            unsafe {
                (entries as *mut u8)
                    .add(i * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(e)
            };
        }
        n as isize
    })
}

/// `ibv_query_gid_type` (PRIVATE_34, `ibv_devinfo -v` calls it): 0 or -1.
pub extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        match unsafe { context(ctx) }
            .ok_or(libc::EINVAL)
            .and_then(|x| gid_entry(x, port, index))
        {
            Ok(_) if !ty.is_null() => {
                // SAFETY: `ty` points to the caller's enum ibv_gid_type_sysfs.
                unsafe { ty.write(GID_SYSFS_ROCE_V2) };
                0
            }
            Ok(_) => {
                set_errno(libc::EINVAL);
                -1
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// One P_Key, the default 0xFFFF (IBTA vol. 1 §10.9.1.2; RoCE uses only it).
pub extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        if unsafe { context(ctx) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // rdma-core reads the P_Key from the device's sysfs directory, which the
        // unregistered device no longer has: -1 (errno EIO here, as for every verb).
        if ctx_gone(ctx) {
            set_errno(libc::EIO);
            return -1;
        }
        // SAFETY: `pkey` points to the caller's __be16.
        unsafe { pkey.write(0xffff) };
        0
    })
}

/// The index of a P_Key (network order): 0 for the default one, else -1 (ENOENT).
pub extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        if unsafe { context(ctx) }.is_none() || port != 1 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // rdma-core's loops over ibv_query_pkey: its -1 once the device is gone.
        if ctx_gone(ctx) {
            set_errno(libc::EIO);
            return -1;
        }
        if pkey != 0xffff {
            set_errno(libc::ENOENT);
            return -1;
        }
        0
    })
}

pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// The content of an xrnic device's sysfs file (the `ibdev_path` of a listed device is
/// not a real directory); `None` for a file it has not.
fn virtual_file(xdev: &XDevice, file: &str) -> Option<String> {
    let guid = xv::query_netdev(&xdev.ifname).ok().map(|i| {
        let g = i.attr.node_guid;
        format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    });
    Some(match file {
        "board_id" => "xrnic".to_string(),
        "hca_type" => "xrnic".to_string(),
        "hw_rev" => "0".to_string(),
        "fw_ver" => env!("CARGO_PKG_VERSION").to_string(),
        "node_desc" => format!("xrnic {}", xdev.ifname),
        "node_type" => "1: CA".to_string(),
        "node_guid" | "sys_image_guid" => guid?,
        _ => return None,
    })
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: the bytes read (a trailing newline
/// replaced by NUL), or -1. Files under an xrnic device's `ibdev_path` are answered by
/// [`virtual_file`]; any other path is read from the file system like rdma-core does.
pub extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: both are NUL-terminated strings of the caller (verbs.h contract).
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let (dir, file) = (dir.to_string_lossy(), file.to_string_lossy());
        let ours = dir.strip_prefix(IBDEV_DIR).and_then(|name| {
            let list = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
            list.iter().find(|d| name_str(&d.ibv) == name).copied()
        });
        let content = match ours {
            Some(xdev) => match virtual_file(xdev, &file) {
                Some(mut s) => {
                    s.push('\n');
                    s.into_bytes()
                }
                None => {
                    set_errno(libc::ENOENT);
                    return -1;
                }
            },
            None => match std::fs::read(format!("{dir}/{file}")) {
                Ok(mut b) => {
                    b.truncate(size);
                    b
                }
                Err(e) => {
                    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                    return -1;
                }
            },
        };
        let mut len = content.len().min(size);
        // SAFETY: `buf` has `size` writable bytes (verbs.h contract), len <= size.
        unsafe { core::ptr::copy_nonoverlapping(content.as_ptr(), buf as *mut u8, len) };
        // SAFETY: indices below are < size.
        unsafe {
            if len > 0 && *buf.add(len - 1) == b'\n' as c_char {
                len -= 1;
                *buf.add(len) = 0;
            } else if len < size {
                *buf.add(len) = 0;
            } else {
                // No room for the terminating NUL: fail, as rdma-core does.
                set_errno(libc::EOVERFLOW);
                return -1;
            }
        }
        len as c_int
    })
}

/// The device's `name` as text.
fn name_str(d: &ibv_device) -> &str {
    let n = d.name.iter().position(|&c| c == 0).unwrap_or(d.name.len());
    // SAFETY: c_char and u8 have the same layout; `n` bytes are in bounds.
    let b = unsafe { core::slice::from_raw_parts(d.name.as_ptr() as *const u8, n) };
    core::str::from_utf8(b).unwrap_or("")
}

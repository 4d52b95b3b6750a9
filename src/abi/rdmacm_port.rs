//! One CM per device for librdmacm (src/abi/rdmacm.rs): the CM's own context of the
//! device (opened once, the program sees it as `rdma_cm_id.verbs`), its GSI QP (QP1, Q_Key
//! 0x80010000, [`xrnic::verbs::Pd::create_gsi_qp`]), the sans-IO [`xrnic::cm::Cm`], and a
//! thread that moves MADs between them and runs the CM's timers on the real clock.
//!
//! The thread hands every [`CmEvent`] to librdmacm's dispatcher ([`Upcalls`]) with no lock of this port
//! held, so that the dispatcher may call back into the port (accept, rtu) freely.
//!
//! On a device served by the device service (src/service), QP1 is the service's: the
//! port then moves its MADs through the service's GSI relay ([`xv::GsiRelay`],
//! src/service/gsi.rs) instead of a GSI QP of its own, its CM takes its comm IDs in the
//! block the service gave it, and its listens are registered with the service (which
//! routes REQs by ServiceID). The CM itself is the same either way: only the transport
//! of its MADs ([`Mads`]) differs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xrnic::cm::{Cm, CmConfig, CmEvent};
use xrnic::proto::ud::grh_gids;
use xrnic::proto::{GRH_LEN, Instant as CmInstant};
use xrnic::verbs::{self as xv, AddressVector, GSI_QKEY, Qpn, RecvWr, SendWr, WrOpcode};
use xrnic::wire::mad::MAD_LEN;

use crate::types::ibv_context;

const RECV_SLOTS: usize = 64;
const SEND_SLOTS: usize = 64;
const RECV_SLOT: usize = xv::GSI_RECV_SLOT;

/// What the port calls back into librdmacm's ids (rdmacm.rs), handed in by it at the
/// port's opening so that this module never imports the one above it.
pub struct Upcalls {
    /// Every event the CM decided, with no lock of the port held.
    pub dispatch: fn(&Port, CmEvent),
    /// After each round of the port's thread: publish the ids (`xrnic res cm_id`).
    pub publish: fn(),
}

pub struct Port {
    /// The process generation that opened it (`crate::live::generation`): a fork child
    /// opens ports of its own; its parent's (their thread is not in the child) stay
    /// listed, unused and never dropped.
    generation: u32,
    pub ifname: String,
    up: &'static Upcalls,
    /// The context the program sees as `rdma_cm_id.verbs`: never closed.
    pub ctx: *mut ibv_context,
    pub dev: xv::Device,
    pub cm: Mutex<Cm>,
    start: Instant,
    mads: Mads,
}

/// How the port's MADs travel.
enum Mads {
    /// A GSI QP of this process's device.
    Local(Box<LocalGsi>),
    /// The device service's QP1, through its relay.
    Relay(xv::GsiRelay),
}

struct LocalGsi {
    qp: xv::Qp,
    pd: xv::Pd,
    cq: xv::Cq,
    rmr: xv::Mr,
    smr: xv::Mr,
    next_send: Mutex<usize>,
    ahs: Mutex<HashMap<[u8; 16], xv::Ah>>,
    /// MADs posted, and their send completions seen by the port's thread (a UD send
    /// completes when its frame leaves): `drain_sends` waits for the two to meet.
    sends_posted: AtomicU64,
    sends_done: AtomicU64,
}

// SAFETY: `ctx` is a leaked, never-freed ibv_context that is only handed to C callers
// and to the thread-safe verbs entry points; the rest is Send + Sync already.
unsafe impl Send for Port {}
// SAFETY: as above.
unsafe impl Sync for Port {}

static PORTS: Mutex<Vec<Arc<Port>>> = Mutex::new(Vec::new());

/// Every port this process opened so far.
pub fn ports() -> Vec<Arc<Port>> {
    let generation = crate::live::generation();
    PORTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|p| p.generation == generation)
        .cloned()
        .collect()
}

/// The port of `ifname`, opening the device and starting its CM on first use.
pub fn port(ifname: &str, up: &'static Upcalls) -> Result<Arc<Port>, i32> {
    let mut g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let generation = crate::live::generation();
    if let Some(p) = g
        .iter()
        .find(|p| p.generation == generation && p.ifname == ifname)
    {
        return Ok(p.clone());
    }
    // The CM's own context, as librdmacm opens one per device (cma.c
    // `ucma_open_device`): beside any context the program opened itself, on the same
    // device (src/abi/opened.rs), so the program may close its own freely.
    let ctx = open_own(ifname)?;
    // SAFETY: the program does not close `ctx` while this call uses it.
    let x = unsafe { crate::context::context(ctx) }.ok_or(libc::ENODEV)?;
    let dev = x.dev.clone();
    let p = Arc::new(open(ifname, ctx, dev, up).map_err(|e| {
        eprintln!("xrnic: rdma_cm on {ifname}: {e}");
        e.errno()
    })?);
    g.push(p.clone());
    // Kept open: the program's ibv_close_device of `rdma_cm_id.verbs` leaves it.
    crate::context::keep(ctx);
    AT_EXIT.call_once(|| {
        // SAFETY: registers a function of this library that takes no argument and
        // returns nothing; glibc ties it to this object (__cxa_atexit with its
        // __dso_handle), so it runs at exit or at the library's unloading, never after.
        if unsafe { libc::atexit(disconnect_all_at_exit) } != 0 {
            eprintln!("xrnic: atexit failed: connections left open at exit send no DREQ");
        }
    });
    let t = p.clone();
    std::thread::Builder::new()
        .name(format!("xrnic-cm-{ifname}"))
        .spawn(move || run(&t))
        .map_err(|_| libc::EAGAIN)?;
    Ok(p)
}

/// Registers [`disconnect_all_at_exit`] once, when the first port opens.
static AT_EXIT: std::sync::Once = std::sync::Once::new();

/// How long the exit handler waits for a lock another thread holds, and for its MADs to
/// leave the device.
const EXIT_PATIENCE: Duration = Duration::from_millis(100);

/// The atexit(3) handler: a program that exits with ids still connected (perftest's
/// latency servers return from main without rdma_disconnect or rdma_destroy_id) closes
/// them as the kernel does when the process's rdma_cm file is released (ucma.c
/// `ucma_close` destroys each id; cm.c `cm_destroy_id` sends the DREQ of an ESTABLISHED
/// one, the DREP of a DREQ_RCVD one, the REJ of a REQ_RCVD one): [`Cm::destroy`] on every
/// id of every port. Without it the peer's own DREQ went unanswered and its
/// rdma_disconnect waited out every retry (about a minute) for its DISCONNECTED event.
/// Every wait is bounded; not run for `_exit()` or a fatal signal.
extern "C" fn disconnect_all_at_exit() {
    crate::guard((), || {
        // A fork child runs the handler its parent registered at its own exit too: it
        // closes the ids of its own ports and leaves its parent's alone (the kernel's
        // ucma file is shared by the two and released only with its last holder).
        let generation = crate::live::generation();
        let Some(ports) = xrnic::driver::try_lock_for(&PORTS, EXIT_PATIENCE).map(|g| {
            g.iter()
                .filter(|p| p.generation == generation)
                .cloned()
                .collect::<Vec<_>>()
        }) else {
            return;
        };
        for p in ports {
            let Some(mut cm) = xrnic::driver::try_lock_for(&p.cm, EXIT_PATIENCE) else {
                continue;
            };
            let now = p.now();
            let ids = cm.ids();
            if ids.is_empty() {
                continue;
            }
            for (id, _) in ids {
                cm.destroy(now, id);
            }
            p.flush(&mut cm);
            drop(cm);
            p.drain_sends(EXIT_PATIENCE);
        }
    })
}

/// Open a context of `ifname`'s device for the CM.
fn open_own(ifname: &str) -> Result<*mut ibv_context, i32> {
    let mut n = 0;
    let list = crate::device::ibv_get_device_list(&mut n);
    if list.is_null() {
        return Err(libc::ENODEV);
    }
    let want = format!("xrnic_{ifname}");
    let mut ctx = core::ptr::null_mut();
    for i in 0..n as usize {
        // SAFETY: ibv_get_device_list returned `n` valid device pointers.
        let d = unsafe { *list.add(i) };
        let name = crate::device::ibv_get_device_name(d);
        if !name.is_null()
            // SAFETY: the device name is a NUL-terminated string inside the interned
            // device.
            && unsafe { core::ffi::CStr::from_ptr(name) }.to_bytes() == want.as_bytes()
        {
            ctx = crate::device::ibv_open_device(d);
            break;
        }
    }
    crate::device::ibv_free_device_list(list);
    if ctx.is_null() {
        return Err(libc::ENODEV);
    }
    Ok(ctx)
}

fn open(
    ifname: &str,
    ctx: *mut ibv_context,
    dev: xv::Device,
    up: &'static Upcalls,
) -> xv::Result<Port> {
    // The node GUID as the CA GUID (rxe derives both from the MAC, as device.rs does).
    let guid = xv::node_guid(dev.mac());
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    let (mads, comm_ids) = match dev.gsi_relay()? {
        Some(r) => {
            let ids = r.comm_ids();
            (Mads::Relay(r), Some(ids))
        }
        None => (Mads::Local(Box::new(open_local(&dev)?)), None),
    };
    let cm = Cm::new(CmConfig {
        ca_guid: guid,
        first_comm_id: seed | 1,
        comm_ids,
        ..CmConfig::default()
    });
    Ok(Port {
        generation: crate::live::generation(),
        ifname: ifname.to_string(),
        up,
        ctx,
        dev,
        cm: Mutex::new(cm),
        start: Instant::now(),
        mads,
    })
}

fn open_local(dev: &xv::Device) -> xv::Result<LocalGsi> {
    let xv::GsiQueues {
        qp,
        pd,
        cq,
        rmr,
        smr,
    } = xv::GsiQueues::open(dev, RECV_SLOTS, SEND_SLOTS)?;
    Ok(LocalGsi {
        qp,
        pd,
        cq,
        rmr,
        smr,
        next_send: Mutex::new(0),
        ahs: Mutex::new(HashMap::new()),
        sends_posted: AtomicU64::new(0),
        sends_done: AtomicU64::new(0),
    })
}

impl Port {
    /// The CM's clock: the port's monotonic clock since it opened.
    pub fn now(&self) -> CmInstant {
        CmInstant::ZERO.saturating_add(self.start.elapsed())
    }

    /// Run `f` on the CM, then send what it queued and dispatch what it decided.
    pub fn with_cm<T>(&self, f: impl FnOnce(&mut Cm, CmInstant) -> T) -> T {
        let now = self.now();
        let (r, events) = {
            let mut cm = self.cm.lock().unwrap_or_else(|e| e.into_inner());
            let r = f(&mut cm, now);
            self.flush(&mut cm);
            let ev: Vec<CmEvent> = std::iter::from_fn(|| cm.poll_event()).collect();
            (r, ev)
        };
        for e in events {
            (self.up.dispatch)(self, e);
        }
        r
    }

    /// The index of `gid` in the device's GID table.
    pub fn gid_index(&self, gid: &[u8; 16]) -> Option<u8> {
        self.dev
            .gid_table()
            .iter()
            .position(|g| g == gid)
            .map(|i| i as u8)
    }

    fn flush(&self, cm: &mut Cm) {
        while let Some(t) = cm.poll_transmit() {
            if let Err(e) = self.send(&t.to, &t.mad) {
                // A MAD that cannot leave is a lost MAD: the CM's timers resend it.
                eprintln!("xrnic: rdma_cm on {}: MAD not sent: {e}", self.ifname);
            }
        }
    }

    fn send(&self, to: &[u8; 16], mad: &[u8; MAD_LEN]) -> xv::Result<()> {
        match &self.mads {
            Mads::Local(l) => l.send(&self.dev, to, mad),
            Mads::Relay(r) => r.send(to, mad),
        }
    }

    /// Listen on `service_id` for the consumer's id `listener`: through the service, the
    /// service is told first (a listen of another process there: EADDRINUSE).
    pub fn listen(&self, service_id: u64, listener: u64) -> Result<(), i32> {
        if let Mads::Relay(r) = &self.mads {
            r.listen(service_id).map_err(|e| e.errno())?;
        }
        if self.with_cm(|cm, _| cm.listen(service_id, listener)) {
            return Ok(());
        }
        Err(libc::EADDRINUSE)
    }

    pub fn unlisten(&self, service_id: u64) {
        self.with_cm(|cm, _| cm.unlisten(service_id));
        if let Mads::Relay(r) = &self.mads {
            let _ = r.unlisten(service_id);
        }
    }

    /// Wait (at most `limit`) until every MAD posted so far has left the device. The
    /// kernel's CM outlives the process that asked for a DREQ or a REJ; this one lives in
    /// the process, so `rdma_disconnect` and `rdma_destroy_id` wait here: a program that
    /// exits right after them (rping's client does) still has its DREQ on the wire, and
    /// the peer is not left waiting for a disconnect that never comes. Through the
    /// service the MAD is posted already (the service posted it before it answered, and
    /// it outlives the program), but the same moment is given: the peer's answer (a
    /// DREP) then comes and is dispatched within the call as in-process, and a program
    /// whose CM thread reads its channel while the main thread destroys it (rping) sees
    /// the same order of events as in-process.
    pub fn drain_sends(&self, limit: Duration) {
        let Mads::Local(l) = &self.mads else {
            std::thread::sleep(Duration::from_millis(10));
            return;
        };
        let target = l.sends_posted.load(Ordering::Acquire);
        let end = Instant::now() + limit;
        while l.sends_done.load(Ordering::Acquire) < target && Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
        }
        // The completion is made as the engine emits the frame, before the driver has
        // pushed it to the socket and kicked the ring: give the driver that moment
        // before the process may exit (a DREP lost this way left ucmatose's peer
        // waiting for its DREQ retries).
        std::thread::sleep(Duration::from_millis(10));
    }

    /// How long the thread may wait for a MAD before the CM's next timer.
    fn wait(&self) -> Duration {
        let cm = self.cm.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.now();
        cm.poll_timeout()
            .map_or(Duration::from_millis(100), |d| {
                d.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100))
    }
}

impl LocalGsi {
    fn send(&self, dev: &xv::Device, to: &[u8; 16], mad: &[u8; MAD_LEN]) -> xv::Result<()> {
        let ah = {
            let mut ahs = self.ahs.lock().unwrap_or_else(|e| e.into_inner());
            match ahs.get(to) {
                Some(a) => a.clone(),
                None => {
                    let sgid_index = xv::cm_sgid_index(dev, to);
                    let a = self.pd.create_ah(&AddressVector {
                        dgid: *to,
                        sgid_index,
                        ..AddressVector::default()
                    })?;
                    ahs.insert(*to, a.clone());
                    a
                }
            }
        };
        let slot = {
            let mut n = self.next_send.lock().unwrap_or_else(|e| e.into_inner());
            let s = *n;
            *n = (s + 1) % SEND_SLOTS;
            s
        };
        self.smr.write(slot * MAD_LEN, mad)?;
        let mut wr = SendWr::new(slot as u64 | 1 << 32, WrOpcode::Send);
        wr.sg_list = vec![self.smr.sge(slot * MAD_LEN, MAD_LEN as u32)];
        self.qp.post_send_ud(wr, &ah, Qpn::new(1), GSI_QKEY)?;
        self.sends_posted.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// The port's thread: receive MADs, run timers, forever (the port lives as long as
/// the process).
fn run(p: &Port) {
    let mut wcs = Vec::new();
    let mut buf = vec![0u8; RECV_SLOT];
    loop {
        let wait = p.wait();
        match &p.mads {
            Mads::Local(l) => {
                wcs.clear();
                l.cq.wait_into(16, wait, &mut wcs);
                for w in &wcs {
                    if w.wr_id >> 32 != 0 {
                        l.sends_done.fetch_add(1, Ordering::AcqRel);
                        continue; // a send completion
                    }
                    let slot = w.wr_id as usize;
                    if w.status == xv::WcStatus::Success
                        && w.byte_len as usize >= RECV_SLOT
                        && l.rmr.read(slot * RECV_SLOT, &mut buf).is_ok()
                        && let Some((src, dst)) = grh_gids(&buf[..GRH_LEN])
                    {
                        p.with_cm(|cm, now| cm.handle_mad(now, src, dst, &buf[GRH_LEN..]));
                    }
                    let _ = l.qp.post_recv(RecvWr {
                        wr_id: slot as u64,
                        sg_list: vec![l.rmr.sge(slot * RECV_SLOT, RECV_SLOT as u32)],
                    });
                }
            }
            Mads::Relay(r) => match r.recv(wait) {
                Ok(mads) => {
                    for m in mads {
                        p.with_cm(|cm, now| cm.handle_mad(now, m.from, m.to, &m.mad));
                    }
                }
                Err(e) => {
                    // The service is gone (or refused): its verbs fail too; do not spin.
                    say_once(&p.ifname, &e);
                    std::thread::sleep(wait.max(Duration::from_millis(10)));
                }
            },
        }
        p.with_cm(|cm, now| cm.handle_timeout(now));
        // `xrnic res cm_id` (src/abi/rdmacm/res.rs).
        (p.up.publish)();
    }
}

/// Say once that the relay failed (the service stopped): later failures are the same.
fn say_once(ifname: &str, e: &xv::Error) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Ordering::SeqCst) {
        eprintln!("xrnic: rdma_cm on {ifname}: the device service's GSI relay: {e}");
    }
}

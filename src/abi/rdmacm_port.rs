//! One CM per device for librdmacm (src/abi/rdmacm.rs): the CM's own context of the
//! device (opened once, the program sees it as `rdma_cm_id.verbs`), its GSI QP (QP1, Q_Key
//! 0x80010000, [`xrnic::verbs::Pd::create_gsi_qp`]), the sans-IO [`xrnic::cm::Cm`], and a
//! thread that moves MADs between them and runs the CM's timers on the real clock.
//!
//! The thread hands every [`CmEvent`] to `rdmacm::dispatch` with no lock of this port
//! held, so that the dispatcher may call back into the port (accept, rtu) freely.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xrnic::cm::{Cm, CmConfig, CmEvent};
use xrnic::proto::{GRH_LEN, Instant as CmInstant};
use xrnic::verbs::{self as xv, Access, AddressVector, QpInitAttr, Qpn, RecvWr, SendWr, WrOpcode};
use xrnic::wire::mad::MAD_LEN;

use crate::types::ibv_context;

/// The GSI Q_Key (IBTA §13.5.1).
const GSI_QKEY: u32 = 0x8001_0000;
const RECV_SLOTS: usize = 64;
const SEND_SLOTS: usize = 64;
const RECV_SLOT: usize = GRH_LEN + MAD_LEN;

pub struct Port {
    pub ifname: String,
    /// The context the program sees as `rdma_cm_id.verbs`: never closed.
    pub ctx: *mut ibv_context,
    pub dev: xv::Device,
    pub cm: Mutex<Cm>,
    start: Instant,
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

/// Every port opened so far.
pub fn ports() -> Vec<Arc<Port>> {
    PORTS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The port of `ifname`, opening the device and starting its CM on first use.
pub fn port(ifname: &str) -> Result<Arc<Port>, i32> {
    let mut g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = g.iter().find(|p| p.ifname == ifname) {
        return Ok(p.clone());
    }
    // The CM's own context, as librdmacm opens one per device (cma.c
    // `ucma_open_device`): beside any context the program opened itself, on the same
    // device (src/abi/opened.rs), so the program may close its own freely.
    let ctx = open_own(ifname)?;
    let x = crate::device::context(ctx).ok_or(libc::ENODEV)?;
    let dev = x.dev.clone();
    let p = Arc::new(open(ifname, ctx, dev).map_err(|e| {
        eprintln!("xrnic: rdma_cm on {ifname}: {e}");
        crate::errno_of(&e)
    })?);
    g.push(p.clone());
    let t = p.clone();
    std::thread::Builder::new()
        .name(format!("xrnic-cm-{ifname}"))
        .spawn(move || run(&t))
        .map_err(|_| libc::EAGAIN)?;
    Ok(p)
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
        // SAFETY: the device name is a NUL-terminated string inside the interned device.
        if !name.is_null()
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

fn open(ifname: &str, ctx: *mut ibv_context, dev: xv::Device) -> xv::Result<Port> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(RECV_SLOTS + SEND_SLOTS)?;
    let qp = pd.create_gsi_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        max_send_wr: SEND_SLOTS as u32,
        max_recv_wr: RECV_SLOTS as u32,
        sq_sig_all: true,
    })?;
    qp.ud_ready(GSI_QKEY, 0)?;
    let rmr = pd.reg_mr(RECV_SLOTS * RECV_SLOT, Access::LOCAL_WRITE)?;
    let smr = pd.reg_mr(SEND_SLOTS * MAD_LEN, Access::LOCAL_WRITE)?;
    for i in 0..RECV_SLOTS {
        qp.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: vec![rmr.sge(i * RECV_SLOT, RECV_SLOT as u32)],
        })?;
    }
    // The node GUID as the CA GUID (rxe derives both from the MAC, as device.rs does).
    let m = dev.mac();
    let guid = u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    let cm = Cm::new(CmConfig {
        ca_guid: guid,
        first_comm_id: seed | 1,
        ..CmConfig::default()
    });
    Ok(Port {
        ifname: ifname.to_string(),
        ctx,
        dev,
        cm: Mutex::new(cm),
        start: Instant::now(),
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
            crate::rdmacm::dispatch(self, e);
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
        let ah = {
            let mut ahs = self.ahs.lock().unwrap_or_else(|e| e.into_inner());
            match ahs.get(to) {
                Some(a) => a.clone(),
                None => {
                    let v4 = to[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
                    let sgid_index = self
                        .dev
                        .gid_table()
                        .iter()
                        .position(|g| {
                            (g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]) == v4
                                && g[..2] != [0xfe, 0x80]
                        })
                        .unwrap_or(0) as u8;
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

    /// Wait (at most `limit`) until every MAD posted so far has left the device. The
    /// kernel's CM outlives the process that asked for a DREQ or a REJ; this one lives in
    /// the process, so `rdma_disconnect` and `rdma_destroy_id` wait here: a program that
    /// exits right after them (rping's client does) still has its DREQ on the wire, and
    /// the peer is not left waiting for a disconnect that never comes.
    pub fn drain_sends(&self, limit: Duration) {
        let target = self.sends_posted.load(Ordering::Acquire);
        let end = Instant::now() + limit;
        while self.sends_done.load(Ordering::Acquire) < target && Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
        }
        // The completion is made as the engine emits the frame, before the driver has
        // pushed it to the socket and kicked the ring: give the driver that moment
        // before the process may exit (a DREP lost this way left ucmatose's peer
        // waiting for its DREQ retries).
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The port's thread: receive MADs, run timers, forever (the port lives as long as
/// the process).
fn run(p: &Port) {
    let mut wcs = Vec::new();
    let mut buf = vec![0u8; RECV_SLOT];
    loop {
        let wait = {
            let cm = p.cm.lock().unwrap_or_else(|e| e.into_inner());
            let now = p.now();
            cm.poll_timeout()
                .map_or(Duration::from_millis(100), |d| {
                    d.saturating_duration_since(now)
                })
                .min(Duration::from_millis(100))
        };
        wcs.clear();
        p.cq.wait_into(16, wait, &mut wcs);
        for w in &wcs {
            if w.wr_id >> 32 != 0 {
                p.sends_done.fetch_add(1, Ordering::AcqRel);
                continue; // a send completion
            }
            let slot = w.wr_id as usize;
            if w.status == xv::WcStatus::Success
                && w.byte_len as usize >= RECV_SLOT
                && p.rmr.read(slot * RECV_SLOT, &mut buf).is_ok()
            {
                let (src, dst) = grh_gids(&buf[..GRH_LEN]);
                p.with_cm(|cm, now| cm.handle_mad(now, src, dst, &buf[GRH_LEN..]));
            }
            let _ = p.qp.post_recv(RecvWr {
                wr_id: slot as u64,
                sg_list: vec![p.rmr.sge(slot * RECV_SLOT, RECV_SLOT as u32)],
            });
        }
        p.with_cm(|cm, now| cm.handle_timeout(now));
        // `xrnic res cm_id` (src/abi/rdmacm/res.rs).
        crate::rdmacm::publish_ids();
    }
}

/// Source and destination GIDs of a received GRH: for RoCE v2 over IPv4 the last 20
/// bytes are the IPv4 header (rxe's layout), else the IPv6 header.
fn grh_gids(g: &[u8]) -> ([u8; 16], [u8; 16]) {
    let mut s = [0u8; 16];
    let mut d = [0u8; 16];
    if g[20] >> 4 == 4 && g[..20] == [0u8; 20] {
        s[10] = 0xff;
        s[11] = 0xff;
        d[10] = 0xff;
        d[11] = 0xff;
        s[12..].copy_from_slice(&g[32..36]);
        d[12..].copy_from_slice(&g[36..40]);
    } else {
        s.copy_from_slice(&g[8..24]);
        d.copy_from_slice(&g[24..40]);
    }
    (s, d)
}

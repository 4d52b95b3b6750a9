//! The public API: a libibverbs-shaped interface to an xrnic device.
//!
//! Contract:
//! - [`Device::open`] takes a network interface name (in the caller's network namespace),
//!   attaches the XDP filter and an AF_XDP socket, builds the GID table and active MTU
//!   from the interface ([`netdev`]), and starts the driver thread ([`crate::driver`]).
//!   [`Device::open_sim_pair`] gives two devices joined by an in-process link, for
//!   examples and tests without root. [`Device::open_rdma`] opens an RDMA device
//!   (`rxe0`, `mlx5_0`) through libibverbs instead: the offload backend (`offload.rs`,
//!   [`ibv`], docs/offload.md). Every object below works the same on both; each handle
//!   dispatches on its backend, and what the offload backend lacks is an
//!   [`Error::Unsupported`] or a documented zero, never a made-up value.
//! - Objects are named like their libibverbs counterparts: [`Device`] (`ibv_context`),
//!   [`Pd`], [`Mr`], [`Cq`], [`Qp`] (RC), with `query_device`, `query_port`,
//!   `query_gid`, `alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify`, `query`,
//!   `post_send`, `post_recv`, `poll`. [`Cq::wait`] blocks until a completion arrives
//!   (the driver signals a condition variable), instead of spinning.
//! - Every object frees itself on drop, in a safe order: a [`Qp`] keeps its PD and CQs
//!   alive, an [`Mr`] its PD, all of them the device; the device's driver thread stops
//!   and the XDP program is detached when the last handle goes. Memory regions are owned
//!   by the engine (plain heap memory, nothing pinned); read and write them through
//!   [`Mr::read`], [`Mr::write`], [`Mr::with`] and [`Mr::with_mut`] (the last two lend a
//!   copy and hold no lock while the closure runs, on both backends: `mr_copy`).
//! - `modify` to RTR with an address vector whose `dmac` is all zero resolves the MAC of
//!   the destination GID through the kernel's neighbour table, like the kernel does for
//!   rxe (`ib_resolve_eth_dmac`); like that function it also replaces the hop limit with
//!   the route's (64 by default) unless the destination GID is link-local.
//!
//! # Example
//!
//! Two devices on the simulated link (no root needed): a SEND and an RDMA WRITE.
//!
//! ```
//! use std::time::Duration;
//! use xrnic::verbs::{
//!     Access, ConnectOpts, Device, QpInitAttr, RecvWr, Remote, SendWr, WcStatus, WrOpcode,
//! };
//!
//! let (a, b) = Device::open_sim_pair().unwrap();
//! let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
//! let (cq_a, cq_b) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
//! let mr_a = pd_a.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
//! let mr_b = pd_b.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
//! let qp_a = pd_a.create_qp(&QpInitAttr::new(&cq_a, &cq_a, 16)).unwrap();
//! let qp_b = pd_b.create_qp(&QpInitAttr::new(&cq_b, &cq_b, 16)).unwrap();
//! // Exchange what ibv_rc_pingpong exchanges (QPN, PSN, GID), then connect both ends.
//! let gid_index = 1u8; // ::ffff:192.0.2.x
//! let opts = ConnectOpts { access: Access::ALL, ..Default::default() };
//! let gid = |d: &Device| d.query_gid(gid_index.into()).unwrap();
//! qp_a.connect(&Remote { qpn: qp_b.qp_num(), psn: 0x100, gid: gid(&b) }, 0x200, gid_index, &opts)
//!     .unwrap();
//! qp_b.connect(&Remote { qpn: qp_a.qp_num(), psn: 0x200, gid: gid(&a) }, 0x100, gid_index, &opts)
//!     .unwrap();
//!
//! // SEND: B posts a receive, A sends "hello".
//! qp_b.post_recv(RecvWr { wr_id: 1, sg_list: vec![mr_b.sge(0, 64)] }).unwrap();
//! mr_a.write(0, b"hello").unwrap();
//! let mut wr = SendWr::new(2, WrOpcode::Send);
//! wr.sg_list = vec![mr_a.sge(0, 5)];
//! qp_a.post_send(wr).unwrap();
//! let wc = cq_b.wait(1, Duration::from_secs(5));
//! assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 5));
//! let mut got = [0u8; 5];
//! mr_b.read(0, &mut got).unwrap();
//! assert_eq!(&got, b"hello");
//!
//! // RDMA WRITE into B's region: B's application does nothing, its driver answers.
//! mr_a.write(100, b"one-sided").unwrap();
//! let mut wr = SendWr::new(3, WrOpcode::RdmaWrite);
//! wr.sg_list = vec![mr_a.sge(100, 9)];
//! wr.rdma.remote_addr = mr_b.addr() + 1000;
//! wr.rdma.rkey = mr_b.rkey();
//! qp_a.post_send(wr).unwrap();
//! let wcs: Vec<_> = [cq_a.wait(1, Duration::from_secs(5)), cq_a.wait(1, Duration::from_secs(5))]
//!     .concat();
//! assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
//! let mut got = [0u8; 9];
//! mr_b.read(1000, &mut got).unwrap();
//! assert_eq!(&got, b"one-sided");
//! ```
//!
//! The same program runs on a real interface with `Device::open("eth0")` as root; see
//! `examples/rnic_veth.rs`, which builds a veth pair in two namespaces and runs it.

mod error;
mod gsi;
mod gsi_relay;
pub mod ibv;
mod link_watch;
mod mcast;
mod mr;
mod mr_copy;
pub mod netdev;
mod offload;
mod path;
mod qp;
pub(crate) mod remote;
mod srq;
mod stat_files;
#[cfg(test)]
mod tests;
mod ud;

pub use crate::ipc::GsiMad;
pub use error::{Error, Result};
pub use gsi::{GSI_RECV_SLOT, GsiQueues, cm_sgid_index, node_guid};
pub use gsi_relay::GsiRelay;
pub use mr::Mr;
use mr::MrKind;
pub use offload::{Backend, DeviceList, choose_backend, hw_counters, list_devices, query_rdma};
pub use path::PathStep;
use qp::QpKind;
pub use qp::{ConnectOpts, Qp, QpInitAttr, Remote};
pub use srq::Srq;
pub use stat_files::{STAT_DIR, snapshot_is_here, stat_file, stat_files};
pub use ud::Ah;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::driver::{Driver, DriverOptions, DriverStats, Shared};
use crate::io::afxdp::{self, PortOptions, XskPort};
use crate::io::frame::{SimIo, sim_link};
use crate::proto::congestion::{Algorithm, CongestionControl, Pacer};
use crate::proto::{self, Config, Rnic, gid_is_ipv4};

pub use crate::proto::congestion::{CongestionCounters, DcqcnParams, QpRateStatus};

pub use crate::io::frame::IoStats;
pub use crate::proto::{
    Access, AddressVector, AsyncEvent, AtomicInfo, AttrMask, DeviceCounters, Mtu, QpAttr,
    QpCounters, QpState, QpType, RdmaInfo, RecvWr, SendFlags, SendWr, Sge, SrqAttr, SrqAttrMask,
    VerbsError, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
pub use crate::proto::{GRH_LEN, GSI_QKEY, GSI_QPN, UdCounters};
pub use crate::wire::{Lkey, Psn, Qpn, Rkey};

/// A GID: 16 bytes, an IPv6 address or an IPv4-mapped one.
pub type Gid = [u8; 16];

/// Options of [`Device::open_with`].
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// The interface receive queue to bind (veth and most test setups: 0).
    pub queue: u32,
    pub port: PortOptions,
    /// Fault injection: drop this fraction of received frames (see [`DriverOptions`]).
    pub rx_drop: f64,
    /// Testing congestion control: mark this fraction of received ECN-capable frames CE,
    /// like an ECN switch (see [`DriverOptions`]).
    pub rx_ce_mark: f64,
    pub seed: u64,
    /// Write stat snapshots to [`stat_file`]`(dir, netdev)` (`xrnic stat` reads them).
    pub stat_dir: Option<PathBuf>,
    pub stat_interval: Duration,
    /// Write the device's last snapshot (`running: false`, its counters as it closes) to
    /// this file when it closes: the snapshot in `stat_dir` is removed then.
    pub final_stat: Option<PathBuf>,
    /// Capture every frame the device sends and receives into this pcapng file, with a
    /// comment on each frame that is not the obvious next one ([`crate::driver::tap`]).
    pub pcap: Option<PathBuf>,
    /// DCQCN congestion control with these parameters (`None`: off, nothing changes on
    /// the wire). On: data frames are ECT(0) unless the QP's traffic class sets the ECN
    /// field, CE-marked packets are answered with CNPs (notification point), received CNPs
    /// cut the QP's rate and a pacer holds it there (reaction point); see
    /// docs/congestion.md. [`DEFAULT_DCQCN`] is the default.
    pub dcqcn: Option<DcqcnParams>,
}

/// Whether devices run DCQCN unless told otherwise: on, with the ConnectX defaults, as a
/// ConnectX port runs it (data frames ECT(0), CNPs answered). Measured to cost nothing
/// visible on a veth pair (docs/congestion.md, "On real devices"); `--no-dcqcn` or
/// `DeviceOptions { dcqcn: None, .. }` turns it off.
pub const DEFAULT_DCQCN: Option<DcqcnParams> = Some(DcqcnParams::connectx());

/// The line rate DCQCN starts from when the interface does not report a speed (veth
/// reports 10000 Mb/s; tap and some virtual devices report none).
const FALLBACK_LINE_RATE_BPS: u64 = 10_000_000_000;

/// The engine of a device, with congestion control as `opts` asks. `line_bps`: the
/// interface speed, the rate an unthrottled QP sends at.
fn engine(cfg: Config, opts: &DeviceOptions, line_bps: u64) -> Rnic {
    let mut rnic = Rnic::new(cfg);
    if let Some(p) = opts.dcqcn {
        let mut cc = CongestionControl::new(Algorithm::Dcqcn(p), line_bps, Pacer::DEFAULT_BURST);
        // The port paces at line rate itself; a QP is paced once a CNP throttled it.
        cc.set_pace_unthrottled(false);
        rnic.enable_congestion_control(cc);
    }
    rnic
}

/// The interface speed from sysfs (Mb/s there), or [`FALLBACK_LINE_RATE_BPS`].
fn line_rate_bps(ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .filter(|&mbps| mbps > 0)
        .map_or(FALLBACK_LINE_RATE_BPS, |mbps| mbps as u64 * 1_000_000)
}

/// Congestion-control state of a device: its counters and each QP's rate, target rate
/// and α (what `xrnic stat` and `xrnic perf --json` show).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CongestionStatus {
    /// The parameters in use.
    pub params: DcqcnParams,
    pub line_rate_bps: u64,
    pub counters: CongestionCounters,
    pub qps: Vec<(Qpn, QpRateStatus)>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            queue: 0,
            port: PortOptions::default(),
            rx_drop: 0.0,
            rx_ce_mark: 0.0,
            seed: 0,
            stat_dir: None,
            stat_interval: Duration::from_millis(500),
            final_stat: None,
            pcap: None,
            dcqcn: DEFAULT_DCQCN,
        }
    }
}

/// How long [`Device::open`] waits for an XDP program already on the interface to be
/// detached (a process killed just before, whose link the kernel releases some tens of
/// milliseconds later) before it reports [`Error::XdpBusy`].
pub const XDP_DETACH_PATIENCE: Duration = Duration::from_secs(1);

/// Device attributes (`struct ibv_device_attr`, the fields xrnic has values for).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    /// Big-endian GUID: the EUI-64 of the MAC, as rxe sets it.
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub phys_port_cnt: u8,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    /// `IBV_ATOMIC_HCA` (1): atomics are atomic with respect to this device.
    pub atomic_cap: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
}

/// Port states (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    Nop = 0,
    Down = 1,
    Init = 2,
    Armed = 3,
    Active = 4,
    ActiveDefer = 5,
}

impl PortState {
    /// The state of an `enum ibv_port_state` value (unknown values: [`PortState::Nop`]).
    pub fn from_ibv(v: u32) -> PortState {
        match v {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            _ => PortState::Nop,
        }
    }

    /// `ibv_port_state_str`'s spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
        }
    }
}

/// What kind of address a GID table entry is (`enum ibv_gid_type`): the software
/// backend's are all RoCE v2; an RDMA device may list RoCE v1 entries too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    Ib,
    RoceV1,
    RoceV2,
}

impl GidType {
    /// How `ibv_devinfo -v` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        }
    }
}

/// Port attributes (`struct ibv_port_attr`, RoCE subset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    /// The interface MTU the active MTU was derived from.
    pub netdev_mtu: u32,
    pub lid: u16,
    pub max_msg_sz: u32,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u16,
}

/// How a device finds destination MACs.
#[derive(Debug)]
enum Addressing {
    Netdev {
        ns: netdev::NetNs,
        ifname: String,
        ifindex: u32,
    },
    /// The simulated link: the peer's addresses are known.
    Sim { peer: Vec<(IpAddr, [u8; 6])> },
}

#[derive(Debug)]
struct DevInner {
    name: String,
    netdev: String,
    mac: [u8; 6],
    attr: DeviceAttr,
    port: PortAttr,
    /// The link state the link watcher keeps (`None`: no watcher; `port.state` holds).
    link_up: Option<Arc<std::sync::atomic::AtomicBool>>,
    gids: Vec<Gid>,
    gid_types: Vec<GidType>,
    /// The kernel memberships of the multicast groups this device's QPs are attached to
    /// (src/verbs/mcast.rs).
    mcast: mcast::Memberships,
    // Last: dropped after everything above; the software driver joins its thread and
    // detaches XDP, the verbs context closes the device.
    backend: DevBackend,
}

#[derive(Debug)]
enum DevBackend {
    Soft {
        addressing: Addressing,
        driver: Driver,
    },
    Verbs(Arc<ibv::Context>),
    /// The device service of the interface, in another process (`xrnic up`,
    /// src/service, [`remote`]).
    Svc {
        addressing: Addressing,
        conn: Arc<remote::Conn>,
    },
}

impl DevInner {
    /// The engine of a software device.
    fn soft(&self) -> Option<&Arc<Shared>> {
        match &self.backend {
            DevBackend::Soft { driver, .. } => Some(driver.shared()),
            DevBackend::Verbs(_) | DevBackend::Svc { .. } => None,
        }
    }

    /// How a software device (in this process or the service) finds MACs.
    fn addressing(&self) -> Option<&Addressing> {
        match &self.backend {
            DevBackend::Soft { addressing, .. } | DevBackend::Svc { addressing, .. } => {
                Some(addressing)
            }
            DevBackend::Verbs(_) => None,
        }
    }
}

/// An open device (`struct ibv_context`). Cheap to clone; the driver runs until the last
/// clone and the last object made from it are dropped.
#[derive(Clone, Debug)]
pub struct Device {
    inner: Arc<DevInner>,
}

/// What [`Device::open`] reads from an interface without opening it, or
/// [`Device::open_rdma`] from an RDMA device (`xrnic devinfo`).
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    /// The interface (an RDMA device's: the one its GID 0 belongs to, when known).
    pub netdev: Option<netdev::NetdevInfo>,
    pub attr: DeviceAttr,
    pub port: PortAttr,
    /// The GID table by index; unused entries of an RDMA device's table are all zero.
    pub gids: Vec<Gid>,
    /// The type of each entry of `gids`.
    pub gid_types: Vec<GidType>,
    /// A software device's AF_XDP buffer mode (single-buffer caps the MTU); `None` for an
    /// RDMA device.
    pub af_xdp: Option<afxdp::BufferMode>,
    /// A software device's XDP attach mode as `XRNIC_XDP_MODE` forces it (`None`: auto,
    /// native unless the driver refuses it, which the port logs; or an RDMA device).
    pub xdp_mode: Option<afxdp::XdpMode>,
}

/// The largest CQ a program may ask for (`max_cqe`): what the software engine and the
/// device service (its completion ring per CQ, src/service/client_verbs.rs) both take, a
/// power of two less one so that rxe's rounding of a request (`n + 1` up to a power of
/// two, less one) keeps the maximum where it is.
pub const MAX_CQE: u32 = 0xffff;

/// rxe's vendor id (`RXE_VENDOR_ID`): no PCI vendor.
const VENDOR_ID: u32 = 0xff_ffff;

fn device_attr(mac: [u8; 6], max_qp_wr: u32) -> DeviceAttr {
    let guid = u64::from_be_bytes(netdev::eui64(mac));
    DeviceAttr {
        fw_ver: env!("CARGO_PKG_VERSION").to_string(),
        node_guid: guid,
        sys_image_guid: guid,
        vendor_id: VENDOR_ID,
        vendor_part_id: 0,
        hw_ver: 0,
        phys_port_cnt: 1,
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        max_qp: 0x1_0000,
        max_qp_wr,
        max_sge: 32,
        max_cq: 0x1_0000,
        max_cqe: MAX_CQE,
        max_mr: 0x00ff_fffe,
        max_pd: 0x1_0000,
        // What modify_qp accepts for max_rd_atomic / max_dest_rd_atomic (128, as rxe;
        // ConnectX 16): reporting more would make perftest-style peers ask for a depth the
        // engine refuses.
        max_qp_rd_atom: u32::from(crate::proto::qp::MAX_RD_ATOMIC),
        max_res_rd_atom: 0x3f000,
        max_qp_init_rd_atom: u32::from(crate::proto::qp::MAX_RD_ATOMIC),
        atomic_cap: 1,
        max_pkeys: 1,
        local_ca_ack_delay: 15,
    }
}

/// Query an interface the way [`Device::open`] would see it, without opening it: with
/// the default port options' buffer mode ([`afxdp::BufferMode::for_options`]).
pub fn query_netdev(ifname: &str) -> Result<DeviceInfo> {
    query_netdev_with(
        ifname,
        afxdp::BufferMode::for_options(&PortOptions::default()),
    )
}

fn query_netdev_with(ifname: &str, mode: afxdp::BufferMode) -> Result<DeviceInfo> {
    let nd = netdev::probe(ifname)?;
    let (max_mtu, active) =
        netdev::port_mtus(nd.mtu, mode.max_frame()).ok_or_else(|| Error::MtuTooSmall {
            ifname: ifname.to_string(),
            mtu: nd.mtu,
        })?;
    let gids = netdev::gid_table(nd.mac, &nd.addrs);
    let port = PortAttr {
        state: if nd.up {
            PortState::Active
        } else {
            PortState::Down
        },
        max_mtu,
        active_mtu: active,
        netdev_mtu: nd.mtu,
        lid: 0,
        // The engine's message size limit (2^31, IBTA §9.7.2 / ibv_devinfo max_msg_sz).
        max_msg_sz: 0x8000_0000,
        gid_tbl_len: gids.len() as u32,
        pkey_tbl_len: 1,
    };
    Ok(DeviceInfo {
        name: format!("xrnic_{ifname}"),
        attr: device_attr(nd.mac, Config::default().max_qp_wr),
        port,
        gid_types: vec![GidType::RoceV2; gids.len()],
        gids,
        netdev: Some(nd),
        af_xdp: Some(mode),
        xdp_mode: match afxdp::XdpModeChoice::from_env() {
            Ok(afxdp::XdpModeChoice::Skb) => Some(afxdp::XdpMode::Skb),
            Ok(afxdp::XdpModeChoice::Native) => Some(afxdp::XdpMode::Native),
            _ => None,
        },
    })
}

impl Device {
    /// Open the device on network interface `netdev` (in the calling thread's network
    /// namespace). Needs root (AF_XDP, XDP).
    pub fn open(netdev: &str) -> Result<Device> {
        Device::open_with(netdev, &DeviceOptions::default())
    }

    /// [`Device::open`] with options. When a device service serves `netdev` in this
    /// network namespace (`xrnic up`, src/service), the device is the service's: every
    /// object lives there, posts and completions go through shared-memory rings, and no
    /// root is needed ([`Device::service_pid`] says so, and a log line at info level);
    /// `opts` are then the service's, not these. Without a service, the device runs in
    /// this process ([`Device::open_in_process`]).
    pub fn open_with(netdev: &str, opts: &DeviceOptions) -> Result<Device> {
        match remote::Conn::connect(netdev)? {
            Some(conn) => Device::open_service(netdev, conn),
            None => Device::open_in_process(netdev, opts),
        }
    }

    /// The device served by the service (see [`Device::open_with`]).
    fn open_service(netdev: &str, conn: remote::Conn) -> Result<Device> {
        let mut info = query_netdev(netdev)?;
        let Some(nd) = info.netdev.clone() else {
            return Err(Error::Io(std::io::Error::other("no interface facts")));
        };
        if let (Some(a), Some(m)) = (
            Mtu::from_bytes(conn.active_mtu),
            Mtu::from_bytes(conn.max_mtu),
        ) {
            info.port.active_mtu = a;
            info.port.max_mtu = m;
        }
        info.attr.max_sge = info.attr.max_sge.min(crate::ipc::MAX_SGE as u32);
        tracing::info!(
            "xrnic_{netdev}: using the device service (pid {}) on {netdev}",
            conn.service_pid
        );
        Ok(Device {
            inner: Arc::new(DevInner {
                name: info.name,
                netdev: netdev.to_string(),
                mac: nd.mac,
                attr: info.attr,
                port: info.port,
                link_up: None,
                gid_types: info.gid_types,
                gids: info.gids,
                mcast: Default::default(),
                backend: DevBackend::Svc {
                    addressing: Addressing::Netdev {
                        ns: netdev::NetNs::current()?,
                        ifname: netdev.to_string(),
                        ifindex: nd.ifindex,
                    },
                    conn: Arc::new(conn),
                },
            }),
        })
    }

    /// The pid of the device service this device goes through, `None` for a device in
    /// this process (or an RDMA device).
    pub fn service_pid(&self) -> Option<u32> {
        match &self.inner.backend {
            DevBackend::Svc { conn, .. } => Some(conn.service_pid),
            _ => None,
        }
    }

    /// [`Device::open_with`], always in this process (never through a service): what
    /// the service itself opens. Needs root (AF_XDP, XDP).
    pub fn open_in_process(netdev: &str, opts: &DeviceOptions) -> Result<Device> {
        afxdp::sys::require_root("opening an xrnic device (AF_XDP and XDP)")?;
        let mut info = query_netdev_with(netdev, afxdp::BufferMode::for_options(&opts.port))?;
        let Some(nd) = info.netdev.clone() else {
            return Err(Error::Io(std::io::Error::other("no interface facts")));
        };
        // Checked before attaching, whose refusal (EBUSY) would not say why. A program
        // still attached may be a process's that just died (kill -9) and is being
        // detached: wait for it as the port waits for a queue still being released.
        if nd.xdp_attached && !netdev::wait_xdp_detached(netdev, XDP_DETACH_PATIENCE)? {
            return Err(Error::XdpBusy {
                ifname: netdev.to_string(),
                waited: XDP_DETACH_PATIENCE,
            });
        }
        let ns = netdev::NetNs::current()?;
        let port = XskPort::open(netdev, opts.queue, opts.port)?;
        if info.af_xdp.as_ref() != Some(port.buffer_mode()) {
            // The bind itself fell back to single-buffer: cap the MTU for what it carries.
            info = query_netdev_with(netdev, port.buffer_mode().clone())?;
        }
        // QPNs from a random start on each open (the peer may still hold the previous
        // process's QPNs: docs/rnic.md); the simulated pair keeps the fixed start.
        let first_qpn = crate::proto::device::random_first_qpn();
        tracing::debug!(netdev, first_qpn, "QPNs start here");
        let cfg = Config {
            mac: nd.mac,
            gids: info.gids.clone(),
            port_mtu: info.port.active_mtu,
            first_qpn,
            ..Config::default()
        }
        .with_rx_capacity(opts.port.rx_frames(
            info.port.active_mtu.bytes() as usize + crate::proto::config::RX_FRAME_OVERHEAD,
        ));
        let dopts = DriverOptions {
            rx_drop: opts.rx_drop,
            rx_ce_mark: opts.rx_ce_mark,
            seed: opts.seed,
            stat_path: opts
                .stat_dir
                .as_ref()
                .map(|d| stat_file(d, netdev))
                .transpose()?,
            stat_interval: opts.stat_interval,
            final_stat_path: opts.final_stat.clone(),
            netdev: netdev.to_string(),
            link: Some(crate::driver::LinkId::new(nd.ifindex, nd.mac)),
            pcap: opts.pcap.clone(),
        };
        let rnic = engine(cfg, opts, line_rate_bps(netdev));
        // Frames to our own MAC (a QP of this device reaching another) loop back
        // inside the driver (crate::driver::loopback), as rxe's do; so do frames to a
        // multicast group one of its QPs is attached to (src/verbs/mcast.rs).
        let mcast = mcast::Memberships::default();
        let io = crate::driver::loopback::Loopback::with_groups(
            Box::new(port),
            nd.mac,
            mcast.loop_groups(),
        )?;
        let driver = Driver::start(rnic, Box::new(io), dopts)?;
        // Opened in the device's namespace, on the opening thread: see link_watch.rs.
        let link_up = link_watch::start(netdev, nd.ifindex, nd.up, Arc::downgrade(driver.shared()));
        Ok(Device {
            inner: Arc::new(DevInner {
                name: info.name,
                netdev: netdev.to_string(),
                mac: nd.mac,
                attr: info.attr,
                port: info.port,
                link_up,
                gid_types: info.gid_types,
                gids: info.gids,
                mcast,
                backend: DevBackend::Soft {
                    addressing: Addressing::Netdev {
                        ns,
                        ifname: netdev.to_string(),
                        ifindex: nd.ifindex,
                    },
                    driver,
                },
            }),
        })
    }

    /// Two devices joined by an in-process link (a Unix datagram socket pair), each with
    /// its own driver thread: "sim0" with MAC 02:00:00:00:00:01, 192.0.2.1 and fd00::1,
    /// and "sim1" with …:02, 192.0.2.2 and fd00::2. Interface MTU 9000 (active MTU
    /// 4096). No root needed.
    pub fn open_sim_pair() -> Result<(Device, Device)> {
        Device::open_sim_pair_with(&DeviceOptions::default(), &DeviceOptions::default())
    }

    /// [`Device::open_sim_pair`] with options per side (`rx_drop`, `seed`, stats).
    pub fn open_sim_pair_with(a: &DeviceOptions, b: &DeviceOptions) -> Result<(Device, Device)> {
        let (ia, ib) = sim_link(proto::MAX_FRAME_LEN + 64)?;
        let side = |n: u8| -> ([u8; 6], Vec<IpAddr>) {
            (
                [0x02, 0, 0, 0, 0, n],
                vec![
                    IpAddr::from([192, 0, 2, n]),
                    IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n)]),
                ],
            )
        };
        let (mac_a, ips_a) = side(1);
        let (mac_b, ips_b) = side(2);
        let da = Device::sim(0, ia, mac_a, &ips_a, &ips_b, mac_b, a)?;
        let db = Device::sim(1, ib, mac_b, &ips_b, &ips_a, mac_a, b)?;
        Ok((da, db))
    }

    fn sim(
        n: u8,
        io: SimIo,
        mac: [u8; 6],
        ips: &[IpAddr],
        peer_ips: &[IpAddr],
        peer_mac: [u8; 6],
        opts: &DeviceOptions,
    ) -> Result<Device> {
        let gids = netdev::gid_table(mac, ips);
        let name = format!("sim{n}");
        let cfg = Config {
            mac,
            gids: gids.clone(),
            ..Config::default()
        };
        let mut peer: Vec<(IpAddr, [u8; 6])> = peer_ips.iter().map(|&ip| (ip, peer_mac)).collect();
        peer.push((
            IpAddr::from(std::net::Ipv6Addr::from(netdev::link_local_gid(peer_mac))),
            peer_mac,
        ));
        let dopts = DriverOptions {
            rx_drop: opts.rx_drop,
            rx_ce_mark: opts.rx_ce_mark,
            seed: opts.seed,
            stat_path: opts
                .stat_dir
                .as_ref()
                .map(|d| stat_file(d, &name))
                .transpose()?,
            stat_interval: opts.stat_interval,
            final_stat_path: opts.final_stat.clone(),
            netdev: name.clone(),
            link: None,
            pcap: opts.pcap.clone(),
        };
        let rnic = engine(cfg, opts, FALLBACK_LINE_RATE_BPS);
        let driver = Driver::start(rnic, Box::new(io), dopts)?;
        let port = PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            netdev_mtu: 9000,
            lid: 0,
            max_msg_sz: 0x8000_0000,
            gid_tbl_len: gids.len() as u32,
            pkey_tbl_len: 1,
        };
        Ok(Device {
            inner: Arc::new(DevInner {
                name: format!("xrnic_{name}"),
                netdev: name,
                mac,
                attr: device_attr(mac, Config::default().max_qp_wr),
                port,
                link_up: None,
                gid_types: vec![GidType::RoceV2; gids.len()],
                gids,
                mcast: Default::default(),
                backend: DevBackend::Soft {
                    addressing: Addressing::Sim { peer },
                    driver,
                },
            }),
        })
    }

    /// The device name (`ibv_get_device_name`): `xrnic_<netdev>`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The network interface the device runs on.
    pub fn netdev(&self) -> &str {
        &self.inner.netdev
    }

    pub fn mac(&self) -> [u8; 6] {
        self.inner.mac
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.inner.attr.clone()
    }

    /// `ibv_query_port` (the only port, 1).
    pub fn query_port(&self) -> PortAttr {
        let mut p = self.inner.port.clone();
        // An in-process device's port follows its link (link_watch.rs), a service's
        // device the port events it forwarded (remote.rs).
        let up = match &self.inner.backend {
            DevBackend::Svc { conn, .. } => conn.port_active(),
            _ => self
                .inner
                .link_up
                .as_ref()
                .map(|u| u.load(std::sync::atomic::Ordering::SeqCst)),
        };
        if let Some(up) = up {
            p.state = if up {
                PortState::Active
            } else {
                PortState::Down
            };
        }
        p
    }

    /// `ibv_query_gid`: the GID at `index`, `None` past the table.
    pub fn query_gid(&self, index: usize) -> Option<Gid> {
        self.inner.gids.get(index).copied()
    }

    /// The whole GID table by index (software: all entries are RoCE v2; an RDMA
    /// device's may hold RoCE v1 entries, see [`Device::gid_type`], and unused all-zero
    /// ones).
    pub fn gid_table(&self) -> &[Gid] {
        &self.inner.gids
    }

    /// The type of GID table entry `index`.
    pub fn gid_type(&self, index: usize) -> Option<GidType> {
        self.inner.gid_types.get(index).copied()
    }

    /// The device is gone (its interface was deleted: IBV_EVENT_DEVICE_FATAL, see
    /// link_watch.rs): verbs that need it fail with [`VerbsError::DeviceFatal`];
    /// destroying objects and polling CQs still work.
    pub fn is_fatal(&self) -> bool {
        if let DevBackend::Svc { conn, .. } = &self.inner.backend {
            return conn.is_fatal();
        }
        self.inner.soft().is_some_and(|s| s.lock().rnic.is_fatal())
    }

    /// Handles of this device besides this one: its clones and the objects made from
    /// it (each holds one).
    pub fn other_handles(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }

    /// The program closes its context (`ibv_close_device`) while objects it never
    /// destroyed still hold the device. The kernel destroys a context's objects when its
    /// file closes (uverbs `ib_uverbs_cleanup_ufile`), so a real RNIC's resources are
    /// free after the close whatever the program left; here the objects' handles would
    /// keep the driver thread, the AF_XDP socket and the XDP program until the process
    /// exits, and the next open of the interface would find it taken. So the device
    /// is made fatal (every QP to ERR, its WRs flushed; verbs on the objects left fail
    /// EIO, as on a disassociated device, src/proto/fatal.rs) and its port is closed
    /// now. Only a software device of this process: returns whether it did so.
    pub fn close_leaving_objects(&self) -> bool {
        let Some(s) = self.inner.soft() else {
            return false;
        };
        s.lock().rnic.device_fatal();
        s.close_port();
        true
    }

    /// Which backend runs this device.
    pub fn backend(&self) -> Backend {
        match self.inner.backend {
            // The service runs the same software device, in its own process.
            DevBackend::Soft { .. } | DevBackend::Svc { .. } => Backend::Software,
            DevBackend::Verbs(_) => Backend::Offload,
        }
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let kind = match &self.inner.backend {
            DevBackend::Soft { driver, .. } => {
                let shared = driver.shared().clone();
                let pd = {
                    let mut g = shared.lock();
                    if g.rnic.is_fatal() {
                        return Err(VerbsError::DeviceFatal.into());
                    }
                    g.rnic.alloc_pd()
                };
                PdKind::Soft(Arc::new(PdInner {
                    _dev: self.clone(),
                    shared,
                    pd,
                }))
            }
            DevBackend::Verbs(ctx) => PdKind::Verbs(Arc::new(ibv::Pd::alloc(ctx)?)),
            DevBackend::Svc { conn, .. } => PdKind::Svc(Arc::new(remote::RemotePd::alloc(conn)?)),
        };
        Ok(Pd {
            dev: self.clone(),
            kind,
        })
    }

    /// `ibv_create_cq` with room for `cqe` completions.
    pub fn create_cq(&self, cqe: usize) -> Result<Cq> {
        let kind = match &self.inner.backend {
            DevBackend::Soft { driver, .. } => {
                let shared = driver.shared().clone();
                let (cq, ready) = {
                    let mut g = shared.lock();
                    if g.rnic.is_fatal() {
                        return Err(VerbsError::DeviceFatal.into());
                    }
                    let cq = g.rnic.create_cq(cqe);
                    let ready = g.rnic.cq_ready(cq).expect("the CQ just created");
                    (cq, ready)
                };
                CqKind::Soft(Arc::new(CqInner {
                    _dev: self.clone(),
                    shared,
                    cq,
                    ready,
                }))
            }
            DevBackend::Verbs(ctx) => CqKind::Verbs(Arc::new(ibv::Cq::create(ctx, cqe)?)),
            DevBackend::Svc { conn, .. } => {
                CqKind::Svc(Arc::new(remote::RemoteCq::create(conn, cqe)?))
            }
        };
        Ok(Cq { kind })
    }

    /// Device counters (all QPs, live and destroyed, plus frame-level drops): the
    /// software engine's. [`Error::Unsupported`] on the offload backend, whose counters
    /// are the kernel's ([`hw_counters`]), not zeros that would read as "nothing
    /// happened".
    /// Set (or clear) a function called after completions may have been added to this
    /// device's CQs, on the thread that added them, with the engine unlocked (software
    /// backend: the libibverbs library's completion channels).
    pub fn set_completion_hook(&self, hook: Option<crate::driver::CompletionHook>) -> Result<()> {
        if let DevBackend::Svc { conn, .. } = &self.inner.backend {
            conn.set_completion_hook(hook);
            return Ok(());
        }
        self.soft_shared("completion hooks")?
            .set_completion_hook(hook);
        Ok(())
    }

    /// Run the completion hook now (after a verb that may have completed work requests
    /// on the caller's thread, such as a modify to the error state).
    pub fn run_completion_hook(&self) {
        if let Some(s) = self.inner.soft() {
            s.run_completion_hook();
        }
    }

    pub fn counters(&self) -> Result<DeviceCounters> {
        Ok(self.soft_shared("device counters")?.lock().rnic.counters())
    }

    /// The software backend's driver, or [`Error::Unsupported`] naming `what` needs it.
    fn soft_shared(&self, what: &'static str) -> Result<&Arc<Shared>> {
        self.inner.soft().ok_or(Error::Unsupported {
            what,
            backend: Backend::Offload,
        })
    }

    /// DCQCN's counters and every QP's rate, target rate and α; `None` when congestion
    /// control is off, and on the offload backend.
    pub fn congestion(&self) -> Option<CongestionStatus> {
        let g = self.inner.soft()?.lock();
        let cc = g.rnic.congestion()?;
        Some(CongestionStatus {
            params: cc.dcqcn_params()?,
            line_rate_bps: cc.line_rate_bps(),
            counters: cc.counters(),
            qps: cc.qp_statuses(),
        })
    }

    /// What the driver thread counted ([`Error::Unsupported`] on the offload backend: it
    /// has no driver thread).
    pub fn driver_stats(&self) -> Result<DriverStats> {
        Ok(self.soft_shared("driver statistics")?.lock().stats)
    }

    /// The port's counters as of the last stat interval ([`Error::Unsupported`] on the
    /// offload backend: see [`hw_counters`]).
    pub fn io_stats(&self) -> Result<IoStats> {
        Ok(self.soft_shared("AF_XDP port counters")?.lock().io)
    }

    /// The hop limit the kernel's routing gives packets to `gid` from this device's
    /// interface: the route's hop-limit metric when it has one, else
    /// `net.ipv4.ip_default_ttl` or `net.ipv6.conf.IF.hop_limit` of its network namespace
    /// (what `ip4_dst_hoplimit` / `ip6_dst_hoplimit` return); 64, the kernel's default, on
    /// the simulated link or when unreadable.
    pub fn route_hop_limit(&self, gid: &Gid) -> u8 {
        let Some(addressing) = self.inner.addressing() else {
            // The kernel picks it for a hardware RNIC (ib_resolve_eth_dmac).
            return DEFAULT_HOP_LIMIT;
        };
        match addressing {
            Addressing::Netdev {
                ns,
                ifname,
                ifindex,
            } => ns
                .run(|| {
                    crate::io::link::route_to(netdev::gid_ip(gid), None, Some(*ifindex))
                        .ok()
                        .and_then(|r| r.hop_limit)
                        .unwrap_or_else(|| sysctl_hop_limit(gid, ifname))
                })
                .unwrap_or(DEFAULT_HOP_LIMIT),
            Addressing::Sim { .. } => DEFAULT_HOP_LIMIT,
        }
    }

    /// The MAC for `gid` (see [`Device::resolve_path`]).
    pub fn resolve_dmac(&self, gid: &Gid) -> Result<[u8; 6]> {
        self.resolve_path(None, gid).map(|(mac, _)| mac)
    }

    /// The next hop's MAC and the hop limit for packets to `dgid` from source GID `sgid`:
    /// the kernel's route to the destination (from `sgid`'s address, out of this
    /// device's interface), the neighbour-table entry of its next hop (the destination on
    /// the link, the router behind one), resolved through the kernel when missing, and
    /// the route's hop limit ([`Device::route_hop_limit`]). On the simulated link, from the
    /// peer's addresses.
    pub fn resolve_path(&self, sgid: Option<&Gid>, dgid: &Gid) -> Result<([u8; 6], u8)> {
        let ip = netdev::gid_ip(dgid);
        if self.inner.addressing().is_some() && self.inner.gids.contains(dgid) {
            // This device's own GID: the frames loop back inside the driver
            // (crate::driver::Loopback), as rxe loops them (rxe_net.c, rxe_loopback).
            return Ok((self.inner.mac, DEFAULT_HOP_LIMIT));
        }
        let Some(addressing) = self.inner.addressing() else {
            return Err(Error::Unsupported {
                what: "MAC resolution (the kernel resolves it for RDMA devices)",
                backend: Backend::Offload,
            });
        };
        match addressing {
            Addressing::Netdev {
                ns,
                ifname,
                ifindex,
            } => {
                let src = sgid.map(netdev::gid_ip);
                Ok(ns.run(|| {
                    netdev::resolve_path(ifname, *ifindex, src, ip).map(|(mac, hl)| {
                        (mac, hl.unwrap_or_else(|| sysctl_hop_limit(dgid, ifname)))
                    })
                })??)
            }
            Addressing::Sim { peer } => peer
                .iter()
                .find(|(a, _)| *a == ip)
                .map(|(_, m)| (*m, DEFAULT_HOP_LIMIT))
                .ok_or_else(|| {
                    Error::Io(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no neighbour {ip} on the simulated link"),
                    ))
                }),
        }
    }
}

/// The kernel's default TTL / hop limit (`IPDEFTTL`).
const DEFAULT_HOP_LIMIT: u8 = 64;

/// The namespace's default hop limit for `gid`'s family from `ifname` (read on a thread
/// inside the namespace: /proc/sys/net shows the reading thread's).
fn sysctl_hop_limit(gid: &Gid, ifname: &str) -> u8 {
    let path = if gid_is_ipv4(gid) {
        "/proc/sys/net/ipv4/ip_default_ttl".to_string()
    } else {
        format!("/proc/sys/net/ipv6/conf/{ifname}/hop_limit")
    };
    std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.trim().parse::<u8>().ok())
        .filter(|&h| h > 0)
        .unwrap_or(DEFAULT_HOP_LIMIT)
}

#[derive(Debug)]
struct PdInner {
    _dev: Device,
    shared: Arc<Shared>,
    pd: proto::Pd,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Every MR and QP of this PD holds this PdInner, so none is left: this succeeds
        // (a failure would be a bug: logged, not hidden).
        if let Err(e) = self.shared.lock().rnic.dealloc_pd(self.pd) {
            tracing::error!("dealloc_pd: {e}");
        }
    }
}

#[derive(Clone, Debug)]
enum PdKind {
    Soft(Arc<PdInner>),
    Verbs(Arc<ibv::Pd>),
    Svc(Arc<remote::RemotePd>),
}

/// A protection domain (`struct ibv_pd`).
#[derive(Clone, Debug)]
pub struct Pd {
    dev: Device,
    kind: PdKind,
}

impl Pd {
    /// `ibv_reg_mr`: a zeroed region of `length` bytes owned by the device (software:
    /// engine memory; offload: a page-aligned buffer registered with the RNIC).
    pub fn reg_mr(&self, length: usize, access: Access) -> Result<Mr> {
        match &self.kind {
            PdKind::Soft(pd) => {
                let info = pd.shared.lock().rnic.reg_mr(pd.pd, length, access)?;
                Ok(Mr {
                    lkey: info.lkey,
                    rkey: info.rkey,
                    addr: info.addr,
                    length: info.length,
                    kind: MrKind::Soft(pd.clone()),
                })
            }
            PdKind::Verbs(pd) => {
                let mr = ibv::Mr::reg(pd, length, access)?;
                Ok(Mr {
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                    addr: mr.addr(),
                    length: mr.len(),
                    kind: MrKind::Verbs(mr),
                })
            }
            PdKind::Svc(pd) => {
                let (addr, words, mem) = remote::RemoteMr::alloc(length)?;
                let (lkey, rkey) = pd.reg(addr, length, addr, access.0)?;
                Ok(Mr {
                    lkey: Lkey(lkey),
                    rkey: Rkey(rkey),
                    addr,
                    length,
                    kind: MrKind::Svc(remote::RemoteMr::new_owned(pd, lkey, words, mem)),
                })
            }
        }
    }

    /// Register `len` bytes at `addr` of the address space `space` (the device service
    /// registers its clients' buffers so): the engine reads and writes them through it
    /// ([`proto::UserMem::in_space`]). The first and last byte are read now, so an
    /// unmapped range fails here (EFAULT) rather than at the first packet. Software
    /// backend in this process only.
    pub fn reg_process_mr(
        &self,
        space: &std::sync::Arc<proto::AddressSpace>,
        addr: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Mr> {
        let PdKind::Soft(pd) = &self.kind else {
            return Err(Error::Unsupported {
                what: "registering another process's memory",
                backend: self.dev.backend(),
            });
        };
        let mem = proto::UserMem::in_space(space.clone(), addr, len).ok_or(Error::Verbs(
            VerbsError::Resource("a NULL or wrapping address range"),
        ))?;
        let mut b = [0u8; 1];
        if len > 0 && !(mem.read(0, &mut b) && mem.read(len - 1, &mut b)) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(14)));
        }
        let info = pd
            .shared
            .lock()
            .rnic
            .reg_user_mr(pd.pd, mem, iova, access)?;
        Ok(Mr {
            lkey: info.lkey,
            rkey: info.rkey,
            addr: info.addr,
            length: info.length,
            kind: MrKind::Soft(pd.clone()),
        })
    }

    /// `ibv_create_qp` for an RC QP; it starts in RESET.
    /// Register `len` bytes of this process's memory at `addr` as a memory region whose
    /// I/O virtual address is `iova` (`addr` for `ibv_reg_mr`; any value for
    /// `ibv_reg_mr_iova2`). The engine reads and writes those bytes in place, with raw
    /// copies only (never a Rust reference over them), from its driver thread;
    /// [`Mr::read`] and friends refuse such a region (the caller has the bytes).
    ///
    /// # Safety
    /// `addr..addr+len` must stay mapped, readable and writable until the returned [`Mr`]
    /// is dropped. Its content may change under the caller at any time while RDMA
    /// operations run (as with any RNIC).
    pub unsafe fn reg_user_mr(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Mr> {
        match &self.kind {
            PdKind::Soft(pd) => {
                // SAFETY: the caller upholds UserMem::new's contract (this fn's contract).
                let mem = unsafe { proto::UserMem::new(addr, len) }.ok_or(Error::Verbs(
                    VerbsError::Resource("a NULL or wrapping address range"),
                ))?;
                let info = pd
                    .shared
                    .lock()
                    .rnic
                    .reg_user_mr(pd.pd, mem, iova, access)?;
                Ok(Mr {
                    lkey: info.lkey,
                    rkey: info.rkey,
                    addr: info.addr,
                    length: info.length,
                    kind: MrKind::Soft(pd.clone()),
                })
            }
            PdKind::Verbs(_) => Err(Error::Unsupported {
                what: "registering the caller's memory",
                backend: Backend::Offload,
            }),
            PdKind::Svc(pd) => {
                let (lkey, rkey) = pd.reg(addr as u64, len, iova, access.0)?;
                Ok(Mr {
                    lkey: Lkey(lkey),
                    rkey: Rkey(rkey),
                    addr: iova,
                    length: len,
                    kind: MrKind::Svc(remote::RemoteMr::new_user(pd, lkey)),
                })
            }
        }
    }

    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        match (&self.kind, &init.send_cq.kind, &init.recv_cq.kind) {
            (PdKind::Soft(pd), CqKind::Soft(scq), CqKind::Soft(rcq)) => {
                if !Arc::ptr_eq(&pd.shared, &scq.shared) || !Arc::ptr_eq(&pd.shared, &rcq.shared) {
                    return Err(Error::DeviceMismatch);
                }
                let attr = proto::QpInitAttr {
                    send_cq: scq.cq,
                    recv_cq: rcq.cq,
                    max_send_wr: init.max_send_wr,
                    max_recv_wr: init.max_recv_wr,
                    sq_sig_all: init.sq_sig_all,
                    qp_type: proto::QpType::Rc,
                    srq: None,
                };
                let qpn = {
                    let mut g = pd.shared.lock();
                    let q = g.rnic.create_qp(pd.pd, &attr)?;
                    g.qps.insert(q, ());
                    q
                };
                Ok(Qp {
                    qpn,
                    dev: self.dev.clone(),
                    kind: QpKind::Soft {
                        pd: pd.clone(),
                        _cqs: [scq.clone(), rcq.clone()],
                        _srq: None,
                    },
                })
            }
            (PdKind::Svc(pd), CqKind::Svc(scq), CqKind::Svc(rcq)) => {
                remote::create_qp(&self.dev, pd, [scq, rcq], init, proto::QpType::Rc, None)
            }
            (PdKind::Verbs(pd), CqKind::Verbs(scq), CqKind::Verbs(rcq)) => {
                let caps = ibv::QpCaps {
                    max_send_wr: init.max_send_wr,
                    max_recv_wr: init.max_recv_wr,
                    // Enough for any list the CLI and tests build, within every RNIC's
                    // limit (rxe 32, ConnectX-5 30).
                    max_sge: self.dev.inner.attr.max_sge.min(16),
                    sq_sig_all: init.sq_sig_all,
                };
                let qp = ibv::Qp::create(pd, scq, rcq, caps)?;
                Ok(Qp {
                    qpn: qp.qp_num(),
                    dev: self.dev.clone(),
                    kind: QpKind::Verbs(qp),
                })
            }
            _ => Err(Error::DeviceMismatch),
        }
    }
}

#[derive(Debug)]
struct CqInner {
    _dev: Device,
    shared: Arc<Shared>,
    cq: proto::Cq,
    /// The CQ's count of waiting completions, read without the engine's lock: an empty
    /// poll (programs poll in tight loops) takes no lock for its look.
    ready: Arc<std::sync::atomic::AtomicUsize>,
}

impl CqInner {
    /// Completions may be waiting (a hint: the drain under the lock decides).
    fn has_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// Drain under the engine's lock, unless the lock-free count says there is nothing.
    fn drain(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        if !self.has_ready() {
            return 0;
        }
        self.shared.lock().rnic.poll_cq(self.cq, max, out)
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Every QP using this CQ holds this CqInner, so none is left (a failure would be
        // a bug: logged, not hidden).
        if let Err(e) = self.shared.lock().rnic.destroy_cq(self.cq) {
            tracing::error!("destroy_cq: {e}");
        }
    }
}

#[derive(Clone, Debug)]
enum CqKind {
    Soft(Arc<CqInner>),
    Verbs(Arc<ibv::Cq>),
    Svc(Arc<remote::RemoteCq>),
}

/// A completion queue (`struct ibv_cq`).
#[derive(Clone, Debug)]
pub struct Cq {
    kind: CqKind,
}

impl Cq {
    /// `ibv_poll_cq`: up to `max` completions that are there now. When there is none, the
    /// calling thread receives waiting frames, runs due timers and transmits (busy
    /// polling, see [`crate::driver::poll`]) and looks again, so a loop of `poll` needs
    /// no other thread to wake up.
    pub fn poll(&self, max: usize) -> Vec<WorkCompletion> {
        let mut v = Vec::new();
        self.poll_into(max, &mut v);
        v
    }

    /// [`Cq::poll`] appending to `out`; returns how many were added. A failing
    /// `ibv_poll_cq` (offload backend: the CQ overran or the device died) is logged and
    /// reads as no completion; [`Cq::try_poll_into`] returns it.
    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        self.try_poll_into(max, out).unwrap_or_else(|e| {
            tracing::error!("poll_cq: {e}");
            0
        })
    }

    /// [`Cq::poll_into`] with the offload backend's errors. On the software backend an
    /// empty poll makes progress on the calling thread (busy polling, see
    /// [`crate::driver::poll`]) and looks again.
    pub fn try_poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        match &self.kind {
            CqKind::Soft(cq) => {
                // An empty CQ is seen without the engine's lock: a program polling in a
                // tight loop would otherwise take it on every call and starve the driver
                // thread that wants it to make the completions.
                let s = &cq.shared;
                let n = cq.drain(max, out);
                if n > 0 {
                    s.poll_found();
                    return Ok(n);
                }
                // The step takes what it completed under its own engine lock.
                let Some(n) = s.poll_progress_into(cq.cq, max, out) else {
                    return Ok(0);
                };
                if n > 0 {
                    s.poll_found();
                } else {
                    // Nothing to return: the ACKs the step deferred (hoping to leave with
                    // the caller's answer) go now.
                    s.flush_deferred();
                }
                Ok(n)
            }
            CqKind::Verbs(cq) => cq.poll_into(max, out),
            CqKind::Svc(cq) => Ok(cq.poll_into(max, out)),
        }
    }

    /// Take up to `max` completions that are there now, and nothing else: no busy
    /// polling of the port and no poll lease (the device service moves completions to
    /// its clients with it when the completion hook says there are some; a lease would
    /// make the driver stop watching the socket for a poller that is not there).
    pub fn take_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        match &self.kind {
            CqKind::Soft(cq) => cq.drain(max, out),
            _ => self.poll_into(max, out),
        }
    }

    /// Wait up to `timeout` for completions, then return up to `max` of them (empty on
    /// timeout). Sleeps on a condition variable (software: signalled by whichever call
    /// adds a completion, a frame or timer of the driver or a verb such as a flush on
    /// modify to ERR) or on the CQ's completion channel (offload); no spinning. Like `ibv_get_cq_event` +
    /// `ibv_poll_cq` in one call.
    /// How many completions wait in this CQ (software backend; the offload backend
    /// cannot tell without polling: `Unsupported`).
    /// `ibv_resize_cq`: room for `cqe` completions, those queued kept; fewer than are
    /// queued is refused (EINVAL, as rxe). [`Error::Unsupported`] on the offload backend.
    pub fn resize(&self, cqe: usize) -> Result<()> {
        match &self.kind {
            CqKind::Soft(cq) => cq
                .shared
                .lock()
                .rnic
                .resize_cq(cq.cq, cqe)
                .map_err(Error::Verbs),
            CqKind::Svc(cq) => cq.resize(cqe),
            CqKind::Verbs(_) => Err(Error::Unsupported {
                what: "resizing a CQ",
                backend: Backend::Offload,
            }),
        }
    }

    pub fn pending(&self) -> Result<usize> {
        match &self.kind {
            CqKind::Soft(cq) => Ok(cq.ready.load(std::sync::atomic::Ordering::Acquire)),
            CqKind::Svc(cq) => Ok(cq.pending()),
            CqKind::Verbs(_) => Err(Error::Unsupported {
                what: "counting a CQ's completions",
                backend: Backend::Offload,
            }),
        }
    }

    pub fn wait(&self, max: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let mut v = Vec::new();
        self.wait_into(max, timeout, &mut v);
        v
    }

    /// [`Cq::wait`] for request/response exchanges (`rc-pingpong -e`): the calling
    /// thread sleeps on the device's socket and receives on its own thread, saving the
    /// driver thread's wake-up per message (when another thread already waits this way,
    /// like [`Cq::wait`]). A stream of messages does better with [`Cq::wait`], where the
    /// driver thread receives and batches beside the application. On the offload backend
    /// it is [`Cq::wait_into`].
    pub fn wait_receiving(
        &self,
        max: usize,
        timeout: Duration,
        out: &mut Vec<WorkCompletion>,
    ) -> usize {
        match &self.kind {
            CqKind::Soft(cq) => cq.shared.wait_cq_receiving(cq.cq, max, out, timeout),
            CqKind::Verbs(_) | CqKind::Svc(_) => self.wait_into(max, timeout, out),
        }
    }

    /// [`Cq::wait`] appending to `out`; returns how many were added (errors as in
    /// [`Cq::poll_into`]).
    pub fn wait_into(&self, max: usize, timeout: Duration, out: &mut Vec<WorkCompletion>) -> usize {
        match &self.kind {
            CqKind::Soft(cq) => cq.shared.wait_cq(cq.cq, max, out, timeout),
            CqKind::Verbs(cq) => cq.wait_into(max, timeout, out).unwrap_or_else(|e| {
                tracing::error!("wait for completions: {e}");
                0
            }),
            CqKind::Svc(cq) => cq.wait_into(max, timeout, out),
        }
    }
}

//! The public API: a libibverbs-shaped interface to an xrnic device.
//!
//! Contract:
//! - [`Device::open`] takes a network interface name (in the caller's network namespace),
//!   attaches the XDP filter and an AF_XDP socket, builds the GID table and active MTU
//!   from the interface ([`netdev`]), and starts the driver thread ([`crate::driver`]).
//!   [`Device::open_sim_pair`] gives two devices joined by an in-process link, for
//!   examples and tests without root.
//! - Objects are named like their libibverbs counterparts: [`Device`] (`ibv_context`),
//!   [`Pd`], [`Mr`], [`Cq`], [`Qp`] (RC), with `query_device`, `query_port`,
//!   `query_gid`, `alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify`, `query`,
//!   `post_send`, `post_recv`, `poll`. [`Cq::wait`] blocks until a completion arrives
//!   (the driver signals a condition variable), instead of spinning.
//! - Every object frees itself on drop, in a safe order: a [`Qp`] keeps its PD and CQs
//!   alive, an [`Mr`] its PD, all of them the device; the device's driver thread stops
//!   and the XDP program is detached when the last handle goes. Memory regions are owned
//!   by the engine (plain heap memory, nothing pinned); read and write them through
//!   [`Mr::read`], [`Mr::write`], [`Mr::with`] and [`Mr::with_mut`].
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

pub mod netdev;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::driver::{Driver, DriverOptions, DriverStats, Shared, SimIo, sim_link};
use crate::io::afxdp::{self, PortOptions, XskPort};
use crate::proto::congestion::{Algorithm, CongestionControl, Pacer};
use crate::proto::{self, Config, MrInfo, Rnic, gid_is_ipv4};

pub use crate::proto::congestion::{CongestionCounters, DcqcnParams, QpRateStatus};

pub use crate::driver::IoStats;
pub use crate::proto::{
    Access, AddressVector, AtomicInfo, AttrMask, DeviceCounters, Mtu, QpAttr, QpCounters, QpState,
    RdmaInfo, RecvWr, SendFlags, SendWr, Sge, VerbsError, WcOpcode, WcStatus, WorkCompletion,
    WrOpcode,
};
pub use crate::wire::{Lkey, Psn, Qpn, Rkey};

/// A GID: 16 bytes, an IPv6 address or an IPv4-mapped one.
pub type Gid = [u8; 16];

/// Why an API call failed.
#[derive(Debug)]
pub enum Error {
    /// Opening the AF_XDP port: not root, interface missing, XDP attach refused, queue
    /// already in use, ...
    Port(afxdp::Error),
    /// Reading the interface or the neighbour table, or starting the driver.
    Io(std::io::Error),
    /// The interface MTU leaves no room for even a 256-byte IB MTU.
    MtuTooSmall { ifname: String, mtu: u32 },
    /// The engine refused the verb.
    Verbs(VerbsError),
    /// A path MTU above the port's active MTU would make frames the link drops.
    PathMtuTooLarge { requested: u32, active: u32 },
    /// Source and destination GIDs of different IP versions.
    GidFamilyMismatch { sgid_index: u8 },
    /// The interface already has an XDP program: another device is open on it.
    XdpBusy { ifname: String },
    /// A range outside a memory region.
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Port(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::MtuTooSmall { ifname, mtu } => write!(
                f,
                "{ifname}: MTU {mtu} is too small for RoCE (needs at least {})",
                256 + netdev::MAX_HDR_LENGTH
            ),
            Error::Verbs(e) => write!(f, "{e}"),
            Error::PathMtuTooLarge { requested, active } => write!(
                f,
                "path MTU {requested} exceeds the port's active MTU {active}"
            ),
            Error::GidFamilyMismatch { sgid_index } => write!(
                f,
                "source GID {sgid_index} and the destination GID are not both IPv4 or both IPv6"
            ),
            Error::XdpBusy { ifname } => write!(
                f,
                "{ifname} already has an XDP program attached: is an xrnic device open on it \
                 in another process? (`ip link show dev {ifname}` shows the program)"
            ),
            Error::OutOfBounds { offset, len, size } => write!(
                f,
                "bytes {offset}..{} are outside the {size}-byte memory region",
                offset + len
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        Error::Verbs(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<afxdp::Error> for Error {
    fn from(e: afxdp::Error) -> Self {
        Error::Port(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

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
    /// DCQCN congestion control with these parameters (`None`: off, nothing changes on
    /// the wire). On: data frames are ECT(0) unless the QP's traffic class sets the ECN
    /// field, CE-marked packets are answered with CNPs (notification point), received CNPs
    /// cut the QP's rate and a pacer holds it there (reaction point); see
    /// docs/congestion.md. [`DEFAULT_DCQCN`] is the default.
    pub dcqcn: Option<DcqcnParams>,
}

/// Whether devices run DCQCN unless told otherwise: off, until a quiet `make bench-net`
/// shows it costs nothing (docs/congestion.md, "On real devices").
pub const DEFAULT_DCQCN: Option<DcqcnParams> = None;

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
            dcqcn: DEFAULT_DCQCN,
        }
    }
}

/// The directory `xrnic` tools write stat snapshots to.
pub const STAT_DIR: &str = "/run/xrnic";

/// The stat snapshot file of `netdev` in the calling thread's network namespace:
/// `<dir>/<netdev>.<netns inode>.json`. The inode keeps two namespaces' `eth0` apart;
/// `xrnic stat` run in the same namespace finds the same file.
pub fn stat_file(dir: &std::path::Path, netdev: &str) -> std::io::Result<PathBuf> {
    let ino = netns_inode()?;
    Ok(dir.join(format!("{netdev}.{ino}.json")))
}

/// The inode of the calling thread's network namespace.
fn netns_inode() -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// Every stat snapshot of the calling thread's network namespace in `dir`, as
/// `(netdev, path)` sorted by netdev: the devices `xrnic res` lists without `--netdev`.
/// A missing `dir` is no snapshot, not an error.
pub fn stat_files(dir: &std::path::Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let suffix = format!(".{}.json", netns_inode()?);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        // Interface names may hold dots (`eth0.100`): strip the suffix, not split.
        if let Some(netdev) = name.strip_suffix(&suffix).filter(|n| !n.is_empty()) {
            out.push((netdev.to_string(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

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
    Down = 1,
    Active = 4,
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
    gids: Vec<Gid>,
    addressing: Addressing,
    // Last: dropped after everything above, and it joins the thread and detaches XDP.
    driver: Driver,
}

impl DevInner {
    fn shared(&self) -> &Shared {
        self.driver.shared()
    }
}

/// An open device (`struct ibv_context`). Cheap to clone; the driver runs until the last
/// clone and the last object made from it are dropped.
#[derive(Clone, Debug)]
pub struct Device {
    inner: Arc<DevInner>,
}

/// What [`Device::open`] reads from an interface, without opening it (`xrnic devinfo`).
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub netdev: netdev::NetdevInfo,
    pub attr: DeviceAttr,
    pub port: PortAttr,
    pub gids: Vec<Gid>,
}

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
        max_cqe: 0x10_0000,
        max_mr: 0x00ff_fffe,
        max_pd: 0x1_0000,
        // What modify_qp accepts for max_rd_atomic / max_dest_rd_atomic (rxe reports 128,
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

/// Query an interface the way [`Device::open`] would see it, without opening it.
pub fn query_netdev(ifname: &str) -> Result<DeviceInfo> {
    let nd = netdev::probe(ifname)?;
    let active = netdev::active_mtu(nd.mtu).ok_or_else(|| Error::MtuTooSmall {
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
        max_mtu: Mtu::Mtu4096,
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
        gids,
        netdev: nd,
    })
}

impl Device {
    /// Open the device on network interface `netdev` (in the calling thread's network
    /// namespace). Needs root (AF_XDP, XDP).
    pub fn open(netdev: &str) -> Result<Device> {
        Device::open_with(netdev, &DeviceOptions::default())
    }

    /// [`Device::open`] with options.
    pub fn open_with(netdev: &str, opts: &DeviceOptions) -> Result<Device> {
        afxdp::sys::require_root("opening an xrnic device (AF_XDP and XDP)")?;
        let info = query_netdev(netdev)?;
        // Checked first so that the answer is immediate: attaching would be refused with
        // EBUSY only after the port's retries (meant for a queue still being released).
        if info.netdev.xdp_attached {
            return Err(Error::XdpBusy {
                ifname: netdev.to_string(),
            });
        }
        let ns = netdev::NetNs::current()?;
        let port = XskPort::open(netdev, opts.queue, opts.port)?;
        let cfg = Config {
            mac: info.netdev.mac,
            gids: info.gids.clone(),
            ..Config::default()
        };
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
            netdev: netdev.to_string(),
        };
        let rnic = engine(cfg, opts, line_rate_bps(netdev));
        let driver = Driver::start(rnic, Box::new(port), dopts)?;
        Ok(Device {
            inner: Arc::new(DevInner {
                name: info.name,
                netdev: netdev.to_string(),
                mac: info.netdev.mac,
                attr: info.attr,
                port: info.port,
                gids: info.gids,
                addressing: Addressing::Netdev {
                    ns,
                    ifname: netdev.to_string(),
                    ifindex: info.netdev.ifindex,
                },
                driver,
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
        let (ia, ib) = sim_link()?;
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
            netdev: name.clone(),
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
                gids,
                addressing: Addressing::Sim { peer },
                driver,
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
        self.inner.port.clone()
    }

    /// `ibv_query_gid`: the GID at `index`, `None` past the table.
    pub fn query_gid(&self, index: usize) -> Option<Gid> {
        self.inner.gids.get(index).copied()
    }

    /// The whole GID table (all entries are RoCE v2).
    pub fn gid_table(&self) -> &[Gid] {
        &self.inner.gids
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let pd = self.inner.shared().lock().rnic.alloc_pd();
        Ok(Pd {
            inner: Arc::new(PdInner {
                dev: self.clone(),
                pd,
            }),
        })
    }

    /// `ibv_create_cq` with room for `cqe` completions.
    pub fn create_cq(&self, cqe: usize) -> Result<Cq> {
        let cq = self.inner.shared().lock().rnic.create_cq(cqe);
        Ok(Cq {
            inner: Arc::new(CqInner {
                dev: self.clone(),
                cq,
            }),
        })
    }

    /// Device counters (all QPs, live and destroyed, plus frame-level drops).
    pub fn counters(&self) -> DeviceCounters {
        self.inner.shared().lock().rnic.counters()
    }

    /// DCQCN's counters and every QP's rate, target rate and α; `None` when congestion
    /// control is off.
    pub fn congestion(&self) -> Option<CongestionStatus> {
        let g = self.inner.shared().lock();
        let cc = g.rnic.congestion()?;
        Some(CongestionStatus {
            params: cc.dcqcn_params()?,
            line_rate_bps: cc.line_rate_bps(),
            counters: cc.counters(),
            qps: cc.qp_statuses(),
        })
    }

    /// What the driver thread counted.
    pub fn driver_stats(&self) -> DriverStats {
        self.inner.shared().lock().stats
    }

    /// The port's counters as of the last stat interval.
    pub fn io_stats(&self) -> IoStats {
        self.inner.shared().lock().io
    }

    fn shared(&self) -> &Shared {
        self.inner.shared()
    }

    /// The hop limit the kernel's routing gives packets to `gid` from this device's
    /// interface: `net.ipv4.ip_default_ttl` or `net.ipv6.conf.IF.hop_limit` of its network
    /// namespace (what `ip4_dst_hoplimit` / `ip6_dst_hoplimit` return without a route
    /// metric); 64, the kernel's default, on the simulated link or when unreadable.
    pub fn route_hop_limit(&self, gid: &Gid) -> u8 {
        const DEFAULT: u8 = 64;
        match &self.inner.addressing {
            Addressing::Netdev { ns, ifname, .. } => {
                let path = if gid_is_ipv4(gid) {
                    "/proc/sys/net/ipv4/ip_default_ttl".to_string()
                } else {
                    format!("/proc/sys/net/ipv6/conf/{ifname}/hop_limit")
                };
                // /proc/sys/net shows the network namespace of the reading thread.
                ns.run(|| std::fs::read_to_string(&path))
                    .ok()
                    .and_then(|r| r.ok())
                    .and_then(|t| t.trim().parse::<u8>().ok())
                    .filter(|&h| h > 0)
                    .unwrap_or(DEFAULT)
            }
            Addressing::Sim { .. } => DEFAULT,
        }
    }

    /// The MAC for `gid`, from the neighbour table (resolving it through the kernel when
    /// missing) or, on the simulated link, from the peer's addresses.
    pub fn resolve_dmac(&self, gid: &Gid) -> Result<[u8; 6]> {
        let ip = netdev::gid_ip(gid);
        match &self.inner.addressing {
            Addressing::Netdev {
                ns,
                ifname,
                ifindex,
            } => Ok(ns.run(|| netdev::resolve_neighbour(ifname, *ifindex, ip))??),
            Addressing::Sim { peer } => peer
                .iter()
                .find(|(a, _)| *a == ip)
                .map(|(_, m)| *m)
                .ok_or_else(|| {
                    Error::Io(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no neighbour {ip} on the simulated link"),
                    ))
                }),
        }
    }
}

#[derive(Debug)]
struct PdInner {
    dev: Device,
    pd: proto::Pd,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Every MR and QP of this PD holds this PdInner, so none is left: this succeeds.
        let _ = self.dev.shared().lock().rnic.dealloc_pd(self.pd);
    }
}

/// A protection domain (`struct ibv_pd`).
#[derive(Clone, Debug)]
pub struct Pd {
    inner: Arc<PdInner>,
}

impl Pd {
    /// `ibv_reg_mr`: a zeroed region of `length` bytes owned by the device.
    pub fn reg_mr(&self, length: usize, access: Access) -> Result<Mr> {
        let info = self
            .inner
            .dev
            .shared()
            .lock()
            .rnic
            .reg_mr(self.inner.pd, length, access)?;
        Ok(Mr {
            pd: self.inner.clone(),
            info,
        })
    }

    /// `ibv_create_qp` for an RC QP; it starts in RESET.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        let dev = &self.inner.dev;
        let attr = proto::QpInitAttr {
            send_cq: init.send_cq.inner.cq,
            recv_cq: init.recv_cq.inner.cq,
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.max_recv_wr,
            sq_sig_all: init.sq_sig_all,
        };
        let qpn = {
            let mut g = dev.shared().lock();
            let q = g.rnic.create_qp(self.inner.pd, &attr)?;
            g.qps.insert(q, ());
            q
        };
        Ok(Qp {
            qpn,
            _cqs: [init.send_cq.inner.clone(), init.recv_cq.inner.clone()],
            pd: self.inner.clone(),
        })
    }
}

/// A memory region (`struct ibv_mr`).
#[derive(Debug)]
pub struct Mr {
    pd: Arc<PdInner>,
    info: MrInfo,
}

impl Mr {
    pub fn lkey(&self) -> Lkey {
        self.info.lkey
    }
    pub fn rkey(&self) -> Rkey {
        self.info.rkey
    }
    /// The address of the first byte, in the device's address space (what SGEs, RETHs
    /// and atomic requests name).
    pub fn addr(&self) -> u64 {
        self.info.addr
    }
    pub fn len(&self) -> usize {
        self.info.length
    }
    pub fn is_empty(&self) -> bool {
        self.info.length == 0
    }

    /// A scatter/gather element for bytes `offset..offset + length` of this region.
    pub fn sge(&self, offset: usize, length: u32) -> Sge {
        Sge {
            addr: self.info.addr + offset as u64,
            length,
            lkey: self.info.lkey,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.info.length) {
            return Err(Error::OutOfBounds {
                offset,
                len,
                size: self.info.length,
            });
        }
        Ok(())
    }

    /// Copy bytes out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        self.with(|b| out.copy_from_slice(&b[offset..offset + out.len()]))
    }

    /// Copy bytes into the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        self.with_mut(|b| b[offset..offset + data.len()].copy_from_slice(data))
    }

    /// Look at the region's bytes (the device is locked meanwhile: keep it short).
    pub fn with<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
        let g = self.pd.dev.shared().lock();
        let b = g
            .rnic
            .mr_bytes(self.info.lkey)
            .ok_or(VerbsError::NotFound("memory region"))?;
        Ok(f(b))
    }

    /// Change the region's bytes (the device is locked meanwhile: keep it short).
    pub fn with_mut<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> Result<T> {
        let mut g = self.pd.dev.shared().lock();
        let b = g
            .rnic
            .mr_bytes_mut(self.info.lkey)
            .ok_or(VerbsError::NotFound("memory region"))?;
        Ok(f(b))
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _ = self.pd.dev.shared().lock().rnic.dereg_mr(self.info.lkey);
    }
}

#[derive(Debug)]
struct CqInner {
    dev: Device,
    cq: proto::Cq,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Every QP using this CQ holds this CqInner, so none is left.
        let _ = self.dev.shared().lock().rnic.destroy_cq(self.cq);
    }
}

/// A completion queue (`struct ibv_cq`).
#[derive(Clone, Debug)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl Cq {
    /// `ibv_poll_cq`: up to `max` completions that are there now.
    pub fn poll(&self, max: usize) -> Vec<WorkCompletion> {
        let mut v = Vec::new();
        self.poll_into(max, &mut v);
        v
    }

    /// [`Cq::poll`] appending to `out`; returns how many were added.
    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        self.inner
            .dev
            .shared()
            .lock()
            .rnic
            .poll_cq(self.inner.cq, max, out)
    }

    /// Wait up to `timeout` for completions, then return up to `max` of them (empty on
    /// timeout). Sleeps on a condition variable the driver signals; no spinning. Like
    /// `ibv_get_cq_event` + `ibv_poll_cq` in one call.
    pub fn wait(&self, max: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let mut v = Vec::new();
        self.wait_into(max, timeout, &mut v);
        v
    }

    /// [`Cq::wait`] appending to `out`; returns how many were added.
    pub fn wait_into(&self, max: usize, timeout: Duration, out: &mut Vec<WorkCompletion>) -> usize {
        self.inner
            .dev
            .shared()
            .wait_cq(self.inner.cq, max, out, timeout)
    }
}

/// Creation attributes of an RC QP (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    pub send_cq: &'a Cq,
    pub recv_cq: &'a Cq,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// Both queues `depth` deep, only signaled sends complete.
    pub fn new(send_cq: &'a Cq, recv_cq: &'a Cq, depth: u32) -> Self {
        QpInitAttr {
            send_cq,
            recv_cq,
            max_send_wr: depth,
            max_recv_wr: depth,
            sq_sig_all: false,
        }
    }
}

/// What the other end announces (ibv_rc_pingpong's `pingpong_dest`, without the LID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    pub qpn: Qpn,
    /// The first PSN the remote end sends (our expected receive PSN).
    pub psn: u32,
    pub gid: Gid,
}

/// Attributes [`Qp::connect`] uses besides the remote's values; the defaults are
/// ibv_rc_pingpong's (`pp_connect_ctx`).
#[derive(Clone, Copy, Debug)]
pub struct ConnectOpts {
    pub access: Access,
    pub path_mtu: Mtu,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// IP hop limit / TTL; rc_pingpong sets 1. Like ib_core, `modify` replaces it with
    /// the route's hop limit unless the destination GID is link-local.
    pub hop_limit: u8,
    pub traffic_class: u8,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            access: Access::LOCAL_WRITE,
            path_mtu: Mtu::Mtu1024,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            hop_limit: 1,
            traffic_class: 0,
        }
    }
}

/// An RC queue pair (`struct ibv_qp`).
#[derive(Debug)]
pub struct Qp {
    qpn: Qpn,
    pd: Arc<PdInner>,
    _cqs: [Arc<CqInner>; 2],
}

impl Qp {
    pub fn qp_num(&self) -> Qpn {
        self.qpn
    }

    fn dev(&self) -> &Device {
        &self.pd.dev
    }

    /// `ibv_modify_qp`. With [`AttrMask::AV`] and an all-zero `dmac`, the MAC of `dgid` is
    /// looked up (and resolved) in the kernel's neighbour table first.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let dev = self.dev();
        let mut attr = *attr;
        if mask.contains(AttrMask::PATH_MTU) {
            let active = dev.inner.port.active_mtu;
            if attr.path_mtu.bytes() > active.bytes() {
                return Err(Error::PathMtuTooLarge {
                    requested: attr.path_mtu.bytes(),
                    active: active.bytes(),
                });
            }
        }
        if mask.contains(AttrMask::AV) {
            let av = &mut attr.ah_attr;
            if let Some(sgid) = dev.query_gid(usize::from(av.sgid_index)) {
                if gid_is_ipv4(&sgid) != gid_is_ipv4(&av.dgid) {
                    return Err(Error::GidFamilyMismatch {
                        sgid_index: av.sgid_index,
                    });
                }
            }
            if av.dmac == [0; 6] {
                av.dmac = dev.resolve_dmac(&av.dgid)?;
            }
            // ib_core's `ib_resolve_eth_dmac` (drivers/infiniband/core/verbs.c), run on
            // every RoCE modify with an address vector of a connected QP, replaces the
            // GRH hop limit with the route's (`rdma_addr_find_l2_eth_by_grh`) unless the
            // destination GID is link-local. So rxe and ConnectX send TTL / hop limit 64
            // where ibv_rc_pingpong asks for 1, and so do we (seen against rxe: ours was 1).
            if !netdev::gid_is_link_local(&av.dgid) {
                av.hop_limit = dev.route_hop_limit(&av.dgid);
            }
        }
        dev.shared().lock().rnic.modify_qp(self.qpn, &attr, mask)?;
        dev.shared().kick();
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.dev().shared().lock().rnic.query_qp(self.qpn)?)
    }

    /// RESET → INIT → RTR → RTS towards `remote`, like ibv_rc_pingpong (`pp_init_ctx`'s
    /// INIT, then `pp_connect_ctx`): `sq_psn` is our first PSN, `sgid_index` our GID.
    pub fn connect(
        &self,
        remote: &Remote,
        sq_psn: u32,
        sgid_index: u8,
        o: &ConnectOpts,
    ) -> Result<()> {
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: o.access,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        if self.query()?.qp_state == QpState::Reset {
            self.modify(
                &attr,
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            )?;
        }
        attr.qp_state = QpState::Rtr;
        attr.path_mtu = o.path_mtu;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = Psn::new(remote.psn);
        attr.max_dest_rd_atomic = o.max_dest_rd_atomic;
        attr.min_rnr_timer = o.min_rnr_timer;
        attr.ah_attr = AddressVector {
            dmac: [0; 6],
            dgid: remote.gid,
            sgid_index,
            traffic_class: o.traffic_class,
            hop_limit: o.hop_limit,
            flow_label: 0,
            vlan_tci: None,
        };
        self.modify(
            &attr,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
        )?;
        attr.qp_state = QpState::Rts;
        attr.timeout = o.timeout;
        attr.retry_cnt = o.retry_cnt;
        attr.rnr_retry = o.rnr_retry;
        attr.sq_psn = Psn::new(sq_psn);
        attr.max_rd_atomic = o.max_rd_atomic;
        self.modify(
            &attr,
            AttrMask::STATE
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::SQ_PSN
                | AttrMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// `ibv_post_send` (one work request).
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        let s = self.dev().shared();
        s.lock().rnic.post_send(self.qpn, wr)?;
        s.kick();
        Ok(())
    }

    /// `ibv_post_recv` (one work request).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let s = self.dev().shared();
        // No kick: a new receive WQE gives the driver nothing to send (a peer that got an
        // RNR NAK retries on its own timer, IBTA §9.7.5.2.8).
        s.lock().rnic.post_recv(self.qpn, wr)?;
        Ok(())
    }

    /// This QP's current rate, target rate and α (DCQCN); `None` when congestion control
    /// is off.
    pub fn rate_status(&self) -> Option<QpRateStatus> {
        self.dev()
            .shared()
            .lock()
            .rnic
            .congestion()?
            .qp_status(self.qpn)
    }

    /// This QP's counters.
    pub fn counters(&self) -> QpCounters {
        self.dev()
            .shared()
            .lock()
            .rnic
            .qp_counters(self.qpn)
            .unwrap_or_default()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let mut g = self.pd.dev.shared().lock();
        let _ = g.rnic.destroy_qp(self.qpn);
        g.qps.remove(&self.qpn);
    }
}

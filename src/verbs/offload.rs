//! The switch between the two backends, and what the offload backend learns about an
//! RDMA device.
//!
//! Contract:
//! - [`Backend::Software`] is xrnic's own RNIC on AF_XDP ([`Device::open`], named by its
//!   network interface); [`Backend::Offload`] hands the data path to an RDMA device
//!   through rdma-core's libibverbs ([`Device::open_rdma`], named like `rxe0` or
//!   `mlx5_0`). Both give the same [`Device`], [`super::Pd`], [`super::Mr`],
//!   [`super::Cq`] and [`super::Qp`]; what the offload backend lacks (engine counters,
//!   fault injection, MAC resolution, the simulated link) is an
//!   [`Error::Unsupported`] or documented zeros, never a made-up value.
//! - libibverbs is loaded on first use ([`super::ibv::lib`]); without it the software
//!   backend works as before and [`list_devices`] says why no RDMA device is listed.
//! - [`query_rdma`] reads an RDMA device like `ibv_devinfo` (opening it, no QP made);
//!   the GID table comes from `ibv_query_gid`, each entry's type from sysfs
//!   (`/sys/class/infiniband/DEV/ports/1/gid_attrs/types/N`, what libibverbs'
//!   `ibv_query_gid_type` reads) and the associated interface from
//!   `gid_attrs/ndevs/0`.
//! - [`choose_backend`] is the backend choice by name every tool makes (`--netdev IF`,
//!   `--device NAME`, `-d xrnic_IF`) and [`Device::open_named`] opens what it chose;
//!   options only the software backend has (fault injection, the capture tap) are an
//!   [`Error::Unsupported`] on the other, never silently dropped.
//! - [`hw_counters`] reads the kernel's counters of an RDMA device's port 1 from sysfs
//!   (`hw_counters/` and `counters/`), what `rdma statistic show` reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    DevBackend, DevInner, Device, DeviceAttr, DeviceInfo, DeviceOptions, Error, Gid, GidType,
    PortAttr, PortState, Result, ibv, netdev, query_netdev,
};

/// Which implementation runs a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// xrnic's RNIC on AF_XDP (`--netdev IF`).
    Software,
    /// An RDMA device through libibverbs (`--device NAME`).
    Offload,
}

impl core::fmt::Display for Backend {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Backend::Software => "software (AF_XDP)",
            Backend::Offload => "offload (libibverbs)",
        })
    }
}

/// Where the kernel publishes RDMA devices.
const SYSFS_IB: &str = "/sys/class/infiniband";

/// The port every xrnic tool uses.
const PORT: u8 = 1;

/// libibverbs stops at the table length, but a kernel GID table is filled from the
/// bottom: after this many empty entries in a row the rest is taken as empty (rxe has
/// 1024 entries; reading them all costs a sysfs read each).
const GID_EMPTY_RUN: usize = 32;

fn port_dir(dev: &str) -> PathBuf {
    Path::new(SYSFS_IB)
        .join(dev)
        .join("ports")
        .join(PORT.to_string())
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The GID type sysfs gives entry `i` (RoCE devices); "IB" when there is no such file.
fn gid_type(dev: &str, i: usize) -> GidType {
    match read_trim(&port_dir(dev).join("gid_attrs/types").join(i.to_string())).as_deref() {
        Some("RoCE v2") => GidType::RoceV2,
        Some(t) if t.contains("RoCE") => GidType::RoceV1,
        _ => GidType::Ib,
    }
}

/// What [`Device::open_rdma`] and [`query_rdma`] read from an open device.
struct RdmaFacts {
    info: DeviceInfo,
    gid_types: Vec<GidType>,
}

fn read_facts(name: &str, ctx: &ibv::Context) -> Result<RdmaFacts> {
    let a = ctx.query_device()?;
    let p = ctx.query_port(PORT)?;
    let fw: Vec<u8> = a
        .fw_ver
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let attr = DeviceAttr {
        fw_ver: String::from_utf8_lossy(&fw).into_owned(),
        // __be64 in memory: the numeric GUID as xrnic keeps it (first byte highest).
        node_guid: u64::from_be(a.node_guid),
        sys_image_guid: u64::from_be(a.sys_image_guid),
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        phys_port_cnt: a.phys_port_cnt,
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        max_qp: a.max_qp.max(0) as u32,
        max_qp_wr: a.max_qp_wr.max(0) as u32,
        max_sge: a.max_sge.max(0) as u32,
        max_cq: a.max_cq.max(0) as u32,
        max_cqe: a.max_cqe.max(0) as u32,
        max_mr: a.max_mr.max(0) as u32,
        max_pd: a.max_pd.max(0) as u32,
        max_qp_rd_atom: a.max_qp_rd_atom.max(0) as u32,
        max_res_rd_atom: a.max_res_rd_atom.max(0) as u32,
        max_qp_init_rd_atom: a.max_qp_init_rd_atom.max(0) as u32,
        atomic_cap: a.atomic_cap as u32,
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
    };
    let mut gids: Vec<Gid> = Vec::new();
    let mut gid_types = Vec::new();
    let mut empty = 0;
    for i in 0..p.gid_tbl_len.max(0) as usize {
        // An entry the kernel has not filled reads as zero (or EINVAL on some kernels).
        let g = ctx.query_gid(PORT, i as u32).unwrap_or([0; 16]);
        gids.push(g);
        gid_types.push(if g == [0; 16] {
            GidType::Ib
        } else {
            gid_type(name, i)
        });
        if g == [0; 16] {
            empty += 1;
            if empty >= GID_EMPTY_RUN {
                break;
            }
        } else {
            empty = 0;
        }
    }
    // Keep the table up to its last used entry (indexes are what `-g` names).
    let used = gids
        .iter()
        .rposition(|g| *g != [0; 16])
        .map_or(0, |i| i + 1);
    gids.truncate(used);
    gid_types.truncate(used);
    let ndev = read_trim(&port_dir(name).join("gid_attrs/ndevs/0"));
    let nd = ndev.as_deref().and_then(|n| netdev::probe(n).ok());
    let port = PortAttr {
        state: PortState::from_ibv(p.state as u32),
        max_mtu: ibv::conv::mtu_from_ibv(p.max_mtu).unwrap_or_default(),
        active_mtu: ibv::conv::mtu_from_ibv(p.active_mtu).unwrap_or_default(),
        netdev_mtu: nd.as_ref().map_or(0, |n| n.mtu),
        lid: p.lid,
        max_msg_sz: p.max_msg_sz,
        gid_tbl_len: p.gid_tbl_len.max(0) as u32,
        pkey_tbl_len: p.pkey_tbl_len,
    };
    if p.link_layer != ibv::sys::LINK_LAYER_ETHERNET {
        tracing::warn!("{name}: link layer {} is not Ethernet", p.link_layer);
    }
    Ok(RdmaFacts {
        info: DeviceInfo {
            name: name.to_string(),
            netdev: nd,
            attr,
            port,
            gids,
            gid_types: gid_types.clone(),
            af_xdp: None,
            xdp_mode: None,
        },
        gid_types,
    })
}

/// Read an RDMA device the way [`Device::open_rdma`] sees it (`ibv_devinfo`).
pub fn query_rdma(name: &str) -> Result<DeviceInfo> {
    let ctx = ibv::Context::open(name)?;
    Ok(read_facts(name, &ctx)?.info)
}

impl Device {
    /// Open the RDMA device `name` (`rxe0`, `mlx5_0`, ...) through libibverbs: the
    /// offload backend. Needs libibverbs and the device's provider at run time, and the
    /// rights libibverbs needs (`/dev/infiniband/uverbsN`).
    pub fn open_rdma(name: &str) -> Result<Device> {
        let ctx = Arc::new(ibv::Context::open(name)?);
        let f = read_facts(name, &ctx)?;
        let i = f.info;
        Ok(Device {
            inner: Arc::new(DevInner {
                name: i.name,
                netdev: i
                    .netdev
                    .as_ref()
                    .map(|n| n.ifname.clone())
                    .unwrap_or_default(),
                mac: i.netdev.as_ref().map_or([0; 6], |n| n.mac),
                attr: i.attr,
                port: i.port,
                link_up: None,
                gids: i.gids,
                gid_types: f.gid_types,
                mcast: Default::default(),
                backend: DevBackend::Verbs(ctx),
            }),
        })
    }
}

/// The backend and the name that a tool's two device options select: `netdev` (`--netdev
/// IF`) is the software device on IF; `device` (`--device NAME`, `-d`) an RDMA device
/// through libibverbs, except that `xrnic_IF`, the software device's own name (what
/// `xrnic devinfo` lists), is the software device on IF. `netdev` wins when both are given.
pub fn choose_backend<'a>(
    netdev: Option<&'a str>,
    device: Option<&'a str>,
) -> Result<(Backend, &'a str)> {
    let soft = netdev.or_else(|| device.and_then(|d| d.strip_prefix("xrnic_")));
    match (soft, device) {
        (Some(ifname), _) => Ok((Backend::Software, ifname)),
        (None, Some(name)) => Ok((Backend::Offload, name)),
        (None, None) => Err(Error::NoDeviceNamed),
    }
}

impl Device {
    /// Open the device [`choose_backend`] selects, with `opts` on the software backend.
    /// Returns the device and the name messages give it (IF or NAME). On the offload
    /// backend, fault injection (`opts.rx_drop`) and the capture tap (`opts.pcap`) are
    /// [`Error::Unsupported`]: the hardware's data path never passes through xrnic, so a
    /// capture would be empty (a wrong answer, not a capture); stat snapshots are a
    /// software-backend feature (`xrnic stat --device` reads the kernel's counters). A
    /// NAME that is no RDMA device but a network interface is
    /// [`Error::NetdevNotRdma`] (its message says how to name the software device on it).
    pub fn open_named(
        netdev: Option<&str>,
        device: Option<&str>,
        opts: &DeviceOptions,
    ) -> Result<(Device, String)> {
        let (backend, name) = choose_backend(netdev, device)?;
        if backend == Backend::Software {
            return Device::open_with(name, opts).map(|d| (d, name.to_string()));
        }
        if opts.rx_drop > 0.0 {
            return Err(Error::Unsupported {
                what: "fault injection (--rx-drop)",
                backend,
            });
        }
        if opts.pcap.is_some() {
            return Err(Error::Unsupported {
                what: "a capture inside the software RNIC's driver (--pcap; capture on the wire \
                       instead)",
                backend,
            });
        }
        Device::open_rdma(name)
            .map(|d| (d, name.to_string()))
            .map_err(|e| match e {
                Error::NoRdmaDevice { name, found }
                    if Path::new("/sys/class/net").join(&name).exists() =>
                {
                    Error::NetdevNotRdma { name, found }
                }
                e => e,
            })
    }
}

/// The devices `xrnic devinfo` lists without a name.
#[derive(Debug)]
pub struct DeviceList {
    /// Ethernet interfaces of this network namespace the software backend can run on.
    pub netdevs: Vec<String>,
    /// RDMA devices libibverbs finds, or why there are none to ask.
    pub rdma: Result<Vec<String>>,
}

/// Every device of both kinds (see [`DeviceList`]).
pub fn list_devices() -> DeviceList {
    let mut netdevs: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    // ARPHRD_ETHER (1), not the loopback device.
                    n != "lo"
                        && read_trim(&Path::new("/sys/class/net").join(n).join("type")).as_deref()
                            == Some("1")
                })
                .filter(|n| query_netdev(n).is_ok())
                .collect()
        })
        .unwrap_or_default();
    netdevs.sort();
    let rdma = ibv::device_names().map(|mut v| {
        v.sort();
        v
    });
    DeviceList { netdevs, rdma }
}

/// The kernel's counters of RDMA device `name`, port 1, as `(name, value)` sorted by
/// name: `hw_counters/*` (the driver's, e.g. rxe's `sent_pkts`, `rcvd_pkts`,
/// `retry_exceeded_err`) and `counters/*` (the IB port counters; entries the device
/// cannot read are left out).
pub fn hw_counters(name: &str) -> Result<Vec<(String, u64)>> {
    let dir = port_dir(name);
    if !dir.exists() {
        return Err(Error::NoRdmaDevice {
            name: name.to_string(),
            found: ibv::device_names().unwrap_or_default(),
        });
    }
    let mut out = Vec::new();
    for sub in ["hw_counters", "counters"] {
        let Ok(rd) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(v) = read_trim(&e.path()).and_then(|t| t.parse::<u64>().ok()) {
                out.push((n, v));
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(Error::Unsupported {
            what: "counters (the device has no hw_counters or counters in sysfs)",
            backend: Backend::Offload,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_is_chosen_by_name() {
        let c = |n, d| choose_backend(n, d).map_err(|e| e.to_string());
        assert_eq!(c(Some("eth0"), None), Ok((Backend::Software, "eth0")));
        assert_eq!(c(None, Some("rxe0")), Ok((Backend::Offload, "rxe0")));
        // The software device's own name opens the software device on its interface.
        assert_eq!(
            c(None, Some("xrnic_veth1")),
            Ok((Backend::Software, "veth1"))
        );
        // --netdev wins over --device.
        assert_eq!(
            c(Some("eth0"), Some("rxe0")),
            Ok((Backend::Software, "eth0"))
        );
        let none = c(None, None).unwrap_err();
        assert!(none.contains("--netdev IF or --device NAME"), "{none}");
    }

    /// What only the software backend has is refused on the offload backend before
    /// libibverbs is even loaded, with a message naming the option and the backend.
    #[test]
    fn software_only_options_are_refused_on_the_offload_backend() {
        let drop = DeviceOptions {
            rx_drop: 0.1,
            ..DeviceOptions::default()
        };
        let pcap = DeviceOptions {
            pcap: Some("/nonexistent/x.pcapng".into()),
            ..DeviceOptions::default()
        };
        for (opts, what) in [(drop, "--rx-drop"), (pcap, "--pcap")] {
            let e = Device::open_named(None, Some("rxe0"), &opts).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Unsupported {
                        backend: Backend::Offload,
                        ..
                    }
                ),
                "{e:?}"
            );
            let m = e.to_string();
            assert!(
                m.contains(what) && m.contains("not available on the offload"),
                "{m}"
            );
        }
    }

    /// A network interface given as an RDMA device name gets the hint to name the
    /// software device instead (`lo` exists in every network namespace, and is never an
    /// RDMA device).
    #[test]
    fn a_netdev_named_as_an_rdma_device_gets_the_software_name_in_the_message() {
        match Device::open_named(None, Some("lo"), &DeviceOptions::default()) {
            Err(e @ Error::NetdevNotRdma { .. }) => {
                let m = e.to_string();
                assert!(m.starts_with("no RDMA device lo"), "{m}");
                assert!(m.contains("use --netdev lo (or -d xrnic_lo)"), "{m}");
            }
            // Without libibverbs there is no device list to look `lo` up in.
            Err(Error::NoLibibverbs(_)) => {}
            other => panic!("{:?}", other.map(|(_, n)| n)),
        }
    }
}

//! The device view of `xrnic exec` (docs/verbs-abi.md "Where programs look for a device"):
//! in a private mount namespace of the program it starts, `/sys/class/infiniband/xrnic_IF/`,
//! `/sys/class/infiniband_verbs/uverbsN/` and `/dev/infiniband/{uverbsN, rdma_cm}`, as the
//! kernel's ib_core shows an RDMA device (drivers/infiniband/core/sysfs.c,
//! uverbs_main.c), so that programs which look there (infiniband-diags' `ibstat` and
//! `ibstatus`, UCX, NCCL, rdma-core's test suite) find xrnic's devices.
//!
//! Contract:
//! - The values are what the C library answers `ibv_query_device`, `ibv_query_port` and
//!   `ibv_query_gid` with, from the same code ([`xv::query_netdev`],
//!   [`xv::netdev::ib_width_speed`], [`xv::netdev::listed_netdevs`] for the order, which is
//!   the `uverbsN` numbering), taken once when the program starts: a snapshot. The
//!   library itself never reads these files (it answers `ibv_read_sysfs_file` for its own
//!   devices without them, src/abi/device.rs).
//! - The real sysfs and /dev stay visible beside the view: a tmpfs covers `/sys/class` and
//!   `/dev`, and every entry the real directory had is recreated in it (a directory or a
//!   file as a bind mount of the real one, submounts included; a symbolic link as a copy),
//!   except the ones the view replaces (`infiniband`, `infiniband_verbs`; `/dev/infiniband`).
//!   sysfs has no way to add a directory, and `/dev/infiniband` may be missing on the
//!   host, so covering the parent is the one way that needs nothing on the host.
//! - `/dev/infiniband/uverbsN` and `rdma_cm` are `/dev/null` bind-mounted onto a file (a
//!   character device a program can stat, open and read: it reads end of file). A user
//!   namespace refuses mknod(2) and a tmpfs mounted in one is `nodev`; a bind mount of a
//!   real device node is allowed (the way rootless containers give /dev/null). The
//!   library never opens them.
//! - Root: `unshare(CLONE_NEWNS)`. Any other user: a user namespace mapping only the
//!   caller's own uid and gid onto themselves (user_namespaces(7): an unprivileged
//!   process may map its own ids) together with the mount namespace; the program runs as
//!   the same uid, with no capabilities once it execs (capabilities(7), execve of a
//!   non-root uid). Propagation is made private first, so nothing leaks to the host.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};
use xrnic::verbs::{self as xv, DeviceInfo, GidType, PortState};

/// The uverbs ABI version rdma-core 44's libibverbs expects (`IB_USER_VERBS_ABI_VERSION`).
const UVERBS_ABI_VERSION: u32 = 6;
/// The kernel's uverbs character device major (`IB_UVERBS_MAJOR`) and first minor
/// (`IB_UVERBS_BASE_MINOR`): what `uverbsN/dev` names.
const UVERBS_DEV: (u32, u32) = (231, 192);

/// One device as the view shows it.
#[derive(Clone, Debug)]
pub struct Shown {
    pub ifname: String,
    pub info: DeviceInfo,
    /// The interface's speed (Mb/s), from which the port's width and speed follow.
    pub mbps: u64,
    /// The interface's own device directory (`/sys/class/net/IF/device` resolved), for
    /// an interface on a bus; `None` for a virtual one (veth).
    pub device_dir: Option<PathBuf>,
}

/// What the view holds at a path (relative to the directory it is built in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    /// A file and its content.
    File(String),
    /// A symbolic link and its target.
    Link(String),
    /// A character device a program can open and read (`/dev/null`, module doc).
    CharDevice,
}

/// The devices to show, in the library's order: each interface that
/// [`xv::query_netdev`] knows (one it does not, e.g. a missing interface, gets no
/// entry; the library lists it and fails to open it).
pub fn shown(netdevs: &[String]) -> Vec<Shown> {
    netdevs
        .iter()
        .filter_map(|ifname| {
            let info = xv::query_netdev(ifname).ok()?;
            Some(Shown {
                ifname: ifname.clone(),
                info,
                mbps: xv::netdev::link_speed_mbps(ifname),
                device_dir: std::fs::canonicalize(format!("/sys/class/net/{ifname}/device")).ok(),
            })
        })
        .collect()
}

/// A GUID as sysfs `node_guid` prints it: four groups of 16 bits.
fn guid_text(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// A GID as sysfs `gids/N` prints it (`%pI6`: eight groups of 16 bits, zeros kept).
fn gid_text(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// `ports/N/state` (sysfs.c `state_show`): the number and the name.
fn state_text(s: PortState) -> String {
    let name = match s {
        PortState::Nop => "NOP",
        PortState::Down => "DOWN",
        PortState::Init => "INIT",
        PortState::Armed => "ARMED",
        PortState::Active => "ACTIVE",
        PortState::ActiveDefer => "ACTIVE_DEFER",
    };
    format!("{}: {name}", s as u32)
}

/// `ports/N/phys_state` (sysfs.c `phys_state_show`, IBTA vol. 1 §14.2.5.6
/// PortPhysicalState): LinkUp (5) for an active port, else Disabled (3), as the C
/// library's `ibv_query_port` answers.
fn phys_state_text(s: PortState) -> &'static str {
    if s == PortState::Active {
        "5: LinkUp"
    } else {
        "3: Disabled"
    }
}

/// `ports/N/rate` (sysfs.c `rate_show`) for an `active_width`, `active_speed` pair: the
/// total in Gb/s, the lane count and the speed's name, e.g. `10 Gb/sec (1X FDR10)`.
pub fn rate_text(width: u8, speed: u8) -> String {
    let lanes = match width {
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    // Tenths of Gb/s per lane.
    let (tenths, name) = match speed {
        2 => (50, "DDR"),
        4 => (100, "QDR"),
        8 => (100, "FDR10"),
        16 => (140, "FDR"),
        32 => (250, "EDR"),
        64 => (500, "HDR"),
        128 => (1000, "NDR"),
        _ => (25, "SDR"),
    };
    let r = tenths * lanes;
    let half = if r % 10 != 0 { ".5" } else { "" };
    format!("{}{half} Gb/sec ({lanes}X {name})", r / 10)
}

/// A CPU list (`0-3,8`, sysfs `cpu/online`) as a cpumask (`%*pb`: 32-bit hex groups,
/// most significant first, separated by commas) of `nbits` bits.
fn cpumask(list: &str, nbits: usize) -> String {
    let mut words = vec![0u32; nbits.div_ceil(32).max(1)];
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) else {
            continue;
        };
        for cpu in a..=b.min(words.len() * 32 - 1) {
            words[cpu / 32] |= 1 << (cpu % 32);
        }
    }
    let top_digits = (nbits % 32).div_ceil(4);
    let top_digits = if top_digits == 0 { 8 } else { top_digits };
    let mut out = Vec::new();
    for (i, w) in words.iter().rev().enumerate() {
        let width = if i == 0 { top_digits } else { 8 };
        out.push(format!("{w:0width$x}"));
    }
    out.join(",")
}

/// The entries under `/sys/class` (relative to it): `infiniband/` and
/// `infiniband_verbs/`, with `cpus_online` and `cpus_possible` as sysfs gives them
/// (`/sys/devices/system/cpu/online`, `possible`) for a virtual interface's
/// `device/local_cpus`.
pub fn class_tree(devs: &[Shown], cpus_online: &str, cpus_possible: &str) -> Vec<(PathBuf, Node)> {
    let nbits = cpus_possible
        .trim()
        .rsplit(['-', ','])
        .next()
        .and_then(|n| n.parse::<usize>().ok())
        .map_or(1, |n| n + 1);
    let mut t: Vec<(PathBuf, Node)> = vec![
        ("infiniband".into(), Node::Dir),
        ("infiniband_verbs".into(), Node::Dir),
        (
            "infiniband_verbs/abi_version".into(),
            Node::File(UVERBS_ABI_VERSION.to_string()),
        ),
    ];
    for (n, d) in devs.iter().enumerate() {
        let name = &d.info.name;
        let ib = PathBuf::from("infiniband").join(name);
        let a = &d.info.attr;
        let p = &d.info.port;
        let (width, speed) = xv::netdev::ib_width_speed(d.mbps);
        let mut file = |path: &str, s: String| t.push((ib.join(path), Node::File(s)));
        file("node_type", "1: CA".into());
        file("node_guid", guid_text(a.node_guid));
        file("sys_image_guid", guid_text(a.sys_image_guid));
        file("fw_ver", a.fw_ver.clone());
        file("hw_rev", format!("{:x}", a.hw_ver));
        file("hca_type", "xrnic".into());
        file("board_id", "xrnic".into());
        file("node_desc", format!("xrnic {}", d.ifname));
        let port = "ports/1";
        file(&format!("{port}/state"), state_text(p.state));
        file(
            &format!("{port}/phys_state"),
            phys_state_text(p.state).into(),
        );
        file(&format!("{port}/rate"), rate_text(width, speed));
        file(&format!("{port}/link_layer"), "Ethernet".into());
        file(&format!("{port}/lid"), format!("0x{:x}", p.lid));
        file(&format!("{port}/sm_lid"), "0x0".into());
        file(&format!("{port}/sm_sl"), "0".into());
        file(&format!("{port}/lid_mask_count"), "0".into());
        // `port_cap_flags` of the C library's ibv_query_port: none set.
        file(&format!("{port}/cap_mask"), "0x00000000".into());
        file(&format!("{port}/pkeys/0"), "0xffff".into());
        for (i, g) in d.info.gids.iter().enumerate() {
            file(&format!("{port}/gids/{i}"), gid_text(g));
            let kind = match d.info.gid_types.get(i) {
                Some(GidType::RoceV1) => "IB/RoCE v1",
                Some(GidType::Ib) => "IB/RoCE v1",
                _ => "RoCE v2",
            };
            file(&format!("{port}/gid_attrs/types/{i}"), kind.into());
            file(&format!("{port}/gid_attrs/ndevs/{i}"), d.ifname.clone());
        }
        t.push((ib.clone(), Node::Dir));
        for dir in [
            "ports",
            "ports/1",
            "ports/1/gids",
            "ports/1/gid_attrs",
            "ports/1/gid_attrs/types",
            "ports/1/gid_attrs/ndevs",
            "ports/1/pkeys",
        ] {
            t.push((ib.join(dir), Node::Dir));
        }
        match &d.device_dir {
            // A NIC on a bus: its own device directory (numa_node, local_cpus, net/IF).
            Some(dev) => t.push((ib.join("device"), Node::Link(dev.display().to_string()))),
            None => {
                let dev = ib.join("device");
                t.push((dev.clone(), Node::Dir));
                t.push((dev.join("numa_node"), Node::File("-1".into())));
                t.push((
                    dev.join("local_cpulist"),
                    Node::File(cpus_online.trim().into()),
                ));
                t.push((
                    dev.join("local_cpus"),
                    Node::File(cpumask(cpus_online, nbits)),
                ));
                t.push((dev.join("net"), Node::Dir));
                t.push((
                    dev.join("net").join(&d.ifname),
                    Node::Link(format!("/sys/class/net/{}", d.ifname)),
                ));
            }
        }
        let uv = PathBuf::from("infiniband_verbs").join(format!("uverbs{n}"));
        t.push((uv.clone(), Node::Dir));
        t.push((uv.join("ibdev"), Node::File(name.clone())));
        t.push((
            uv.join("abi_version"),
            Node::File(UVERBS_ABI_VERSION.to_string()),
        ));
        t.push((
            uv.join("dev"),
            Node::File(format!("{}:{}", UVERBS_DEV.0, UVERBS_DEV.1 + n as u32)),
        ));
        t.push((
            uv.join("device"),
            Node::Link(format!("../../infiniband/{name}/device")),
        ));
    }
    // Parents before children.
    t.sort_by_key(|(p, _)| p.components().count());
    t
}

/// The entries under `/dev` (relative to it): `infiniband/uverbsN` for `n` devices and
/// `infiniband/rdma_cm`.
pub fn dev_tree(n: usize) -> Vec<(PathBuf, Node)> {
    let mut t = vec![
        ("infiniband".into(), Node::Dir),
        ("infiniband/rdma_cm".into(), Node::CharDevice),
    ];
    t.extend((0..n).map(|i| (format!("infiniband/uverbs{i}").into(), Node::CharDevice)));
    t
}

/// Why there is no view: the kernel gave no namespace or no right to mount in it
/// (nothing changed: the program runs without the view), or building it failed halfway
/// (the program must not run with a half-built /dev).
#[derive(Debug)]
pub enum Failure {
    NoNamespace(String),
    Build(String),
}

/// Enter a private mount namespace (and, for a user, a user namespace) and build the
/// view of `devs` in it (module doc). The calling process must have one thread.
pub fn enter(devs: &[Shown]) -> Result<(), Failure> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let class = class_tree(
        devs,
        &read("/sys/devices/system/cpu/online"),
        &read("/sys/devices/system/cpu/possible"),
    );
    let dev = dev_tree(devs.len());
    private_namespace()?;
    // The first mount call: refused (EPERM) where a policy leaves a user namespace
    // without mount rights (AppArmor's restriction of unprivileged user namespaces);
    // nothing has changed yet.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| Failure::NoNamespace(format!("mount: {e}")))?;
    let build = || -> io::Result<()> {
        cover("/sys/class", &["infiniband", "infiniband_verbs"])?;
        build_tree(Path::new("/sys/class"), &class)?;
        cover("/dev", &["infiniband"])?;
        build_tree(Path::new("/dev"), &dev)?;
        Ok(())
    };
    build().map_err(|e| Failure::Build(e.to_string()))
}

/// `unshare` as module doc says, with the uid and gid maps of a user namespace (a
/// namespace entered without its maps is a [`Failure::Build`]: the process would be
/// nobody in it).
fn private_namespace() -> Result<(), Failure> {
    use rustix::thread::UnshareFlags;
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let flags = if uid == 0 {
        UnshareFlags::NEWNS
    } else {
        UnshareFlags::NEWUSER | UnshareFlags::NEWNS
    };
    // SAFETY: no UnshareFlags::FILES: the descriptor table stays shared as it was.
    unsafe { rustix::thread::unshare_unsafe(flags) }
        .map_err(|e| Failure::NoNamespace(format!("unshare: {e}")))?;
    if uid != 0 {
        // user_namespaces(7): setgroups must be denied before an unprivileged gid_map.
        let write = |f: &str, s: String| {
            std::fs::write(f, s).map_err(|e| Failure::Build(format!("{f}: {e}")))
        };
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    Ok(())
}

/// Cover `dir` with a tmpfs holding every entry `dir` had except `replaced`, each
/// recreated as the module doc says.
fn cover(dir: &str, replaced: &[&str]) -> io::Result<()> {
    let ctx = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| ctx(dir, e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !replaced.contains(&n.as_str()))
        .collect();
    // The covered directory stays reachable through this descriptor.
    let real: OwnedFd = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ctx(dir, e.into()))?;
    rustix::mount::mount("tmpfs", dir, "tmpfs", MountFlags::NOSUID, c"mode=755")
        .map_err(|e| ctx(&format!("tmpfs on {dir}"), e.into()))?;
    for name in names {
        let dst = Path::new(dir).join(&name);
        let src = format!("/proc/self/fd/{}/{name}", real.as_raw_fd());
        let st = match rustix::fs::statat(&real, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since it was listed.
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(ctx(&src, e.into())),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let to = rustix::fs::readlinkat(&real, name.as_str(), Vec::new())?;
                std::os::unix::fs::symlink(to.to_string_lossy().as_ref(), &dst)
                    .map_err(|e| ctx(&dst.display().to_string(), e))?;
            }
            FileType::Directory => {
                std::fs::create_dir(&dst).map_err(|e| ctx(&dst.display().to_string(), e))?;
                rustix::mount::mount_bind_recursive(src.as_str(), &dst)
                    .map_err(|e| ctx(&format!("bind {}", dst.display()), e.into()))?;
            }
            _ => {
                std::fs::File::create(&dst).map_err(|e| ctx(&dst.display().to_string(), e))?;
                rustix::mount::mount_bind(src.as_str(), &dst)
                    .map_err(|e| ctx(&format!("bind {}", dst.display()), e.into()))?;
            }
        }
    }
    Ok(())
}

/// Create `tree` (parents first) under `root`.
fn build_tree(root: &Path, tree: &[(PathBuf, Node)]) -> io::Result<()> {
    for (rel, node) in tree {
        let p = root.join(rel);
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(ctx)?;
        }
        match node {
            Node::Dir => std::fs::create_dir_all(&p).map_err(ctx)?,
            Node::File(s) => std::fs::write(&p, format!("{s}\n")).map_err(ctx)?,
            Node::Link(to) => std::os::unix::fs::symlink(to, &p).map_err(ctx)?,
            Node::CharDevice => {
                std::fs::File::create(&p).map_err(ctx)?;
                rustix::mount::mount_bind("/dev/null", &p).map_err(|e| ctx(e.into()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_formats() {
        assert_eq!(guid_text(0x0211_22ff_fe33_4455), "0211:22ff:fe33:4455");
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = 1;
        assert_eq!(gid_text(&g), "fe80:0000:0000:0000:0000:0000:0000:0001");
        assert_eq!(state_text(PortState::Active), "4: ACTIVE");
        assert_eq!(state_text(PortState::Down), "1: DOWN");
        assert_eq!(phys_state_text(PortState::Active), "5: LinkUp");
        assert_eq!(rate_text(1, 8), "10 Gb/sec (1X FDR10)");
        assert_eq!(rate_text(1, 1), "2.5 Gb/sec (1X SDR)");
        assert_eq!(rate_text(2, 4), "40 Gb/sec (4X QDR)");
        assert_eq!(rate_text(1, 128), "100 Gb/sec (1X NDR)");
    }

    #[test]
    fn cpumasks_as_sysfs_prints_them() {
        assert_eq!(cpumask("0-1", 2), "3");
        assert_eq!(cpumask("0-3", 8), "0f");
        assert_eq!(cpumask("0,2", 4), "5");
        assert_eq!(cpumask("0-39", 40), "ff,ffffffff");
        assert_eq!(cpumask("0-31", 32), "ffffffff");
    }

    /// The tree of `lo` (every Linux system has it; netlink needs no privilege) as a
    /// virtual interface of 25 Gb/s: each file holds what the device answers.
    #[test]
    fn class_tree_holds_what_the_device_answers() {
        let info = xv::query_netdev("lo").expect("lo");
        let shown = Shown {
            ifname: "lo".into(),
            info: info.clone(),
            mbps: 25_000,
            device_dir: None,
        };
        let t = class_tree(&[shown], "0-1\n", "0-3\n");
        let get = |p: &str| {
            t.iter()
                .find(|(q, _)| q == Path::new(p))
                .map(|(_, n)| n.clone())
                .unwrap_or_else(|| panic!("no {p}"))
        };
        let file = |p: &str| match get(p) {
            Node::File(s) => s,
            other => panic!("{p}: {other:?}"),
        };
        let dev = "infiniband/xrnic_lo";
        assert_eq!(
            file(&format!("{dev}/node_guid")),
            guid_text(info.attr.node_guid)
        );
        assert_eq!(file(&format!("{dev}/fw_ver")), info.attr.fw_ver);
        assert_eq!(
            file(&format!("{dev}/ports/1/state")),
            state_text(info.port.state)
        );
        assert_eq!(file(&format!("{dev}/ports/1/rate")), "25 Gb/sec (1X EDR)");
        for (i, g) in info.gids.iter().enumerate() {
            assert_eq!(file(&format!("{dev}/ports/1/gids/{i}")), gid_text(g));
            assert_eq!(
                file(&format!("{dev}/ports/1/gid_attrs/types/{i}")),
                "RoCE v2"
            );
            assert_eq!(file(&format!("{dev}/ports/1/gid_attrs/ndevs/{i}")), "lo");
        }
        let past = format!("{dev}/ports/1/gids/{}", info.gids.len());
        assert!(!t.iter().any(|(q, _)| q == Path::new(&past)));
        assert_eq!(file(&format!("{dev}/device/local_cpus")), "3");
        assert_eq!(file(&format!("{dev}/device/local_cpulist")), "0-1");
        assert_eq!(
            get(&format!("{dev}/device/net/lo")),
            Node::Link("/sys/class/net/lo".into())
        );
        assert_eq!(file("infiniband_verbs/uverbs0/ibdev"), "xrnic_lo");
        assert_eq!(file("infiniband_verbs/uverbs0/dev"), "231:192");
        // Parents first: each entry's directory comes before it.
        for (i, (p, _)) in t.iter().enumerate() {
            if let Some(parent) = p.parent().filter(|q| !q.as_os_str().is_empty()) {
                let at = t.iter().position(|(q, _)| q == parent);
                assert!(
                    at.is_some_and(|a| a < i),
                    "{} before its parent",
                    p.display()
                );
            }
        }
    }

    #[test]
    fn dev_tree_has_a_node_per_device_and_rdma_cm() {
        let t = dev_tree(2);
        assert!(t.contains(&("infiniband/uverbs1".into(), Node::CharDevice)));
        assert!(t.contains(&("infiniband/rdma_cm".into(), Node::CharDevice)));
        assert!(!t.iter().any(|(p, _)| p == Path::new("infiniband/uverbs2")));
    }
}

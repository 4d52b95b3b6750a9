//! `xrnic devinfo`: the device and port attributes of the xrnic device on an interface, in
//! the layout of `ibv_devinfo` (rdma-core libibverbs/examples/devinfo.c): `hca_id`, the
//! tab-aligned device fields, then per port the state, MTUs, LID and link layer, and with
//! `-v` the long device list and the GID table (`GID[  i]: <address>, RoCE v2`).
//!
//! Contract: `--netdev IF` reads the software device's facts ([`crate::verbs::query_netdev`])
//! without opening it: no root needed, no XDP attached, works while another process runs
//! the device. `--device NAME` (`-d`) reads an RDMA device through libibverbs (the offload
//! backend, [`crate::verbs::query_rdma`]) in the same format. With neither, every device of
//! both kinds is printed (as `ibv_devinfo` prints every device), the software ones
//! first; when libibverbs is missing or lists nothing, a line on stderr says so. Fields
//! devinfo.c prints that have no meaning here (ODP, tag matching, device memory, ...) are
//! left out; unused (all-zero) GID entries are skipped as devinfo.c skips them. A missing
//! interface or device is a message on stderr and exit 1.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::io::afxdp::{BufferMode, XdpMode};
use crate::proto::Mtu;
use crate::verbs::{self, DeviceInfo, netdev, query_netdev};

#[derive(Clone, Debug, clap::Args)]
pub struct DevinfoArgs {
    /// The network interface a software device runs on.
    #[arg(long, value_name = "IF", conflicts_with = "device")]
    pub netdev: Option<String>,
    /// An RDMA device (rxe0, mlx5_0, ...), read through libibverbs.
    #[arg(short = 'd', long, value_name = "NAME")]
    pub device: Option<String>,
    /// Print all the attributes (ibv_devinfo -v).
    #[arg(short, long)]
    pub verbose: bool,
}

/// `enum ibv_mtu` value of an MTU.
pub fn mtu_enum(m: Mtu) -> u8 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

fn guid_str(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// The text `ibv_devinfo [-v]` would print for this device.
/// Not an ibv_devinfo field: the AF_XDP port's UMEM and ring sizes a device opens with
/// (`PortOptions::default`), the response frames at `mtu` its receive path holds, and
/// the READ credit that follows (docs/transport.md, "READ credit").
fn receive_capacity(mtu: Mtu) -> String {
    let o = crate::io::afxdp::PortOptions::default();
    let frames = o.rx_frames(mtu.bytes() as usize + crate::proto::config::RX_FRAME_OVERHEAD);
    let c = crate::proto::Config::default().with_rx_capacity(frames);
    format!(
        "\t\t\taf_xdp_rings:\t\tumem {} chunks of {} bytes, rings {}, holds {frames} \
         frames of MTU {}, read credit {} per device, {} per QP",
        o.frame_count,
        crate::io::afxdp::CHUNK_SIZE,
        o.ring_size,
        mtu.bytes(),
        c.read_device_pkts,
        c.read_qp_pkts
    )
}

pub fn render(d: &DeviceInfo, verbose: bool) -> String {
    let a = &d.attr;
    let p = &d.port;
    let mut s = String::new();
    // write! to a String cannot fail.
    let _ = writeln!(s, "hca_id:\t{}", d.name);
    // rxe and every RoCE device report the InfiniBand transport over an Ethernet link.
    let _ = writeln!(s, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(s, "\tfw_ver:\t\t\t\t{}", a.fw_ver);
    let _ = writeln!(s, "\tnode_guid:\t\t\t{}", guid_str(a.node_guid));
    let _ = writeln!(s, "\tsys_image_guid:\t\t\t{}", guid_str(a.sys_image_guid));
    let _ = writeln!(s, "\tvendor_id:\t\t\t0x{:04x}", a.vendor_id);
    let _ = writeln!(s, "\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    let _ = writeln!(s, "\thw_ver:\t\t\t\t0x{:X}", a.hw_ver);
    let _ = writeln!(s, "\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    if verbose {
        let _ = writeln!(s, "\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size);
        let _ = writeln!(s, "\tpage_size_cap:\t\t\t0x{:x}", a.page_size_cap);
        let _ = writeln!(s, "\tmax_qp:\t\t\t\t{}", a.max_qp);
        let _ = writeln!(s, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        let _ = writeln!(s, "\tmax_sge:\t\t\t{}", a.max_sge);
        let _ = writeln!(s, "\tmax_cq:\t\t\t\t{}", a.max_cq);
        let _ = writeln!(s, "\tmax_cqe:\t\t\t{}", a.max_cqe);
        let _ = writeln!(s, "\tmax_mr:\t\t\t\t{}", a.max_mr);
        let _ = writeln!(s, "\tmax_pd:\t\t\t\t{}", a.max_pd);
        let _ = writeln!(s, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        let _ = writeln!(s, "\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom);
        let _ = writeln!(s, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        let _ = writeln!(
            s,
            "\tatomic_cap:\t\t\t{} ({})",
            if a.atomic_cap == 1 {
                "ATOMIC_HCA"
            } else {
                "ATOMIC_NONE"
            },
            a.atomic_cap
        );
        let _ = writeln!(s, "\tmax_pkeys:\t\t\t{}", a.max_pkeys);
        let _ = writeln!(s, "\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);
    }
    let _ = writeln!(s, "\t\tport:\t1");
    let (st, stn) = (p.state.as_str(), p.state as u8);
    let _ = writeln!(s, "\t\t\tstate:\t\t\t{st} ({stn})");
    let _ = writeln!(
        s,
        "\t\t\tmax_mtu:\t\t{} ({})",
        p.max_mtu.bytes(),
        mtu_enum(p.max_mtu)
    );
    let _ = writeln!(
        s,
        "\t\t\tactive_mtu:\t\t{} ({})",
        p.active_mtu.bytes(),
        mtu_enum(p.active_mtu)
    );
    let _ = writeln!(s, "\t\t\tsm_lid:\t\t\t0");
    let _ = writeln!(s, "\t\t\tport_lid:\t\t{}", p.lid);
    let _ = writeln!(s, "\t\t\tport_lmc:\t\t0x00");
    let _ = writeln!(s, "\t\t\tlink_layer:\t\tEthernet");
    // Not an ibv_devinfo field: said only when the AF_XDP port limits the MTU.
    if let Some(BufferMode::Single { why }) = &d.af_xdp {
        let _ = writeln!(
            s,
            "\t\t\taf_xdp:\t\t\tsingle-buffer, frames up to {} bytes, max_mtu capped at {} ({why})",
            BufferMode::Single { why: why.clone() }.max_frame(),
            p.max_mtu.bytes()
        );
    }
    // Not an ibv_devinfo field either: said only for generic (skb) XDP.
    if d.xdp_mode == Some(XdpMode::Skb) {
        let _ = writeln!(
            s,
            "\t\t\txdp_mode:\t\tskb (generic XDP, AF_XDP in copy mode)"
        );
    }
    if verbose && d.af_xdp.is_some() {
        let _ = writeln!(s, "{}", receive_capacity(p.active_mtu));
    }
    if verbose {
        let _ = writeln!(s, "\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
        // IB_PORT_IP_BASED_GIDS (bit 26): GIDs are IP addresses, as for every RoCE port.
        let _ = writeln!(s, "\t\t\tport_cap_flags:\t\t0x{:08x}", 1u32 << 26);
        let _ = writeln!(s, "\t\t\tport_cap_flags2:\t0x0000");
        let _ = writeln!(s, "\t\t\tmax_vl_num:\t\tinvalid value (0)");
        let _ = writeln!(s, "\t\t\tbad_pkey_cntr:\t\t0x0");
        let _ = writeln!(s, "\t\t\tqkey_viol_cntr:\t\t0x0");
        let _ = writeln!(s, "\t\t\tsm_sl:\t\t\t0");
        let _ = writeln!(s, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        let _ = writeln!(s, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
        let _ = writeln!(s, "\t\t\tsubnet_timeout:\t\t0");
        let _ = writeln!(s, "\t\t\tinit_type_reply:\t0");
        for (i, g) in d.gids.iter().enumerate() {
            if *g == [0; 16] {
                continue;
            }
            let ty = d.gid_types.get(i).map_or("RoCE v2", |t| t.as_str());
            let _ = writeln!(s, "\t\t\tGID[{i:3}]:\t\t{}, {ty}", netdev::gid_text(g));
        }
    }
    s.push('\n');
    s
}

/// `xrnic devinfo`.
pub fn run(args: &DevinfoArgs) -> ExitCode {
    use std::io::Write;
    let one = match (&args.netdev, &args.device) {
        (Some(n), _) => Some(query_netdev(n)),
        (None, Some(d)) => Some(verbs::query_rdma(d)),
        (None, None) => None,
    };
    let mut out = std::io::stdout().lock();
    match one {
        Some(Ok(d)) => {
            let _ = out.write_all(render(&d, args.verbose).as_bytes());
            // Not an ibv_devinfo field: who runs the device programs here will open.
            if let Some(n) = &args.netdev {
                let _ = out.write_all(crate::cli::service::devinfo_line(n).as_bytes());
            }
            ExitCode::SUCCESS
        }
        Some(Err(e)) => {
            eprintln!("xrnic devinfo: {e}");
            ExitCode::FAILURE
        }
        None => {
            let list = verbs::list_devices();
            let mut failed = false;
            for n in &list.netdevs {
                match query_netdev(n) {
                    Ok(d) => {
                        let _ = out.write_all(render(&d, args.verbose).as_bytes());
                    }
                    Err(e) => {
                        eprintln!("xrnic devinfo: {e}");
                        failed = true;
                    }
                }
            }
            match &list.rdma {
                Ok(names) if names.is_empty() => {
                    eprintln!("xrnic devinfo: no RDMA device (libibverbs finds none)");
                }
                Ok(names) => {
                    for n in names {
                        match verbs::query_rdma(n) {
                            Ok(d) => {
                                let _ = out.write_all(render(&d, args.verbose).as_bytes());
                            }
                            Err(e) => {
                                eprintln!("xrnic devinfo: {n}: {e}");
                                failed = true;
                            }
                        }
                    }
                }
                Err(e) => eprintln!("xrnic devinfo: no RDMA devices listed: {e}"),
            }
            if list.netdevs.is_empty() && !matches!(&list.rdma, Ok(v) if !v.is_empty()) {
                eprintln!("xrnic devinfo: no device found");
                return ExitCode::FAILURE;
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{DeviceAttr, GidType, PortAttr, PortState};

    fn sample() -> DeviceInfo {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let addrs = vec!["192.0.2.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let gids = netdev::gid_table(mac, &addrs);
        DeviceInfo {
            name: "xrnic_eth0".into(),
            netdev: Some(netdev::NetdevInfo {
                ifname: "eth0".into(),
                ifindex: 2,
                mac,
                mtu: 1500,
                addrs,
                up: true,
                xdp_attached: false,
            }),
            attr: DeviceAttr {
                fw_ver: "0.1.0".into(),
                node_guid: u64::from_be_bytes(netdev::eui64(mac)),
                sys_image_guid: u64::from_be_bytes(netdev::eui64(mac)),
                vendor_id: 0xffffff,
                vendor_part_id: 0,
                hw_ver: 0,
                phys_port_cnt: 1,
                max_mr_size: u64::MAX,
                page_size_cap: 0xfffff000,
                max_qp: 1,
                max_qp_wr: 2,
                max_sge: 3,
                max_cq: 4,
                max_cqe: 5,
                max_mr: 6,
                max_pd: 7,
                max_qp_rd_atom: 8,
                max_res_rd_atom: 9,
                max_qp_init_rd_atom: 10,
                atomic_cap: 1,
                max_pkeys: 1,
                local_ca_ack_delay: 15,
            },
            port: PortAttr {
                state: PortState::Active,
                max_mtu: Mtu::Mtu4096,
                active_mtu: Mtu::Mtu1024,
                netdev_mtu: 1500,
                lid: 0,
                max_msg_sz: 0x8000_0000,
                gid_tbl_len: gids.len() as u32,
                pkey_tbl_len: 1,
            },
            gid_types: vec![GidType::RoceV2; gids.len()],
            gids,
            af_xdp: Some(BufferMode::Multi),
            xdp_mode: None,
        }
    }

    #[test]
    fn a_single_buffer_port_says_why_its_mtu_is_capped() {
        let mut d = sample();
        d.port.max_mtu = Mtu::Mtu2048;
        d.af_xdp = Some(BufferMode::Single {
            why: "kernel 6.1.0 has no AF_XDP multi-buffer (XDP_USE_SG, Linux 6.6+)".into(),
        });
        let t = render(&d, false);
        assert!(t.contains("\t\t\tmax_mtu:\t\t2048 (4)\n"), "{t}");
        assert!(
            t.contains(
                "\t\t\tlink_layer:\t\tEthernet\n\t\t\taf_xdp:\t\t\tsingle-buffer, frames up to 3840 \
                 bytes, max_mtu capped at 2048 (kernel 6.1.0 has no AF_XDP multi-buffer \
                 (XDP_USE_SG, Linux 6.6+))\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn verbose_shows_the_rings_and_the_read_credit() {
        let mut d = sample();
        d.port.active_mtu = Mtu::Mtu4096;
        let t = render(&d, true);
        assert!(
            t.contains(
                "\t\t\taf_xdp_rings:\t\tumem 8192 chunks of 4096 bytes, rings 4096, holds \
                 2048 frames of MTU 4096, read credit 1024 per device, 512 per QP\n"
            ),
            "{t}"
        );
        assert!(!render(&d, false).contains("af_xdp_rings"));
    }

    #[test]
    fn layout_follows_ibv_devinfo() {
        let t = render(&sample(), false);
        let want = "hca_id:\txrnic_eth0\n\
            \ttransport:\t\t\tInfiniBand (0)\n\
            \tfw_ver:\t\t\t\t0.1.0\n\
            \tnode_guid:\t\t\t5054:00ff:fe12:3456\n\
            \tsys_image_guid:\t\t\t5054:00ff:fe12:3456\n\
            \tvendor_id:\t\t\t0xffffff\n\
            \tvendor_part_id:\t\t\t0\n\
            \thw_ver:\t\t\t\t0x0\n\
            \tphys_port_cnt:\t\t\t1\n\
            \t\tport:\t1\n\
            \t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\
            \t\t\tmax_mtu:\t\t4096 (5)\n\
            \t\t\tactive_mtu:\t\t1024 (3)\n\
            \t\t\tsm_lid:\t\t\t0\n\
            \t\t\tport_lid:\t\t0\n\
            \t\t\tport_lmc:\t\t0x00\n\
            \t\t\tlink_layer:\t\tEthernet\n\n";
        assert_eq!(t, want);
    }

    #[test]
    fn verbose_lists_the_gid_table_as_roce_v2() {
        let t = render(&sample(), true);
        assert!(t.contains("\t\t\tGID[  0]:\t\tfe80::5054:ff:fe12:3456, RoCE v2\n"));
        assert!(t.contains("\t\t\tGID[  1]:\t\t::ffff:192.0.2.1, RoCE v2\n"));
        assert!(t.contains("\t\t\tGID[  2]:\t\tfd00::1, RoCE v2\n"));
        assert!(t.contains("\t\t\tgid_tbl_len:\t\t3\n"));
        assert!(t.contains("\tmax_qp_wr:\t\t\t2\n"));
        assert!(t.contains("\tatomic_cap:\t\t\tATOMIC_HCA (1)\n"));
    }

    #[test]
    fn rdma_device_tables_skip_empty_entries_and_name_types() {
        let mut d = sample();
        d.name = "mlx5_0".into();
        d.gids.insert(1, [0; 16]);
        d.gid_types = vec![
            GidType::RoceV1,
            GidType::Ib,
            GidType::RoceV2,
            GidType::RoceV2,
        ];
        d.port.state = PortState::Init;
        let t = render(&d, true);
        assert!(t.starts_with("hca_id:\tmlx5_0\n"), "{t}");
        assert!(t.contains("\t\t\tGID[  0]:\t\tfe80::5054:ff:fe12:3456, RoCE v1\n"));
        assert!(!t.contains("GID[  1]"), "{t}");
        assert!(t.contains("\t\t\tGID[  2]:\t\t::ffff:192.0.2.1, RoCE v2\n"));
        assert!(t.contains("\t\t\tstate:\t\t\tPORT_INIT (2)\n"));
    }
}

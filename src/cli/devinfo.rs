//! `xrnic devinfo`: the device and port attributes of the xrnic device on an interface, in
//! the layout of `ibv_devinfo` (rdma-core libibverbs/examples/devinfo.c): `hca_id`, the
//! tab-aligned device fields, then per port the state, MTUs, LID and link layer, and with
//! `-v` the long device list and the GID table (`GID[  i]: <address>, RoCE v2`).
//!
//! Contract: reads the interface's facts ([`crate::verbs::query_netdev`]) without opening
//! the device: no root needed, no XDP attached, works while another process runs the
//! device. Fields devinfo.c prints that have no meaning here (ODP, tag matching, device
//! memory, ...) are left out. A missing interface is a message on stderr and exit 1.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::proto::Mtu;
use crate::verbs::{DeviceInfo, PortState, netdev, query_netdev};

#[derive(Clone, Debug, clap::Args)]
pub struct DevinfoArgs {
    /// The network interface the device runs on.
    #[arg(long, value_name = "IF")]
    pub netdev: String,
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
    let (st, stn) = match p.state {
        PortState::Active => ("PORT_ACTIVE", 4),
        PortState::Down => ("PORT_DOWN", 1),
    };
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
            let _ = writeln!(s, "\t\t\tGID[{i:3}]:\t\t{}, RoCE v2", netdev::gid_text(g));
        }
    }
    s.push('\n');
    s
}

/// `xrnic devinfo`.
pub fn run(args: &DevinfoArgs) -> ExitCode {
    use std::io::Write;
    match query_netdev(&args.netdev) {
        Ok(d) => {
            let _ = std::io::stdout()
                .lock()
                .write_all(render(&d, args.verbose).as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xrnic devinfo: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{DeviceAttr, PortAttr};

    fn sample() -> DeviceInfo {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let addrs = vec!["192.0.2.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let gids = netdev::gid_table(mac, &addrs);
        DeviceInfo {
            name: "xrnic_eth0".into(),
            netdev: netdev::NetdevInfo {
                ifname: "eth0".into(),
                ifindex: 2,
                mac,
                mtu: 1500,
                addrs,
                up: true,
                xdp_attached: false,
            },
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
            gids,
        }
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
}

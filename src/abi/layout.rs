//! The size of every structure in types.rs (the one definition, src/verbs/ibv/abi.rs,
//! shared with the offload backend) and the offset of each of its fields, keyed by
//! the C name (`ibv_wc`, `ibv_send_wr.wr.rdma.rkey`). The test below writes a C program
//! that prints the same keys from the system's `<infiniband/verbs.h>` (libibverbs-dev),
//! compiles it with `cc` and compares both tables.

use crate::types::*;
use core::mem::{offset_of, size_of};

/// One row: `struct` or `struct.field.path` and its size or offset in bytes.
pub type Row = (String, usize);

macro_rules! fields {
    ($out:ident, $t:ident; $($f:ident),* $(,)?) => {
        $out.push((stringify!($t).to_string(), size_of::<$t>()));
        $( $out.push((concat!(stringify!($t), ".", stringify!($f)).to_string(), offset_of!($t, $f))); )*
    };
}

macro_rules! renamed {
    ($out:ident, $t:ident; $($c:literal => $($f:ident).+),* $(,)?) => {
        $( $out.push((concat!(stringify!($t), ".", $c).to_string(), offset_of!($t, $($f).+))); )*
    };
}

/// The table of every structure this library shares with programs.
pub fn table() -> Vec<Row> {
    let mut o = Vec::new();
    fields!(o, ibv_device; _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path);
    fields!(o, ibv_context_ops; _compat_query_device, _compat_query_port, alloc_mw, bind_mw,
        dealloc_mw, poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv,
        _compat_async_event);
    fields!(o, ibv_context; device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat);
    fields!(o, verbs_context; query_port, advise_mr, alloc_null_mr, create_counters, reg_dm_mr,
        modify_cq, create_wq, query_rt_values, create_cq_ex, query_device_ex, ibv_create_flow,
        open_qp, create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, sz, context);
    renamed!(o, verbs_context; "priv" => priv_, "ABI_placeholder1" => abi_placeholder1,
        "ABI_placeholder2" => abi_placeholder2);
    fields!(o, ibv_device_attr; fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap,
        vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge,
        max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom,
        max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd,
        max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
        max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
        max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt);
    fields!(o, ibv_rss_caps; supported_qpts, max_rwq_indirection_tables,
        max_rwq_indirection_table_size, rx_hash_fields_mask, rx_hash_function);
    fields!(o, ibv_device_attr_ex; orig_attr, comp_mask, rss_caps, completion_timestamp_mask,
        hca_core_clock, device_cap_flags_ex, max_wq_type_rq, raw_packet_caps, max_dm_size,
        xrc_odp_caps, phys_port_cnt_ex);
    renamed!(o, ibv_device_attr_ex;
        "odp_caps.general_caps" => odp_general_caps,
        "odp_caps.per_transport_caps.rc_odp_caps" => odp_rc_caps,
        "odp_caps.per_transport_caps.ud_odp_caps" => odp_ud_caps,
        "tso_caps.max_tso" => tso_max_tso,
        "tso_caps.supported_qpts" => tso_supported_qpts,
        "rss_caps.supported_qpts" => rss_caps.supported_qpts,
        "rss_caps.rx_hash_fields_mask" => rss_caps.rx_hash_fields_mask,
        "rss_caps.rx_hash_function" => rss_caps.rx_hash_function,
        "packet_pacing_caps.qp_rate_limit_min" => pp_qp_rate_limit_min,
        "packet_pacing_caps.supported_qpts" => pp_supported_qpts,
        "tm_caps.max_rndv_hdr_size" => tm_max_rndv_hdr_size,
        "tm_caps.max_sge" => tm_max_sge,
        "cq_mod_caps.max_cq_count" => cq_mod_max_cq_count,
        "cq_mod_caps.max_cq_period" => cq_mod_max_cq_period,
        "pci_atomic_caps.fetch_add" => pci_atomic_fetch_add,
        "pci_atomic_caps.compare_swap" => pci_atomic_compare_swap);
    fields!(o, ibv_port_attr; state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags,
        max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num,
        sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state,
        link_layer, flags, port_cap_flags2);
    o.push(("ibv_gid".to_string(), size_of::<ibv_gid>()));
    o.push((
        "_Alignof ibv_gid".to_string(),
        core::mem::align_of::<ibv_gid>(),
    ));
    fields!(o, ibv_gid_entry; gid, gid_index, port_num, gid_type, ndev_ifindex);
    fields!(o, ibv_pd; context, handle);
    fields!(o, ibv_mr; context, pd, addr, length, handle, lkey, rkey);
    fields!(o, ibv_comp_channel; context, fd, refcnt);
    fields!(o, ibv_cq; context, channel, cq_context, handle, cqe, mutex, cond,
        comp_events_completed, async_events_completed);
    fields!(o, ibv_qp; context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state,
        qp_type, mutex, cond, events_completed);
    fields!(o, ibv_wc; wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp,
        wc_flags, pkey_index, slid, sl, dlid_path_bits);
    renamed!(o, ibv_wc; "invalidated_rkey" => imm_data);
    fields!(o, ibv_sge; addr, length, lkey);
    fields!(o, ibv_send_wr; wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data);
    renamed!(o, ibv_send_wr;
        "invalidate_rkey" => imm_data,
        "wr.rdma.remote_addr" => wr.remote_addr,
        "wr.rdma.rkey" => wr.compare_add,
        "wr.atomic.remote_addr" => wr.remote_addr,
        "wr.atomic.compare_add" => wr.compare_add,
        "wr.atomic.swap" => wr.swap,
        "wr.atomic.rkey" => wr.rkey,
        "qp_type.xrc.remote_srqn" => qp_type_xrc_remote_srqn,
        "bind_mw" => bind_mw_or_tso);
    fields!(o, ibv_recv_wr; wr_id, next, sg_list, num_sge);
    fields!(o, ibv_qp_cap; max_send_wr, max_recv_wr, max_send_sge, max_recv_sge,
        max_inline_data);
    fields!(o, ibv_global_route; dgid, flow_label, sgid_index, hop_limit, traffic_class);
    fields!(o, ibv_ah_attr; grh, dlid, sl, src_path_bits, static_rate, is_global, port_num);
    fields!(o, ibv_qp_attr; qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
        sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
        alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic,
        min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout,
        rate_limit);
    fields!(o, ibv_qp_init_attr; qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all);
    fields!(o, ibv_async_event; element, event_type);
    fields!(o, ibv_query_device_ex_input; comp_mask);
    fields!(o, ibv_ah; context, pd, handle);
    fields!(o, ibv_grh; version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid);
    fields!(o, ibv_srq; context, srq_context, pd, handle, mutex, cond, events_completed);
    fields!(o, ibv_srq_attr; max_wr, max_sge, srq_limit);
    fields!(o, ibv_srq_init_attr; srq_context, attr);
    fields!(o, ibv_qp_init_attr_ex; qp_context, send_cq, recv_cq, srq, cap, qp_type,
        sq_sig_all, comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl,
        rx_hash_conf, source_qpn, send_ops_flags);
    fields!(o, ibv_data_buf; addr, length);
    fields!(o, ibv_qp_ex; qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp,
        wr_atomic_fetch_add, wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write,
        wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr,
        wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge,
        wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write);
    fields!(o, ibv_poll_cq_attr; comp_mask);
    fields!(o, ibv_cq_ex; context, channel, cq_context, handle, cqe, mutex, cond,
        comp_events_completed, async_events_completed, comp_mask, status, wr_id, start_poll,
        next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len, read_imm_data,
        read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits,
        read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
        read_completion_wallclock_ns);
    fields!(o, ibv_cq_init_attr_ex; cqe, cq_context, channel, comp_vector, wc_flags,
        comp_mask, flags, parent_domain);
    fields!(o, ibv_values_ex; comp_mask, raw_clock);
    renamed!(o, ibv_send_wr;
        "wr.ud.ah" => wr.remote_addr,
        "wr.ud.remote_qpn" => wr.compare_add);
    o.push((
        "ibv_send_wr.wr.ud.remote_qkey".to_string(),
        offset_of!(ibv_send_wr, wr) + ibv_send_wr::UD_REMOTE_QKEY_OFFSET,
    ));
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::process::Command;

    /// The C program that prints every row of [`table`] from the system header.
    fn c_program(rows: &[Row]) -> String {
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        // The unions among the keys; every other name is a struct.
        let tag = |t: &str| {
            if t.ends_with("ibv_gid") {
                "union"
            } else {
                "struct"
            }
        };
        for (key, _) in rows {
            let line = match key.split_once('.') {
                None if key.starts_with("_Alignof ") => {
                    let t = &key["_Alignof ".len()..];
                    format!(
                        "  printf(\"%s %zu\\n\", \"{key}\", _Alignof({} {t}));\n",
                        tag(t)
                    )
                }
                None => format!(
                    "  printf(\"%s %zu\\n\", \"{key}\", sizeof({} {key}));\n",
                    tag(key)
                ),
                Some((t, f)) => {
                    format!("  printf(\"%s %zu\\n\", \"{key}\", offsetof(struct {t}, {f}));\n")
                }
            };
            c.push_str(&line);
        }
        c.push_str("  return 0;\n}\n");
        c
    }

    #[test]
    fn every_struct_matches_the_system_verbs_h() {
        if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true needs libibverbs-dev (/usr/include/infiniband/verbs.h)"
            );
            eprintln!("skipped: no /usr/include/infiniband/verbs.h (libibverbs-dev)");
            return;
        }
        let rows = table();
        let dir = std::env::temp_dir().join(format!("xrnic-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
        std::fs::write(&src, c_program(&rows)).unwrap();
        let cc = Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("run cc");
        assert!(
            cc.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let c: BTreeMap<String, usize> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect();
        let mismatches: Vec<String> = rows
            .iter()
            .filter(|(k, v)| c.get(k) != Some(v))
            .map(|(k, v)| format!("{k}: Rust {v}, C {:?}", c.get(k)))
            .collect();
        assert_eq!(c.len(), rows.len(), "the C program printed every row");
        assert!(
            mismatches.is_empty(),
            "layout mismatches:\n{}",
            mismatches.join("\n")
        );
        // The sizes programs allocate themselves (verbs.h, rdma-core 44).
        assert_eq!(c["verbs_context"], 648);
        assert_eq!(c["ibv_context_ops.post_send"], 200);
    }
}

//! Every default-version symbol of rdma-core 39 to 56's libibverbs.so.1 (the lists of
//! libibverbs/libibverbs.map.in their builds export, tests/symbols/), bound to its
//! version node.
//!
//! How: for each symbol a global entry `xrnic_sym_NAME` (one `jmp` to the Rust function:
//! an alias made with `.set` is undefined in the object when the function lands in another
//! codegen unit) is marked `.symver xrnic_sym_NAME, NAME@@NODE`. rustc's version script
//! keeps the entry itself local, the linker exports the versioned name, and
//! libibverbs.map declares the nodes. The data-path ops are not exported (programs call
//! them through `ibv_context.ops`), so no hot call pays the `jmp`.
//! Unit tests build without the aliases (a test binary has no version script).

macro_rules! export {
    ($(fn $name:ident @ $ver:literal => $($f:ident)::+;)* $(data $dname:ident @ $dver:literal = $val:literal;)*) => {
        $(
            #[cfg(not(test))]
            core::arch::global_asm!(
                ".text",
                concat!(".globl xrnic_sym_", stringify!($name)),
                concat!(".type xrnic_sym_", stringify!($name), ", @function"),
                concat!(".symver xrnic_sym_", stringify!($name), ", ", stringify!($name), "@@", $ver),
                concat!("xrnic_sym_", stringify!($name), ":"),
                "jmp {f}",
                f = sym $($f)::+,
            );
        )*
        $(
            #[cfg(not(test))]
            core::arch::global_asm!(
                ".pushsection .rodata",
                concat!(".globl xrnic_sym_", stringify!($dname)),
                concat!(".type xrnic_sym_", stringify!($dname), ", @object"),
                concat!(".size xrnic_sym_", stringify!($dname), ", 1"),
                concat!(".symver xrnic_sym_", stringify!($dname), ", ", stringify!($dname), "@@", $dver),
                concat!("xrnic_sym_", stringify!($dname), ":"),
                concat!(".byte ", $val),
                ".popsection",
            );
        )*

        /// Unit tests build without the `.symver` entries: the table names the same
        /// functions, so the test build checks that each exists.
        #[cfg(test)]
        pub(crate) fn table() -> Vec<(&'static str, &'static str, usize)> {
            vec![$((stringify!($name), $ver, $($f)::+ as *const () as usize),)*]
        }
    };
}

use crate::{ah, cq, device, events, mcast, misc, mr, qp, srq, stubs};

export! {

    // IBVERBS_1.0
    fn ibv_copy_path_rec_from_kern @ "IBVERBS_1.0" => stubs::ibv_copy_path_rec_from_kern;
    fn ibv_copy_path_rec_to_kern @ "IBVERBS_1.0" => stubs::ibv_copy_path_rec_to_kern;
    fn ibv_copy_qp_attr_from_kern @ "IBVERBS_1.0" => stubs::ibv_copy_qp_attr_from_kern;
    fn ibv_create_comp_channel @ "IBVERBS_1.0" => cq::ibv_create_comp_channel;
    fn ibv_destroy_comp_channel @ "IBVERBS_1.0" => cq::ibv_destroy_comp_channel;
    fn ibv_get_sysfs_path @ "IBVERBS_1.0" => device::ibv_get_sysfs_path;
    fn ibv_rate_to_mult @ "IBVERBS_1.0" => misc::ibv_rate_to_mult;
    fn ibv_read_sysfs_file @ "IBVERBS_1.0" => device::ibv_read_sysfs_file;
    fn mult_to_ibv_rate @ "IBVERBS_1.0" => misc::mult_to_ibv_rate;

    // IBVERBS_1.1
    fn ibv_ack_async_event @ "IBVERBS_1.1" => events::ibv_ack_async_event;
    fn ibv_ack_cq_events @ "IBVERBS_1.1" => cq::ibv_ack_cq_events;
    fn ibv_alloc_pd @ "IBVERBS_1.1" => mr::ibv_alloc_pd;
    fn ibv_attach_mcast @ "IBVERBS_1.1" => mcast::ibv_attach_mcast;
    fn ibv_close_device @ "IBVERBS_1.1" => device::ibv_close_device;
    fn ibv_copy_ah_attr_from_kern @ "IBVERBS_1.1" => stubs::ibv_copy_ah_attr_from_kern;
    fn ibv_create_ah @ "IBVERBS_1.1" => ah::ibv_create_ah;
    fn ibv_create_ah_from_wc @ "IBVERBS_1.1" => ah::ibv_create_ah_from_wc;
    fn ibv_create_cq @ "IBVERBS_1.1" => cq::ibv_create_cq;
    fn ibv_create_qp @ "IBVERBS_1.1" => qp::ibv_create_qp;
    fn ibv_create_srq @ "IBVERBS_1.1" => srq::ibv_create_srq;
    fn ibv_dealloc_pd @ "IBVERBS_1.1" => mr::ibv_dealloc_pd;
    fn ibv_dereg_mr @ "IBVERBS_1.1" => mr::ibv_dereg_mr;
    fn ibv_destroy_ah @ "IBVERBS_1.1" => ah::ibv_destroy_ah;
    fn ibv_destroy_cq @ "IBVERBS_1.1" => cq::ibv_destroy_cq;
    fn ibv_destroy_qp @ "IBVERBS_1.1" => qp::ibv_destroy_qp;
    fn ibv_destroy_srq @ "IBVERBS_1.1" => srq::ibv_destroy_srq;
    fn ibv_detach_mcast @ "IBVERBS_1.1" => mcast::ibv_detach_mcast;
    fn ibv_dofork_range @ "IBVERBS_1.1" => misc::ibv_dofork_range;
    fn ibv_dontfork_range @ "IBVERBS_1.1" => misc::ibv_dontfork_range;
    fn ibv_event_type_str @ "IBVERBS_1.1" => misc::ibv_event_type_str;
    fn ibv_fork_init @ "IBVERBS_1.1" => misc::ibv_fork_init;
    fn ibv_free_device_list @ "IBVERBS_1.1" => device::ibv_free_device_list;
    fn ibv_get_async_event @ "IBVERBS_1.1" => events::ibv_get_async_event;
    fn ibv_get_cq_event @ "IBVERBS_1.1" => cq::ibv_get_cq_event;
    fn ibv_get_device_guid @ "IBVERBS_1.1" => device::ibv_get_device_guid;
    fn ibv_get_device_list @ "IBVERBS_1.1" => device::ibv_get_device_list;
    fn ibv_get_device_name @ "IBVERBS_1.1" => device::ibv_get_device_name;
    fn ibv_init_ah_from_wc @ "IBVERBS_1.1" => ah::ibv_init_ah_from_wc;
    fn ibv_modify_qp @ "IBVERBS_1.1" => qp::ibv_modify_qp;
    fn ibv_modify_srq @ "IBVERBS_1.1" => srq::ibv_modify_srq;
    fn ibv_node_type_str @ "IBVERBS_1.1" => misc::ibv_node_type_str;
    fn ibv_open_device @ "IBVERBS_1.1" => device::ibv_open_device;
    fn ibv_port_state_str @ "IBVERBS_1.1" => misc::ibv_port_state_str;
    fn ibv_query_device @ "IBVERBS_1.1" => device::ibv_query_device;
    fn ibv_query_gid @ "IBVERBS_1.1" => device::ibv_query_gid;
    fn ibv_query_pkey @ "IBVERBS_1.1" => device::ibv_query_pkey;
    fn ibv_query_port @ "IBVERBS_1.1" => device::ibv_query_port;
    fn ibv_query_qp @ "IBVERBS_1.1" => qp::ibv_query_qp;
    fn ibv_query_srq @ "IBVERBS_1.1" => srq::ibv_query_srq;
    fn ibv_rate_to_mbps @ "IBVERBS_1.1" => misc::ibv_rate_to_mbps;
    fn ibv_reg_mr @ "IBVERBS_1.1" => mr::ibv_reg_mr;
    fn ibv_rereg_mr @ "IBVERBS_1.1" => stubs::ibv_rereg_mr;
    fn ibv_resize_cq @ "IBVERBS_1.1" => cq::ibv_resize_cq;
    fn ibv_resolve_eth_l2_from_gid @ "IBVERBS_1.1" => stubs::ibv_resolve_eth_l2_from_gid;
    fn ibv_wc_status_str @ "IBVERBS_1.1" => misc::ibv_wc_status_str;
    fn mbps_to_ibv_rate @ "IBVERBS_1.1" => misc::mbps_to_ibv_rate;

    // IBVERBS_1.5
    fn ibv_get_pkey_index @ "IBVERBS_1.5" => device::ibv_get_pkey_index;

    // IBVERBS_1.6
    fn ibv_qp_to_qp_ex @ "IBVERBS_1.6" => qp::ibv_qp_to_qp_ex;

    // IBVERBS_1.7
    fn ibv_reg_mr_iova @ "IBVERBS_1.7" => mr::ibv_reg_mr_iova;

    // IBVERBS_1.8
    fn ibv_reg_mr_iova2 @ "IBVERBS_1.8" => mr::ibv_reg_mr_iova2;

    // IBVERBS_1.9
    fn ibv_get_device_index @ "IBVERBS_1.9" => device::ibv_get_device_index;

    // IBVERBS_1.10
    fn ibv_import_device @ "IBVERBS_1.10" => stubs::ibv_import_device;
    fn ibv_import_mr @ "IBVERBS_1.10" => stubs::ibv_import_mr;
    fn ibv_import_pd @ "IBVERBS_1.10" => stubs::ibv_import_pd;
    fn ibv_query_ece @ "IBVERBS_1.10" => stubs::ibv_query_ece;
    fn ibv_set_ece @ "IBVERBS_1.10" => stubs::ibv_set_ece;
    fn ibv_unimport_mr @ "IBVERBS_1.10" => stubs::ibv_unimport_mr;
    fn ibv_unimport_pd @ "IBVERBS_1.10" => stubs::ibv_unimport_pd;

    // IBVERBS_1.11
    fn _ibv_query_gid_ex @ "IBVERBS_1.11" => device::_ibv_query_gid_ex;
    fn _ibv_query_gid_table @ "IBVERBS_1.11" => device::_ibv_query_gid_table;

    // IBVERBS_1.12
    fn ibv_reg_dmabuf_mr @ "IBVERBS_1.12" => stubs::ibv_reg_dmabuf_mr;

    // IBVERBS_1.13
    fn ibv_import_dm @ "IBVERBS_1.13" => stubs::ibv_import_dm;
    fn ibv_is_fork_initialized @ "IBVERBS_1.13" => misc::ibv_is_fork_initialized;
    fn ibv_unimport_dm @ "IBVERBS_1.13" => stubs::ibv_unimport_dm;

    // IBVERBS_1.14
    fn ibv_query_qp_data_in_order @ "IBVERBS_1.14" => misc::ibv_query_qp_data_in_order;

    // IBVERBS_PRIVATE_34
    fn __ioctl_final_num_attrs @ "IBVERBS_PRIVATE_34" => stubs::__ioctl_final_num_attrs;
    fn __verbs_log @ "IBVERBS_PRIVATE_34" => stubs::__verbs_log;
    fn _verbs_init_and_alloc_context @ "IBVERBS_PRIVATE_34" => stubs::_verbs_init_and_alloc_context;
    fn execute_ioctl @ "IBVERBS_PRIVATE_34" => stubs::execute_ioctl;
    fn ibv_cmd_advise_mr @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_advise_mr;
    fn ibv_cmd_alloc_dm @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_alloc_dm;
    fn ibv_cmd_alloc_mw @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_alloc_mw;
    fn ibv_cmd_alloc_pd @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_alloc_pd;
    fn ibv_cmd_attach_mcast @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_attach_mcast;
    fn ibv_cmd_close_xrcd @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_close_xrcd;
    fn ibv_cmd_create_ah @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_ah;
    fn ibv_cmd_create_counters @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_counters;
    fn ibv_cmd_create_cq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_cq;
    fn ibv_cmd_create_cq_ex @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_cq_ex;
    fn ibv_cmd_create_cq_ex2 @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_cq_ex2;
    fn ibv_cmd_create_flow @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_flow;
    fn ibv_cmd_create_flow_action_esp @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_flow_action_esp;
    fn ibv_cmd_create_qp @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_qp;
    fn ibv_cmd_create_qp_ex @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_qp_ex;
    fn ibv_cmd_create_qp_ex2 @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_qp_ex2;
    fn ibv_cmd_create_rwq_ind_table @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_rwq_ind_table;
    fn ibv_cmd_create_srq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_srq;
    fn ibv_cmd_create_srq_ex @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_srq_ex;
    fn ibv_cmd_create_wq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_create_wq;
    fn ibv_cmd_dealloc_mw @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_dealloc_mw;
    fn ibv_cmd_dealloc_pd @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_dealloc_pd;
    fn ibv_cmd_dereg_mr @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_dereg_mr;
    fn ibv_cmd_destroy_ah @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_ah;
    fn ibv_cmd_destroy_counters @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_counters;
    fn ibv_cmd_destroy_cq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_cq;
    fn ibv_cmd_destroy_flow @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_flow;
    fn ibv_cmd_destroy_flow_action @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_flow_action;
    fn ibv_cmd_destroy_qp @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_qp;
    fn ibv_cmd_destroy_rwq_ind_table @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_rwq_ind_table;
    fn ibv_cmd_destroy_srq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_srq;
    fn ibv_cmd_destroy_wq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_destroy_wq;
    fn ibv_cmd_detach_mcast @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_detach_mcast;
    fn ibv_cmd_free_dm @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_free_dm;
    fn ibv_cmd_get_context @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_get_context;
    fn ibv_cmd_modify_cq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_modify_cq;
    fn ibv_cmd_modify_flow_action_esp @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_modify_flow_action_esp;
    fn ibv_cmd_modify_qp @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_modify_qp;
    fn ibv_cmd_modify_qp_ex @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_modify_qp_ex;
    fn ibv_cmd_modify_srq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_modify_srq;
    fn ibv_cmd_modify_wq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_modify_wq;
    fn ibv_cmd_open_qp @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_open_qp;
    fn ibv_cmd_open_xrcd @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_open_xrcd;
    fn ibv_cmd_poll_cq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_poll_cq;
    fn ibv_cmd_post_recv @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_post_recv;
    fn ibv_cmd_post_send @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_post_send;
    fn ibv_cmd_post_srq_recv @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_post_srq_recv;
    fn ibv_cmd_query_context @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_query_context;
    fn ibv_cmd_query_device_any @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_query_device_any;
    fn ibv_cmd_query_mr @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_query_mr;
    fn ibv_cmd_query_port @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_query_port;
    fn ibv_cmd_query_qp @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_query_qp;
    fn ibv_cmd_query_srq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_query_srq;
    fn ibv_cmd_read_counters @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_read_counters;
    fn ibv_cmd_reg_dm_mr @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_reg_dm_mr;
    fn ibv_cmd_reg_dmabuf_mr @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_reg_dmabuf_mr;
    fn ibv_cmd_reg_mr @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_reg_mr;
    fn ibv_cmd_req_notify_cq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_req_notify_cq;
    fn ibv_cmd_rereg_mr @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_rereg_mr;
    fn ibv_cmd_resize_cq @ "IBVERBS_PRIVATE_34" => stubs::ibv_cmd_resize_cq;
    fn ibv_query_gid_type @ "IBVERBS_PRIVATE_34" => device::ibv_query_gid_type;
    fn ibv_read_ibdev_sysfs_file @ "IBVERBS_PRIVATE_34" => stubs::ibv_read_ibdev_sysfs_file;
    fn ibv_wr_opcode_str @ "IBVERBS_PRIVATE_34" => misc::ibv_wr_opcode_str;
    fn verbs_init_cq @ "IBVERBS_PRIVATE_34" => stubs::verbs_init_cq;
    fn verbs_open_device @ "IBVERBS_PRIVATE_34" => stubs::verbs_open_device;
    fn verbs_register_driver_34 @ "IBVERBS_PRIVATE_34" => misc::verbs_register_driver_34;
    fn verbs_set_ops @ "IBVERBS_PRIVATE_34" => stubs::verbs_set_ops;
    fn verbs_uninit_context @ "IBVERBS_PRIVATE_34" => stubs::verbs_uninit_context;

    // driver.h `bool verbs_allow_disassociate_destroy`, read by providers only: false.
    data verbs_allow_disassociate_destroy @ "IBVERBS_PRIVATE_34" = "0";
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_symbol_once_at_a_declared_node() {
        let t = super::table();
        let map = include_str!("libibverbs.map");
        let mut names: Vec<&str> = t.iter().map(|e| e.0).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), t.len(), "a symbol listed twice");
        for (name, ver, f) in &t {
            assert!(
                map.contains(&format!("{ver} {{")),
                "{name}: node {ver} not in libibverbs.map"
            );
            assert_ne!(*f, 0, "{name}");
        }
    }
}

// librdmacm's symbols, with the same macro (its textual scope covers this child module).
#[path = "rdmacm_exports.rs"]
mod rdmacm_exports;
#[cfg(test)]
pub(crate) use rdmacm_exports::table as rdmacm_table;

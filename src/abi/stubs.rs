//! Entry points xrnic does not implement (yet): each returns the error its caller
//! checks for, with errno `EOPNOTSUPP`, and never touches its arguments.
//!
//! - `int` verbs return `EOPNOTSUPP` (libibverbs verbs return the errno value);
//! - the two event calls return -1 (their documented error);
//! - constructors return NULL;
//! - `void` calls do nothing: the provider hooks (`verbs_set_ops`, `verbs_init_cq`, ...)
//!   only run inside a provider this library never loads; the `ibv_copy_*_kern`
//!   converters and `ibv_unimport_*` have no object of ours to act on;
//!   `ibv_ack_*_events` have no event of ours to acknowledge.
//!
//! The functions take no parameters: on x86-64 a callee may ignore its arguments, and
//! the C prototypes live in verbs.h / driver.h.

use core::ffi::{c_int, c_uint, c_void};

use crate::{guard, set_errno};

macro_rules! int_stubs {
    ($($name:ident),* $(,)?) => {$(
        pub extern "C" fn $name() -> c_int {
            guard(libc::EIO, || {
                set_errno(libc::EOPNOTSUPP);
                libc::EOPNOTSUPP
            })
        }
    )*};
}

macro_rules! neg_stubs {
    ($($name:ident),* $(,)?) => {$(
        pub extern "C" fn $name() -> c_int {
            guard(-1, || {
                set_errno(libc::EOPNOTSUPP);
                -1
            })
        }
    )*};
}

macro_rules! null_stubs {
    ($($name:ident),* $(,)?) => {$(
        pub extern "C" fn $name() -> *mut c_void {
            guard(core::ptr::null_mut(), || {
                set_errno(libc::EOPNOTSUPP);
                core::ptr::null_mut()
            })
        }
    )*};
}

macro_rules! void_stubs {
    ($($name:ident),* $(,)?) => {$(
        pub extern "C" fn $name() {}
    )*};
}

/// `unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, ...)`: no ioctl
/// attributes without a kernel device.
pub extern "C" fn __ioctl_final_num_attrs() -> c_uint {
    0
}

int_stubs!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_cq_ex2,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    ibv_query_ece,
    ibv_rereg_mr,
    ibv_resolve_eth_l2_from_gid,
    ibv_set_ece
);

neg_stubs!(ibv_read_ibdev_sysfs_file);

null_stubs!(
    _verbs_init_and_alloc_context,
    ibv_import_device,
    ibv_import_dm,
    ibv_import_mr,
    ibv_import_pd,
    ibv_reg_dmabuf_mr,
    verbs_open_device
);

void_stubs!(
    __verbs_log,
    ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_unimport_dm,
    ibv_unimport_mr,
    ibv_unimport_pd,
    verbs_init_cq,
    verbs_set_ops,
    verbs_uninit_context
);

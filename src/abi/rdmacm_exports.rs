//! Every default-version symbol of rdma-core 44's librdmacm.so.1 (librdmacm/librdmacm.map),
//! bound to its RDMACM_1.x node by the `export!` macro of exports.rs; the nodes are in
//! libibverbs.map. `librdmacm.so.1` is a link to this library (docs/verbs-abi.md).

use crate::rdmacm::{self, unsupported};

export! {
    fn raccept @ "RDMACM_1.0" => unsupported::raccept;
    fn rbind @ "RDMACM_1.0" => unsupported::rbind;
    fn rclose @ "RDMACM_1.0" => unsupported::rclose;
    fn rconnect @ "RDMACM_1.0" => unsupported::rconnect;
    fn rdma_accept @ "RDMACM_1.0" => rdmacm::rdma_accept;
    fn rdma_ack_cm_event @ "RDMACM_1.0" => rdmacm::rdma_ack_cm_event;
    fn rdma_bind_addr @ "RDMACM_1.0" => rdmacm::rdma_bind_addr;
    fn rdma_connect @ "RDMACM_1.0" => rdmacm::rdma_connect;
    fn rdma_create_ep @ "RDMACM_1.0" => rdmacm::rdma_create_ep;
    fn rdma_create_event_channel @ "RDMACM_1.0" => rdmacm::rdma_create_event_channel;
    fn rdma_create_id @ "RDMACM_1.0" => rdmacm::rdma_create_id;
    fn rdma_create_qp @ "RDMACM_1.0" => rdmacm::rdma_create_qp;
    fn rdma_create_qp_ex @ "RDMACM_1.0" => unsupported::rdma_create_qp_ex;
    fn rdma_create_srq @ "RDMACM_1.0" => unsupported::rdma_create_srq;
    fn rdma_create_srq_ex @ "RDMACM_1.0" => unsupported::rdma_create_srq_ex;
    fn rdma_destroy_ep @ "RDMACM_1.0" => rdmacm::rdma_destroy_ep;
    fn rdma_destroy_event_channel @ "RDMACM_1.0" => rdmacm::rdma_destroy_event_channel;
    fn rdma_destroy_id @ "RDMACM_1.0" => rdmacm::rdma_destroy_id;
    fn rdma_destroy_qp @ "RDMACM_1.0" => rdmacm::rdma_destroy_qp;
    fn rdma_destroy_srq @ "RDMACM_1.0" => unsupported::rdma_destroy_srq;
    fn rdma_disconnect @ "RDMACM_1.0" => rdmacm::rdma_disconnect;
    fn rdma_event_str @ "RDMACM_1.0" => rdmacm::rdma_event_str;
    fn rdma_free_devices @ "RDMACM_1.0" => rdmacm::rdma_free_devices;
    fn rdma_freeaddrinfo @ "RDMACM_1.0" => rdmacm::rdma_freeaddrinfo;
    fn rdma_get_cm_event @ "RDMACM_1.0" => rdmacm::rdma_get_cm_event;
    fn rdma_get_devices @ "RDMACM_1.0" => rdmacm::rdma_get_devices;
    fn rdma_get_dst_port @ "RDMACM_1.0" => rdmacm::rdma_get_dst_port;
    fn rdma_get_request @ "RDMACM_1.0" => rdmacm::rdma_get_request;
    fn rdma_get_src_port @ "RDMACM_1.0" => rdmacm::rdma_get_src_port;
    fn rdma_getaddrinfo @ "RDMACM_1.0" => rdmacm::rdma_getaddrinfo;
    fn rdma_join_multicast @ "RDMACM_1.0" => rdmacm::rdma_join_multicast;
    fn rdma_leave_multicast @ "RDMACM_1.0" => rdmacm::rdma_leave_multicast;
    fn rdma_listen @ "RDMACM_1.0" => rdmacm::rdma_listen;
    fn rdma_migrate_id @ "RDMACM_1.0" => rdmacm::rdma_migrate_id;
    fn rdma_notify @ "RDMACM_1.0" => rdmacm::rdma_notify;
    fn rdma_reject @ "RDMACM_1.0" => rdmacm::rdma_reject;
    fn rdma_resolve_addr @ "RDMACM_1.0" => rdmacm::rdma_resolve_addr;
    fn rdma_resolve_route @ "RDMACM_1.0" => rdmacm::rdma_resolve_route;
    fn rdma_set_option @ "RDMACM_1.0" => rdmacm::rdma_set_option;
    fn rfcntl @ "RDMACM_1.0" => unsupported::rfcntl;
    fn rgetpeername @ "RDMACM_1.0" => unsupported::rgetpeername;
    fn rgetsockname @ "RDMACM_1.0" => unsupported::rgetsockname;
    fn rgetsockopt @ "RDMACM_1.0" => unsupported::rgetsockopt;
    fn riomap @ "RDMACM_1.0" => unsupported::riomap;
    fn riounmap @ "RDMACM_1.0" => unsupported::riounmap;
    fn riowrite @ "RDMACM_1.0" => unsupported::riowrite;
    fn rlisten @ "RDMACM_1.0" => unsupported::rlisten;
    fn rpoll @ "RDMACM_1.0" => unsupported::rpoll;
    fn rread @ "RDMACM_1.0" => unsupported::rread;
    fn rreadv @ "RDMACM_1.0" => unsupported::rreadv;
    fn rrecv @ "RDMACM_1.0" => unsupported::rrecv;
    fn rrecvfrom @ "RDMACM_1.0" => unsupported::rrecvfrom;
    fn rrecvmsg @ "RDMACM_1.0" => unsupported::rrecvmsg;
    fn rselect @ "RDMACM_1.0" => unsupported::rselect;
    fn rsend @ "RDMACM_1.0" => unsupported::rsend;
    fn rsendmsg @ "RDMACM_1.0" => unsupported::rsendmsg;
    fn rsendto @ "RDMACM_1.0" => unsupported::rsendto;
    fn rsetsockopt @ "RDMACM_1.0" => unsupported::rsetsockopt;
    fn rshutdown @ "RDMACM_1.0" => unsupported::rshutdown;
    fn rsocket @ "RDMACM_1.0" => unsupported::rsocket;
    fn rwrite @ "RDMACM_1.0" => unsupported::rwrite;
    fn rwritev @ "RDMACM_1.0" => unsupported::rwritev;
    fn rdma_join_multicast_ex @ "RDMACM_1.1" => rdmacm::rdma_join_multicast_ex;
    fn rdma_establish @ "RDMACM_1.2" => rdmacm::rdma_establish;
    fn rdma_init_qp_attr @ "RDMACM_1.2" => rdmacm::rdma_init_qp_attr;
    fn rdma_get_remote_ece @ "RDMACM_1.3" => rdmacm::rdma_get_remote_ece;
    fn rdma_reject_ece @ "RDMACM_1.3" => rdmacm::rdma_reject_ece;
    fn rdma_set_local_ece @ "RDMACM_1.3" => rdmacm::rdma_set_local_ece;
}

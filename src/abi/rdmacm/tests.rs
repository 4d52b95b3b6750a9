use super::*;

/// The export table names 68 distinct librdmacm symbols, each at an RDMACM node
/// (tests/rdmacm_exports.rs compares the built library with Debian's).
#[test]
fn export_table_is_librdmacms() {
    let t = crate::exports::rdmacm_table();
    assert_eq!(t.len(), 68);
    let names: std::collections::HashSet<_> = t.iter().map(|e| e.0).collect();
    assert_eq!(names.len(), t.len());
    assert!(t.iter().all(|e| e.1.starts_with("RDMACM_1.") && e.2 != 0));
    for n in [
        "rdma_connect",
        "rdma_accept",
        "rdma_get_cm_event",
        "rsocket",
    ] {
        assert!(names.contains(n), "{n}");
    }
}

/// The answer's `rdma_addrinfo` is the first field of what the library allocates
/// (a reordered struct handed ucmatose a NULL source address).
#[test]
fn getaddrinfo_passive_and_active_numeric() {
    // SAFETY: plain C data, all-zero valid.
    let mut hints: rdma_addrinfo = unsafe { core::mem::zeroed() };
    hints.ai_flags = 1; // RAI_PASSIVE
    hints.ai_port_space = c_int::from(RDMA_PS_TCP);
    let mut res: *mut rdma_addrinfo = core::ptr::null_mut();
    let port = c"7471";
    assert_eq!(
        rdma_getaddrinfo(core::ptr::null(), port.as_ptr(), &hints, &mut res),
        0
    );
    // SAFETY: a live answer from rdma_getaddrinfo.
    let r = unsafe { &*res };
    assert_eq!(
        sockaddr(r.ai_src_addr),
        Some("0.0.0.0:7471".parse().unwrap())
    );
    assert!(r.ai_dst_addr.is_null());
    assert_eq!(
        (r.ai_family, r.ai_port_space, r.ai_src_len),
        (libc::AF_INET, 0x0106, 16)
    );
    rdma_freeaddrinfo(res);
    hints.ai_flags = 0;
    let node = c"fd00::2";
    assert_eq!(
        rdma_getaddrinfo(node.as_ptr(), port.as_ptr(), &hints, &mut res),
        0
    );
    // SAFETY: as above.
    let r = unsafe { &*res };
    assert_eq!(
        sockaddr(r.ai_dst_addr),
        Some("[fd00::2]:7471".parse().unwrap())
    );
    assert_eq!(r.ai_family, libc::AF_INET6);
    rdma_freeaddrinfo(res);
    let bad = c"not-an-address";
    assert_ne!(
        rdma_getaddrinfo(bad.as_ptr(), port.as_ptr(), &hints, &mut res),
        0
    );
}

#[test]
fn event_channel_fd_is_readable_while_events_wait() {
    let ch = rdma_create_event_channel();
    assert!(!ch.is_null());
    let mut id: *mut rdma_cm_id = core::ptr::null_mut();
    assert_eq!(
        rdma_create_id(ch, &mut id, core::ptr::null_mut(), 0x0106),
        0
    );
    // UD ids (RDMA_PS_UDP) are UD; IPoIB ids are refused with a clear errno.
    let mut ud: *mut rdma_cm_id = core::ptr::null_mut();
    assert_eq!(
        rdma_create_id(ch, &mut ud, core::ptr::null_mut(), 0x0111),
        0
    );
    // SAFETY: the id just made.
    assert_eq!(unsafe { (*ud).qp_type }, ud::QPT_UD);
    assert_eq!(rdma_destroy_id(ud), 0);
    let mut ipoib: *mut rdma_cm_id = core::ptr::null_mut();
    assert_eq!(
        rdma_create_id(ch, &mut ipoib, core::ptr::null_mut(), 0x0002),
        -1
    );
    // SAFETY: the program does not destroy the id `id` while this call uses it.
    let x = unsafe { xid(id) }.unwrap();
    push(ch, event(x, ev::ADDR_ERROR, -libc::ENODEV));
    // SAFETY: `ch` is a live channel; poll reads one pollfd.
    let fd = unsafe { (*ch).fd };
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no wait.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1);
    let mut e: *mut rdma_cm_event = core::ptr::null_mut();
    assert_eq!(rdma_get_cm_event(ch, &mut e), 0);
    // SAFETY: the event just returned.
    let (kind, status, eid) = unsafe { ((*e).event, (*e).status, (*e).id) };
    assert_eq!((kind, status, eid), (ev::ADDR_ERROR, -libc::ENODEV, id));
    assert_eq!(rdma_ack_cm_event(e), 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "no event left");
    assert_eq!(rdma_destroy_id(id), 0);
    assert_eq!(rdma_destroy_id(id), -1, "a destroyed id is refused");
    rdma_destroy_event_channel(ch);
    // SAFETY: rdma_event_str returns a static NUL-terminated string.
    let s = unsafe { core::ffi::CStr::from_ptr(rdma_event_str(ev::REJECTED)) };
    assert_eq!(s.to_str().unwrap(), "RDMA_CM_EVENT_REJECTED");
}

#[test]
fn ud_ids_qp_attributes_are_the_udp_port_space_ones() {
    // librdmacm ucma_init_ud_qp: INIT with port, P_Key index and RDMA_UDP_QKEY; RTR
    // with the state only; RTS with SQ PSN 0.
    let (a, m) = ud::init_qp_attr(1).unwrap();
    assert_eq!((a.qp_state, a.qkey, a.port_num), (1, 0x0123_4567, 1));
    assert_eq!(m, (1 | 1 << 4 | 1 << 5 | 1 << 6) as c_int);
    let (a, m) = ud::init_qp_attr(2).unwrap();
    assert_eq!((a.qp_state, m), (2, 1));
    let (a, m) = ud::init_qp_attr(3).unwrap();
    assert_eq!((a.qp_state, a.sq_psn, m), (3, 0, (1 | 1 << 16) as c_int));
    assert!(ud::init_qp_attr(4).is_err());
}

#[test]
fn a_sync_id_waits_for_its_event_and_keeps_it() {
    // A NULL channel: the id gets a channel of its own (librdmacm's synchronous mode).
    let mut id: *mut rdma_cm_id = core::ptr::null_mut();
    assert_eq!(
        rdma_create_id(
            core::ptr::null_mut(),
            &mut id,
            core::ptr::null_mut(),
            0x0106
        ),
        0
    );
    // SAFETY: the program does not destroy the id `id` while this call uses it.
    let x = unsafe { xid(id) }.unwrap();
    assert!(!x.c().channel.is_null());
    assert!(sync::is_sync(x));
    push(x.c().channel, event(x, ev::ADDR_RESOLVED, 0));
    assert_eq!(sync::complete(x), Ok(()));
    let first = x.c().event;
    assert!(!first.is_null());
    // SAFETY: the event the id holds.
    assert_eq!(unsafe { (*first).event }, ev::ADDR_RESOLVED);
    // A REJECTED event is ECONNREFUSED (ucma_complete), the previous event acked.
    let mut rej = event(x, ev::REJECTED, 28);
    rej.ev.status = 28;
    push(x.c().channel, rej);
    assert_eq!(sync::complete(x), Err(libc::ECONNREFUSED));
    // SAFETY: the event the id holds now.
    assert_eq!(unsafe { (*x.c().event).event }, ev::REJECTED);
    push(
        x.c().channel,
        event(x, ev::ROUTE_ERROR, -libc::EHOSTUNREACH),
    );
    assert_eq!(sync::complete(x), Err(libc::EHOSTUNREACH));
    // rdma_get_request refuses an id that is not a listener's event source.
    let mut ch_id: *mut rdma_cm_id = core::ptr::null_mut();
    let ch = rdma_create_event_channel();
    assert_eq!(
        rdma_create_id(ch, &mut ch_id, core::ptr::null_mut(), 0x0106),
        0
    );
    let mut out: *mut rdma_cm_id = core::ptr::null_mut();
    assert_eq!(rdma_get_request(ch_id, &mut out), -1);
    assert_eq!(rdma_destroy_id(ch_id), 0);
    rdma_destroy_event_channel(ch);
    // Destroying the sync id frees its channel and its last event.
    assert_eq!(rdma_destroy_id(id), 0);
}

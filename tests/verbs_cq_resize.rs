//! `Cq::resize` (`ibv_resize_cq`) on the software engine, on the in-process simulated
//! link (no root needed): a CQ grows and shrinks with completions queued and keeps them
//! in order; fewer slots than are queued is refused (EINVAL, as rxe's
//! `rxe_cq_chk_attr`) and changes nothing; a grown CQ holds more than it did.

use xrnic::verbs::{Access, AttrMask, Device, QpAttr, QpInitAttr, QpState, RecvWr, WcStatus};

#[test]
fn a_cq_resizes_with_completions_queued_and_keeps_them_in_order() {
    let (dev, _peer) = Device::open_sim_pair().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let mr = pd.reg_mr(4096, Access::ALL).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&err, AttrMask::STATE).unwrap();
    // A receive posted in ERR completes at once, flushed (IBTA vol. 1 §10.8.3.3).
    let recv = |id: u64| {
        qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![mr.sge(0, 64)],
        })
        .unwrap()
    };
    for id in 0..5 {
        recv(id);
    }
    assert_eq!(cq.pending().unwrap(), 5);
    let e = cq.resize(4).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert_eq!(
        cq.pending().unwrap(),
        5,
        "a refused resize keeps what is queued"
    );
    cq.resize(5).unwrap();
    // Full at 5: a sixth flush overruns (dropped).
    recv(5);
    assert_eq!(cq.pending().unwrap(), 5);
    cq.resize(64).unwrap();
    for id in 6..20 {
        recv(id);
    }
    assert_eq!(cq.pending().unwrap(), 19, "the grown CQ holds 19");
    let mut got = Vec::new();
    while cq.try_poll_into(64, &mut got).unwrap() > 0 {}
    let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    let want: Vec<u64> = (0..5).chain(6..20).collect();
    assert_eq!(
        ids, want,
        "in order across the resizes, the overrun one missing"
    );
    assert!(got.iter().all(|w| w.status == WcStatus::WrFlushErr));
}

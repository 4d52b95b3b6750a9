//! Memory regions over the application's own memory (`Pd::reg_user_mr`, what the
//! libibverbs library registers for `ibv_reg_mr`): SEND, RDMA WRITE, RDMA READ and both
//! atomics move bytes between two applications' buffers on the simulated link, at the
//! IOVAs the applications chose, and the key, bounds and access checks still hold.

use std::time::Duration;

use xrnic::verbs::{
    Access, ConnectOpts, Cq, Device, Mr, Qp, QpInitAttr, RecvWr, Remote, SendWr, Sge, WcStatus,
    WrOpcode,
};

const PATIENCE: Duration = Duration::from_secs(10);
const LEN: usize = 16 * 1024;

struct End {
    cq: Cq,
    qp: Qp,
    mr: Mr,
    /// The application's buffer (u64 words: 8-byte aligned for the atomics).
    buf: Vec<u64>,
}

impl End {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `buf` is LEN bytes of plain u64s; read only between operations (after
        // their completions), when the engine does not write it.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const u8, LEN) }
    }

    fn fill(&mut self, at: usize, data: &[u8]) {
        // SAFETY: as in `bytes`, for writes before the operation is posted.
        let b = unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr() as *mut u8, LEN) };
        b[at..at + data.len()].copy_from_slice(data);
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn wait_one(&self) -> WcStatus {
        let wc = self.cq.wait(1, PATIENCE);
        assert_eq!(wc.len(), 1, "one completion within {PATIENCE:?}");
        wc[0].status
    }
}

fn end(dev: &Device, iova: Option<u64>) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut buf = vec![0u64; LEN / 8];
    let addr = buf.as_mut_ptr() as *mut u8;
    let iova = iova.unwrap_or(addr as u64);
    // SAFETY: `buf` lives in the returned End, beside `mr`, and is dropped after it
    // (field order: mr before buf).
    let mr = unsafe { pd.reg_user_mr(addr, LEN, iova, Access::ALL) }.unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
    End { cq, qp, mr, buf }
}

fn connect(a: &End, b: &End, da: &Device, db: &Device) {
    let gid = |d: &Device| d.query_gid(1).unwrap();
    let o = ConnectOpts {
        access: Access::ALL,
        ..Default::default()
    };
    let ra = Remote {
        qpn: b.qp.qp_num(),
        psn: 0x10,
        gid: gid(db),
    };
    let rb = Remote {
        qpn: a.qp.qp_num(),
        psn: 0x20,
        gid: gid(da),
    };
    a.qp.connect(&ra, 0x20, 1, &o).unwrap();
    b.qp.connect(&rb, 0x10, 1, &o).unwrap();
}

#[test]
fn every_operation_moves_bytes_between_application_buffers() {
    let (da, db) = Device::open_sim_pair().unwrap();
    // A at its own address; B at an IOVA unrelated to its address (ibv_reg_mr_iova2).
    let mut a = end(&da, None);
    let mut b = end(&db, Some(0x5000_0000));
    assert_eq!(a.mr.addr(), a.buf.as_ptr() as u64);
    assert_eq!(b.mr.addr(), 0x5000_0000);
    connect(&a, &b, &da, &db);
    let pattern: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();

    // SEND of 5000 bytes (5 packets at MTU 1024), two SGEs on each side.
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![b.sge(100, 3000), b.sge(8000, 3000)],
    })
    .unwrap();
    a.fill(0, &pattern);
    let mut wr = SendWr::new(2, WrOpcode::Send);
    wr.sg_list = vec![a.sge(0, 1234), a.sge(1234, 5000 - 1234)];
    a.qp.post_send(wr).unwrap();
    assert_eq!(a.wait_one(), WcStatus::Success);
    assert_eq!(b.wait_one(), WcStatus::Success);
    assert_eq!(&b.bytes()[100..3100], &pattern[..3000]);
    assert_eq!(&b.bytes()[8000..10000], &pattern[3000..]);

    // RDMA WRITE into B's buffer at its IOVA.
    a.fill(6000, b"written by A");
    let mut wr = SendWr::new(3, WrOpcode::RdmaWrite);
    wr.sg_list = vec![a.sge(6000, 12)];
    wr.rdma.remote_addr = b.mr.addr() + 12000;
    wr.rdma.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    assert_eq!(a.wait_one(), WcStatus::Success);
    assert_eq!(&b.bytes()[12000..12012], b"written by A");

    // RDMA READ of B's first SEND bytes back into A's buffer.
    let mut wr = SendWr::new(4, WrOpcode::RdmaRead);
    wr.sg_list = vec![a.sge(10000, 3000)];
    wr.rdma.remote_addr = b.mr.addr() + 100;
    wr.rdma.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    assert_eq!(a.wait_one(), WcStatus::Success);
    assert_eq!(&a.bytes()[10000..13000], &pattern[..3000]);

    // FETCH_ADD then CMP_SWAP on B's word 2; the originals land in A's word 1.
    b.buf[2] = 40;
    for (id, op, cmp, val, orig, after) in [
        (5, WrOpcode::AtomicFetchAndAdd, 0, 2, 40, 42),
        (6, WrOpcode::AtomicCmpAndSwp, 42, 7, 42, 7),
        (7, WrOpcode::AtomicCmpAndSwp, 42, 9, 7, 7),
    ] {
        let mut wr = SendWr::new(id, op);
        wr.sg_list = vec![a.sge(8, 8)];
        wr.atomic.remote_addr = b.mr.addr() + 16;
        wr.atomic.rkey = b.mr.rkey();
        wr.atomic.compare_add = if op == WrOpcode::AtomicCmpAndSwp {
            cmp
        } else {
            val
        };
        wr.atomic.swap = val;
        a.qp.post_send(wr).unwrap();
        assert_eq!(a.wait_one(), WcStatus::Success);
        assert_eq!(a.buf[1], orig, "wr {id}: the original value");
        assert_eq!(b.buf[2], after, "wr {id}: B's word after");
    }

    // A WRITE past the end of B's region is a remote access error, B's bytes untouched.
    let mut wr = SendWr::new(8, WrOpcode::RdmaWrite);
    wr.sg_list = vec![a.sge(0, 16)];
    wr.rdma.remote_addr = b.mr.addr() + LEN as u64 - 8;
    wr.rdma.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    assert_eq!(a.wait_one(), WcStatus::RemAccessErr);
    assert!(b.bytes()[LEN - 8..].iter().all(|&x| x == 0));

    // The Rust accessors refuse a region over application memory (its owner has it).
    assert!(a.mr.read(0, &mut [0u8; 4]).is_err());
}

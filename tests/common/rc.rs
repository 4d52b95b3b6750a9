//! Two devices' RC QPs connected through GID index 1 (IPv4-mapped) and a WRITE then a READ
//! of a whole region checked byte for byte: the transfer the AF_XDP mode tests run
//! (rnic_xdp_skb.rs, rnic_xdp_nofrags.rs).

use std::time::Duration;

use xrnic::verbs::{
    Access, ConnectOpts, Cq, Device, Mr, Mtu, Qp, QpInitAttr, Remote, SendWr, WcStatus, WrOpcode,
};

/// A's and B's ends of one connected RC QP pair, each with a region of `len` bytes.
pub struct Connected {
    pub cq_a: Cq,
    pub mr_a: Mr,
    pub qp_a: Qp,
    pub mr_b: Mr,
    pub qp_b: Qp,
    /// B's GID 1 and the options both ends connected with (for another QP to B).
    pub gid_b: [u8; 16],
    pub opts: ConnectOpts,
}

impl Connected {
    /// One PD, CQ, region of `len` bytes and RC QP on each device, connected at `mtu`.
    pub fn new(da: &Device, db: &Device, len: usize, mtu: Mtu) -> Connected {
        let mk = |d: &Device| {
            let pd = d.alloc_pd().unwrap();
            let cq = d.create_cq(256).unwrap();
            let mr = pd.reg_mr(len, Access::ALL).unwrap();
            let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 64)).unwrap();
            (cq, mr, qp)
        };
        let (cq_a, mr_a, qp_a) = mk(da);
        let (_cq_b, mr_b, qp_b) = mk(db);
        let opts = ConnectOpts {
            access: Access::ALL,
            path_mtu: mtu,
            ..ConnectOpts::default()
        };
        let (ga, gb) = (da.query_gid(1).unwrap(), db.query_gid(1).unwrap());
        qp_a.connect(&remote(qp_b.qp_num(), gb), 0x10, 1, &opts)
            .unwrap();
        qp_b.connect(&remote(qp_a.qp_num(), ga), 0x10, 1, &opts)
            .unwrap();
        Connected {
            cq_a,
            mr_a,
            qp_a,
            mr_b,
            qp_b,
            gid_b: gb,
            opts,
        }
    }

    /// `data` (the region's length) WRITTEN from A to B, A's region cleared, READ back:
    /// both completions succeed, and A's and B's regions hold exactly `data`.
    pub fn write_then_read_back(&self, data: &[u8]) {
        let len = data.len() as u32;
        self.mr_a.write(0, data).unwrap();
        for (id, op) in [(1, WrOpcode::RdmaWrite), (2, WrOpcode::RdmaRead)] {
            let mut wr = SendWr::new(id, op);
            wr.sg_list = vec![self.mr_a.sge(0, len)];
            wr.rdma.remote_addr = self.mr_b.addr();
            wr.rdma.rkey = self.mr_b.rkey();
            self.qp_a.post_send(wr).unwrap();
            let wcs = self.cq_a.wait(1, Duration::from_secs(20));
            assert_eq!(wcs.len(), 1, "{op:?} completion");
            assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
            if op == WrOpcode::RdmaWrite {
                // The READ overwrites A's source with what B holds: clear it first.
                self.mr_a.with_mut(|m| m.fill(0)).unwrap();
            }
        }
        let mut back = vec![0u8; data.len()];
        self.mr_a.read(0, &mut back).unwrap();
        assert!(
            back == data,
            "the READ brought back other bytes than the WRITE put"
        );
        self.mr_b.read(0, &mut back).unwrap();
        assert!(back == data, "B's region differs from what A wrote");
    }
}

/// The remote end of a connection: QP number, its first PSN (0x10) and GID.
pub fn remote(qpn: xrnic::wire::Qpn, gid: [u8; 16]) -> Remote {
    Remote {
        qpn,
        psn: 0x10,
        gid,
    }
}

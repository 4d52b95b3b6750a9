//! Fuzz target `engine`: a hostile peer. The input is a program of actions against one
//! xrnic engine (`proto::Rnic`, sans-IO): well-formed frames (valid ICRC, emitted by the
//! wire layer from fuzzer-chosen fields: any opcode the stack knows, PSN near the expected
//! one or anywhere, rkeys biased towards the real ones, VA, DMA length, AETH, DETH, atomic
//! operands, P_Key, ECN), steps of time, draining the transmit queue, and verbs the local
//! application would call (post receives, post READs/atomics/WRITEs/SENDs).
//!
//! The device holds QPs in every state (RESET, INIT, RTR, RTS in two PDs, one RTS QP with
//! only remote read rights, ERR) and memory regions over one application buffer with canary
//! bytes between them (plus one engine-owned region). After the input:
//! - no panic (libFuzzer catches it);
//! - every canary intact;
//! - no byte changed outside a range that some frame was allowed to write (rkey, PD,
//!   bounds and access rights of region and QP all matching; a shadow model of those
//!   ranges), or that the application handed to the engine (receive buffers, local
//!   buffers of its READs and atomics);
//! - no atomic executed twice: atomics executed <= distinct (QP, PSN) atomic requests that
//!   were allowed to execute;
//! - counters consistent: every frame handed in lands in exactly one place (a device drop
//!   counter or a QP's packets_received), packets_received >= dropped_wrong_state;
//! - queue lengths within their caps (send and receive queues <= max_wr, CQ <= cqe).
#![no_main]
#![warn(clippy::undocumented_unsafe_blocks)]

use libfuzzer_sys::fuzz_target;
use std::time::Duration;

use xrnic::proto::{
    Access, AddressVector, AttrMask, Cq, Instant, MAX_FRAME_LEN, MrInfo, Mtu, Pd, QpAttr,
    QpInitAttr, QpState, QpType, RecvWr, Rnic, SendWr, Sge, UserMem, WrOpcode,
};
use xrnic::sim::{Side, side_config};
use xrnic::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EthRepr, Ext, ExtHeaders,
    FethRepr, FrameRepr, IpRepr, Msn, OPCODE_ROWS, Opcode, Operation, PKey, Psn, Qpn, RethRepr,
    Rkey, RoceRepr, Syndrome, UdpRepr,
};

/// The fuzzer's bytes, read front to back; zeros once exhausted.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

const CANARY: u8 = 0xc5;
const GAP: usize = 64;
const MAX_WR: u32 = 16;
const CQE: usize = 32;
/// Base of the I/O virtual addresses of the user regions (not their process addresses).
const IOVA: u64 = 0x7000_0000_0000;

/// One QP of the device under attack.
#[derive(Clone, Copy)]
struct QpUnderTest {
    qpn: Qpn,
    pd: Pd,
    /// The QP's remote access flags (qp_access_flags).
    access: Access,
}

/// One region over the application buffer: `off..off+len` of it.
struct Region {
    mr: MrInfo,
    off: usize,
}

struct World {
    dev: Rnic,
    /// The application buffer (u64 for 8-byte alignment), canaries between the regions.
    buf: Vec<u64>,
    /// The pristine copy of `buf`.
    orig: Vec<u8>,
    /// Bytes of `buf` some operation was allowed to change.
    allowed: Vec<bool>,
    regions: Vec<Region>,
    /// An engine-owned region, its pristine bytes and its allowed map.
    owned: MrInfo,
    owned_orig: Vec<u8>,
    owned_allowed: Vec<bool>,
    qps: Vec<QpUnderTest>,
    /// Distinct (QPN, PSN) of atomic requests allowed to execute.
    atomics: std::collections::HashSet<(u32, u32)>,
    cq: Cq,
    /// The PSN of the first replayed capture frame.
    replay_first: Option<u32>,
    frames_in: u64,
    now: Instant,
    tx: Vec<u8>,
}

fn buf_bytes(buf: &[u64]) -> Vec<u8> {
    buf.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

fn av(gid: [u8; 16], mac: [u8; 6]) -> AddressVector {
    AddressVector {
        dmac: mac,
        dgid: gid,
        sgid_index: 0,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
        vlan_tci: None,
    }
}

/// Move `qpn` from RESET up to `to` (INIT, RTR or RTS), as `sim::Pair::connect` does.
fn bring_up(dev: &mut Rnic, qpn: Qpn, peer: Qpn, to: QpState, access: Access, rq_psn: u32) {
    let a = side_config(Side::A);
    let mut attr = QpAttr::rc_init(access);
    dev.modify_qp(qpn, &attr, AttrMask::RC_INIT).unwrap();
    if to == QpState::Init {
        return;
    }
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = av(a.gids[0], a.mac);
    attr.path_mtu = Mtu::Mtu1024;
    attr.dest_qp_num = peer;
    attr.rq_psn = Psn::new(rq_psn);
    attr.max_dest_rd_atomic = 4;
    attr.min_rnr_timer = 1;
    dev.modify_qp(qpn, &attr, AttrMask::RC_RTR).unwrap();
    if to == QpState::Rtr {
        return;
    }
    attr.qp_state = QpState::Rts;
    attr.timeout = 8;
    attr.retry_cnt = 3;
    attr.rnr_retry = 3;
    attr.sq_psn = Psn::new(rq_psn ^ 0x80_0000);
    attr.max_rd_atomic = 4;
    dev.modify_qp(qpn, &attr, AttrMask::RC_RTS).unwrap();
}

impl World {
    fn new() -> World {
        let mut dev = Rnic::new(side_config(Side::B));
        let pd = dev.alloc_pd();
        let pd2 = dev.alloc_pd();
        let cq = dev.create_cq(CQE);
        let init = QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            max_send_wr: MAX_WR,
            max_recv_wr: MAX_WR,
            sq_sig_all: false,
            qp_type: QpType::Rc,
            srq: None,
        };
        let peer = Qpn::new(0x11);
        let mut qps = Vec::new();
        // RTS (PD 1), RTS (PD 2), RTS with remote read only, RTR, INIT, RESET, ERR; the
        // RTS QPs start near the PSN wrap.
        let plan = [
            (pd, QpState::Rts, Access::ALL),
            (pd2, QpState::Rts, Access::ALL),
            (pd, QpState::Rts, Access::REMOTE_READ),
            (pd, QpState::Rtr, Access::ALL),
            (pd, QpState::Init, Access::ALL),
            (pd, QpState::Reset, Access::ALL),
            (pd, QpState::Err, Access::ALL),
        ];
        for (i, &(p, state, access)) in plan.iter().enumerate() {
            let qpn = dev.create_qp(p, &init).unwrap();
            let rq_psn = 0xff_fff0u32.wrapping_add(i as u32 * 0x10_0000) & 0xff_ffff;
            match state {
                QpState::Reset => {}
                QpState::Err => {
                    bring_up(&mut dev, qpn, peer, QpState::Rts, access, rq_psn);
                    let attr = QpAttr {
                        qp_state: QpState::Err,
                        ..QpAttr::rc_init(access)
                    };
                    dev.modify_qp(qpn, &attr, AttrMask::STATE).unwrap();
                }
                s => bring_up(&mut dev, qpn, peer, s, access, rq_psn),
            }
            assert_eq!(dev.query_qp(qpn).unwrap().qp_state, state);
            qps.push(QpUnderTest { qpn, pd: p, access });
        }

        // The application buffer: GAP canary bytes, a region, GAP canary bytes, ...
        let lw = Access::LOCAL_WRITE;
        let plan: [(Pd, usize, Access); 6] = [
            (pd, 4096, Access::ALL),
            (pd, 1024, Access(lw.0 | Access::REMOTE_WRITE.0)),
            (pd, 1024, Access::REMOTE_READ),
            (pd, 1024, Access(lw.0 | Access::REMOTE_ATOMIC.0)),
            (pd2, 1024, Access::ALL),
            (pd, 2048, lw), // receive buffers and local READ/atomic targets
        ];
        let total = GAP + plan.iter().map(|p| p.1 + GAP).sum::<usize>();
        let mut buf = vec![0u64; total / 8];
        let mut bytes = vec![CANARY; total];
        let mut off = GAP;
        let mut spans = Vec::new();
        for (i, &(_, len, _)) in plan.iter().enumerate() {
            for (j, b) in bytes[off..off + len].iter_mut().enumerate() {
                *b = (j as u8).wrapping_mul(31).wrapping_add(i as u8 * 17 + 1);
            }
            spans.push(off);
            off += len + GAP;
        }
        for (w, c) in buf.iter_mut().zip(bytes.chunks(8)) {
            *w = u64::from_ne_bytes(c.try_into().unwrap());
        }
        let base = buf.as_mut_ptr() as *mut u8;
        let mut regions = Vec::new();
        for (&(p, len, access), &off) in plan.iter().zip(&spans) {
            // SAFETY: `buf` lives in the World beside `dev` and is dropped after it (field
            // order: `dev` first), never resized, and only read through raw copies while
            // the engine holds the region (`buf_bytes` reads a copy via the Vec, which is
            // sound: no `&mut` to it exists while the engine writes, the fuzz target is
            // single-threaded and the engine writes only inside its calls).
            let mem = unsafe { UserMem::new(base.add(off), len) }.unwrap();
            let mr = dev.reg_user_mr(p, mem, IOVA + off as u64, access).unwrap();
            regions.push(Region { mr, off });
        }
        let owned = dev.reg_mr(pd, 512, Access::ALL).unwrap();
        for (j, b) in dev.mr_bytes_mut(owned.lkey).unwrap().iter_mut().enumerate() {
            *b = (j as u8) ^ 0x3c;
        }
        let owned_orig = dev.mr_bytes(owned.lkey).unwrap().to_vec();
        World {
            dev,
            orig: bytes,
            allowed: vec![false; total],
            buf,
            regions,
            owned,
            owned_allowed: vec![false; owned_orig.len()],
            owned_orig,
            qps,
            atomics: Default::default(),
            cq,
            replay_first: None,
            frames_in: 0,
            now: Instant::ZERO,
            tx: vec![0; MAX_FRAME_LEN],
        }
    }

    /// Every region: (info, allowed map, offset of the region in that map).
    fn mrs(&self) -> Vec<(MrInfo, bool, usize)> {
        let mut v: Vec<_> = self.regions.iter().map(|r| (r.mr, true, r.off)).collect();
        v.push((self.owned, false, 0));
        v
    }

    fn allow(&mut self, user: bool, off: usize, len: usize) {
        let m = if user {
            &mut self.allowed
        } else {
            &mut self.owned_allowed
        };
        for b in &mut m[off..off + len] {
            *b = true;
        }
    }

    /// Mark `va..va+len` of the region `rkey` names allowed when a request of `qp` with
    /// that target passes every check the spec demands (C9-xx, §10.6.3.3 / §9.7.5.1.x).
    fn allow_remote(
        &mut self,
        qp: QpUnderTest,
        rkey: Rkey,
        va: u64,
        len: u64,
        need: Access,
    ) -> bool {
        if !qp.access.contains(need) {
            return false;
        }
        for (mr, user, base) in self.mrs() {
            if mr.rkey != rkey || mr.pd != qp.pd || !mr.access.contains(need) {
                continue;
            }
            let Some(end) = va.checked_add(len) else {
                continue;
            };
            if va < mr.addr || end > mr.addr + mr.length as u64 {
                continue;
            }
            let off = base + (va - mr.addr) as usize;
            self.allow(user, off, len as usize);
            return true;
        }
        false
    }

    fn drain(&mut self, max: usize) {
        for _ in 0..max {
            if self.dev.poll_transmit(self.now, &mut self.tx).is_none() {
                break;
            }
        }
    }

    /// A frame from the peer (or a stranger) built from the fuzzer's fields.
    fn frame(&mut self, inp: &mut Input) {
        let row = &OPCODE_ROWS[inp.u8() as usize % OPCODE_ROWS.len()];
        let sel = inp.u8();
        let qp = self.qps[sel as usize % self.qps.len()];
        let dest_qp = if sel >= 0xf0 {
            Qpn::new(inp.u32())
        } else {
            qp.qpn
        };
        let attr = self.dev.query_qp(qp.qpn).unwrap();
        let flags = inp.u8();
        let delta = inp.u8() as i8 as i32;
        let base = if row.is_request() {
            attr.rq_psn.value()
        } else {
            attr.sq_psn.value()
        };
        let psn = match flags & 3 {
            3 => inp.u32() & 0xff_ffff,
            _ => base.wrapping_add(delta as u32) & 0xff_ffff,
        };
        let pick = inp.u8();
        let mrs = self.mrs();
        let (rkey, va) = if pick < 0xe0 {
            let (mr, _, _) = mrs[pick as usize % mrs.len()];
            let key = if pick & 0x10 != 0 {
                Rkey(mr.rkey.0 ^ u32::from(inp.u8()))
            } else {
                mr.rkey
            };
            let off = inp.u16() as u64;
            let va = if pick & 0x20 != 0 {
                mr.addr.wrapping_sub(off)
            } else {
                mr.addr.wrapping_add(off % (mr.length as u64 + 64))
            };
            (key, va)
        } else {
            (Rkey(inp.u32()), inp.u64())
        };
        let dma_len = match inp.u8() {
            0..=0xef => u32::from(inp.u16() % 2200),
            _ => inp.u32(),
        };
        let plen = if row.has_payload {
            usize::from(inp.u16() % 1100)
        } else {
            0
        };
        let fill = inp.u8();
        let payload: Vec<u8> = (0..plen).map(|i| fill.wrapping_add(i as u8)).collect();
        let mut ext = ExtHeaders::NONE;
        for e in row.exts.iter() {
            match e {
                Ext::Deth => {
                    ext.deth = Some(DethRepr {
                        qkey: inp.u32(),
                        src_qp: Qpn::new(inp.u32()),
                    })
                }
                Ext::Feth => {
                    ext.feth = Some(FethRepr {
                        selectivity: inp.u8(),
                        placement_type: inp.u8(),
                    })
                }
                Ext::Reth => {
                    ext.reth = Some(RethRepr { va, rkey, dma_len });
                }
                Ext::AtomicEth => {
                    ext.atomic = Some(AtomicEthRepr {
                        va,
                        rkey,
                        swap_add: inp.u64(),
                        compare: inp.u64(),
                    })
                }
                Ext::ImmDt => ext.immdt = Some(inp.u32()),
                Ext::Ieth => ext.ieth = Some(Rkey(inp.u32())),
                Ext::Aeth => {
                    ext.aeth = Some(AethRepr {
                        syndrome: Syndrome::from_byte(inp.u8()),
                        msn: Msn::new(inp.u32()),
                    })
                }
                Ext::AtomicAckEth => ext.atomic_ack = Some(AtomicAckEthRepr { orig: inp.u64() }),
                Ext::CnpPad => {}
            }
        }
        let a = side_config(Side::A);
        let b = side_config(Side::B);
        let opcode = Opcode(row.code);
        let stranger = flags & 0x40 != 0;
        let src_ip = if stranger {
            [192, 0, 2, 9]
        } else {
            [192, 0, 2, 1]
        };
        let pkey = if flags & 0x80 != 0 {
            PKey(inp.u16())
        } else {
            PKey::DEFAULT
        };
        let repr = FrameRepr {
            eth: EthRepr {
                dst: b.mac,
                src: a.mac,
                vlan_tci: None,
            },
            ip: IpRepr::V4 {
                src: src_ip,
                dst: [192, 0, 2, 2],
                tos: (flags >> 2) & 3,
                identification: 0,
                dont_fragment: true,
                ttl: 64,
            },
            udp: UdpRepr {
                src_port: 0xc000 | u16::from(flags),
                checksum: 0,
            },
            roce: RoceRepr {
                bth: BthRepr {
                    solicited: flags & 0x10 != 0,
                    ack_req: flags & 0x20 != 0,
                    pkey,
                    ..BthRepr::new(opcode, dest_qp, Psn::new(psn))
                },
                ext,
                payload: &payload,
            },
        };
        self.inject(&repr, stranger);
    }

    /// Emit `repr` (valid ICRC), update the shadow model with what it may write, and hand
    /// it to the engine.
    fn inject(&mut self, repr: &FrameRepr<'_>, stranger: bool) {
        let mut out = vec![0u8; repr.buffer_len()];
        let Ok(n) = repr.emit(&mut out) else {
            return;
        };
        let Some(info) = repr.roce.bth.opcode.info() else {
            return;
        };
        let (dest_qp, pkey) = (repr.roce.bth.dest_qp, repr.roce.bth.pkey);
        let psn = repr.roce.bth.psn.value();
        let ext = repr.roce.ext;
        // The shadow model: what this frame may write, if the engine takes it.
        // Over-approximated: the P_Key's partition matches (membership aside), the source is
        // the peer, and the destination is one of our QPs (whatever its state).
        let target = self.qps.iter().copied().find(|q| q.qpn == dest_qp);
        let pkey_ok = PKey::DEFAULT.0 & 0x7fff == pkey.0 & 0x7fff;
        if let (Some(qp), false, true) = (target, stranger, pkey_ok) {
            match (info.operation, ext.reth, ext.atomic) {
                (Operation::Write, Some(r), _) => {
                    self.allow_remote(qp, r.rkey, r.va, u64::from(r.dma_len), Access::REMOTE_WRITE);
                }
                // The guard's allow_remote records the range (it runs once, when the
                // pattern matches).
                (Operation::CmpSwap | Operation::FetchAdd, _, Some(a))
                    if a.va % 8 == 0
                        && self.allow_remote(qp, a.rkey, a.va, 8, Access::REMOTE_ATOMIC) =>
                {
                    self.atomics.insert((qp.qpn.value(), psn));
                }
                _ => {}
            }
        }
        self.frames_in += 1;
        let _ = self.dev.handle_frame(self.now, &out[..n]);
    }

    /// A frame of a real capture (the seeds), readdressed from the peer to one of our QPs,
    /// its PSN moved next to the one the QP expects (keeping the capture's PSN steps).
    fn replay(&mut self, inp: &mut Input) {
        let sel = inp.u8();
        let len = usize::from(inp.u16()).min(inp.0.len());
        let (bytes, rest) = inp.0.split_at(len);
        inp.0 = rest;
        let Ok(mut repr) = FrameRepr::parse(bytes) else {
            return;
        };
        let Some(info) = repr.roce.bth.opcode.info() else {
            return;
        };
        let qp = self.qps[sel as usize % self.qps.len()];
        let attr = self.dev.query_qp(qp.qpn).unwrap();
        let orig = repr.roce.bth.psn.value();
        let first = *self.replay_first.get_or_insert(orig);
        let base = if info.is_request() {
            attr.rq_psn.value()
        } else {
            attr.sq_psn.value()
        };
        if sel & 0x80 == 0 {
            let step = orig.wrapping_sub(first);
            repr.roce.bth.psn = Psn::new(base.wrapping_add(step) & 0xff_ffff);
        }
        repr.roce.bth.dest_qp = qp.qpn;
        let (a, b) = (side_config(Side::A), side_config(Side::B));
        repr.eth = EthRepr {
            dst: b.mac,
            src: a.mac,
            vlan_tci: None,
        };
        repr.ip = IpRepr::V4 {
            src: [192, 0, 2, 1],
            dst: [192, 0, 2, 2],
            tos: repr.ip.ecn(),
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        };
        self.inject(&repr, false);
    }

    fn post_recv(&mut self, inp: &mut Input) {
        let qp = self.qps[inp.u8() as usize % self.qps.len()];
        let r = &self.regions[5];
        let (mr, roff) = (r.mr, r.off);
        let off = usize::from(inp.u16()) % mr.length;
        let len = (usize::from(inp.u16()) % 1500).min(mr.length - off);
        let wr = RecvWr {
            wr_id: u64::from(inp.u8()),
            sg_list: vec![Sge {
                addr: mr.addr + off as u64,
                length: len as u32,
                lkey: mr.lkey,
            }],
        };
        if self.dev.post_recv(qp.qpn, wr).is_ok() {
            self.allow(true, roff + off, len);
        }
    }

    fn post_send(&mut self, inp: &mut Input) {
        let qp = self.qps[inp.u8() as usize % 3];
        let op = match inp.u8() % 6 {
            0 => WrOpcode::RdmaRead,
            1 => WrOpcode::AtomicCmpAndSwp,
            2 => WrOpcode::AtomicFetchAndAdd,
            3 => WrOpcode::RdmaWrite,
            4 => WrOpcode::Send,
            _ => WrOpcode::SendWithImm,
        };
        let r = &self.regions[5];
        let (mr, roff) = (r.mr, r.off);
        let atomic = matches!(op, WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd);
        let off = (usize::from(inp.u16()) % mr.length) & !7;
        let len = if atomic {
            8
        } else {
            (usize::from(inp.u16()) % 3000).min(mr.length - off)
        };
        let mut wr = SendWr::new(u64::from(inp.u8()), op);
        wr.sg_list = vec![Sge {
            addr: mr.addr + off as u64,
            length: len as u32,
            lkey: mr.lkey,
        }];
        wr.rdma.remote_addr = inp.u64();
        wr.rdma.rkey = Rkey(inp.u32());
        wr.atomic.remote_addr = wr.rdma.remote_addr & !7;
        wr.atomic.rkey = wr.rdma.rkey;
        if self.dev.post_send(qp.qpn, wr).is_ok() && (atomic || op == WrOpcode::RdmaRead) {
            // READ responses and atomic ACKs from the peer land here.
            self.allow(true, roff + off, len);
        }
    }

    fn check(&self) {
        let now = buf_bytes(&self.buf);
        let mut off = 0;
        for r in &self.regions {
            assert!(
                now[off..r.off].iter().all(|&b| b == CANARY),
                "canary before the region at {} overwritten",
                r.off
            );
            off = r.off + r.mr.length;
        }
        assert!(
            now[off..].iter().all(|&b| b == CANARY),
            "last canary overwritten"
        );
        for (i, (&n, &o)) in now.iter().zip(&self.orig).enumerate() {
            assert!(
                n == o || self.allowed[i],
                "byte {i} of the application buffer changed ({o:#x} -> {n:#x}) though no frame was allowed to write it"
            );
        }
        let owned = self.dev.mr_bytes(self.owned.lkey).unwrap();
        for (i, (&n, &o)) in owned.iter().zip(&self.owned_orig).enumerate() {
            assert!(
                n == o || self.owned_allowed[i],
                "byte {i} of the owned region changed ({o:#x} -> {n:#x}) without permission"
            );
        }

        let c = self.dev.counters();
        assert!(
            c.qp.atomics_executed <= self.atomics.len() as u64,
            "{} atomics executed, only {} distinct atomic requests were allowed",
            c.qp.atomics_executed,
            self.atomics.len()
        );
        let accounted = c.malformed_frames_dropped
            + c.wrong_address_dropped
            + c.unknown_qp_dropped
            + c.unsupported_dropped
            + c.bad_pkey_dropped
            + c.rp_cnp_handled
            + c.rp_cnp_ignored
            + c.qp.packets_received;
        assert_eq!(accounted, self.frames_in, "frames not accounted for: {c:?}");
        assert_eq!(
            c.malformed_frames_dropped, 0,
            "we only send well-formed frames"
        );
        for q in &self.qps {
            let qc = self.dev.qp_counters(q.qpn).unwrap();
            assert!(qc.packets_received >= qc.dropped_wrong_state);
            assert!(self.dev.send_queue_len(q.qpn) <= MAX_WR as usize);
        }
        let res = self.dev.resources();
        for q in &res.qps {
            assert!(
                q.sq_wrs <= MAX_WR as usize,
                "send queue past its cap: {q:?}"
            );
            assert!(
                q.rq_wrs <= MAX_WR as usize,
                "receive queue past its cap: {q:?}"
            );
            assert!(q.sq_started <= q.sq_wrs);
        }
        for cq in &res.cqs {
            assert!(cq.queued <= cq.cqe, "CQ past its size: {cq:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut w = World::new();
    let mut inp = Input(data);
    let mut steps = 0;
    while !inp.done() && steps < 512 {
        steps += 1;
        match inp.u8() % 9 {
            0..=3 => w.frame(&mut inp),
            4 => {
                let dt = match inp.u8() {
                    0..=0x7f => Duration::from_micros(u64::from(inp.u16())),
                    0x80..=0xef => Duration::from_millis(u64::from(inp.u16())),
                    _ => Duration::from_millis(u64::from(inp.u32())),
                };
                w.now = w.now.saturating_add(dt);
                w.dev.handle_timeout(w.now);
            }
            5 => w.drain(usize::from(inp.u8())),
            6 => w.post_recv(&mut inp),
            7 => w.post_send(&mut inp),
            _ => w.replay(&mut inp),
        }
        // Completions pile up like an application that polls rarely.
        if inp.u8() & 7 == 0 {
            let mut wcs = Vec::new();
            w.dev.poll_cq(w.cq, usize::MAX, &mut wcs);
        }
    }
    w.drain(4096);
    w.check();
});

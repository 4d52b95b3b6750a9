//! The fixed layouts of the ring slots: a work request in a submission slot, a work
//! completion in a completion slot (the rings themselves are [`crate::io::shm`]).

use crate::proto::{
    AtomicInfo, RdmaInfo, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
    WrOpcode,
};
use crate::wire::{Lkey, Qpn, Rkey};

/// Submission ring: slots of 256 bytes (32 words).
pub const SQ_SLOT_BYTES: usize = 256;
pub const SQ_WORDS: usize = SQ_SLOT_BYTES / 8;
/// Slots of a client's submission ring (every send and receive of all its QPs).
pub const SQ_SLOTS: u32 = 4096;
/// Most SGEs one work request carries through the ring.
pub const MAX_SGE: usize = 12;
/// Completion ring slots: 48 bytes.
pub const CQ_SLOT_BYTES: usize = 48;
pub const CQ_WORDS: usize = CQ_SLOT_BYTES / 8;

/// Whose a submission slot is.
const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
/// A UD send: as a send, words 3 and 4 name the destination ([`UdTarget`]).
const KIND_SEND_UD: u64 = 3;
/// A receive posted to an SRQ: word 1 is the client's handle of the SRQ.
const KIND_SRQ_RECV: u64 = 4;

const WR_OPCODES: [WrOpcode; 8] = [
    WrOpcode::Send,
    WrOpcode::SendWithImm,
    WrOpcode::SendWithInv,
    WrOpcode::RdmaWrite,
    WrOpcode::RdmaWriteWithImm,
    WrOpcode::RdmaRead,
    WrOpcode::AtomicCmpAndSwp,
    WrOpcode::AtomicFetchAndAdd,
];

/// Where a UD send goes (`ibv_send_wr.wr.ud`): the client's handle of the AH, the
/// remote QPN and the remote Q_Key (high bit set: the QP's own, as the engine reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdTarget {
    pub ah: u32,
    pub remote_qpn: Qpn,
    pub remote_qkey: u32,
}

/// A decoded submission slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    Send(Qpn, SendWr),
    Recv(Qpn, RecvWr),
    SendUd(Qpn, SendWr, UdTarget),
    /// A receive for the client's SRQ of this handle.
    SrqRecv(u32, RecvWr),
}

fn put_sges(w: &mut [u64; SQ_WORDS], sges: &[Sge]) -> Option<()> {
    if sges.len() > MAX_SGE {
        return None;
    }
    for (i, s) in sges.iter().enumerate() {
        w[8 + 2 * i] = s.addr;
        w[9 + 2 * i] = u64::from(s.length) | u64::from(s.lkey.0) << 32;
    }
    Some(())
}

fn get_sges(w: &[u64; SQ_WORDS], n: usize) -> Option<Vec<Sge>> {
    if n > MAX_SGE {
        return None;
    }
    Some(
        (0..n)
            .map(|i| Sge {
                addr: w[8 + 2 * i],
                length: w[9 + 2 * i] as u32,
                lkey: Lkey((w[9 + 2 * i] >> 32) as u32),
            })
            .collect(),
    )
}

/// Word 0: kind (bits 0..8), SGE count (8..16), opcode (16..24), send flags (32..64).
/// Word 1: the QPN (an SRQ receive: the SRQ's handle) and the immediate; word 2 the
/// wr_id; words 3..7 the remote address, keys and atomic operands (a UD send: the AH
/// handle and remote QPN, the remote Q_Key); words 8.. the SGEs.
pub fn encode_send(qpn: Qpn, wr: &SendWr) -> Option<[u64; SQ_WORDS]> {
    let mut w = [0u64; SQ_WORDS];
    let op = WR_OPCODES.iter().position(|&o| o == wr.opcode)? as u64;
    w[0] = KIND_SEND | (wr.sg_list.len() as u64) << 8 | op << 16 | u64::from(wr.send_flags.0) << 32;
    w[1] = u64::from(qpn.value()) | u64::from(wr.imm_data) << 32;
    w[2] = wr.wr_id;
    let (addr, rkey) = if wr.opcode.is_atomic() {
        (wr.atomic.remote_addr, wr.atomic.rkey)
    } else {
        (wr.rdma.remote_addr, wr.rdma.rkey)
    };
    w[3] = addr;
    w[4] = u64::from(rkey.0) | u64::from(wr.invalidate_rkey.0) << 32;
    w[5] = wr.atomic.compare_add;
    w[6] = wr.atomic.swap;
    put_sges(&mut w, &wr.sg_list)?;
    Some(w)
}

pub fn encode_recv(qpn: Qpn, wr: &RecvWr) -> Option<[u64; SQ_WORDS]> {
    encode_recv_kind(KIND_RECV, qpn.value(), wr)
}

/// A receive for the client's SRQ `srq`.
pub fn encode_srq_recv(srq: u32, wr: &RecvWr) -> Option<[u64; SQ_WORDS]> {
    encode_recv_kind(KIND_SRQ_RECV, srq, wr)
}

fn encode_recv_kind(kind: u64, target: u32, wr: &RecvWr) -> Option<[u64; SQ_WORDS]> {
    let mut w = [0u64; SQ_WORDS];
    w[0] = kind | (wr.sg_list.len() as u64) << 8;
    w[1] = u64::from(target);
    w[2] = wr.wr_id;
    put_sges(&mut w, &wr.sg_list)?;
    Some(w)
}

/// A UD send (SEND or SEND_WITH_IMM only, as the engine's UD QPs take): word 3 the AH
/// handle and the remote QPN, word 4 the remote Q_Key.
pub fn encode_send_ud(qpn: Qpn, wr: &SendWr, to: &UdTarget) -> Option<[u64; SQ_WORDS]> {
    if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
        return None;
    }
    let mut w = encode_send(qpn, wr)?;
    w[0] = (w[0] & !0xff) | KIND_SEND_UD;
    w[3] = u64::from(to.ah) | u64::from(to.remote_qpn.value()) << 32;
    w[4] = u64::from(to.remote_qkey);
    w[5] = 0;
    w[6] = 0;
    Some(w)
}

/// Decode a submission slot; `None` for anything malformed.
pub fn decode_work(w: &[u64; SQ_WORDS]) -> Option<Work> {
    let kind = w[0] & 0xff;
    let nsge = ((w[0] >> 8) & 0xff) as usize;
    let qpn = Qpn::new(w[1] as u32);
    let sg_list = get_sges(w, nsge)?;
    match kind {
        KIND_SEND => {
            let opcode = *WR_OPCODES.get(((w[0] >> 16) & 0xff) as usize)?;
            if w[0] >> 24 & 0xff != 0 {
                return None;
            }
            let rkey = Rkey(w[4] as u32);
            let mut wr = SendWr::new(w[2], opcode);
            wr.sg_list = sg_list;
            wr.send_flags = SendFlags((w[0] >> 32) as u32);
            wr.imm_data = (w[1] >> 32) as u32;
            wr.invalidate_rkey = Rkey((w[4] >> 32) as u32);
            if opcode.is_atomic() {
                wr.atomic = AtomicInfo {
                    remote_addr: w[3],
                    rkey,
                    compare_add: w[5],
                    swap: w[6],
                };
            } else {
                wr.rdma = RdmaInfo {
                    remote_addr: w[3],
                    rkey,
                };
            }
            Some(Work::Send(qpn, wr))
        }
        KIND_SEND_UD => {
            let opcode = *WR_OPCODES.get(((w[0] >> 16) & 0xff) as usize)?;
            if w[0] >> 24 & 0xff != 0 || !matches!(opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
                return None;
            }
            let remote_qpn = (w[3] >> 32) as u32;
            if remote_qpn > 0xff_ffff || w[4] >> 32 != 0 {
                return None;
            }
            let mut wr = SendWr::new(w[2], opcode);
            wr.sg_list = sg_list;
            wr.send_flags = SendFlags((w[0] >> 32) as u32);
            wr.imm_data = (w[1] >> 32) as u32;
            let to = UdTarget {
                ah: w[3] as u32,
                remote_qpn: Qpn::new(remote_qpn),
                remote_qkey: w[4] as u32,
            };
            Some(Work::SendUd(qpn, wr, to))
        }
        KIND_RECV => Some(Work::Recv(
            qpn,
            RecvWr {
                wr_id: w[2],
                sg_list,
            },
        )),
        KIND_SRQ_RECV => Some(Work::SrqRecv(
            w[1] as u32,
            RecvWr {
                wr_id: w[2],
                sg_list,
            },
        )),
        _ => None,
    }
}

const WC_OPCODES: [WcOpcode; 7] = [
    WcOpcode::Send,
    WcOpcode::RdmaWrite,
    WcOpcode::RdmaRead,
    WcOpcode::CompSwap,
    WcOpcode::FetchAdd,
    WcOpcode::Recv,
    WcOpcode::RecvRdmaWithImm,
];

/// A completion slot: wr_id; status | opcode | flags | sl | byte_len; imm | invalidated rkey;
/// qp_num | src_qp.
pub fn encode_wc(wc: &WorkCompletion) -> [u64; CQ_WORDS] {
    let op = WC_OPCODES.iter().position(|&o| o == wc.opcode).unwrap_or(0) as u64;
    let flags = u64::from(wc.imm_data.is_some())
        | u64::from(wc.invalidated_rkey.is_some()) << 1
        | u64::from(wc.grh) << 2;
    let mut w = [0u64; CQ_WORDS];
    w[0] = wc.wr_id;
    w[1] = wc.status as u64
        | op << 8
        | flags << 16
        | u64::from(wc.sl) << 24
        | u64::from(wc.byte_len) << 32;
    w[2] = u64::from(wc.imm_data.unwrap_or(0))
        | u64::from(wc.invalidated_rkey.map_or(0, |r| r.0)) << 32;
    w[3] = u64::from(wc.qp_num.value()) | u64::from(wc.src_qp.value()) << 32;
    w
}

pub fn decode_wc(w: &[u64; CQ_WORDS]) -> WorkCompletion {
    let flags = (w[1] >> 16) & 0xff;
    WorkCompletion {
        wr_id: w[0],
        status: WcStatus::from_ibv((w[1] & 0xff) as u32),
        opcode: WC_OPCODES
            .get(((w[1] >> 8) & 0xff) as usize)
            .copied()
            .unwrap_or(WcOpcode::Send),
        byte_len: (w[1] >> 32) as u32,
        imm_data: (flags & 1 != 0).then_some(w[2] as u32),
        invalidated_rkey: (flags & 2 != 0).then_some(Rkey((w[2] >> 32) as u32)),
        qp_num: Qpn::new(w[3] as u32),
        src_qp: Qpn::new((w[3] >> 32) as u32),
        grh: flags & 4 != 0,
        sl: (w[1] >> 24) as u8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_garbage_is_refused() {
        let mut wr = SendWr::new(7, WrOpcode::AtomicCmpAndSwp);
        wr.sg_list = vec![Sge {
            addr: 0x1000,
            length: 8,
            lkey: Lkey(0x1234),
        }];
        wr.atomic = AtomicInfo {
            remote_addr: 0x2000,
            rkey: Rkey(9),
            compare_add: 1,
            swap: 2,
        };
        let w = encode_send(Qpn::new(17), &wr).unwrap();
        assert_eq!(decode_work(&w), Some(Work::Send(Qpn::new(17), wr.clone())));
        let r = RecvWr {
            wr_id: 3,
            sg_list: vec![],
        };
        assert_eq!(
            decode_work(&encode_recv(Qpn::new(5), &r).unwrap()),
            Some(Work::Recv(Qpn::new(5), r))
        );
        let mut bad = w;
        bad[0] = 0xff;
        assert_eq!(decode_work(&bad), None, "unknown kind");
        bad = w;
        bad[0] = KIND_SEND | 40 << 8;
        assert_eq!(decode_work(&bad), None, "too many SGEs");
        bad = w;
        bad[0] = KIND_SEND | 9 << 16;
        assert_eq!(decode_work(&bad), None, "unknown opcode");
        wr.sg_list = vec![Sge::default(); MAX_SGE + 1];
        assert!(encode_send(Qpn::new(1), &wr).is_none());

        let wc = WorkCompletion {
            wr_id: 11,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm_data: Some(0xabcd),
            invalidated_rkey: None,
            qp_num: Qpn::new(17),
            src_qp: Qpn::new(18),
            grh: false,
            sl: 0,
        };
        assert_eq!(decode_wc(&encode_wc(&wc)), wc);
        let ud = WorkCompletion {
            grh: true,
            sl: 0xa,
            ..wc
        };
        assert_eq!(decode_wc(&encode_wc(&ud)), ud);

        // A UD send and an SRQ receive round trip; a UD slot with an RDMA opcode or a
        // QPN past 24 bits is refused.
        let mut ud = SendWr::new(21, WrOpcode::SendWithImm);
        ud.imm_data = 0x1234_5678;
        ud.sg_list = vec![Sge {
            addr: 0x3000,
            length: 100,
            lkey: Lkey(5),
        }];
        let to = UdTarget {
            ah: 4,
            remote_qpn: Qpn::new(0x12_3456),
            remote_qkey: 0x8000_0000,
        };
        let w = encode_send_ud(Qpn::new(9), &ud, &to).unwrap();
        assert_eq!(
            decode_work(&w),
            Some(Work::SendUd(Qpn::new(9), ud.clone(), to))
        );
        let mut bad = w;
        bad[0] = (bad[0] & !(0xff << 16)) | 3 << 16;
        assert_eq!(decode_work(&bad), None, "RDMA WRITE on a UD slot");
        bad = w;
        bad[3] |= 0xff00_0000 << 32;
        assert_eq!(decode_work(&bad), None, "a remote QPN past 24 bits");
        assert!(encode_send_ud(Qpn::new(9), &SendWr::new(1, WrOpcode::RdmaRead), &to).is_none());
        let r = RecvWr {
            wr_id: 8,
            sg_list: vec![],
        };
        assert_eq!(
            decode_work(&encode_srq_recv(77, &r).unwrap()),
            Some(Work::SrqRecv(77, r))
        );
    }
}

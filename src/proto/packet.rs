//! One packet the engine sends, as the requester or the responder describes it before
//! it is addressed and framed: its BTH fields, its extension headers and its payload.
//!
//! Contract: [`TxExt`] holds the extension headers an RC requester or responder packet
//! can carry, in a few bytes; it writes them exactly as `ExtHeaders` would (test
//! `tx_ext_writes_what_ext_headers_writes`). [`TxPacket`] is what
//! `Requester::poll_transmit` and `Responder::poll_transmit` return and `framing::emit`
//! writes: nothing in it is allocated, the payload borrows the memory table or the
//! device's scratch buffer ([`TxBufs`]). This module sits at the bottom of proto/ (it
//! imports only `memory` and `trace`).

use crate::wire::{AethRepr, AtomicEthRepr, BthFields, Ext, ExtHeaders, ExtWriter, RethRepr, Rkey};

use super::memory::MemTable;
use super::trace::TxReason;

/// Where a packet's payload comes from: the memory table (an owned region's bytes are
/// borrowed) and the device's scratch buffer (gathered or copied bytes). Handed to one
/// side's `poll_transmit`; the packet it returns borrows them.
pub(crate) struct TxBufs<'a> {
    pub mem: &'a MemTable,
    pub scratch: &'a mut Vec<u8>,
}

/// One packet to send: the per-packet BTH fields, the extension headers, the payload
/// and why it is sent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxPacket<'a> {
    pub bth: BthFields,
    pub ext: TxExt,
    pub payload: &'a [u8],
    pub reason: TxReason,
}

/// What one side's `poll_transmit` gives the scheduler when it took its turn.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Tx<'a> {
    /// Frame and send this packet.
    Send(TxPacket<'a>),
    /// The packet's bytes could not be read: nothing goes out this time.
    Unreadable,
    /// A READ response's bytes belong to a process that is gone: the QP is as good as
    /// destroyed (`execute::owner_gone`, for the PSN given).
    OwnerGone(crate::wire::Psn),
}

/// The extension headers of one packet the engine sends (RC requests and responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum TxExt {
    #[default]
    None,
    /// READ request, WRITE FIRST/ONLY.
    Reth(RethRepr),
    /// WRITE ONLY with immediate.
    RethImm(RethRepr, u32),
    /// SEND ONLY/LAST or WRITE LAST with immediate.
    Imm(u32),
    /// SEND ONLY/LAST with invalidate.
    Ieth(Rkey),
    /// CmpSwap, FetchAdd.
    Atomic(AtomicEthRepr),
    /// ACK, NAK, READ response FIRST/LAST/ONLY.
    Aeth(AethRepr),
    /// Atomic ACK: AETH and the original value.
    AethAtomicAck(AethRepr, u64),
}

impl ExtWriter for TxExt {
    fn present(&self) -> u16 {
        match self {
            TxExt::None => 0,
            TxExt::Reth(_) => Ext::Reth.bit(),
            TxExt::RethImm(..) => Ext::Reth.bit() | Ext::ImmDt.bit(),
            TxExt::Imm(_) => Ext::ImmDt.bit(),
            TxExt::Ieth(_) => Ext::Ieth.bit(),
            TxExt::Atomic(_) => Ext::AtomicEth.bit(),
            TxExt::Aeth(_) => Ext::Aeth.bit(),
            TxExt::AethAtomicAck(..) => Ext::Aeth.bit() | Ext::AtomicAckEth.bit(),
        }
    }

    fn write(&self, e: Ext, b: &mut [u8]) {
        match (e, self) {
            (Ext::Reth, TxExt::Reth(r) | TxExt::RethImm(r, _)) => r.emit(b),
            (Ext::ImmDt, TxExt::Imm(i) | TxExt::RethImm(_, i)) => {
                b.copy_from_slice(&i.to_be_bytes())
            }
            (Ext::Ieth, TxExt::Ieth(k)) => b.copy_from_slice(&k.0.to_be_bytes()),
            (Ext::AtomicEth, TxExt::Atomic(a)) => a.emit(b),
            (Ext::Aeth, TxExt::Aeth(a) | TxExt::AethAtomicAck(a, _)) => a.emit(b),
            (Ext::AtomicAckEth, TxExt::AethAtomicAck(_, o)) => b.copy_from_slice(&o.to_be_bytes()),
            // Absent: zeros, as `ExtHeaders` writes an absent header's defaults.
            _ => b.fill(0),
        }
    }

    fn to_headers(&self) -> ExtHeaders {
        let mut x = ExtHeaders::default();
        match *self {
            TxExt::None => {}
            TxExt::Reth(r) => x.reth = Some(r),
            TxExt::RethImm(r, i) => {
                x.reth = Some(r);
                x.immdt = Some(i);
            }
            TxExt::Imm(i) => x.immdt = Some(i),
            TxExt::Ieth(k) => x.ieth = Some(k),
            TxExt::Atomic(a) => x.atomic = Some(a),
            TxExt::Aeth(a) => x.aeth = Some(a),
            TxExt::AethAtomicAck(a, o) => {
                x.aeth = Some(a);
                x.atomic_ack = Some(crate::wire::AtomicAckEthRepr { orig: o });
            }
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        BthRepr, EthRepr, FrameTemplate, IpRepr, Msn, OPCODE_ROWS, Opcode, Psn, Qpn, Syndrome,
        UdpRepr,
    };

    #[test]
    fn tx_ext_writes_what_ext_headers_writes() {
        let reth = RethRepr {
            va: 0x0102_0304_0506_0708,
            rkey: Rkey(0x1122_3344),
            dma_len: 0x5566_7788,
        };
        let aeth = AethRepr {
            syndrome: Syndrome::RnrNak { timer: 13 },
            msn: Msn::new(0xabcdef),
        };
        let atomic = AtomicEthRepr {
            va: 9,
            rkey: Rkey(10),
            swap_add: 11,
            compare: 12,
        };
        let all = [
            TxExt::None,
            TxExt::Reth(reth),
            TxExt::RethImm(reth, 0xdead_beef),
            TxExt::Imm(0x0bad_cafe),
            TxExt::Ieth(Rkey(0x7777)),
            TxExt::Atomic(atomic),
            TxExt::Aeth(aeth),
            TxExt::AethAtomicAck(aeth, 0xfeed_f00d_1234_5678),
        ];
        let t = FrameTemplate::new(
            EthRepr {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
                vlan_tci: None,
            },
            IpRepr::V4 {
                src: [192, 0, 2, 1],
                dst: [192, 0, 2, 2],
                tos: 0,
                identification: 0,
                dont_fragment: true,
                ttl: 64,
            },
            UdpRepr {
                src_port: 0xc001,
                checksum: 0,
            },
            &BthRepr::new(Opcode::RC_ACK, Qpn::new(0x12), Psn::new(0)),
        );
        let mut matched = 0;
        // Every opcode with every variant: the same bytes, or the same error.
        for row in OPCODE_ROWS {
            for x in all {
                let op = Opcode(row.code);
                let pl: &[u8] = if row.has_payload {
                    &[1, 2, 3, 4, 5]
                } else {
                    &[]
                };
                let mut a = [0xa5u8; 256];
                let mut b = [0x5au8; 256];
                let f = BthFields {
                    opcode: op,
                    psn: Psn::new(77),
                    ack_req: true,
                    solicited: true,
                };
                let ra = t.emit(f, &x, pl, &mut a);
                let rb = t.emit(f, &x.to_headers(), pl, &mut b);
                assert_eq!(ra, rb, "{} {x:?}", row.name);
                if let Ok(n) = ra {
                    assert_eq!(a[..n], b[..n], "{} {x:?}", row.name);
                    matched += 1;
                }
            }
        }
        // Each variant fits some RC opcode (None several).
        assert!(matched >= all.len(), "{matched}");
    }
}

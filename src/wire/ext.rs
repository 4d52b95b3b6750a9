//! The extended transport headers that follow the BTH (IBTA vol. 1 §9.3 and §9.4),
//! each as a plain `Repr` with `parse` from and `emit` into a slice of exactly its length.
//!
//! The frame layer slices each header by its offset from the opcode table, so a `parse`
//! here can assume the length; the `debug_assert`s document it.

use super::{Msn, Qpn, Rkey};

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}
fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

/// RDMA Extended Transport Header, 16 bytes: VA, R_Key, DMA length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RethRepr {
    pub va: u64,
    pub rkey: Rkey,
    pub dma_len: u32,
}

impl RethRepr {
    pub const LEN: usize = 16;
    pub fn parse(b: &[u8]) -> Self {
        debug_assert_eq!(b.len(), Self::LEN);
        RethRepr {
            va: be64(&b[0..8]),
            rkey: Rkey(be32(&b[8..12])),
            dma_len: be32(&b[12..16]),
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.0.to_be_bytes());
        b[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
    }
}

/// NAK codes of the AETH (IBTA table 45).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// A reserved code, kept so that parse/emit round-trips.
    Reserved(u8),
}

impl NakCode {
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    pub const fn from_code(c: u8) -> Self {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Reserved(_) => "reserved",
        }
    }
}

/// The AETH syndrome byte (IBTA §9.7.5.2.2, table 44): bit 7 reserved, bits 6-5 type,
/// bits 4-0 value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    /// ACK with a credit code (0..=30 per [`aeth_credits`], 31 = unlimited).
    Ack { credit_code: u8 },
    /// RNR NAK with a timer code (see [`rnr_timer_ns`]).
    RnrNak { timer: u8 },
    /// NAK.
    Nak(NakCode),
    /// Type 01 is reserved, as is bit 7; kept raw so that parse/emit round-trips.
    Reserved(u8),
}

impl Syndrome {
    /// The value rxe sends on every ACK: credit code 31, "unlimited".
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credit_code: 31 };

    pub const fn from_byte(b: u8) -> Self {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 3 {
            0 => Syndrome::Ack {
                credit_code: b & 0x1f,
            },
            1 => Syndrome::RnrNak { timer: b & 0x1f },
            3 => Syndrome::Nak(NakCode::from_code(b)),
            _ => Syndrome::Reserved(b),
        }
    }

    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => credit_code & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.code(),
            Syndrome::Reserved(b) => b,
        }
    }
}

/// Credits an ACK credit code stands for (IBTA table 46); `None` for 31, unlimited.
pub const fn aeth_credits(code: u8) -> Option<u32> {
    const T: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    let c = (code & 0x1f) as usize;
    if c == 31 { None } else { Some(T[c]) }
}

/// The RNR NAK timer for a 5-bit code, in nanoseconds (IBTA table 45; code 0 is 655.36 ms).
pub const fn rnr_timer_ns(code: u8) -> u64 {
    const US100: [u32; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    // The table is in units of 10 µs.
    US100[(code & 0x1f) as usize] as u64 * 10_000
}

/// ACK Extended Transport Header, 4 bytes: syndrome and MSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AethRepr {
    pub syndrome: Syndrome,
    pub msn: Msn,
}

impl AethRepr {
    pub const LEN: usize = 4;
    pub fn parse(b: &[u8]) -> Self {
        debug_assert_eq!(b.len(), Self::LEN);
        AethRepr {
            syndrome: Syndrome::from_byte(b[0]),
            msn: Msn::new(be24(&b[1..4])),
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.syndrome.to_byte();
        b[1..4].copy_from_slice(&self.msn.value().to_be_bytes()[1..]);
    }
}

/// Atomic Extended Transport Header, 28 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub rkey: Rkey,
    /// Swap data (CmpSwap) or add data (FetchAdd).
    pub swap_add: u64,
    /// Compare data (CmpSwap only).
    pub compare: u64,
}

impl AtomicEthRepr {
    pub const LEN: usize = 28;
    pub fn parse(b: &[u8]) -> Self {
        debug_assert_eq!(b.len(), Self::LEN);
        AtomicEthRepr {
            va: be64(&b[0..8]),
            rkey: Rkey(be32(&b[8..12])),
            swap_add: be64(&b[12..20]),
            compare: be64(&b[20..28]),
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.0.to_be_bytes());
        b[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        b[20..28].copy_from_slice(&self.compare.to_be_bytes());
    }
}

/// Atomic ACK Extended Transport Header, 8 bytes: the original remote data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicAckEthRepr {
    pub orig: u64,
}

impl AtomicAckEthRepr {
    pub const LEN: usize = 8;
    pub fn parse(b: &[u8]) -> Self {
        debug_assert_eq!(b.len(), Self::LEN);
        AtomicAckEthRepr { orig: be64(b) }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.orig.to_be_bytes());
    }
}

/// Datagram Extended Transport Header, 8 bytes: Q_Key, reserved byte, source QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DethRepr {
    pub qkey: u32,
    pub src_qp: Qpn,
}

impl DethRepr {
    pub const LEN: usize = 8;
    pub fn parse(b: &[u8]) -> Self {
        debug_assert_eq!(b.len(), Self::LEN);
        DethRepr {
            qkey: be32(&b[0..4]),
            src_qp: Qpn::new(be24(&b[5..8])),
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.qkey.to_be_bytes());
        b[4] = 0;
        b[5..8].copy_from_slice(&self.src_qp.value().to_be_bytes()[1..]);
    }
}

/// Flush Extended Transport Header, 4 bytes: selectivity (bits 5-4) and placement type
/// (bits 3-0) in the last byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FethRepr {
    pub selectivity: u8,
    pub placement_type: u8,
}

impl FethRepr {
    pub const LEN: usize = 4;
    pub fn parse(b: &[u8]) -> Self {
        debug_assert_eq!(b.len(), Self::LEN);
        FethRepr {
            selectivity: (b[3] >> 4) & 3,
            placement_type: b[3] & 0x0f,
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0..3].fill(0);
        b[3] = ((self.selectivity & 3) << 4) | (self.placement_type & 0x0f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_round_trips_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::ACK_UNLIMITED);
        assert_eq!(Syndrome::from_byte(0x2e), Syndrome::RnrNak { timer: 14 });
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from_byte(0x40), Syndrome::Reserved(0x40));
    }

    #[test]
    fn credit_and_timer_tables_match_reference() {
        assert_eq!(aeth_credits(0), Some(0));
        assert_eq!(aeth_credits(5), Some(6));
        assert_eq!(aeth_credits(6), Some(8));
        assert_eq!(aeth_credits(30), Some(32768));
        assert_eq!(aeth_credits(31), None);
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }

    #[test]
    fn headers_emit_into_junk_and_parse_back() {
        let mut b = [0xa5u8; 28];
        let a = AtomicEthRepr {
            va: 0x1122_3344_5566_7788,
            rkey: Rkey(9),
            swap_add: 7,
            compare: 3,
        };
        a.emit(&mut b);
        assert_eq!(AtomicEthRepr::parse(&b), a);
        let mut b = [0xa5u8; 8];
        let d = DethRepr {
            qkey: 0x8001_0000,
            src_qp: Qpn::new(1),
        };
        d.emit(&mut b);
        assert_eq!(b, [0x80, 1, 0, 0, 0, 0, 0, 1]);
        assert_eq!(DethRepr::parse(&b), d);
        let mut b = [0xa5u8; 4];
        let f = FethRepr {
            selectivity: 1,
            placement_type: 2,
        };
        f.emit(&mut b);
        assert_eq!(b, [0, 0, 0, 0x12]);
        assert_eq!(FethRepr::parse(&b), f);
        let mut b = [0xa5u8; 4];
        let ae = AethRepr {
            syndrome: Syndrome::RnrNak { timer: 18 },
            msn: Msn::new(0x123456),
        };
        ae.emit(&mut b);
        assert_eq!(b, [0x32, 0x12, 0x34, 0x56]);
        assert_eq!(AethRepr::parse(&b), ae);
    }
}

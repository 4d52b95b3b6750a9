//! Base Transport Header (IBTA vol. 1 §9.2), 12 bytes.
//!
//! ```text
//!  0       OpCode
//!  1       SE(0x80) MigReq(0x40) PadCnt(0x30) TVer(0x0F)
//!  2..4    P_Key
//!  4       FECN(0x80) BECN(0x40) resv6 (RoCE v2: masked in the ICRC)
//!  5..8    DestQP
//!  8       AckReq(0x80) resv7
//!  9..12   PSN
//! ```

use super::{Error, Layer, Opcode, PKey, Psn, Qpn};

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: core::ops::Range<usize> = 2..4;
    pub const ECN: usize = 4;
    pub const DEST_QP: core::ops::Range<usize> = 5..8;
    pub const ACK_REQ: usize = 8;
    pub const PSN: core::ops::Range<usize> = 9..12;
}

/// A byte view of a BTH.
#[derive(Debug, Clone, Copy)]
pub struct Bth<T: AsRef<[u8]>> {
    buf: T,
}

fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Header length.
    pub const LEN: usize = 12;

    /// Wrap a buffer without checking its length; accessors may panic if it is short.
    pub const fn new_unchecked(buf: T) -> Self {
        Bth { buf }
    }

    /// Wrap a buffer of at least [`Bth::LEN`] bytes; `offset` is only used in the error.
    pub fn new_checked(buf: T, offset: usize) -> Result<Self, Error> {
        let available = buf.as_ref().len();
        if available < Self::LEN {
            return Err(Error::Truncated {
                layer: Layer::Bth,
                offset,
                needed: Self::LEN,
                available,
            });
        }
        Ok(Bth { buf })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 3
    }
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }
    pub fn pkey(&self) -> PKey {
        PKey(u16::from_be_bytes([
            self.b()[field::PKEY.start],
            self.b()[field::PKEY.start + 1],
        ]))
    }
    pub fn fecn(&self) -> bool {
        self.b()[field::ECN] & 0x80 != 0
    }
    pub fn becn(&self) -> bool {
        self.b()[field::ECN] & 0x40 != 0
    }
    pub fn resv6(&self) -> u8 {
        self.b()[field::ECN] & 0x3f
    }
    pub fn resv7(&self) -> u8 {
        self.b()[field::ACK_REQ] & 0x7f
    }
    #[inline(always)]
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(be24(&self.b()[field::DEST_QP]))
    }
    #[inline(always)]
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & 0x80 != 0
    }
    #[inline(always)]
    pub fn psn(&self) -> Psn {
        Psn::new(be24(&self.b()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }
    pub fn set_opcode(&mut self, op: Opcode) {
        self.bm()[field::OPCODE] = op.0;
    }
    pub fn set_psn(&mut self, psn: Psn) {
        self.bm()[field::PSN].copy_from_slice(&psn.value().to_be_bytes()[1..]);
    }
    pub fn set_ack_req(&mut self, on: bool) {
        let b = &mut self.bm()[field::ACK_REQ];
        *b = (*b & 0x7f) | if on { 0x80 } else { 0 };
    }
    pub fn set_ecn_bits(&mut self, fecn: bool, becn: bool) {
        let b = &mut self.bm()[field::ECN];
        *b = (*b & 0x3f) | if fecn { 0x80 } else { 0 } | if becn { 0x40 } else { 0 };
    }
}

/// The BTH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub pkey: PKey,
    pub fecn: bool,
    pub becn: bool,
    /// The six reserved bits of byte 4 (masked in the ICRC). Zero from us; some hardware
    /// (Huawei hiroce) sets them, so they are kept to re-emit a frame exactly.
    pub resv6: u8,
    pub dest_qp: Qpn,
    pub ack_req: bool,
    /// The seven reserved bits of byte 8, kept for the same reason.
    pub resv7: u8,
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with every flag clear, the default P_Key and zero reserved bits: what we send
    /// unless a field says otherwise (set the others with struct update syntax).
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// The transport header version must be 0 (IBTA 9.2.5).
    pub fn check_tver<T: AsRef<[u8]>>(bth: &Bth<T>, offset: usize) -> Result<(), Error> {
        if bth.tver() != 0 {
            return Err(Error::Malformed {
                layer: Layer::Bth,
                offset,
                what: "TVer",
                value: bth.tver().into(),
            });
        }
        Ok(())
    }

    /// Read a BTH, checking its version.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>, offset: usize) -> Result<Self, Error> {
        Self::check_tver(bth, offset)?;
        Ok(Self::from_view(bth))
    }

    /// Read every field of an already checked BTH.
    pub fn from_view<T: AsRef<[u8]>>(bth: &Bth<T>) -> Self {
        BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            resv6: bth.resv6(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            resv7: bth.resv7(),
            psn: bth.psn(),
        }
    }

    /// Write the 12 header bytes.
    pub fn emit(&self, out: &mut [u8; 12]) {
        out[field::OPCODE] = self.opcode.0;
        out[field::FLAGS] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count & 3) << 4);
        out[field::PKEY].copy_from_slice(&self.pkey.0.to_be_bytes());
        out[field::ECN] =
            (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6) | (self.resv6 & 0x3f);
        out[field::DEST_QP].copy_from_slice(&self.dest_qp.value().to_be_bytes()[1..]);
        out[field::ACK_REQ] = (u8::from(self.ack_req) << 7) | (self.resv7 & 0x7f);
        out[field::PSN].copy_from_slice(&self.psn.value().to_be_bytes()[1..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // BTH of the RC READ REQUEST in vectors/single/pcapplusplus_rc_read_request.pcap.
    const READ_REQ_BTH: [u8; 12] = [
        0x0c, 0x00, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0x54, 0xcb, 0x63,
    ];

    #[test]
    fn parse_fixture() {
        let r = BthRepr::parse(&Bth::new_checked(&READ_REQ_BTH[..], 0).unwrap(), 0).unwrap();
        assert_eq!(r.opcode, Opcode::RC_READ_REQUEST);
        assert!(!r.mig_req && r.ack_req && !r.solicited);
        assert_eq!(r.pkey, PKey::DEFAULT);
        assert_eq!(r.dest_qp, Qpn::new(0x11));
        assert_eq!(r.psn, Psn::new(0x54cb63));
    }

    #[test]
    fn emit_into_junk_sets_every_field() {
        let r = BthRepr::parse(&Bth::new_unchecked(&READ_REQ_BTH[..]), 0).unwrap();
        let mut out = [0xa5u8; 12];
        r.emit(&mut out);
        assert_eq!(out, READ_REQ_BTH);
    }

    #[test]
    fn setters_touch_only_their_field() {
        let mut b = READ_REQ_BTH;
        let mut v = Bth::new_unchecked(&mut b[..]);
        v.set_psn(Psn::new(0xabcdef));
        v.set_ack_req(false);
        v.set_ecn_bits(true, true);
        assert_eq!(v.psn(), Psn::new(0xabcdef));
        assert!(!v.ack_req() && v.fecn() && v.becn());
        assert_eq!(v.dest_qp(), Qpn::new(0x11));
    }

    #[test]
    fn short_and_bad_version() {
        assert_eq!(
            Bth::new_checked(&READ_REQ_BTH[..11], 54).unwrap_err(),
            Error::Truncated {
                layer: Layer::Bth,
                offset: 54,
                needed: 12,
                available: 11
            }
        );
        let mut b = READ_REQ_BTH;
        b[1] |= 1;
        assert!(matches!(
            BthRepr::parse(&Bth::new_unchecked(&b[..]), 0),
            Err(Error::Malformed { what: "TVer", .. })
        ));
    }
}

//! Typed protocol numbers: PSN, QPN, MSN, keys.
//!
//! All 24-bit quantities wrap modulo 2^24 (IBTA 9.7.1). Arithmetic and comparison on them
//! live here and nowhere else.

use core::fmt;

const MASK24: u32 = 0x00ff_ffff;

/// Packet sequence number, 24 bits, compared with serial-number arithmetic.
///
/// Read back (serde) from any number through [`Psn::new`]: the high 8 bits are dropped.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(from = "u32")]
pub struct Psn(u32);

impl From<u32> for Psn {
    fn from(v: u32) -> Psn {
        Psn::new(v)
    }
}

impl Psn {
    /// The largest PSN value.
    pub const MAX: u32 = MASK24;

    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Psn(v & MASK24)
    }

    /// The PSN as a plain number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping modulo 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n`, wrapping modulo 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The signed distance `self - other` in the 24-bit sequence space, in
    /// `-2^23..2^23` (the sign of `((a - b) << 8) as i32`, rxe's `psn_compare` in rxe_verbs.h).
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// True when `self` comes strictly before `other`.
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True when `self` comes strictly after `other`.
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Queue pair number, 24 bits. QP1 is the GSI queue pair used by the RDMA CM.
///
/// Read back (serde) from any number through [`Qpn::new`]: the high 8 bits are dropped.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(from = "u32")]
pub struct Qpn(u32);

impl From<u32> for Qpn {
    fn from(v: u32) -> Qpn {
        Qpn::new(v)
    }
}

impl Qpn {
    /// The general services QP (MADs, RDMA CM).
    pub const GSI: Qpn = Qpn(1);

    /// A QPN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Qpn(v & MASK24)
    }

    /// The QPN as a plain number.
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Message sequence number carried in the AETH, 24 bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize)]
pub struct Msn(u32);

impl Msn {
    /// An MSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Msn(v & MASK24)
    }

    /// The MSN as a plain number.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + 1`, wrapping modulo 2^24.
    pub const fn next(self) -> Msn {
        Msn::new(self.0.wrapping_add(1))
    }
}

/// Remote key: names a memory region to a remote peer (RETH, AtomicETH, IETH).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize)]
pub struct Rkey(pub u32);

/// Local key: names a memory region in a local scatter/gather element.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, serde::Serialize)]
pub struct Lkey(pub u32);

/// Partition key from the BTH. 0xFFFF is the default full-member partition.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize)]
pub struct PKey(pub u16);

impl PKey {
    /// The default partition, full membership.
    pub const DEFAULT: PKey = PKey(0xffff);
}

impl Default for PKey {
    fn default() -> Self {
        PKey::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_and_compares_across_zero() {
        let top = Psn::new(Psn::MAX);
        assert_eq!(top.add(1), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert!(top.before(Psn::new(5)));
        assert!(Psn::new(5).after(top));
        assert_eq!(Psn::new(5).diff(top), 6);
        assert_eq!(top.diff(Psn::new(5)), -6);
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
    }

    #[test]
    fn psn_half_space_is_the_boundary() {
        let a = Psn::new(0);
        assert!(a.before(Psn::new((1 << 23) - 1)));
        assert_eq!(Psn::new(1 << 23).diff(a), -(1 << 23));
    }

    #[test]
    fn qpn_and_msn_are_24_bit() {
        assert_eq!(Qpn::new(0xff00_0011).value(), 0x11);
        assert_eq!(Msn::new(0xff_ffff).next(), Msn::new(0));
    }
}

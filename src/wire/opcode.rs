//! The opcode table: one row per BTH opcode saying what the packet is.
//!
//! Every question about an opcode (which extension headers follow the BTH and at which
//! offset, request or response, first/middle/last/only, whether it carries payload, whether
//! it consumes a receive WQE) is answered here, from a `const` table computed at compile
//! time, so the rest of the stack never matches opcode lists of its own. Rows follow IBTA
//! vol. 1 §9.2 table 35 (opcodes), §9.3 (header order) and the IBA annexes for FLUSH and
//! ATOMIC WRITE (memory placement extensions, opcodes 0x1C/0x1D) and RoCE v2 CNP (0x81).

/// An extension header that can follow the BTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ext {
    /// Datagram ETH (UD): Q_Key and source QP.
    Deth,
    /// Flush ETH: placement type and selectivity.
    Feth,
    /// RDMA ETH: virtual address, R_Key, DMA length.
    Reth,
    /// Atomic ETH: VA, R_Key, swap/add and compare data.
    AtomicEth,
    /// Immediate data.
    ImmDt,
    /// Invalidate ETH: the R_Key to invalidate.
    Ieth,
    /// ACK ETH: syndrome and MSN.
    Aeth,
    /// Atomic ACK ETH: the original remote data.
    AtomicAckEth,
    /// The 16 reserved bytes of a RoCE v2 CNP.
    CnpPad,
}

impl Ext {
    /// All extension headers in the order they appear on the wire when several are present.
    pub const ORDER: [Ext; 9] = [
        Ext::Deth,
        Ext::Feth,
        Ext::Reth,
        Ext::AtomicEth,
        Ext::ImmDt,
        Ext::Ieth,
        Ext::Aeth,
        Ext::AtomicAckEth,
        Ext::CnpPad,
    ];

    /// Header length in bytes.
    pub const fn wire_len(self) -> usize {
        match self {
            Ext::Deth => 8,
            Ext::Feth => 4,
            Ext::Reth => 16,
            Ext::AtomicEth => 28,
            Ext::ImmDt => 4,
            Ext::Ieth => 4,
            Ext::Aeth => 4,
            Ext::AtomicAckEth => 8,
            Ext::CnpPad => 16,
        }
    }

    /// The header's bit in an [`ExtSet`].
    pub const fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// Short lower-case name, as used in JSON output.
    pub const fn name(self) -> &'static str {
        match self {
            Ext::Deth => "deth",
            Ext::Feth => "feth",
            Ext::Reth => "reth",
            Ext::AtomicEth => "atomic",
            Ext::ImmDt => "immdt",
            Ext::Ieth => "ieth",
            Ext::Aeth => "aeth",
            Ext::AtomicAckEth => "atomic_ack",
            Ext::CnpPad => "cnp",
        }
    }
}

// `Ext::bit` numbers headers by declaration order; `ExtSet::len` relies on it matching ORDER.
const _: () = {
    let mut i = 0;
    while i < Ext::ORDER.len() {
        assert!(Ext::ORDER[i] as usize == i);
        i += 1;
    }
};

/// Every `ExtSet` has only the low `Ext::ORDER.len()` bits.
const EXT_LEN_MASK: u16 = (1 << Ext::ORDER.len()) - 1;

/// [`ExtSet::len`] of every set, indexed by its bits.
static EXT_LEN: [u8; 1 << Ext::ORDER.len()] = {
    let mut t = [0u8; 1 << Ext::ORDER.len()];
    let mut i = 0;
    while i < t.len() {
        t[i] = ExtSet(i as u16).len_by_walk() as u8;
        i += 1;
    }
    t
};

/// A set of extension headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ExtSet(u16);

impl ExtSet {
    /// No extension header.
    pub const EMPTY: ExtSet = ExtSet(0);

    /// The set with exactly these headers.
    pub const fn of(exts: &[Ext]) -> ExtSet {
        let mut bits = 0;
        let mut i = 0;
        while i < exts.len() {
            bits |= exts[i].bit();
            i += 1;
        }
        ExtSet(bits)
    }

    /// True when `e` is in the set.
    pub const fn has(self, e: Ext) -> bool {
        self.0 & e.bit() != 0
    }

    /// Total length of the headers in the set.
    pub const fn len(self) -> usize {
        // One load: this runs per packet on both paths (parse and emit).
        EXT_LEN[(self.0 & EXT_LEN_MASK) as usize] as usize
    }

    /// Total length of the headers in the set, summed header by header (builds
    /// [`EXT_LEN`]). Bit i is ORDER[i], which the assertion above keeps true.
    const fn len_by_walk(self) -> usize {
        let mut bits = self.0;
        let mut n = 0;
        while bits != 0 {
            n += Ext::ORDER[bits.trailing_zeros() as usize].wire_len();
            bits &= bits - 1;
        }
        n
    }

    /// The set as bits, bit `i` standing for `Ext::ORDER[i]`.
    pub(crate) const fn bits(self) -> u16 {
        self.0
    }

    /// True when the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Offset of `e` from the end of the BTH, if present.
    pub const fn offset_of(self, e: Ext) -> Option<usize> {
        if !self.has(e) {
            return None;
        }
        let mut n = 0;
        let mut i = 0;
        while i < Ext::ORDER.len() {
            let h = Ext::ORDER[i];
            if h as u16 == e as u16 {
                return Some(n);
            }
            if self.has(h) {
                n += h.wire_len();
            }
            i += 1;
        }
        None
    }

    /// The headers in wire order.
    pub fn iter(self) -> impl Iterator<Item = Ext> {
        // Set bits only, lowest first: bit i is ORDER[i], so this is wire order. Runs per
        // packet on both paths, where a packet has at most two extension headers.
        let mut bits = self.0;
        core::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let e = Ext::ORDER[bits.trailing_zeros() as usize];
            bits &= bits - 1;
            Some(e)
        })
    }
}

/// The transport service an opcode belongs to (the top three bits of the opcode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// RoCE v2 congestion notification packet.
    Cnp,
}

/// What operation a packet belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Ack,
    AtomicAck,
    CmpSwap,
    FetchAdd,
    Flush,
    AtomicWrite,
    Cnp,
}

/// Position of a packet within its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    First,
    Middle,
    Last,
    Only,
}

impl Segment {
    /// True for FIRST and ONLY: the packet starts a message.
    pub const fn starts(self) -> bool {
        matches!(self, Segment::First | Segment::Only)
    }

    /// True for LAST and ONLY: the packet ends a message.
    pub const fn ends(self) -> bool {
        matches!(self, Segment::Last | Segment::Only)
    }
}

/// One row of the opcode table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// The opcode itself.
    pub code: u8,
    /// Name as in the IBTA tables and Linux `IB_OPCODE_*`, e.g. `RC_SEND_FIRST`.
    pub name: &'static str,
    pub service: Service,
    pub operation: Operation,
    pub segment: Segment,
    /// Extension headers after the BTH.
    pub exts: ExtSet,
    /// The packet carries a payload (possibly empty for ONLY).
    pub has_payload: bool,
}

impl OpInfo {
    /// Length of all headers after the BTH.
    pub const fn ext_len(&self) -> usize {
        self.exts.len()
    }

    /// Requester-to-responder packets (sends, writes, read requests, atomics, flush).
    /// Responses are ACK, atomic ACK and read responses; a CNP is neither.
    pub const fn is_request(&self) -> bool {
        !matches!(
            self.operation,
            Operation::ReadResponse | Operation::Ack | Operation::AtomicAck | Operation::Cnp
        )
    }

    /// A response from the responder to the requester.
    pub const fn is_response(&self) -> bool {
        matches!(
            self.operation,
            Operation::ReadResponse | Operation::Ack | Operation::AtomicAck
        )
    }

    /// True when the packet ends a message that consumes a receive WQE at the responder:
    /// the last packet of a SEND, or an RDMA WRITE with immediate (IBTA 9.4.3, 9.4.4).
    pub const fn consumes_recv_wqe(&self) -> bool {
        self.segment.ends()
            && (matches!(self.operation, Operation::Send)
                || (matches!(self.operation, Operation::Write) && self.exts.has(Ext::ImmDt)))
    }
}

const fn row(
    code: u8,
    name: &'static str,
    operation: Operation,
    segment: Segment,
    exts: &[Ext],
    has_payload: bool,
) -> OpInfo {
    let service = match code >> 5 {
        0 => Service::Rc,
        1 => Service::Uc,
        3 => Service::Ud,
        _ => Service::Cnp,
    };
    OpInfo {
        code,
        name,
        service,
        operation,
        segment,
        exts: ExtSet::of(exts),
        has_payload,
    }
}

use Ext::*;
use Operation as O;
use Segment as S;

/// Every opcode this stack knows, in code order.
pub const ROWS: &[OpInfo] = &[
    row(0x00, "RC_SEND_FIRST", O::Send, S::First, &[], true),
    row(0x01, "RC_SEND_MIDDLE", O::Send, S::Middle, &[], true),
    row(0x02, "RC_SEND_LAST", O::Send, S::Last, &[], true),
    row(
        0x03,
        "RC_SEND_LAST_WITH_IMMEDIATE",
        O::Send,
        S::Last,
        &[ImmDt],
        true,
    ),
    row(0x04, "RC_SEND_ONLY", O::Send, S::Only, &[], true),
    row(
        0x05,
        "RC_SEND_ONLY_WITH_IMMEDIATE",
        O::Send,
        S::Only,
        &[ImmDt],
        true,
    ),
    row(
        0x06,
        "RC_RDMA_WRITE_FIRST",
        O::Write,
        S::First,
        &[Reth],
        true,
    ),
    row(0x07, "RC_RDMA_WRITE_MIDDLE", O::Write, S::Middle, &[], true),
    row(0x08, "RC_RDMA_WRITE_LAST", O::Write, S::Last, &[], true),
    row(
        0x09,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        O::Write,
        S::Last,
        &[ImmDt],
        true,
    ),
    row(0x0a, "RC_RDMA_WRITE_ONLY", O::Write, S::Only, &[Reth], true),
    row(
        0x0b,
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        O::Write,
        S::Only,
        &[Reth, ImmDt],
        true,
    ),
    row(
        0x0c,
        "RC_RDMA_READ_REQUEST",
        O::ReadRequest,
        S::Only,
        &[Reth],
        false,
    ),
    row(
        0x0d,
        "RC_RDMA_READ_RESPONSE_FIRST",
        O::ReadResponse,
        S::First,
        &[Aeth],
        true,
    ),
    row(
        0x0e,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        O::ReadResponse,
        S::Middle,
        &[],
        true,
    ),
    row(
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        O::ReadResponse,
        S::Last,
        &[Aeth],
        true,
    ),
    row(
        0x10,
        "RC_RDMA_READ_RESPONSE_ONLY",
        O::ReadResponse,
        S::Only,
        &[Aeth],
        true,
    ),
    row(0x11, "RC_ACKNOWLEDGE", O::Ack, S::Only, &[Aeth], false),
    row(
        0x12,
        "RC_ATOMIC_ACKNOWLEDGE",
        O::AtomicAck,
        S::Only,
        &[Aeth, AtomicAckEth],
        false,
    ),
    row(
        0x13,
        "RC_COMPARE_SWAP",
        O::CmpSwap,
        S::Only,
        &[AtomicEth],
        false,
    ),
    row(
        0x14,
        "RC_FETCH_ADD",
        O::FetchAdd,
        S::Only,
        &[AtomicEth],
        false,
    ),
    row(
        0x16,
        "RC_SEND_LAST_WITH_INVALIDATE",
        O::Send,
        S::Last,
        &[Ieth],
        true,
    ),
    row(
        0x17,
        "RC_SEND_ONLY_WITH_INVALIDATE",
        O::Send,
        S::Only,
        &[Ieth],
        true,
    ),
    row(0x1c, "RC_FLUSH", O::Flush, S::Only, &[Feth, Reth], false),
    row(
        0x1d,
        "RC_ATOMIC_WRITE",
        O::AtomicWrite,
        S::Only,
        &[Reth],
        true,
    ),
    row(0x20, "UC_SEND_FIRST", O::Send, S::First, &[], true),
    row(0x21, "UC_SEND_MIDDLE", O::Send, S::Middle, &[], true),
    row(0x22, "UC_SEND_LAST", O::Send, S::Last, &[], true),
    row(
        0x23,
        "UC_SEND_LAST_WITH_IMMEDIATE",
        O::Send,
        S::Last,
        &[ImmDt],
        true,
    ),
    row(0x24, "UC_SEND_ONLY", O::Send, S::Only, &[], true),
    row(
        0x25,
        "UC_SEND_ONLY_WITH_IMMEDIATE",
        O::Send,
        S::Only,
        &[ImmDt],
        true,
    ),
    row(
        0x26,
        "UC_RDMA_WRITE_FIRST",
        O::Write,
        S::First,
        &[Reth],
        true,
    ),
    row(0x27, "UC_RDMA_WRITE_MIDDLE", O::Write, S::Middle, &[], true),
    row(0x28, "UC_RDMA_WRITE_LAST", O::Write, S::Last, &[], true),
    row(
        0x29,
        "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        O::Write,
        S::Last,
        &[ImmDt],
        true,
    ),
    row(0x2a, "UC_RDMA_WRITE_ONLY", O::Write, S::Only, &[Reth], true),
    row(
        0x2b,
        "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        O::Write,
        S::Only,
        &[Reth, ImmDt],
        true,
    ),
    row(0x64, "UD_SEND_ONLY", O::Send, S::Only, &[Deth], true),
    row(
        0x65,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        O::Send,
        S::Only,
        &[Deth, ImmDt],
        true,
    ),
    row(0x81, "CNP", O::Cnp, S::Only, &[CnpPad], false),
];

const fn build_table() -> [Option<OpInfo>; 256] {
    let mut t = [None; 256];
    let mut i = 0;
    while i < ROWS.len() {
        t[ROWS[i].code as usize] = Some(ROWS[i]);
        i += 1;
    }
    t
}

static TABLE: [Option<OpInfo>; 256] = build_table();

/// A BTH opcode. Conversion from `u8` never fails; [`Opcode::info`] is `None` for opcodes
/// this stack does not implement (reserved codes, RD, XRC, manufacturer-specific).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Opcode(pub u8);

impl Opcode {
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    pub const RC_SEND_LAST_IMM: Opcode = Opcode(0x03);
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    pub const RC_SEND_ONLY_IMM: Opcode = Opcode(0x05);
    pub const RC_WRITE_FIRST: Opcode = Opcode(0x06);
    pub const RC_WRITE_MIDDLE: Opcode = Opcode(0x07);
    pub const RC_WRITE_LAST: Opcode = Opcode(0x08);
    pub const RC_WRITE_LAST_IMM: Opcode = Opcode(0x09);
    pub const RC_WRITE_ONLY: Opcode = Opcode(0x0a);
    pub const RC_WRITE_ONLY_IMM: Opcode = Opcode(0x0b);
    pub const RC_READ_REQUEST: Opcode = Opcode(0x0c);
    pub const RC_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    pub const RC_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    pub const RC_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    pub const RC_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    pub const RC_ACK: Opcode = Opcode(0x11);
    pub const RC_ATOMIC_ACK: Opcode = Opcode(0x12);
    pub const RC_CMP_SWAP: Opcode = Opcode(0x13);
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    pub const RC_SEND_LAST_INV: Opcode = Opcode(0x16);
    pub const RC_SEND_ONLY_INV: Opcode = Opcode(0x17);
    pub const RC_FLUSH: Opcode = Opcode(0x1c);
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1d);
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    pub const UD_SEND_ONLY_IMM: Opcode = Opcode(0x65);
    pub const CNP: Opcode = Opcode(0x81);

    /// The table row, or `None` for an opcode this stack does not implement.
    pub fn info(self) -> Option<&'static OpInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// The opcode's name, or `UNKNOWN`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_sorted_unique_and_in_the_table() {
        for w in ROWS.windows(2) {
            assert!(w[0].code < w[1].code, "{} then {}", w[0].name, w[1].name);
        }
        for r in ROWS {
            assert_eq!(Opcode(r.code).info(), Some(r));
        }
        let known = (0..=255u8).filter(|c| Opcode(*c).info().is_some()).count();
        assert_eq!(known, ROWS.len());
    }

    /// Each row's header length, checked against the byte counts of IBTA table 35 typed
    /// out independently here.
    #[test]
    fn every_row_has_the_spec_header_length() {
        let expect = |code: u8| -> usize {
            match code & 0x1f {
                _ if code == 0x81 => 16,
                _ if code == 0x64 => 8,
                _ if code == 0x65 => 12,
                0x00..=0x02 | 0x04 | 0x07 | 0x08 | 0x0e => 0,
                0x03 | 0x05 | 0x09 => 4,
                0x06 | 0x0a | 0x0c => 16,
                0x0b => 20,
                0x0d | 0x0f | 0x10 | 0x11 => 4,
                0x12 => 12,
                0x13 | 0x14 => 28,
                0x16 | 0x17 => 4,
                0x1c => 20,
                0x1d => 16,
                _ => unreachable!("no row {code:#x}"),
            }
        };
        for r in ROWS {
            assert_eq!(r.ext_len(), expect(r.code), "{}", r.name);
        }
    }

    #[test]
    fn offsets_follow_wire_order() {
        let wimm = Opcode::RC_WRITE_ONLY_IMM.info().unwrap();
        assert_eq!(wimm.exts.offset_of(Ext::Reth), Some(0));
        assert_eq!(wimm.exts.offset_of(Ext::ImmDt), Some(16));
        let flush = Opcode::RC_FLUSH.info().unwrap();
        assert_eq!(flush.exts.offset_of(Ext::Feth), Some(0));
        assert_eq!(flush.exts.offset_of(Ext::Reth), Some(4));
        let aack = Opcode::RC_ATOMIC_ACK.info().unwrap();
        assert_eq!(aack.exts.offset_of(Ext::AtomicAckEth), Some(4));
        let ud = Opcode::UD_SEND_ONLY_IMM.info().unwrap();
        assert_eq!(ud.exts.offset_of(Ext::ImmDt), Some(8));
        assert_eq!(ud.exts.offset_of(Ext::Reth), None);
    }

    #[test]
    fn classification() {
        let send_last = Opcode::RC_SEND_LAST.info().unwrap();
        assert!(send_last.consumes_recv_wqe() && send_last.is_request());
        assert!(!Opcode::RC_WRITE_LAST.info().unwrap().consumes_recv_wqe());
        assert!(
            Opcode::RC_WRITE_LAST_IMM
                .info()
                .unwrap()
                .consumes_recv_wqe()
        );
        assert!(
            Opcode::RC_READ_RESPONSE_MIDDLE
                .info()
                .unwrap()
                .is_response()
        );
        let cnp = Opcode::CNP.info().unwrap();
        assert!(!cnp.is_request() && !cnp.is_response());
        assert_eq!(cnp.service, Service::Cnp);
        assert_eq!(Opcode(0x15).info(), None);
        assert_eq!(Opcode(0x40).name(), "UNKNOWN");
        assert_eq!(Opcode::UD_SEND_ONLY.info().unwrap().service, Service::Ud);
    }
}

//! The RoCE v2 wire format: headers as byte views and plain `Repr` values, the opcode
//! table, the ICRC, and whole-frame parse/emit.
//!
//! Contract: parsing never panics on any input. Every `parse`/`new_checked` validates the
//! length it needs once; after that no accessor can index out of bounds. Every malformed
//! input yields an [`Error`] that says what was wrong, in which layer, at which byte offset
//! of the frame and how many bytes were needed and present.
//!
//! Ethernet, 802.1Q, IPv4, IPv6 and UDP go through `etherparse` (the usual layouts through
//! an equivalent fast path first, see `frame`); the InfiniBand transport headers (BTH and
//! the extended headers) are ours.

mod addr;
mod bth;
mod ecn;
mod error;
mod ext;
mod frame;
pub mod icrc;
pub mod mad;
mod opcode;
mod template;
mod types;
mod v1;
mod vendor;

pub use addr::{
    Gid, MULTICAST_QPN, gid_is, gid_is_ipv4, gid_is_link_local, gid_is_multicast, ipv4_gid,
    mac_is_multicast, mac_text, multicast_mac,
};
pub use bth::{Bth, BthRepr};
pub use ecn::{ip_offset, mark_ce, vlan_tci};
pub use error::{Error, Layer, NotRoce};
pub use ext::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, NakCode, RethRepr, Syndrome,
    aeth_credits, rnr_timer_ns,
};
pub use frame::{
    EthRepr, ExtHeaders, FrameRepr, FrameView, IpRepr, ROCE_V2_PORT, RoceRepr, UdpRepr,
    datagram_icrc,
};
pub use opcode::{Ext, ExtSet, OpInfo, Opcode, Operation, ROWS as OPCODE_ROWS, Segment, Service};
pub use template::{BthFields, ExtWriter, FrameTemplate};
pub use types::{Lkey, Msn, PKey, Psn, Qpn, Rkey};
pub use v1::{
    GRH_LEN, GRH_NEXT_HEADER_BTH, GrhRepr, ROCE_V1_ETHERTYPE, V1Transport, V1View, icrc_v1,
};
pub use vendor::{DC_VENDOR, VendorOp};

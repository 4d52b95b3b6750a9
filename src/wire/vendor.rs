//! Opcodes outside the IBTA table that captures in the wild carry, named for decoding.
//!
//! Mellanox/NVIDIA's Dynamically Connected transport (DC: ConnectX-IB and later, rdma-core's
//! `mlx5dv_create_qp` with `MLX5DV_QP_CREATE_DC`) puts its packets in the opcode class
//! IBTA vol. 1 §9.2 table 35 gives Reliable Datagram (top three bits 010, 0x40–0x55),
//! which no RoCE NIC implements. Wireshark's InfiniBand dissector (packet-infiniband.c)
//! reads every opcode of that class as DC, with the names of the RD rows, a BTH followed
//! by 8 more bytes, and opcode 0x55 (RD's RESYNC) with the BTH's SE bit clear as a DC
//! connect packet with a 16-byte DCCETH. These facts come from that public dissector; the
//! headers beyond the BTH are not decoded here, only named, and the ICRC (which does not
//! depend on them) is checked. xrnic does not implement DC: the engine drops these
//! packets as unknown opcodes.

use super::Opcode;

/// What [`Opcode::vendor`] knows about a vendor opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VendorOp {
    /// Upper-case name in the style of the IBTA rows (`DC_SEND_ONLY`).
    pub name: &'static str,
    /// Who defines it.
    pub vendor: &'static str,
    /// Bytes of vendor headers after the 12-byte BTH (the DC BTH extension, plus the
    /// DCCETH of a connect packet), as Wireshark's dissector counts them.
    pub ext_len: usize,
}

/// The vendor named for the DC class.
pub const DC_VENDOR: &str = "Mellanox/NVIDIA Dynamically Connected (DC)";

/// DC names indexed by `opcode - 0x40` (the RD rows of IBTA vol. 1 table 35, renamed).
const DC_NAMES: [&str; 0x16] = [
    "DC_SEND_FIRST",
    "DC_SEND_MIDDLE",
    "DC_SEND_LAST",
    "DC_SEND_LAST_WITH_IMMEDIATE",
    "DC_SEND_ONLY",
    "DC_SEND_ONLY_WITH_IMMEDIATE",
    "DC_RDMA_WRITE_FIRST",
    "DC_RDMA_WRITE_MIDDLE",
    "DC_RDMA_WRITE_LAST",
    "DC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
    "DC_RDMA_WRITE_ONLY",
    "DC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    "DC_RDMA_READ_REQUEST",
    "DC_RDMA_READ_RESPONSE_FIRST",
    "DC_RDMA_READ_RESPONSE_MIDDLE",
    "DC_RDMA_READ_RESPONSE_LAST",
    "DC_RDMA_READ_RESPONSE_ONLY",
    "DC_ACKNOWLEDGE",
    "DC_ATOMIC_ACKNOWLEDGE",
    "DC_COMPARE_SWAP",
    "DC_FETCH_ADD",
    "DC_CONNECT",
];

/// The DC BTH extension Wireshark's dissector counts after the BTH.
const DC_BTH_EXT: usize = 8;
/// The DC connect packet's DCCETH.
const DCCETH_LEN: usize = 16;

impl Opcode {
    /// The vendor opcode this is, given BTH byte 1 (SE, MigReq, PadCnt, TVer), or `None`
    /// for an IBTA opcode or one no vendor table here names. 0x55 is a DC connect only
    /// with SE clear, as Wireshark reads it.
    pub fn vendor(self, bth_byte1: u8) -> Option<VendorOp> {
        if self.info().is_some() || !(0x40..=0x55).contains(&self.0) {
            return None;
        }
        let connect = self.0 == 0x55;
        if connect && bth_byte1 & 0x80 != 0 {
            return None;
        }
        Some(VendorOp {
            name: DC_NAMES[usize::from(self.0 - 0x40)],
            vendor: DC_VENDOR,
            ext_len: DC_BTH_EXT + if connect { DCCETH_LEN } else { 0 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dc_class_is_named_and_nothing_else_is() {
        let named: Vec<u8> = (0..=255u8)
            .filter(|c| Opcode(*c).vendor(0).is_some())
            .collect();
        assert_eq!(named, (0x40..=0x55).collect::<Vec<u8>>());
        let op = |c: u8, b1: u8| Opcode(c).vendor(b1);
        assert_eq!(op(0x44, 0).unwrap().name, "DC_SEND_ONLY");
        assert_eq!(op(0x4c, 0).unwrap().name, "DC_RDMA_READ_REQUEST");
        assert_eq!(op(0x54, 0).unwrap().name, "DC_FETCH_ADD");
        assert_eq!(op(0x44, 0).unwrap().ext_len, 8);
        assert_eq!(op(0x55, 0).unwrap().ext_len, 24);
        assert_eq!(op(0x55, 0x80), None);
        // IBTA opcodes are the table's, never a vendor's.
        assert_eq!(op(0x04, 0), None);
        assert_eq!(op(0x64, 0), None);
    }
}

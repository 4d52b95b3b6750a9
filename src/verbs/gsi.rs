//! What every user of a GSI QP (QP1, IBTA vol. 1 §13.5) on this device needs the same way:
//! the queues with their receive buffers posted, the source GID a CM MAD leaves from, and
//! the CA GUID. Used by the in-process CM of librdmacm (src/abi/rdmacm_port.rs) and by the
//! device service's GSI relay (src/service/gsi_port.rs).

use super::{Access, Cq, Device, Mr, Pd, Qp, QpInitAttr, RecvWr, Result};
use crate::proto::{GRH_LEN, GSI_QKEY};
use crate::wire::mad::MAD_LEN;

/// One receive buffer: the 40-byte GRH area and a MAD.
pub const GSI_RECV_SLOT: usize = GRH_LEN + MAD_LEN;

/// A ready GSI QP: one CQ for both queues, every send signaled, `recv_slots` receives
/// posted (wr_id = slot index into `rmr`), `send_slots` MAD buffers in `smr`.
pub struct GsiQueues {
    pub qp: Qp,
    pub pd: Pd,
    pub cq: Cq,
    pub rmr: Mr,
    pub smr: Mr,
}

impl GsiQueues {
    pub fn open(dev: &Device, recv_slots: usize, send_slots: usize) -> Result<GsiQueues> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(recv_slots + send_slots)?;
        let qp = pd.create_gsi_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            max_send_wr: send_slots as u32,
            max_recv_wr: recv_slots as u32,
            sq_sig_all: true,
        })?;
        qp.ud_ready(GSI_QKEY, 0)?;
        let rmr = pd.reg_mr(recv_slots * GSI_RECV_SLOT, Access::LOCAL_WRITE)?;
        let smr = pd.reg_mr(send_slots * MAD_LEN, Access::LOCAL_WRITE)?;
        for i in 0..recv_slots {
            qp.post_recv(RecvWr {
                wr_id: i as u64,
                sg_list: vec![rmr.sge(i * GSI_RECV_SLOT, GSI_RECV_SLOT as u32)],
            })?;
        }
        Ok(GsiQueues {
            qp,
            pd,
            cq,
            rmr,
            smr,
        })
    }
}

/// The GID index a MAD to `to` leaves from: the first of the destination's kind
/// (IPv4-mapped or not) that is not link-local; 0 when there is none.
pub fn cm_sgid_index(dev: &Device, to: &[u8; 16]) -> u8 {
    let mapped = |g: &[u8]| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
    let v4 = mapped(to);
    dev.gid_table()
        .iter()
        .position(|g| mapped(g) == v4 && g[..2] != [0xfe, 0x80])
        .unwrap_or(0) as u8
}

/// The node GUID, used as the CA GUID: EUI-64 of the MAC (rxe derives both from it).
pub fn node_guid(m: [u8; 6]) -> u64 {
    u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

//! Work requests as the verbs post them (`struct ibv_send_wr`, `struct ibv_recv_wr`,
//! `struct ibv_sge`; IBTA vol. 1 §11.4.1.1 Post Send Request, §11.4.1.2 Post Receive
//! Request): what the requester, the responder and the UD path take from the application.

use crate::wire::{Lkey, Rkey};

use super::cq::WcOpcode;

/// A scatter/gather element (`struct ibv_sge`): `addr` is in the region's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: Lkey,
}

/// Send work request opcodes (`enum ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    Send,
    SendWithImm,
    SendWithInv,
    RdmaWrite,
    RdmaWriteWithImm,
    RdmaRead,
    AtomicCmpAndSwp,
    AtomicFetchAndAdd,
}

impl WrOpcode {
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    /// The message consumes a receive WQE at the responder.
    pub const fn consumes_recv(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWriteWithImm
        )
    }
    pub(crate) const fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
        }
    }
}

/// Send flags, with the `IBV_SEND_*` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    pub const FENCE: SendFlags = SendFlags(1);
    pub const SIGNALED: SendFlags = SendFlags(2);
    pub const SOLICITED: SendFlags = SendFlags(4);
    pub const fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}

/// RDMA target of a WRITE or READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RdmaInfo {
    pub remote_addr: u64,
    pub rkey: Rkey,
}

/// Target and operands of an atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicInfo {
    pub remote_addr: u64,
    pub rkey: Rkey,
    /// Compare value (CmpSwap) or add value (FetchAdd).
    pub compare_add: u64,
    /// Swap value (CmpSwap).
    pub swap: u64,
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub sg_list: Vec<Sge>,
    pub send_flags: SendFlags,
    /// Immediate data (host order) for the *_WITH_IMM opcodes.
    pub imm_data: u32,
    /// The remote R_Key to invalidate for SEND_WITH_INV.
    pub invalidate_rkey: Rkey,
    pub rdma: RdmaInfo,
    pub atomic: AtomicInfo,
}

impl SendWr {
    /// A signaled work request with no data and no remote target.
    pub fn new(wr_id: u64, opcode: WrOpcode) -> Self {
        SendWr {
            wr_id,
            opcode,
            sg_list: Vec::new(),
            send_flags: SendFlags::SIGNALED,
            imm_data: 0,
            invalidate_rkey: Rkey(0),
            rdma: RdmaInfo::default(),
            atomic: AtomicInfo::default(),
        }
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: Vec<Sge>,
}

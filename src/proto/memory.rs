//! Protection domains and memory regions (IBTA vol. 1 §10.6 "memory management" and
//! §9.4 / §9.7.5 for the remote checks made by the responder).
//!
//! Contract: a region's bytes live in one of two places (`Backing`):
//! - owned by the engine: `reg_mr` allocates them (zeroed) and hands out an address range
//!   (`addr`, an I/O virtual address chosen by the engine, page aligned, never overlapping
//!   another owned region); the user reads and writes them through the engine;
//! - the application's own memory: `reg_user_mr` takes an address range of this process
//!   ([`UserMem`], the one module that touches it) and the IOVA the application chose
//!   (its address, or the iova of `ibv_reg_mr_iova2`).
//!
//! Either way the keys, PD, bounds and access flags are checked here, so a packet can only
//! ever touch bytes of a region that passed them; bytes move through [`MemTable::read`],
//! [`MemTable::write`] and [`MemTable::atomic`], which work on both backings (a borrow,
//! [`MemTable::bytes`], exists only for owned bytes). Every check returns an error value;
//! nothing here panics on bad input.
//!
//! Identity: every registration gets a serial number that is never reused. A checked
//! [`MemRef`] carries it, and every later access through that reference is refused once
//! the region it was checked against is gone, even when a new region got the same key
//! meanwhile (keys are 24-bit slot + 8-bit tag and do come back, as on every RNIC). So an
//! operation held across packets or time (a WRITE in progress, queued READ responses,
//! posted WRs) keeps exactly what it validated: key, PD, bounds, rights.

pub use super::user_mem::UserMem;
use crate::wire::{Lkey, Rkey};

use super::cq::WcStatus;
use super::wr::Sge;

/// Memory access rights, with the libibverbs `IBV_ACCESS_*` values.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Access(pub u32);

impl Access {
    pub const NONE: Access = Access(0);
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// All four.
    pub const ALL: Access = Access(15);

    /// True when every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// A protection domain handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pd(pub(crate) u32);

/// What `reg_mr` returns: the keys and the address range of the new region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    pub lkey: Lkey,
    pub rkey: Rkey,
    /// First byte's address; scatter/gather elements and RETH VAs are in this space.
    pub addr: u64,
    pub length: usize,
    pub pd: Pd,
    pub access: Access,
}

/// Why an access was refused. The responder turns all of these into NAK remote access
/// error (IBTA §9.7.5, R_Key validation); the requester into LOC_PROT_ERR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// No valid region has this key.
    BadKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region (or the QP) lacks the needed right.
    NoPermission,
    /// Atomic operations need an 8-byte aligned address (IBTA §9.4).
    Misaligned,
    /// The region cannot be invalidated remotely (SEND with Invalidate): only memory
    /// windows and fast-registered regions can (IBTA vol. 1 §10.6, memory windows and
    /// fast registration), and a region from `reg_mr` is neither.
    NotInvalidatable,
}

/// Where a region's bytes are.
#[derive(Debug)]
enum Backing {
    /// Engine memory, zeroed at registration (the simulator, tests, the Rust `reg_mr`).
    Owned(Vec<u8>),
    /// Memory of the application, in this process.
    User(UserMem),
}

impl Backing {
    fn len(&self) -> usize {
        match self {
            Backing::Owned(v) => v.len(),
            Backing::User(u) => u.len(),
        }
    }
}

#[derive(Debug)]
struct Region {
    pd: u32,
    addr: u64,
    access: Access,
    key: u32,
    /// Which registration this is; never reused (see the module documentation).
    serial: u64,
    data: Backing,
}

/// A checked reference to bytes of one region: key, registration serial and offset,
/// re-validated on use (the region must still be the registration that was checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemRef {
    pub(crate) key: u32,
    pub(crate) serial: u64,
    pub(crate) offset: usize,
}

impl MemRef {
    /// A reference that names no bytes (zero-length READs check no R_Key): serial 0 is
    /// never a registration's.
    pub(crate) const fn nothing(key: u32) -> Self {
        MemRef {
            key,
            serial: 0,
            offset: 0,
        }
    }
}

/// The table of protection domains and memory regions of one device.
#[derive(Debug, Default)]
pub struct MemTable {
    regions: Vec<Option<Region>>,
    /// Per slot, how many registrations it has had (wrapping): the key's tag comes from it.
    slot_gen: Vec<u8>,
    /// The serial of the latest registration.
    last_serial: u64,
    next_addr: u64,
    next_pd: u32,
    live_pds: Vec<u32>,
}

const PAGE: u64 = 4096;
/// Where the first region's address range starts; nonzero so that 0 is never valid.
const ADDR_BASE: u64 = 0x1_0000_0000;

impl MemTable {
    pub fn new() -> Self {
        MemTable {
            next_addr: ADDR_BASE,
            ..Default::default()
        }
    }

    pub fn alloc_pd(&mut self) -> Pd {
        self.next_pd += 1;
        self.live_pds.push(self.next_pd);
        Pd(self.next_pd)
    }

    /// Free a PD; fails while a region still uses it (like `ibv_dealloc_pd`'s EBUSY).
    pub fn dealloc_pd(&mut self, pd: Pd) -> Result<(), &'static str> {
        if self.regions.iter().flatten().any(|r| r.pd == pd.0) {
            return Err("protection domain still has memory regions");
        }
        let before = self.live_pds.len();
        self.live_pds.retain(|&p| p != pd.0);
        if self.live_pds.len() == before {
            return Err("no such protection domain");
        }
        Ok(())
    }

    pub fn pd_exists(&self, pd: Pd) -> bool {
        self.live_pds.contains(&pd.0)
    }

    /// Register a zeroed region of `length` bytes. As `ibv_reg_mr`, remote write or
    /// remote atomic access requires local write (IBTA §10.6, C10-10 style rule).
    pub fn reg_mr(
        &mut self,
        pd: Pd,
        length: usize,
        access: Access,
    ) -> Result<MrInfo, &'static str> {
        self.register(pd, Backing::Owned(vec![0; length]), None, access)
    }

    /// Register memory of the application at I/O virtual address `iova` (its address
    /// for `ibv_reg_mr`), with the same checks as [`MemTable::reg_mr`].
    pub fn reg_user_mr(
        &mut self,
        pd: Pd,
        mem: UserMem,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, &'static str> {
        if iova.checked_add(mem.len() as u64).is_none() {
            return Err("the region's address range wraps around");
        }
        self.register(pd, Backing::User(mem), Some(iova), access)
    }

    fn register(
        &mut self,
        pd: Pd,
        data: Backing,
        iova: Option<u64>,
        access: Access,
    ) -> Result<MrInfo, &'static str> {
        let length = data.len();
        if !self.pd_exists(pd) {
            return Err("no such protection domain");
        }
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err("remote write or atomic access needs local write");
        }
        if access.0 & !Access::ALL.0 != 0 {
            return Err("unknown access flag");
        }
        let slot = match self.regions.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.regions.push(None);
                self.regions.len() - 1
            }
        };
        if slot >= 0x00ff_ffff {
            return Err("too many memory regions");
        }
        // The low byte of a key is a tag that changes at every registration of the slot,
        // so that a stale key does not name its successor (rxe: index << 8 | an 8-bit
        // key). The engine is deterministic, so the tag is not random, only scrambled
        // (an odd multiplier and a per-slot offset: a bijection of the slot's count, so a
        // slot's key comes back only after 256 registrations of it). What protects held
        // operations is the serial, not the tag.
        if self.slot_gen.len() <= slot {
            self.slot_gen.resize(slot + 1, 0);
        }
        self.slot_gen[slot] = self.slot_gen[slot].wrapping_add(1);
        let tag = self.slot_gen[slot].wrapping_mul(0xa7) ^ (slot as u8).wrapping_mul(0x49);
        let key = ((slot as u32 + 1) << 8) | u32::from(tag);
        self.last_serial += 1;
        let addr = match iova {
            Some(a) => a,
            None => {
                let addr = self.next_addr;
                let span = (length as u64).div_ceil(PAGE).max(1) * PAGE;
                // One unmapped page between regions, so that an overrun never lands in a
                // neighbour.
                self.next_addr = self.next_addr.saturating_add(span + PAGE);
                addr
            }
        };
        self.regions[slot] = Some(Region {
            pd: pd.0,
            addr,
            access,
            key,
            serial: self.last_serial,
            data,
        });
        Ok(MrInfo {
            lkey: Lkey(key),
            rkey: Rkey(key),
            addr,
            length,
            pd,
            access,
        })
    }

    /// Every registered region, in key order (for resource listings).
    pub fn regions(&self) -> impl Iterator<Item = MrInfo> + '_ {
        self.regions.iter().flatten().map(|r| MrInfo {
            lkey: Lkey(r.key),
            rkey: Rkey(r.key),
            addr: r.addr,
            length: r.data.len(),
            pd: Pd(r.pd),
            access: r.access,
        })
    }

    pub fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), &'static str> {
        let slot = self.slot_of(lkey.0).ok_or("no such memory region")?;
        self.regions[slot] = None;
        Ok(())
    }

    fn slot_of(&self, key: u32) -> Option<usize> {
        let slot = (key >> 8).checked_sub(1)? as usize;
        match self.regions.get(slot) {
            Some(Some(r)) if r.key == key => Some(slot),
            _ => None,
        }
    }

    fn region(&self, key: u32) -> Option<&Region> {
        self.slot_of(key).and_then(|s| self.regions[s].as_ref())
    }

    /// The slot of the region a checked reference was made for, if it is still registered.
    #[inline(always)]
    fn slot_of_ref(&self, m: MemRef) -> Option<usize> {
        let slot = self.slot_of(m.key)?;
        match &self.regions[slot] {
            Some(r) if r.serial == m.serial => Some(slot),
            _ => None,
        }
    }

    /// Check an access by a key at `addr..addr+len` for `need` rights on behalf of a QP
    /// in `pd`; on success returns where the bytes are.
    pub fn check(
        &self,
        pd: Pd,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<MemRef, AccessError> {
        let r = self.region(key).ok_or(AccessError::BadKey)?;
        if r.pd != pd.0 {
            return Err(AccessError::WrongPd);
        }
        let end = addr.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if addr < r.addr || end > r.addr + r.data.len() as u64 {
            return Err(AccessError::OutOfBounds);
        }
        if !r.access.contains(need) {
            return Err(AccessError::NoPermission);
        }
        Ok(MemRef {
            key,
            serial: r.serial,
            offset: (addr - r.addr) as usize,
        })
    }

    /// Borrowed bytes `len` at a checked reference plus `skip`, for engine-owned regions
    /// (a frame is built straight from them); `None` if the region went away (also when
    /// its key now names another registration) or is the application's memory (use
    /// [`MemTable::read`], or [`MemTable::live`] to ask whether the bytes are still there).
    #[inline(always)]
    pub fn bytes(&self, m: MemRef, skip: usize, len: usize) -> Option<&[u8]> {
        let r = self.regions[self.slot_of_ref(m)?].as_ref()?;
        let start = m.offset.checked_add(skip)?;
        match &r.data {
            Backing::Owned(v) => v.get(start..start.checked_add(len)?),
            Backing::User(_) => None,
        }
    }

    /// Whether [`MemTable::bytes`] can borrow the bytes of this reference.
    pub fn borrowable(&self, m: MemRef) -> bool {
        self.slot_of_ref(m)
            .and_then(|s| self.regions[s].as_ref())
            .is_some_and(|r| matches!(r.data, Backing::Owned(_)))
    }

    /// Whether the `len` bytes at a checked reference plus `skip` are still there: the
    /// registration the reference was checked against is still registered and holds
    /// the range (either backing).
    pub fn live(&self, m: MemRef, skip: usize, len: usize) -> bool {
        let Some(r) = self.slot_of_ref(m).and_then(|s| self.regions[s].as_ref()) else {
            return false;
        };
        m.offset
            .checked_add(skip)
            .and_then(|a| a.checked_add(len))
            .is_some_and(|end| end <= r.data.len())
    }

    /// True when the reference names memory of another process that a copy found gone
    /// ([`UserMem::owner_gone`]): a failed copy there is the death of its owner, not an
    /// access error.
    pub fn owner_gone(&self, m: MemRef) -> bool {
        self.slot_of_ref(m)
            .and_then(|s| self.regions[s].as_ref())
            .is_some_and(|r| matches!(&r.data, Backing::User(u) if u.owner_gone()))
    }

    /// Copy `dst.len()` bytes at a checked reference plus `skip`; false if the region
    /// went away or the range left it.
    #[inline(always)]
    pub fn read(&self, m: MemRef, skip: usize, dst: &mut [u8]) -> bool {
        let Some(r) = self.slot_of_ref(m).and_then(|s| self.regions[s].as_ref()) else {
            return false;
        };
        let Some(start) = m.offset.checked_add(skip) else {
            return false;
        };
        match &r.data {
            Backing::Owned(v) => match start
                .checked_add(dst.len())
                .and_then(|end| v.get(start..end))
            {
                Some(b) => {
                    dst.copy_from_slice(b);
                    true
                }
                None => false,
            },
            Backing::User(u) => u.read(start, dst),
        }
    }

    /// Copy `src` to a checked reference plus `skip`; false if the region went away or
    /// the range left it.
    #[inline(always)]
    pub fn write(&mut self, m: MemRef, skip: usize, src: &[u8]) -> bool {
        let Some(slot) = self.slot_of_ref(m) else {
            return false;
        };
        let Some(r) = self.regions[slot].as_mut() else {
            return false;
        };
        let Some(start) = m.offset.checked_add(skip) else {
            return false;
        };
        match &mut r.data {
            Backing::Owned(v) => match start
                .checked_add(src.len())
                .and_then(|end| v.get_mut(start..end))
            {
                Some(b) => {
                    b.copy_from_slice(src);
                    true
                }
                None => false,
            },
            Backing::User(u) => u.write(start, src),
        }
    }

    /// The 64-bit atomic at a checked, 8-byte aligned reference (IBTA vol. 1 §9.4.5, host
    /// byte order as the CPU sees the word): compare-and-swap when `cmp` is `Some`, else
    /// fetch-and-add of `swap_add`. Returns the original value; `None` if the region
    /// went away. Atomic with respect to every other operation of this device (all run
    /// on the engine, `IBV_ATOMIC_HCA`); on application memory also to the CPU.
    pub fn atomic(&mut self, m: MemRef, cmp: Option<u64>, swap_add: u64) -> Option<u64> {
        let slot = self.slot_of_ref(m)?;
        let r = self.regions[slot].as_mut()?;
        match &mut r.data {
            Backing::Owned(v) => {
                let word = v.get_mut(m.offset..m.offset.checked_add(8)?)?;
                let orig = u64::from_ne_bytes(word.try_into().ok()?);
                let new = match cmp {
                    Some(c) if orig == c => swap_add,
                    Some(_) => orig,
                    None => orig.wrapping_add(swap_add),
                };
                word.copy_from_slice(&new.to_ne_bytes());
                Some(orig)
            }
            Backing::User(u) => match cmp {
                Some(c) => u.compare_swap(m.offset, c, swap_add),
                None => u.fetch_add(m.offset, swap_add),
            },
        }
    }

    /// All bytes of the engine-owned region named by `lkey` (for the user); `None` for
    /// a region over application memory (the application has its bytes).
    pub fn mr_bytes(&self, lkey: Lkey) -> Option<&[u8]> {
        match &self.region(lkey.0)?.data {
            Backing::Owned(v) => Some(v.as_slice()),
            Backing::User(_) => None,
        }
    }

    /// All bytes of the engine-owned region named by `lkey`, writable (for the user).
    pub fn mr_bytes_mut(&mut self, lkey: Lkey) -> Option<&mut [u8]> {
        let slot = self.slot_of(lkey.0)?;
        match &mut self.regions[slot].as_mut()?.data {
            Backing::Owned(v) => Some(v.as_mut_slice()),
            Backing::User(_) => None,
        }
    }

    /// Invalidate the region named by `rkey` for a SEND with Invalidate (IBTA vol. 1
    /// §10.6, memory windows and fast registration). Remote invalidation is for memory
    /// windows and fast-registered regions; this engine has neither, and a region from
    /// `reg_mr` is never remotely invalidatable (rxe `rxe_invalidate_mr` refuses any MR that is not
    /// IB_MR_TYPE_MEM_REG), so every call fails and nothing changes. The reasons are
    /// checked in the order rxe does: key, PD, then the region's type.
    pub fn invalidate(&mut self, pd: Pd, rkey: Rkey) -> Result<(), AccessError> {
        let r = self.region(rkey.0).ok_or(AccessError::BadKey)?;
        if r.pd != pd.0 {
            return Err(AccessError::WrongPd);
        }
        Err(AccessError::NotInvalidatable)
    }
}

// Scatter/gather lists: resolving a work request's SGEs against the regions, and moving
// message bytes between them and the wire.

/// A scatter/gather element after its key, PD, bounds and rights were checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalSeg {
    pub mem: MemRef,
    pub len: u32,
}

/// A resolved scatter/gather list. Nearly every work request has one SGE (perftest,
/// rdma-core's pingpongs): that one is held inline, so posting it allocates nothing
/// (a `Vec` cost a `malloc` at the post and a `free` at the completion, on each side of
/// a round trip; docs/performance.md, "The round trip").
pub(crate) type Segs = smallvec::SmallVec<[LocalSeg; 1]>;

/// Check a scatter/gather list for a QP in `pd`; `need` is LOCAL_WRITE where the engine
/// will write (receive buffers, READ and atomic results). Local reads need no right.
pub(crate) fn resolve_sges(
    mem: &MemTable,
    pd: Pd,
    sges: &[Sge],
    need: Access,
) -> Result<Segs, WcStatus> {
    let mut out = Segs::with_capacity(sges.len());
    for s in sges {
        if s.length == 0 {
            continue;
        }
        let m = mem
            .check(pd, s.lkey.0, s.addr, u64::from(s.length), need)
            .map_err(|_| WcStatus::LocProtErr)?;
        out.push(LocalSeg {
            mem: m,
            len: s.length,
        });
    }
    Ok(out)
}

/// Where a run of message bytes lies in the scatter/gather list: (segment, offset in it).
pub(crate) fn locate(segs: &[LocalSeg], mut off: usize) -> Option<(usize, usize)> {
    for (i, s) in segs.iter().enumerate() {
        if off < s.len as usize {
            return Some((i, off));
        }
        off -= s.len as usize;
    }
    None
}

/// Copy `data` into the scatter/gather list at message offset `off`.
pub(crate) fn scatter(mem: &mut MemTable, segs: &[LocalSeg], off: usize, data: &[u8]) -> bool {
    if data.is_empty() {
        return true;
    }
    let Some((mut i, mut o)) = locate(segs, off) else {
        return false;
    };
    let mut rest = data;
    while !rest.is_empty() {
        let Some(s) = segs.get(i) else {
            return false;
        };
        let n = rest.len().min(s.len as usize - o);
        if !mem.write(s.mem, o, &rest[..n]) {
            return false;
        }
        rest = &rest[n..];
        i += 1;
        o = 0;
    }
    true
}

/// Where a packet's payload comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Payload {
    None,
    /// Contiguous bytes of one region.
    Mem {
        mem: MemRef,
        skip: usize,
        len: usize,
    },
    /// The first `len` bytes of the engine's gather buffer.
    Scratch(usize),
}

/// True when the `len` message bytes at `off` are all in regions still registered (as
/// the registrations the SGEs were checked against).
pub(crate) fn readable(mem: &MemTable, segs: &[LocalSeg], off: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let Some((mut i, mut o)) = locate(segs, off) else {
        return false;
    };
    let mut rest = len;
    while rest > 0 {
        let Some(s) = segs.get(i) else { return false };
        let n = rest.min(s.len as usize - o);
        if !mem.live(s.mem, o, n) {
            return false;
        }
        rest -= n;
        i += 1;
        o = 0;
    }
    true
}

/// The `len` message bytes at `off` borrowed in place, when one segment of engine-owned
/// memory holds them all and its registration is still there: what [`readable`] and then
/// [`gather`] would find, with one walk of the list and one look-up of the region (the
/// per-packet path of an owned region). `None` otherwise, also for `len` 0: then ask
/// [`readable`] and [`gather`].
#[inline(always)]
pub(crate) fn borrow_run<'a>(
    mem: &'a MemTable,
    segs: &[LocalSeg],
    off: usize,
    len: usize,
) -> Option<&'a [u8]> {
    if len == 0 {
        return None;
    }
    let (i, o) = locate(segs, off)?;
    let s = segs[i];
    if o + len > s.len as usize {
        return None;
    }
    mem.bytes(s.mem, o, len)
}

/// Find `len` message bytes at `off`: borrowed in place when one segment of engine-owned
/// memory holds them all, else copied into `scratch`. The caller checked them with
/// [`readable`]; `None` when a copy failed all the same (another process's memory whose
/// owner died or unmapped it: see src/proto/user_mem.rs).
pub(crate) fn gather(
    mem: &MemTable,
    segs: &[LocalSeg],
    off: usize,
    len: usize,
    scratch: &mut Vec<u8>,
) -> Option<Payload> {
    if len == 0 {
        return Some(Payload::None);
    }
    let (i, o) = locate(segs, off)?;
    // Borrowed in place only from engine-owned bytes: application memory is copied.
    if o + len <= segs[i].len as usize && mem.borrowable(segs[i].mem) {
        return Some(Payload::Mem {
            mem: segs[i].mem,
            skip: o,
            len,
        });
    }
    scratch.clear();
    let (mut i, mut o) = (i, o);
    while scratch.len() < len {
        let Some(s) = segs.get(i) else { break };
        let n = (len - scratch.len()).min(s.len as usize - o);
        let at = scratch.len();
        scratch.resize(at + n, 0);
        if !mem.read(s.mem, o, &mut scratch[at..]) {
            return None;
        }
        i += 1;
        o = 0;
    }
    // Short only if the segments end early, which `readable` ruled out.
    (scratch.len() == len).then_some(Payload::Scratch(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_bounds_pd_and_permissions_are_checked() {
        let mut m = MemTable::new();
        let pd = m.alloc_pd();
        let other = m.alloc_pd();
        let mr = m
            .reg_mr(pd, 100, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let k = mr.rkey.0;
        assert!(m.check(pd, k, mr.addr, 100, Access::REMOTE_READ).is_ok());
        assert_eq!(
            m.check(pd, k, mr.addr + 1, 100, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            m.check(pd, k, mr.addr - 1, 1, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            m.check(pd, k, u64::MAX, 2, Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            m.check(pd, k, mr.addr, 8, Access::REMOTE_WRITE),
            Err(AccessError::NoPermission)
        );
        assert_eq!(
            m.check(other, k, mr.addr, 8, Access::REMOTE_READ),
            Err(AccessError::WrongPd)
        );
        assert_eq!(
            m.check(pd, k ^ 1, mr.addr, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        assert_eq!(
            m.check(pd, 0, mr.addr, 8, Access::NONE),
            Err(AccessError::BadKey)
        );
    }

    #[test]
    fn remote_write_needs_local_write_and_stale_keys_die() {
        let mut m = MemTable::new();
        let pd = m.alloc_pd();
        assert!(m.reg_mr(pd, 8, Access::REMOTE_WRITE).is_err());
        assert!(m.reg_mr(pd, 8, Access::REMOTE_ATOMIC).is_err());
        assert!(m.reg_mr(Pd(99), 8, Access::NONE).is_err());
        let a = m.reg_mr(pd, 8, Access::ALL).unwrap();
        assert!(m.dealloc_pd(pd).is_err());
        m.dereg_mr(a.lkey).unwrap();
        let b = m.reg_mr(pd, 8, Access::ALL).unwrap();
        assert_ne!(a.lkey, b.lkey, "same slot, new generation");
        assert!(m.mr_bytes(a.lkey).is_none());
        assert!(m.mr_bytes(b.lkey).is_some());
        assert!(
            b.addr >= a.addr + 2 * PAGE,
            "regions never share an address"
        );
    }

    #[test]
    fn bytes_follow_checked_refs() {
        let mut m = MemTable::new();
        let pd = m.alloc_pd();
        let mr = m.reg_mr(pd, 16, Access::ALL).unwrap();
        let r = m
            .check(pd, mr.lkey.0, mr.addr + 4, 8, Access::LOCAL_WRITE)
            .unwrap();
        assert!(m.write(r, 2, &[7, 9]));
        assert_eq!(&m.mr_bytes(mr.lkey).unwrap()[6..8], &[7, 9]);
        assert!(m.bytes(r, 10, 4).is_none());
        assert!(!m.write(r, 11, &[0; 2]), "past the region's end");
        assert_eq!(
            m.invalidate(pd, mr.rkey),
            Err(AccessError::NotInvalidatable)
        );
        assert!(m.bytes(r, 0, 1).is_some(), "a reg_mr region stays");
        m.dereg_mr(mr.lkey).unwrap();
        assert!(m.bytes(r, 0, 1).is_none());
    }

    #[test]
    fn a_reference_dies_with_its_registration_even_when_the_key_comes_back() {
        let mut m = MemTable::new();
        let pd = m.alloc_pd();
        let a = m.reg_mr(pd, 16, Access::ALL).unwrap();
        let r = m.check(pd, a.lkey.0, a.addr, 8, Access::NONE).unwrap();
        m.dereg_mr(a.lkey).unwrap();
        let mut again = None;
        for _ in 0..256 {
            let b = m.reg_mr(pd, 16, Access::ALL).unwrap();
            if b.lkey == a.lkey {
                again = Some(b);
                break;
            }
            m.dereg_mr(b.lkey).unwrap();
        }
        let b = again.expect("a slot's key comes back after 256 registrations");
        assert!(m.bytes(r, 0, 8).is_none());
        assert!(!m.write(r, 0, &[0; 8]));
        assert!(!m.live(r, 0, 8));
        let r2 = m.check(pd, b.lkey.0, b.addr, 8, Access::NONE).unwrap();
        assert!(m.bytes(r2, 0, 8).is_some());
    }

    #[test]
    fn application_memory_at_its_own_iova() {
        let mut m = MemTable::new();
        let pd = m.alloc_pd();
        let mut buf = vec![0u64; 8]; // 64 bytes, 8-byte aligned
        let base = buf.as_mut_ptr() as *mut u8;
        // SAFETY: `buf` outlives the region (deregistered below before it is read).
        let user = unsafe { UserMem::new(base, 64) }.unwrap();
        let iova = 0x7000_0000_0000;
        let mr = m.reg_user_mr(pd, user, iova, Access::ALL).unwrap();
        assert_eq!(mr.addr, iova, "the IOVA the application chose");
        assert_eq!(mr.length, 64);
        // Bounds and rights are checked against that IOVA, as for owned regions.
        assert_eq!(
            m.check(pd, mr.rkey.0, iova + 60, 8, Access::REMOTE_WRITE),
            Err(AccessError::OutOfBounds)
        );
        let r = m
            .check(pd, mr.rkey.0, iova + 8, 16, Access::REMOTE_WRITE)
            .unwrap();
        assert!(m.write(r, 0, &42u64.to_ne_bytes()));
        assert!(!m.borrowable(r), "application memory is never borrowed");
        assert!(m.bytes(r, 0, 8).is_none());
        let mut got = [0u8; 8];
        assert!(m.read(r, 0, &mut got));
        assert_eq!(u64::from_ne_bytes(got), 42);
        assert_eq!(m.atomic(r, None, 8), Some(42), "fetch-and-add");
        assert_eq!(m.atomic(r, Some(50), 7), Some(50), "compare-and-swap hit");
        assert_eq!(m.atomic(r, Some(50), 1), Some(7), "miss: no swap");
        assert!(m.mr_bytes(mr.lkey).is_none());
        // An IOVA range that wraps is refused.
        // SAFETY: as above.
        let wrap = unsafe { UserMem::new(base, 64) }.unwrap();
        assert!(m.reg_user_mr(pd, wrap, u64::MAX - 8, Access::ALL).is_err());
        m.dereg_mr(mr.lkey).unwrap();
        assert_eq!(buf[1], 7, "the bytes went to the application's buffer");
    }

    #[test]
    fn gather_borrows_or_copies_across_segments() {
        let mut m = MemTable::new();
        let pd = m.alloc_pd();
        let a = m.reg_mr(pd, 8, Access::LOCAL_WRITE).unwrap();
        let b = m.reg_mr(pd, 8, Access::LOCAL_WRITE).unwrap();
        m.mr_bytes_mut(a.lkey)
            .unwrap()
            .copy_from_slice(&[0, 1, 2, 3, 4, 5, 6, 7]);
        m.mr_bytes_mut(b.lkey)
            .unwrap()
            .copy_from_slice(&[8, 9, 10, 11, 12, 13, 14, 15]);
        let sges = [
            Sge {
                addr: a.addr + 2,
                length: 6,
                lkey: a.lkey,
            },
            Sge {
                addr: b.addr,
                length: 0,
                lkey: Lkey(0),
            },
            Sge {
                addr: b.addr,
                length: 8,
                lkey: b.lkey,
            },
        ];
        let segs = resolve_sges(&m, pd, &sges, Access::NONE).unwrap();
        assert_eq!(segs.len(), 2, "empty SGEs are skipped, even with a bad key");
        assert!(segs.spilled(), "two segments go to the heap");
        let one = resolve_sges(&m, pd, &sges[..1], Access::NONE).unwrap();
        assert_eq!(one[..], segs[..1]);
        assert!(
            !one.spilled(),
            "one segment is held inline: posting it allocates nothing"
        );
        let mut scratch = vec![];
        assert!(matches!(
            gather(&m, &segs, 1, 3, &mut scratch),
            Some(Payload::Mem {
                skip: 1,
                len: 3,
                ..
            })
        ));
        assert!(matches!(
            gather(&m, &segs, 4, 4, &mut scratch),
            Some(Payload::Scratch(4))
        ));
        assert_eq!(scratch, [6, 7, 8, 9]);
        assert!(scatter(&mut m, &segs, 5, &[0xaa, 0xbb, 0xcc]));
        assert_eq!(m.mr_bytes(a.lkey).unwrap()[7], 0xaa);
        assert_eq!(m.mr_bytes(b.lkey).unwrap()[..4], [0xbb, 0xcc, 10, 11]);
        assert!(!scatter(&mut m, &segs, 13, &[1, 2]), "past the end");
        let bad = [Sge {
            addr: a.addr,
            length: 9,
            lkey: a.lkey,
        }];
        assert_eq!(
            resolve_sges(&m, pd, &bad, Access::NONE),
            Err(WcStatus::LocProtErr)
        );
    }

    #[test]
    fn borrow_run_finds_what_gather_borrows_and_nothing_else() {
        let mut m = MemTable::new();
        let pd = m.alloc_pd();
        let a = m.reg_mr(pd, 8, Access::LOCAL_WRITE).unwrap();
        let b = m.reg_mr(pd, 8, Access::LOCAL_WRITE).unwrap();
        m.mr_bytes_mut(a.lkey)
            .unwrap()
            .copy_from_slice(&[0, 1, 2, 3, 4, 5, 6, 7]);
        let sges = [
            Sge {
                addr: a.addr + 2,
                length: 6,
                lkey: a.lkey,
            },
            Sge {
                addr: b.addr,
                length: 8,
                lkey: b.lkey,
            },
        ];
        let segs = resolve_sges(&m, pd, &sges, Access::NONE).unwrap();
        // Inside the first segment: the bytes `gather` borrows.
        assert_eq!(borrow_run(&m, &segs, 1, 3), Some(&[3u8, 4, 5][..]));
        assert_eq!(borrow_run(&m, &segs, 6, 8), Some(&[0u8; 8][..]));
        // Across two segments, past the end, or empty: not a borrow (gather copies).
        assert_eq!(borrow_run(&m, &segs, 4, 4), None);
        assert_eq!(borrow_run(&m, &segs, 14, 1), None);
        assert_eq!(borrow_run(&m, &segs, 0, 0), None);
        // The region gone (or its slot registered again): nothing, as `readable` says.
        m.dereg_mr(a.lkey).unwrap();
        assert_eq!(borrow_run(&m, &segs, 1, 3), None);
        assert!(!readable(&m, &segs, 1, 3));
        let _again = m.reg_mr(pd, 8, Access::LOCAL_WRITE).unwrap();
        assert_eq!(borrow_run(&m, &segs, 1, 3), None);
        assert_eq!(borrow_run(&m, &segs, 6, 8), Some(&[0u8; 8][..]));
    }
}

//! Memory regions (`struct ibv_mr`): over the engine's own buffer, the program's
//! memory, another process's (the device service), or a real RNIC's (offload).

use super::*;

#[derive(Debug)]
pub(super) enum MrKind {
    Soft(Arc<PdInner>),
    Verbs(ibv::Mr),
    Svc(remote::RemoteMr),
}

/// A memory region (`struct ibv_mr`).
#[derive(Debug)]
pub struct Mr {
    pub(super) lkey: Lkey,
    pub(super) rkey: Rkey,
    pub(super) addr: u64,
    pub(super) length: usize,
    pub(super) kind: MrKind,
}

impl Mr {
    pub fn lkey(&self) -> Lkey {
        self.lkey
    }
    pub fn rkey(&self) -> Rkey {
        self.rkey
    }
    /// The address of the first byte, in the device's address space (what SGEs, RETHs
    /// and atomic requests name).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn len(&self) -> usize {
        self.length
    }
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// A scatter/gather element for bytes `offset..offset + length` of this region.
    pub fn sge(&self, offset: usize, length: u32) -> Sge {
        Sge {
            addr: self.addr + offset as u64,
            length,
            lkey: self.lkey,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.length) {
            return Err(Error::OutOfBounds {
                offset,
                len,
                size: self.length,
            });
        }
        Ok(())
    }

    /// Copy bytes out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        match &self.kind {
            MrKind::Soft(pd) => {
                let g = pd.shared.lock();
                let b = g
                    .rnic
                    .mr_bytes(self.lkey)
                    .ok_or(VerbsError::NotFound("memory region"))?;
                out.copy_from_slice(&b[offset..offset + out.len()]);
            }
            MrKind::Verbs(mr) => mr.read(offset, out),
            MrKind::Svc(mr) => {
                let m = mr.mem().ok_or(VerbsError::NotFound("memory region"))?;
                if !m.read(offset, out) {
                    return Err(Error::Io(std::io::Error::from_raw_os_error(14)));
                }
            }
        }
        Ok(())
    }

    /// Copy bytes into the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        match &self.kind {
            MrKind::Soft(pd) => {
                let mut g = pd.shared.lock();
                let b = g
                    .rnic
                    .mr_bytes_mut(self.lkey)
                    .ok_or(VerbsError::NotFound("memory region"))?;
                b[offset..offset + data.len()].copy_from_slice(data);
            }
            MrKind::Verbs(mr) => mr.write(offset, data),
            MrKind::Svc(mr) => {
                let m = mr.mem().ok_or(VerbsError::NotFound("memory region"))?;
                if !m.write(offset, data) {
                    return Err(Error::Io(std::io::Error::from_raw_os_error(14)));
                }
            }
        }
        Ok(())
    }

    /// Look at the region's bytes: `f` gets a copy of the whole region, made when called
    /// (`mr_copy`). No lock is held while `f` runs, so it may call any verb; what the
    /// NIC writes meanwhile is not in the copy. For a few bytes, [`Mr::read`] copies less.
    pub fn with<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
        match &self.kind {
            MrKind::Soft(_) | MrKind::Svc(_) => {
                let mut copy = vec![0u8; self.length];
                self.read(0, &mut copy)?;
                Ok(f(&copy))
            }
            MrKind::Verbs(mr) => Ok(mr.with(f)),
        }
    }

    /// Change the region's bytes: `f` gets a copy of the whole region, and the bytes it
    /// changed are written back when it returns (`mr_copy`); bytes it left alone keep
    /// whatever the NIC wrote there meanwhile. No lock is held while `f` runs, so it may
    /// call any verb. For a few bytes, [`Mr::write`] copies less.
    pub fn with_mut<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> Result<T> {
        match &self.kind {
            MrKind::Soft(pd) => {
                let mut copy = vec![0u8; self.length];
                self.read(0, &mut copy)?;
                let old = copy.clone();
                let r = f(&mut copy);
                let mut g = pd.shared.lock();
                let b = g
                    .rnic
                    .mr_bytes_mut(self.lkey)
                    .ok_or(VerbsError::NotFound("memory region"))?;
                mr_copy::changed_runs(&old, &copy, |at, run| {
                    b[at..at + run.len()].copy_from_slice(run);
                });
                Ok(r)
            }
            MrKind::Verbs(mr) => Ok(mr.with_mut(f)),
            MrKind::Svc(_) => {
                let mut copy = vec![0u8; self.length];
                self.read(0, &mut copy)?;
                let old = copy.clone();
                let r = f(&mut copy);
                let mut res = Ok(());
                mr_copy::changed_runs(&old, &copy, |at, run| {
                    if res.is_ok() {
                        res = self.write(at, run);
                    }
                });
                res.map(|()| r)
            }
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let MrKind::Soft(pd) = &self.kind {
            let _ = pd.shared.lock().rnic.dereg_mr(self.lkey);
        }
    }
}

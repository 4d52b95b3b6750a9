//! The GSI QP of a device served by the device service: the service owns QP1 and relays
//! CM MADs (src/service/gsi.rs, docs/rnic.md "rdma_cm through the service"). A client's
//! CM (src/abi/rdmacm_port.rs) sends its MADs through [`GsiRelay::send`], receives those
//! for its listens and comm IDs through [`GsiRelay::recv`], and takes its comm IDs in
//! [`GsiRelay::comm_ids`].

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

use super::{DevBackend, Device, Error, Result, remote};
use crate::ipc::{GsiMad, Req, Resp};

/// This client's end of the service's GSI relay.
#[derive(Debug)]
pub struct GsiRelay {
    conn: Arc<remote::Conn>,
    /// Written by the service when MADs wait for this client.
    ready: OwnedFd,
    comm_ids: (u32, u32),
}

impl Device {
    /// The service's GSI relay for this client, or `None` when the device runs in this
    /// process (its CM then makes the GSI QP itself: [`super::Pd::create_gsi_qp`]).
    pub fn gsi_relay(&self) -> Result<Option<GsiRelay>> {
        let DevBackend::Svc { conn, .. } = &self.inner.backend else {
            return Ok(None);
        };
        let (resp, mut fds) = conn.call(&Req::GsiOpen)?;
        let Resp::GsiOpened {
            comm_base,
            comm_span,
        } = resp
        else {
            return Err(Error::Io(std::io::Error::other(
                "device service: unexpected answer to GsiOpen",
            )));
        };
        let ready = fds.pop().ok_or_else(|| {
            Error::Io(std::io::Error::other(
                "device service: GsiOpen without its notifier",
            ))
        })?;
        Ok(Some(GsiRelay {
            conn: conn.clone(),
            ready,
            comm_ids: (comm_base, comm_span),
        }))
    }
}

impl GsiRelay {
    /// The comm IDs this client's CM must take its IDs from: `(base, span)`
    /// (`CmConfig::comm_ids`).
    pub fn comm_ids(&self) -> (u32, u32) {
        self.comm_ids
    }

    /// Receive the REQs and SIDR_REQs for `service_id`; EADDRINUSE (an `Error::Io`)
    /// when any process listens there already.
    pub fn listen(&self, service_id: u64) -> Result<()> {
        self.conn.call_ok(&Req::GsiListen { service_id })
    }

    pub fn unlisten(&self, service_id: u64) -> Result<()> {
        self.conn.call_ok(&Req::GsiUnlisten { service_id })
    }

    /// Send the CM MAD `mad` from QP1 to QP1 of the port of GID `to`. The service
    /// refuses (EPERM) a MAD that names comm IDs not this client's.
    pub fn send(&self, to: &[u8; 16], mad: &[u8]) -> Result<()> {
        self.conn.call_ok(&Req::GsiSend {
            to: *to,
            mad: mad.to_vec(),
        })
    }

    /// Wait up to `timeout` for MADs for this client and take them (each: the sender's
    /// GID, the GID it was sent to, the 256 bytes). Empty when none came.
    pub fn recv(&self, timeout: Duration) -> Result<Vec<GsiMad>> {
        let mut fds = [PollFd::new(&self.ready, PollFlags::IN)];
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(Vec::new()),
            Ok(_) => {}
            Err(e) => return Err(Error::Io(e.into())),
        }
        let _ = crate::io::shm::take_wakeups(std::os::fd::AsFd::as_fd(&self.ready));
        match self.conn.call(&Req::GsiRecv)?.0 {
            Resp::GsiMads { mads } => Ok(mads),
            _ => Err(Error::Io(std::io::Error::other(
                "device service: unexpected answer to GsiRecv",
            ))),
        }
    }
}

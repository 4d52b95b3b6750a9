//! Errors of the AF_XDP layer: each says what failed, on which interface and what to do.

use std::fmt;
use std::io;

/// Why opening or driving an AF_XDP port failed.
#[derive(Debug)]
pub enum Error {
    /// AF_XDP sockets and XDP programs need root (CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF).
    NotRoot { what: &'static str },
    /// No interface of that name in this network namespace.
    InterfaceMissing { ifname: String, source: io::Error },
    /// The kernel refused to load the XDP program (verifier, missing BPF support).
    LoadProgram(String),
    /// The kernel refused to attach the XDP program to the interface.
    AttachRefused { ifname: String, reason: String },
    /// Putting the socket into the program's XSKMAP failed.
    RegisterSocket { queue: u32, reason: String },
    /// Creating the UMEM failed (memory, locked-memory limit).
    Umem(String),
    /// Creating or binding the AF_XDP socket failed.
    Socket {
        ifname: String,
        queue: u32,
        reason: String,
    },
    /// Options that cannot work together or with this kernel.
    Config(String),
    /// A frame longer than the port can carry.
    FrameTooLarge { len: usize, max: usize },
    /// A system call on the socket failed.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotRoot { what } => write!(
                f,
                "{what} needs root (CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF); run as root"
            ),
            Error::InterfaceMissing { ifname, source } => {
                write!(
                    f,
                    "interface {ifname:?} not found in this network namespace ({source})"
                )
            }
            Error::LoadProgram(r) => write!(f, "loading the XDP program failed: {r}"),
            Error::AttachRefused { ifname, reason } => {
                write!(
                    f,
                    "attaching the XDP program to {ifname:?} was refused: {reason}"
                )
            }
            Error::RegisterSocket { queue, reason } => {
                write!(
                    f,
                    "registering the AF_XDP socket for queue {queue} in the XSKMAP failed: {reason}"
                )
            }
            Error::Umem(r) => write!(f, "creating the UMEM failed: {r}"),
            Error::Socket {
                ifname,
                queue,
                reason,
            } => {
                write!(
                    f,
                    "creating the AF_XDP socket on {ifname:?} queue {queue} failed: {reason}"
                )
            }
            Error::Config(r) => write!(f, "invalid AF_XDP port options: {r}"),
            Error::FrameTooLarge { len, max } => {
                write!(
                    f,
                    "frame of {len} bytes exceeds the port's maximum of {max}"
                )
            }
            Error::Io(e) => write!(f, "AF_XDP socket I/O failed: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InterfaceMissing { source, .. } => Some(source),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

//! Why a verb failed: the API's one error type.

use std::time::Duration;

use super::{Backend, VerbsError, netdev};
use crate::io::afxdp;

/// Why an API call failed.
#[derive(Debug)]
pub enum Error {
    /// Opening the AF_XDP port: not root, interface missing, XDP attach refused, queue
    /// already in use, ...
    Port(afxdp::Error),
    /// Reading the interface or the neighbour table, or starting the driver.
    Io(std::io::Error),
    /// The interface MTU leaves no room for even a 256-byte IB MTU.
    MtuTooSmall { ifname: String, mtu: u32 },
    /// The engine refused the verb.
    Verbs(VerbsError),
    /// A path MTU above the port's active MTU would make frames the link drops.
    PathMtuTooLarge { requested: u32, active: u32 },
    /// Source and destination GIDs of different IP versions.
    GidFamilyMismatch { sgid_index: u8 },
    /// The interface still has an XDP program after waiting `waited` for it to go:
    /// another device is open on it.
    XdpBusy { ifname: String, waited: Duration },
    /// A range outside a memory region.
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    /// libibverbs (`libibverbs.so.1`) could not be loaded: the offload backend needs
    /// rdma-core's libibverbs1 package.
    NoLibibverbs(String),
    /// No RDMA device of that name (`found`: the ones libibverbs lists).
    NoRdmaDevice { name: String, found: Vec<String> },
    /// A libibverbs call failed.
    Ibv {
        call: &'static str,
        err: std::io::Error,
    },
    /// The device's backend lacks this capability.
    Unsupported {
        what: &'static str,
        backend: Backend,
    },
    /// Objects of two different devices (or backends) used together.
    DeviceMismatch,
    /// A tool named no device ([`super::choose_backend`]).
    NoDeviceNamed,
    /// No RDMA device of that name, but a network interface
    /// ([`super::Device::open_named`]).
    NetdevNotRdma { name: String, found: Vec<String> },
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Port(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::MtuTooSmall { ifname, mtu } => write!(
                f,
                "{ifname}: MTU {mtu} is too small for RoCE (needs at least {})",
                256 + netdev::MAX_HDR_LENGTH
            ),
            Error::Verbs(e) => write!(f, "{e}"),
            Error::PathMtuTooLarge { requested, active } => write!(
                f,
                "path MTU {requested} exceeds the port's active MTU {active}"
            ),
            Error::GidFamilyMismatch { sgid_index } => write!(
                f,
                "source GID {sgid_index} and the destination GID are not both IPv4 or both IPv6"
            ),
            Error::XdpBusy { ifname, waited } => write!(
                f,
                "{ifname} already has an XDP program attached, still after waiting {waited:?} \
                 for it to be detached: is an xrnic device open on it in another process? \
                 (`ip link show dev {ifname}` shows the program)"
            ),
            Error::OutOfBounds { offset, len, size } => write!(
                f,
                "bytes {offset}..{} are outside the {size}-byte memory region",
                offset + len
            ),
            Error::NoLibibverbs(e) => write!(
                f,
                "libibverbs is not available ({e}): RDMA devices need rdma-core's libibverbs1 \
                 and a provider (ibverbs-providers)"
            ),
            Error::NoRdmaDevice { name, found } if found.is_empty() => {
                write!(f, "no RDMA device {name}: libibverbs finds no RDMA device")
            }
            Error::NoRdmaDevice { name, found } => write!(
                f,
                "no RDMA device {name} (libibverbs finds: {})",
                found.join(", ")
            ),
            Error::Ibv { call, err } => write!(f, "{call} failed: {err}"),
            Error::Unsupported { what, backend } => {
                write!(f, "{what} is not available on the {backend} backend")
            }
            Error::DeviceMismatch => {
                write!(f, "objects of different devices cannot be used together")
            }
            Error::NoDeviceNamed => write!(f, "no device: give --netdev IF or --device NAME"),
            Error::NetdevNotRdma { name, found } => {
                let e = Error::NoRdmaDevice {
                    name: name.clone(),
                    found: found.clone(),
                };
                write!(
                    f,
                    "{e}; {name} is a network interface: use --netdev {name} (or -d \
                     xrnic_{name}) for the software device on it"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        Error::Verbs(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<afxdp::Error> for Error {
    fn from(e: afxdp::Error) -> Self {
        Error::Port(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

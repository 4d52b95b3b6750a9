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

impl Error {
    /// The errno a libibverbs caller gets for this error: the one map used by the C
    /// library (src/abi) and the device service's answers (src/service/server.rs), as the
    /// kernel's uverbs and rxe answer the same refusal.
    pub fn errno(&self) -> i32 {
        use crate::io::afxdp::Error as Port;
        match self {
            Error::Verbs(v) => verbs_errno(v),
            // PermissionDenied without an errno: the device service's socket held by a
            // user this process does not trust (ipc::connect_service).
            Error::Io(io) | Error::Ibv { err: io, .. } => {
                io.raw_os_error().unwrap_or(match io.kind() {
                    std::io::ErrorKind::PermissionDenied => libc::EACCES,
                    _ => libc::EIO,
                })
            }
            // Another device holds the interface's XDP hook.
            Error::XdpBusy { .. } => libc::EBUSY,
            Error::PathMtuTooLarge { .. }
            | Error::GidFamilyMismatch { .. }
            | Error::MtuTooSmall { .. }
            | Error::OutOfBounds { .. } => libc::EINVAL,
            // Objects of another context: uverbs finds no such handle in this one
            // (`uobj_get_obj_read` fails, EINVAL in uverbs_cmd.c).
            Error::DeviceMismatch => libc::EINVAL,
            Error::Unsupported { .. } => libc::EOPNOTSUPP,
            Error::Port(Port::NotRoot { .. }) => libc::EPERM,
            _ => libc::EIO,
        }
    }
}

/// The errno of the engine's refusal of a verb.
fn verbs_errno(e: &VerbsError) -> i32 {
    match e {
        // A full work queue: ENOMEM from `ibv_post_*` (rxe's `post_one_send`,
        // `post_one_recv`: "queue full" -> -ENOMEM).
        VerbsError::QueueFull => libc::ENOMEM,
        // A disassociated device: the kernel fails every command EIO (uverbs_main.c).
        VerbsError::DeviceFatal => libc::EIO,
        // Destroying an object still in use: `ib_destroy_usecnt` (and rxe's checks
        // before `ib_destroy_cq_user`, `ib_destroy_srq_user`) answer EBUSY.
        VerbsError::InUse(_) => libc::EBUSY,
        // rxe's multicast limits (`rxe_get_mcg`, `rxe_attach_mcg`): ENOMEM.
        VerbsError::Limit(_) => libc::ENOMEM,
        // A handle that names no object: uverbs_cmd.c answers EINVAL when
        // `uobj_get_obj_read` finds none; every other refusal of a bad argument or of the
        // QP's state is EINVAL too (`ib_modify_qp_is_ok`, rxe_qp.c `rxe_qp_chk_attr`).
        VerbsError::NotFound(_)
        | VerbsError::Resource(_)
        | VerbsError::InvalidTransition { .. }
        | VerbsError::MissingAttributes(_)
        | VerbsError::UnexpectedAttributes(_)
        | VerbsError::CurrentStateMismatch
        | VerbsError::InvalidValue(_)
        | VerbsError::WrongState(_) => libc::EINVAL,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_refusals_map_as_uverbs_and_rxe() {
        let v = |e| Error::Verbs(e).errno();
        assert_eq!(v(VerbsError::InUse("cq still used")), libc::EBUSY);
        assert_eq!(v(VerbsError::Limit("multicast")), libc::ENOMEM);
        assert_eq!(v(VerbsError::QueueFull), libc::ENOMEM);
        assert_eq!(v(VerbsError::DeviceFatal), libc::EIO);
        assert_eq!(v(VerbsError::NotFound("QP")), libc::EINVAL);
        assert_eq!(v(VerbsError::Resource("address range")), libc::EINVAL);
        assert_eq!(v(VerbsError::CurrentStateMismatch), libc::EINVAL);
    }

    #[test]
    fn the_other_errors_keep_their_errno() {
        let io = Error::Io(std::io::Error::from_raw_os_error(libc::ENODEV));
        assert_eq!(io.errno(), libc::ENODEV);
        let denied = Error::Io(std::io::ErrorKind::PermissionDenied.into());
        assert_eq!(denied.errno(), libc::EACCES);
        let root = Error::Port(afxdp::Error::NotRoot { what: "AF_XDP" });
        assert_eq!(root.errno(), libc::EPERM);
        let busy = Error::XdpBusy {
            ifname: "veth0".into(),
            waited: Duration::ZERO,
        };
        assert_eq!(busy.errno(), libc::EBUSY);
        assert_eq!(Error::DeviceMismatch.errno(), libc::EINVAL);
        assert_eq!(Error::NoDeviceNamed.errno(), libc::EIO);
    }
}

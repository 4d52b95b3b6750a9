//! Finding the device service: its socket's name, who listens on it, and whether this
//! process may trust that listener (unix(7): an abstract name has no owner).

/// The service's socket: the abstract name `xrnic/<IF>` (abstract names belong to the
/// network namespace, so each namespace's `eth0` has its own service).
pub fn socket_name(ifname: &str) -> Vec<u8> {
    format!("xrnic/{ifname}").into_bytes()
}

/// Who listens on `@xrnic/<IF>`: the credentials the kernel recorded when that process
/// called listen(2), as SO_PEERCRED gives them on the connected socket (unix(7)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listener {
    pub pid: i32,
    pub uid: u32,
}

/// Whether a client whose effective uid is `me` may talk to a service run as `uid`:
/// root's, or its own. Any other user could have bound the abstract name first (an
/// abstract name has no owner and no permissions, unix(7)); a client that sent its
/// requests there would hand that user its buffer addresses and objects.
pub fn trusted(uid: u32, me: u32) -> bool {
    uid == 0 || uid == me
}

/// Connect to whatever listens on the service socket of `ifname`: the socket and the
/// listener's credentials, `None` when nothing listens. Sends nothing.
pub fn connect_any(ifname: &str) -> std::io::Result<Option<(std::os::fd::OwnedFd, Listener)>> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let addr = SocketAddrUnix::new_abstract_name(&socket_name(ifname))?;
    match rustix::net::connect(&sock, &addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let cred = rustix::net::sockopt::socket_peercred(&sock)?;
    let who = Listener {
        pid: cred.pid.as_raw_nonzero().get(),
        uid: cred.uid.as_raw(),
    };
    Ok(Some((sock, who)))
}

/// [`connect_any`], refusing a listener this process must not trust ([`trusted`]) before
/// anything is sent: a `PermissionDenied` error (EACCES) naming its pid and uid.
pub fn connect_service(ifname: &str) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    let Some((sock, who)) = connect_any(ifname)? else {
        return Ok(None);
    };
    let me = rustix::process::geteuid().as_raw();
    if !trusted(who.uid, me) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            impostor(ifname, who, me),
        ));
    }
    Ok(Some(sock))
}

/// What a client says of a listener it does not trust.
pub fn impostor(ifname: &str, who: Listener, me: u32) -> String {
    format!(
        "@xrnic/{ifname} is held by pid {} (uid {}), not by root or this user (uid {me}): \
         not a device service this process trusts; nothing was sent to it",
        who.pid, who.uid
    )
}

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

/// The environment variable in which `xrnic exec` hands the program the pids of the
/// service listeners it checked with [`trusted`] before entering a user namespace
/// (comma-separated; src/cli/devview.rs).
pub const VERIFIED_PIDS_ENV: &str = "XRNIC_SERVICE_PIDS";

/// For a peer shown with the overflow uid to a process in a non-initial user namespace:
/// the pids `xrnic exec` verified ([`VERIFIED_PIDS_ENV`], empty when unset); `None` for
/// any other peer or process. Inside a user namespace that maps only the caller's own
/// ids, root's service and any other user's process alike appear as the overflow uid
/// (user_namespaces(7), "Unmapped user and group IDs"), so [`trusted`] cannot tell them
/// apart: only the pid `xrnic exec` saw answer for root or this user before it entered
/// the namespace can.
fn unmapped_peer(who: Listener) -> Option<String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let overflow = read("/proc/sys/kernel/overflowuid")
        .trim()
        .parse()
        .unwrap_or(65534);
    if who.uid != overflow || !in_child_user_namespace(&read("/proc/self/uid_map")) {
        return None;
    }
    Some(std::env::var(VERIFIED_PIDS_ENV).unwrap_or_default())
}

/// Whether `list` (comma-separated pids) holds `pid`.
fn verified_pid(list: &str, pid: i32) -> bool {
    list.split(',').any(|p| p.trim().parse::<i32>() == Ok(pid))
}

/// Whether a `/proc/self/uid_map` is not the initial user namespace's identity map of
/// every uid (user_namespaces(7)); an empty (unreadable) map is not known to be one.
fn in_child_user_namespace(uid_map: &str) -> bool {
    let words: Vec<&str> = uid_map.split_whitespace().collect();
    !words.is_empty() && words != ["0", "0", "4294967295"]
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
    let trust = match unmapped_peer(who) {
        // Inside a user namespace of `xrnic exec`: by the pid it verified (even for a
        // client that is nobody itself, whose uid an unmapped squatter shows too).
        Some(verified_pids) => verified_pid(&verified_pids, who.pid),
        None => trusted(who.uid, me),
    };
    if !trust {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listed_pid_in_a_child_user_namespace() {
        assert!(!in_child_user_namespace(
            "         0          0 4294967295\n"
        ));
        assert!(in_child_user_namespace(
            "      1000       1000          1\n"
        ));
        assert!(
            !in_child_user_namespace(""),
            "unreadable: not known to be one"
        );
        assert!(verified_pid("12,345", 345));
        assert!(!verified_pid("12,345", 34));
        assert!(!verified_pid("", 0));
    }
}

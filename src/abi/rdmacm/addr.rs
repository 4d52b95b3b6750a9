//! Addresses and routes of an id: the socket addresses in `rdma_cm_id.route`, the
//! interface and GIDs an IP address maps to, `rdma_bind_addr`, `rdma_resolve_addr`,
//! `rdma_resolve_route`, `rdma_listen`.

use super::*;

/// The socket address at `sa` (AF_INET or AF_INET6).
pub(crate) fn sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller passes a sockaddr of the family it names (sockets API contract).
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    IpAddr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

pub(crate) fn store(dst: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: sockaddr_storage is large and aligned enough for either family.
    unsafe {
        *dst = core::mem::zeroed();
        match a {
            SocketAddr::V4(v) => {
                let s = &mut *(dst as *mut _ as *mut libc::sockaddr_in);
                s.sin_family = libc::AF_INET as u16;
                s.sin_port = v.port().to_be();
                s.sin_addr.s_addr = u32::from_be_bytes(v.ip().octets()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = &mut *(dst as *mut _ as *mut libc::sockaddr_in6);
                s.sin6_family = libc::AF_INET6 as u16;
                s.sin6_port = v.port().to_be();
                s.sin6_addr.s6_addr = v.ip().octets();
            }
        }
    }
}

pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The interface holding `ip` (getifaddrs).
pub(crate) fn ifname_of(ip: IpAddr) -> Option<String> {
    let mut ifa: *mut libc::ifaddrs = core::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifa` with a list freed below by freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned; names are NUL-terminated.
        let (addr, name, next) = unsafe { ((*p).ifa_addr, (*p).ifa_name, (*p).ifa_next) };
        if sockaddr(addr).is_some_and(|a| a.ip() == ip) {
            // SAFETY: as above.
            found = Some(
                unsafe { core::ffi::CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
            break;
        }
        p = next;
    }
    // SAFETY: frees the list from getifaddrs once.
    unsafe { libc::freeifaddrs(ifa) };
    found
}

/// The source address the kernel's routing would use towards `dst`.
pub(crate) fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        IpAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(dst, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

pub(crate) fn ephemeral_port() -> u16 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    32768 + (n % 28000) as u16
}

/// Attach `x` to the port of the interface holding `ip`.
pub(crate) fn attach(x: &XId, ip: IpAddr) -> Result<Arc<Port>, c_int> {
    let ifname = ifname_of(ip).ok_or(libc::EADDRNOTAVAIL)?;
    if !crate::device::netdevs().contains(&ifname) {
        return Err(libc::ENODEV);
    }
    let p = cm_port(&ifname)?;
    // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
    let id = unsafe { &mut *x.id_ptr() };
    id.verbs = p.ctx;
    // cma.c `ucma_get_device`: a bound id carries the device's PD too.
    id.pd = super::sync::default_pd(p.ctx);
    id.port_num = 1;
    id.route.addr.ib.sgid.raw = gid_of(ip);
    id.route.addr.ib.pkey = 0xffff;
    x.st.lock().unwrap_or_else(|e| e.into_inner()).port = Some(p.clone());
    Ok(p)
}

pub extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let Some(mut a) = sockaddr(addr) else {
            return err(libc::EAFNOSUPPORT, -1);
        };
        if a.port() == 0 {
            a.set_port(ephemeral_port());
        }
        if !a.ip().is_unspecified() {
            if let Err(e) = attach(x, a.ip()) {
                return err(e, -1);
            }
        }
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        store(&mut unsafe { &mut *x.id_ptr() }.route.addr.src, a);
        0
    })
}

pub extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let Some(d) = sockaddr(dst) else {
            return err(libc::EAFNOSUPPORT, -1);
        };
        let bound = sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr);
        let s_ip = sockaddr(src)
            .map(|s| s.ip())
            .filter(|i| !i.is_unspecified())
            .or(bound.map(|b| b.ip()).filter(|i| !i.is_unspecified()))
            .or_else(|| route_source(d.ip()));
        let port_no = bound.map_or(0, |b| b.port());
        let r = s_ip
            .ok_or(libc::EADDRNOTAVAIL)
            .and_then(|ip| attach(x, ip).map(|_| ip));
        match r {
            Ok(ip) => {
                let sport = if port_no == 0 {
                    ephemeral_port()
                } else {
                    port_no
                };
                // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one
                // is used.
                let idm = unsafe { &mut *x.id_ptr() };
                store(&mut idm.route.addr.src, SocketAddr::new(ip, sport));
                store(&mut idm.route.addr.dst, d);
                idm.route.addr.ib.dgid.raw = gid_of(d.ip());
                push(x.c().channel, event(x, ev::ADDR_RESOLVED, 0));
            }
            Err(e) => push(x.c().channel, event(x, ev::ADDR_ERROR, -e)),
        }
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let p = x.st.lock().unwrap_or_else(|e| e.into_inner()).port.clone();
        let Some(p) = p else {
            return err(libc::EINVAL, -1);
        };
        // The next hop's MAC: resolving it now makes ROUTE_ERROR the event for a
        // neighbour that does not answer (as the kernel's rdma_resolve_route on RoCE).
        let dgid = x.c().route.addr.ib.dgid.raw;
        match p
            .dev
            .resolve_path(Some(&x.c().route.addr.ib.sgid.raw), &dgid)
        {
            Ok(_) => push(x.c().channel, event(x, ev::ROUTE_RESOLVED, 0)),
            Err(e) => push(x.c().channel, event(x, ev::ROUTE_ERROR, -e.errno())),
        }
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let Some(a) = sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr) else {
            return err(libc::EINVAL, -1);
        };
        let sid = service_id(x.c().ps as u16, a.port());
        let ports: Vec<Arc<Port>> =
            match x.st.lock().unwrap_or_else(|e| e.into_inner()).port.clone() {
                Some(p) => vec![p],
                None => crate::device::netdevs()
                    .iter()
                    .filter_map(|n| cm_port(n).ok())
                    .collect(),
            };
        if ports.is_empty() {
            return err(libc::ENODEV, -1);
        }
        for (i, p) in ports.iter().enumerate() {
            if let Err(e) = p.listen(sid, id as u64) {
                ports[..i].iter().for_each(|q| q.unlisten(sid));
                return err(e, -1);
            }
        }
        if x.c().verbs.is_null() {
            // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
            let id = unsafe { &mut *x.id_ptr() };
            id.verbs = ports[0].ctx;
            id.pd = super::sync::default_pd(ports[0].ctx);
        }
        let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        st.listen = Some(sid);
        st.listen_ports = ports;
        0
    })
}

//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` (librdmacm addrinfo.c), numeric addresses
//! only.

use core::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;

use super::*;

#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// The answer and the addresses it points to (`ai` first: the C caller's pointer).
#[repr(C)]
struct XAddrInfo {
    ai: rdma_addrinfo,
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
}

/// The text of the C string `p`, or None for NULL.
///
/// # Safety
///
/// `p` is NULL or points to a NUL-terminated string that stays put during the call.
unsafe fn cstr(p: *const c_char) -> Option<String> {
    (!p.is_null()).then(|| {
        // SAFETY: not NULL, so a NUL-terminated string (the caller's contract).
        unsafe { core::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    })
}

/// `rdma_getaddrinfo` for numeric addresses (RAI_PASSIVE: the source), port space TCP.
pub extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() {
            return err(libc::EINVAL, -1);
        }
        let (flags, ps) = if hints.is_null() {
            (0, c_int::from(RDMA_PS_TCP))
        } else {
            // SAFETY: not NULL, so the caller's hints (rdma_getaddrinfo(3)).
            unsafe { ((*hints).ai_flags, (*hints).ai_port_space) }
        };
        // SAFETY: `service` and `node` are NULL or C strings (rdma_getaddrinfo(3)).
        let port: u16 = unsafe { cstr(service) }
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        // SAFETY: as above.
        let ip: IpAddr = match unsafe { cstr(node) } {
            Some(n) => match n.parse() {
                Ok(ip) => ip,
                Err(_) => return err(libc::EINVAL, libc::EAI_NONAME),
            },
            None => "0.0.0.0".parse().expect("a literal"),
        };
        // SAFETY: sockaddr_storage is plain data; all-zero is AF_UNSPEC.
        let zero: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
        let mut x = Box::new(XAddrInfo {
            // SAFETY: rdma_addrinfo is C data; all-zero is valid (NULL pointers).
            ai: unsafe { core::mem::zeroed() },
            src: zero,
            dst: zero,
        });
        let a = SocketAddr::new(ip, port);
        let len = if ip.is_ipv4() {
            core::mem::size_of::<libc::sockaddr_in>()
        } else {
            core::mem::size_of::<libc::sockaddr_in6>()
        } as libc::socklen_t;
        x.ai.ai_flags = flags;
        x.ai.ai_family = if ip.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        x.ai.ai_qp_type = 2;
        x.ai.ai_port_space = if ps == 0 {
            c_int::from(RDMA_PS_TCP)
        } else {
            ps
        };
        if flags & 1 != 0 {
            store(&mut x.src, a);
            x.ai.ai_src_len = len;
            x.ai.ai_src_addr = &mut x.src as *mut _ as *mut libc::sockaddr;
        } else {
            store(&mut x.dst, a);
            x.ai.ai_dst_len = len;
            x.ai.ai_dst_addr = &mut x.dst as *mut _ as *mut libc::sockaddr;
        }
        // SAFETY: caller's out-parameter; the box is freed by rdma_freeaddrinfo.
        unsafe { *res = Box::into_raw(x) as *mut rdma_addrinfo };
        0
    })
}

pub extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    if !res.is_null() {
        // SAFETY: a Box<XAddrInfo> from rdma_getaddrinfo (its first field).
        drop(unsafe { Box::from_raw(res as *mut XAddrInfo) });
    }
}

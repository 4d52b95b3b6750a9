//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` as rdma-core 44's librdmacm (addrinfo.c)
//! answers: names and services through getaddrinfo(3), the hints converted as librdmacm
//! converts them.

use core::ffi::{c_char, c_int, c_void};
use xrnic::wire::mad::RDMA_PS_IPOIB;

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

const RAI_PASSIVE: c_int = 0x1;
const RAI_NUMERICHOST: c_int = 0x2;
const RAI_FAMILY: c_int = 0x8;
/// `AF_IB` (infiniband/ib.h).
const AF_IB: c_int = 27;
/// `RDMA_IB_IP_PS_MASK` / `RDMA_IB_IP_PORT_MASK` (rdma/rdma_cma.h).
const IB_IP_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
const IB_IP_PORT_MASK: u64 = 0x0000_0000_0000_FFFF;
/// `RDMA_PS_IB` (rdma/rdma_cma.h).
const RDMA_PS_IB: c_int = 0x013F;
const IBV_QPT_RC: c_int = 2;
const IBV_QPT_UC: c_int = 3;
const IBV_QPT_UD: c_int = 4;
const IBV_QPT_XRC_SEND: c_int = 9;
const IBV_QPT_XRC_RECV: c_int = 10;

/// `struct sockaddr_ib` (infiniband/ib.h): an AF_IB address, 48 bytes.
#[repr(C)]
struct SockaddrIb {
    sib_family: u16,
    sib_pkey: u16,
    sib_flowinfo: u32,
    sib_addr: [u8; 16],
    sib_sid: u64,
    sib_sid_mask: u64,
    sib_scope_id: u64,
}

/// The hints as librdmacm's `ucma_convert_to_ai` gives them to getaddrinfo(3): the
/// passive and numeric flags, the family unless AF_IB, the socket type of the QP type,
/// the protocol of the port space.
fn hints_to_ai(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: addrinfo is C data; all-zero is valid (NULL pointers).
    let mut ai: libc::addrinfo = unsafe { core::mem::zeroed() };
    if h.ai_flags & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if h.ai_flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.ai_family != AF_IB {
        ai.ai_family = h.ai_family;
    }
    ai.ai_socktype = match h.ai_qp_type {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match h.ai_port_space {
        p if p == c_int::from(RDMA_PS_TCP) => libc::IPPROTO_TCP,
        p if p == c_int::from(RDMA_PS_UDP) || p == c_int::from(RDMA_PS_IPOIB) => libc::IPPROTO_UDP,
        p if p == RDMA_PS_IB => match ai.ai_socktype {
            libc::SOCK_STREAM => libc::IPPROTO_TCP,
            libc::SOCK_DGRAM => libc::IPPROTO_UDP,
            _ => 0,
        },
        _ => 0,
    };
    ai
}

/// Copy `len` bytes of the address at `sa` into `dst`; false when it does not fit.
///
/// # Safety
///
/// `sa` points to `len` readable bytes.
unsafe fn copy_addr(
    dst: &mut libc::sockaddr_storage,
    sa: *const libc::sockaddr,
    len: usize,
) -> bool {
    if len > core::mem::size_of::<libc::sockaddr_storage>() {
        return false;
    }
    // SAFETY: `len` bytes readable at `sa` (the contract), and `dst` holds at least `len`.
    unsafe { core::ptr::copy_nonoverlapping(sa as *const u8, dst as *mut _ as *mut u8, len) };
    true
}

/// An IPv6 address as AF_IB (librdmacm `ucma_convert_in6`): pkey 0xFFFF, the flow label
/// and scope kept, the service ID made of the port space and port (`ucma_set_sid`).
fn in6_to_ib(ps: c_int, s: &libc::sockaddr_in6, dst: &mut libc::sockaddr_storage) -> usize {
    let port = u16::from_be(s.sin6_port);
    let mut mask = 0;
    if ps != 0 {
        mask = IB_IP_PS_MASK;
    }
    if port != 0 {
        mask |= IB_IP_PORT_MASK;
    }
    let ib = SockaddrIb {
        sib_family: AF_IB as u16,
        sib_pkey: 0xFFFFu16.to_be(),
        sib_flowinfo: s.sin6_flowinfo,
        sib_addr: s.sin6_addr.s6_addr,
        sib_sid: (((ps as u64) << 16) + u64::from(port)).to_be(),
        sib_sid_mask: mask.to_be(),
        sib_scope_id: u64::from(s.sin6_scope_id),
    };
    // SAFETY: sockaddr_storage (128 bytes, 8-aligned) holds a 48-byte sockaddr_ib.
    unsafe { core::ptr::write(dst as *mut _ as *mut SockaddrIb, ib) };
    core::mem::size_of::<SockaddrIb>()
}

/// What librdmacm's `ucma_getaddrinfo` + `ucma_convert_to_rai` make of `node`/`service`:
/// getaddrinfo(3) with the converted hints, its first answer as the source (passive) or
/// the destination, the QP type and port space from the hints or else from the answer's
/// socket type and protocol. `Err` is getaddrinfo's EAI code (returned as is).
///
/// # Safety
///
/// `node` and `service` are NULL or C strings.
unsafe fn resolve(
    node: *const c_char,
    service: *const c_char,
    h: &rdma_addrinfo,
    x: &mut XAddrInfo,
) -> Result<(), c_int> {
    let want = hints_to_ai(h);
    let mut res: *mut libc::addrinfo = core::ptr::null_mut();
    // SAFETY: C strings or NULL (the contract); `want` and `res` are live locals.
    let rc = unsafe { libc::getaddrinfo(node, service, &want, &mut res) };
    if rc != 0 {
        return Err(rc);
    }
    // SAFETY: getaddrinfo succeeded: `res` is a list of at least one answer, freed below.
    let ai = unsafe { &*res };
    x.ai.ai_qp_type = if h.ai_qp_type != 0 {
        h.ai_qp_type
    } else {
        match ai.ai_socktype {
            libc::SOCK_STREAM => IBV_QPT_RC,
            libc::SOCK_DGRAM => IBV_QPT_UD,
            _ => 0,
        }
    };
    x.ai.ai_port_space = if h.ai_port_space != 0 {
        h.ai_port_space
    } else {
        match ai.ai_protocol {
            libc::IPPROTO_TCP => c_int::from(RDMA_PS_TCP),
            libc::IPPROTO_UDP => c_int::from(RDMA_PS_UDP),
            _ => 0,
        }
    };
    let passive = ai.ai_flags & libc::AI_PASSIVE != 0;
    let to_ib =
        h.ai_flags & RAI_FAMILY != 0 && h.ai_family == AF_IB && h.ai_flags & RAI_NUMERICHOST != 0;
    let slot = if passive { &mut x.src } else { &mut x.dst };
    let len = if to_ib && ai.ai_family == libc::AF_INET6 {
        x.ai.ai_family = AF_IB;
        // SAFETY: an AF_INET6 answer's ai_addr is a sockaddr_in6.
        let s6 = unsafe { &*(ai.ai_addr as *const libc::sockaddr_in6) };
        Some(in6_to_ib(x.ai.ai_port_space, s6, slot))
    } else if to_ib {
        // librdmacm reads an IPv4 answer as a sockaddr_in6 (past its end); refuse instead.
        None
    } else {
        x.ai.ai_family = ai.ai_family;
        // SAFETY: getaddrinfo's answer holds ai_addrlen bytes at ai_addr.
        unsafe { copy_addr(slot, ai.ai_addr, ai.ai_addrlen as usize) }
            .then_some(ai.ai_addrlen as usize)
    };
    // SAFETY: the list getaddrinfo returned, not used after this.
    unsafe { libc::freeaddrinfo(res) };
    let len = len.ok_or(libc::EAI_FAMILY)? as libc::socklen_t;
    if passive {
        x.ai.ai_flags = RAI_PASSIVE;
        x.ai.ai_src_len = len;
        x.ai.ai_src_addr = &mut x.src as *mut _ as *mut libc::sockaddr;
    } else {
        x.ai.ai_dst_len = len;
        x.ai.ai_dst_addr = &mut x.dst as *mut _ as *mut libc::sockaddr;
    }
    Ok(())
}

/// `rdma_getaddrinfo` as rdma-core 44's librdmacm (addrinfo.c) answers it: with a node or
/// a service, getaddrinfo(3) resolves them under the converted hints ([`resolve`]);
/// without either, the answer is the hints' flags, family, QP type, port space and
/// destination. Either way a source address in the hints becomes the answer's source
/// when it has none. No node, service or hints: EINVAL. A getaddrinfo failure returns
/// its EAI code. (The IB ACM route query librdmacm tries for an active answer needs
/// ibacm, which an Ethernet RNIC never has: it does nothing there either.)
pub extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: rdma_addrinfo is C data; all-zero is valid (NULL pointers): librdmacm's
        // `nohints`.
        let none: rdma_addrinfo = unsafe { core::mem::zeroed() };
        let h = if hints.is_null() {
            &none
        } else {
            // SAFETY: not NULL, so the caller's hints (rdma_getaddrinfo(3)), read during
            // the call.
            unsafe { &*hints }
        };
        // SAFETY: sockaddr_storage is plain data; all-zero is AF_UNSPEC.
        let zero: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
        let mut x = Box::new(XAddrInfo {
            // SAFETY: rdma_addrinfo is C data; all-zero is valid (NULL pointers).
            ai: unsafe { core::mem::zeroed() },
            src: zero,
            dst: zero,
        });
        if !node.is_null() || !service.is_null() {
            // SAFETY: `node` and `service` are NULL or C strings (rdma_getaddrinfo(3)).
            if let Err(rc) = unsafe { resolve(node, service, h, &mut x) } {
                return rc;
            }
        } else {
            x.ai.ai_flags = h.ai_flags;
            x.ai.ai_family = h.ai_family;
            x.ai.ai_qp_type = h.ai_qp_type;
            x.ai.ai_port_space = h.ai_port_space;
            if h.ai_dst_len != 0 {
                // SAFETY: the hints' destination holds ai_dst_len bytes (rdma_getaddrinfo(3)).
                if !unsafe { copy_addr(&mut x.dst, h.ai_dst_addr, h.ai_dst_len as usize) } {
                    return err(libc::EINVAL, -1);
                }
                x.ai.ai_dst_len = h.ai_dst_len;
                x.ai.ai_dst_addr = &mut x.dst as *mut _ as *mut libc::sockaddr;
            }
        }
        if x.ai.ai_src_len == 0 && h.ai_src_len != 0 {
            // SAFETY: the hints' source holds ai_src_len bytes (rdma_getaddrinfo(3)).
            if !unsafe { copy_addr(&mut x.src, h.ai_src_addr, h.ai_src_len as usize) } {
                return err(libc::EINVAL, -1);
            }
            x.ai.ai_src_len = h.ai_src_len;
            x.ai.ai_src_addr = &mut x.src as *mut _ as *mut libc::sockaddr;
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

#[cfg(test)]
mod tests {
    //! Each rule of rdma-core 44's addrinfo.c, one case each.
    use super::*;
    use core::ptr::null;
    use std::ffi::CString;
    use std::net::SocketAddr;

    const RAI_NOROUTE: c_int = 0x4;

    fn zero_hints() -> rdma_addrinfo {
        // SAFETY: rdma_addrinfo is C data; all-zero is valid.
        unsafe { core::mem::zeroed() }
    }

    /// An answer's flags, family, QP type, port space, source and destination.
    type Answer = (
        c_int,
        c_int,
        c_int,
        c_int,
        Option<SocketAddr>,
        Option<SocketAddr>,
    );

    /// Call rdma_getaddrinfo; Ok(the answer) or Err(its return value).
    fn gai(
        node: Option<&str>,
        service: Option<&str>,
        hints: Option<&rdma_addrinfo>,
    ) -> Result<Answer, c_int> {
        let n = node.map(|s| CString::new(s).unwrap());
        let s = service.map(|s| CString::new(s).unwrap());
        let mut res: *mut rdma_addrinfo = core::ptr::null_mut();
        let rc = rdma_getaddrinfo(
            n.as_ref().map_or(null(), |c| c.as_ptr()),
            s.as_ref().map_or(null(), |c| c.as_ptr()),
            hints.map_or(null(), |h| h as *const _),
            &mut res,
        );
        if rc != 0 {
            return Err(rc);
        }
        // SAFETY: a successful call's answer, freed below.
        let ai = unsafe { &*res };
        let out = (
            ai.ai_flags,
            ai.ai_family,
            ai.ai_qp_type,
            ai.ai_port_space,
            sockaddr(ai.ai_src_addr),
            sockaddr(ai.ai_dst_addr),
        );
        rdma_freeaddrinfo(res);
        Ok(out)
    }

    #[test]
    fn an_active_answer_is_the_destination_rc_over_the_tcp_port_space() {
        let (flags, fam, qpt, ps, src, dst) = gai(Some("192.0.2.1"), Some("7471"), None).unwrap();
        assert_eq!((flags, fam), (0, libc::AF_INET));
        // getaddrinfo's first answer is SOCK_STREAM/TCP: RC, RDMA_PS_TCP.
        assert_eq!((qpt, ps), (IBV_QPT_RC, c_int::from(RDMA_PS_TCP)));
        assert_eq!(src, None);
        assert_eq!(dst, Some("192.0.2.1:7471".parse().unwrap()));
    }

    #[test]
    fn a_passive_answer_is_the_source_and_keeps_only_the_passive_flag() {
        let mut h = zero_hints();
        h.ai_flags = RAI_PASSIVE | RAI_NOROUTE;
        h.ai_port_space = c_int::from(RDMA_PS_UDP);
        let (flags, _, qpt, ps, src, dst) = gai(None, Some("7471"), Some(&h)).unwrap();
        assert_eq!(
            flags, RAI_PASSIVE,
            "only RAI_PASSIVE survives (convert_to_rai)"
        );
        // The port space from the hints; the QP type from getaddrinfo's UDP answer.
        assert_eq!((qpt, ps), (IBV_QPT_UD, c_int::from(RDMA_PS_UDP)));
        let src = src.unwrap();
        assert!(src.ip().is_unspecified() && src.port() == 7471, "{src}");
        assert_eq!(dst, None);
    }

    #[test]
    fn a_source_in_the_hints_joins_a_resolved_destination() {
        // pyverbs' AddrInfo(src=, dst=): the hints carry the source (rdma-core's tests
        // bind with it).
        // SAFETY: sockaddr_storage is plain data; all-zero is AF_UNSPEC.
        let mut sa: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
        store(&mut sa, "192.0.2.11:0".parse().unwrap());
        let mut h = zero_hints();
        h.ai_src_addr = &mut sa as *mut _ as *mut libc::sockaddr;
        h.ai_src_len = core::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let (_, _, _, _, src, dst) = gai(Some("192.0.2.12"), Some("7471"), Some(&h)).unwrap();
        assert_eq!(src, Some("192.0.2.11:0".parse().unwrap()));
        assert_eq!(dst, Some("192.0.2.12:7471".parse().unwrap()));
    }

    #[test]
    fn without_node_or_service_the_hints_are_the_answer() {
        // SAFETY: sockaddr_storage is plain data; all-zero is AF_UNSPEC.
        let mut d: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
        store(&mut d, "[fd00::2]:18515".parse().unwrap());
        let mut h = zero_hints();
        h.ai_flags = RAI_NUMERICHOST;
        h.ai_family = libc::AF_INET6;
        h.ai_qp_type = IBV_QPT_UD;
        h.ai_port_space = c_int::from(RDMA_PS_IPOIB);
        h.ai_dst_addr = &mut d as *mut _ as *mut libc::sockaddr;
        h.ai_dst_len = core::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        let got = gai(None, None, Some(&h)).unwrap();
        assert_eq!(
            got,
            (
                RAI_NUMERICHOST,
                libc::AF_INET6,
                IBV_QPT_UD,
                c_int::from(RDMA_PS_IPOIB),
                None,
                Some("[fd00::2]:18515".parse().unwrap())
            )
        );
    }

    #[test]
    fn nothing_to_resolve_is_einval_and_bad_names_are_eai_codes() {
        assert_eq!(gai(None, None, None), Err(-1));
        let mut h = zero_hints();
        h.ai_flags = RAI_NUMERICHOST;
        assert_eq!(
            gai(Some("not-a-number"), None, Some(&h)),
            Err(libc::EAI_NONAME)
        );
        let r = gai(Some("192.0.2.1"), Some("no-such-service-xrnic"), None);
        assert!(matches!(r, Err(e) if e < 0), "{r:?}");
    }

    #[test]
    fn af_ib_numeric_hints_give_a_sockaddr_ib_with_the_service_id() {
        let mut h = zero_hints();
        h.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST | RAI_FAMILY;
        h.ai_family = AF_IB;
        h.ai_port_space = c_int::from(RDMA_PS_TCP);
        let n = CString::new("fe80::1").unwrap();
        let s = CString::new("7471").unwrap();
        let mut res: *mut rdma_addrinfo = core::ptr::null_mut();
        assert_eq!(rdma_getaddrinfo(n.as_ptr(), s.as_ptr(), &h, &mut res), 0);
        // SAFETY: a successful call's answer, freed below.
        let ai = unsafe { &*res };
        assert_eq!(ai.ai_family, AF_IB);
        assert_eq!(ai.ai_src_len as usize, core::mem::size_of::<SockaddrIb>());
        // SAFETY: an AF_IB answer's source is a sockaddr_ib.
        let ib = unsafe { &*(ai.ai_src_addr as *const SockaddrIb) };
        assert_eq!(c_int::from(ib.sib_family), AF_IB);
        assert_eq!(u16::from_be(ib.sib_pkey), 0xFFFF);
        assert_eq!(u64::from_be(ib.sib_sid), (0x0106 << 16) + 7471);
        assert_eq!(
            u64::from_be(ib.sib_sid_mask),
            IB_IP_PS_MASK | IB_IP_PORT_MASK
        );
        assert_eq!(ib.sib_addr[0..2], [0xfe, 0x80]);
        rdma_freeaddrinfo(res);
    }
}

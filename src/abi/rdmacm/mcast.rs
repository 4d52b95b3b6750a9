//! Multicast on UD ids: `rdma_join_multicast`, `rdma_join_multicast_ex`,
//! `rdma_leave_multicast`, as librdmacm's cma.c and the kernel's cma.c do them for RoCE v2.
//!
//! - Checks, in the order a program meets them: librdmacm's `rdma_join_multicast_ex`
//!   (comp_mask past the known bits: ENOTSUP; no address bit: EINVAL; no join-flags bit,
//!   or flags past SENDONLY_FULLMEMBER: EINVAL), a readable address (EINVAL, as
//!   `ucma_addrlen`), then the kernel's `rdma_join_multicast` (an id with a device, that
//!   is bound or resolved, and UD: EINVAL) and `cma_iboe_join_multicast` (the zero
//!   address: EINVAL; an IPv6 group on a RoCE v2 port: ENOTSUPP, the kernel's 524, which
//!   is the errno a program on rxe sees).
//! - The group's GID is `cma_iboe_set_mgid`'s for RoCE v2: `::ffff:a.b.c.d`.
//! - The event: RDMA_CM_EVENT_MULTICAST_JOIN on the id's channel with `param.ud` as
//!   `cma_make_mc_event` fills it for RoCE (`ib_init_ah_from_mcmember`): an address handle
//!   to the group (global, the id's source GID index, hop limit 64, the kernel's
//!   IPV6_DEFAULT_HOPLIMIT for an IPv4 group on RoCE v2, DLID 0), QPN 0xFFFFFF, Q_Key
//!   the id's (RDMA_UDP_QKEY); `private_data` is the join's `context` (librdmacm).
//! - The QP: librdmacm's `ucma_process_join` attaches the id's QP to the group with
//!   `ibv_attach_mcast` (not for a send-only join), and a failure turns the event into
//!   MULTICAST_ERROR with status -1. It runs when the program reads the event; here it
//!   runs at the join, so a QP created between the join and the event is not attached
//!   (mckey, ucmatose-style programs create the QP first).
//! - The kernel membership: the kernel's cma joins IPv4 groups in IP (`cma_igmp_send`)
//!   for a full-member join; here the attached QP holds it (src/verbs/mcast.rs), so a
//!   full-member join of an id without a QP sends no IGMP report.
//! - `rdma_leave_multicast`: an address the id did not join is EADDRNOTAVAIL
//!   (librdmacm); else the QP is detached (not for send-only) and the join forgotten.
//!   `rdma_destroy_id` forgets the joins; the QP's attachments go with the QP.

use core::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};

use super::ud::{RDMA_UDP_QKEY, is_ud};
use super::*;

/// `enum rdma_cm_join_mc_attr_mask`.
const ATTR_ADDRESS: u32 = 1 << 0;
const ATTR_JOIN_FLAGS: u32 = 1 << 1;
const ATTR_RESERVED: u32 = 1 << 2;
/// `enum rdma_cm_mc_join_flags`.
const FLAG_FULLMEMBER: u32 = 0;
const FLAG_SENDONLY_FULLMEMBER: u32 = 1;
const FLAG_RESERVED: u32 = 2;
/// The kernel's internal ENOTSUPP (524), what the cma's `cma_iboe_join_multicast`
/// returns for an IPv6 group on a RoCE v2 port.
const ENOTSUPP: c_int = 524;
/// ib_core's IPV6_DEFAULT_HOPLIMIT, the hop limit of an IPv4 group on RoCE v2.
const HOP_LIMIT: u8 = 64;
/// The QPN of a multicast destination (IBTA vol. 1 §10.5.2.2).
const MULTICAST_QPN: u32 = xrnic::wire::MULTICAST_QPN;

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

/// One group an id joined.
#[derive(Clone, Copy, Debug)]
pub(super) struct Join {
    addr: SocketAddr,
    mgid: [u8; 16],
    join_flags: u32,
}

/// `cma_iboe_set_mgid` for RoCE v2: the IPv4-mapped GID, or the IPv6 address.
fn mgid_of(ip: IpAddr) -> [u8; 16] {
    gid_of(ip)
}

pub extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard(-1, || errno_ret(join(id, addr, FLAG_FULLMEMBER, context)))
}

pub extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        if attr.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: the caller's rdma_cm_join_mc_attr_ex (rdma_cma.h contract).
        let a = unsafe { &*attr };
        if a.comp_mask >= ATTR_RESERVED {
            return err(libc::ENOTSUP, -1);
        }
        if a.comp_mask & ATTR_ADDRESS == 0 {
            return err(libc::EINVAL, -1);
        }
        if a.comp_mask & ATTR_JOIN_FLAGS == 0 || a.join_flags >= FLAG_RESERVED {
            return err(libc::EINVAL, -1);
        }
        errno_ret(join(id, a.addr, a.join_flags, context))
    })
}

fn join(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    join_flags: u32,
    context: *mut c_void,
) -> Result<(), c_int> {
    // SAFETY: the program does not destroy the id `id` while this call uses it.
    let x = unsafe { xid(id) }.ok_or(libc::EINVAL)?;
    let a = sockaddr(addr).ok_or(libc::EINVAL)?;
    let port = x.st.lock().unwrap_or_else(|e| e.into_inner()).port.clone();
    let Some(p) = port else {
        // Neither bound to an address nor resolved: no device.
        return Err(libc::EINVAL);
    };
    if !is_ud(x) {
        return Err(libc::EINVAL);
    }
    if a.ip().is_unspecified() {
        return Err(libc::EINVAL);
    }
    // AF_INET6, even `::ffff:a.b.c.d`: the kernel refuses it on RoCE v2.
    if a.is_ipv6() {
        return Err(ENOTSUPP);
    }
    let mgid = mgid_of(a.ip());
    let j = Join {
        addr: a,
        mgid,
        join_flags,
    };
    x.st.lock().unwrap_or_else(|e| e.into_inner()).mc.push(j);

    let mut e = event(x, ev::MULTICAST_JOIN, 0);
    let sgid = x.c().route.addr.ib.sgid.raw;
    let mut ah = ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    ah.grh.dgid.raw = mgid;
    ah.grh.sgid_index = p.gid_index(&sgid).unwrap_or(0);
    ah.grh.hop_limit = HOP_LIMIT;
    e.ev.param.ud = rdma_ud_param {
        private_data: context as *const c_void,
        private_data_len: 0,
        ah_attr: ah,
        qp_num: MULTICAST_QPN,
        qkey: RDMA_UDP_QKEY,
    };
    // librdmacm `ucma_process_join`: the id's QP joins the group, unless send-only.
    let qp = x.c().qp;
    if !qp.is_null() && join_flags != FLAG_SENDONLY_FULLMEMBER {
        let g = ibv_gid { raw: mgid };
        if crate::mcast::ibv_attach_mcast(qp, &g, 0) != 0 {
            e.ev.event = ev::MULTICAST_ERROR;
            e.ev.status = -1;
        }
    }
    push(x.c().channel, e);
    sync::complete(x)
}

pub extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        errno_ret((|| {
            let a = sockaddr(addr).ok_or(libc::EINVAL)?;
            // SAFETY: the program does not destroy the id `id` while this call uses it.
            let x = unsafe { xid(id) }.ok_or(libc::EINVAL)?;
            let j = {
                let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
                let i = st
                    .mc
                    .iter()
                    .position(|j| j.addr == a)
                    .ok_or(libc::EADDRNOTAVAIL)?;
                st.mc.remove(i)
            };
            let qp = x.c().qp;
            if !qp.is_null() && j.join_flags != FLAG_SENDONLY_FULLMEMBER {
                let g = ibv_gid { raw: j.mgid };
                // librdmacm ignores the detach's result too.
                let _ = crate::mcast::ibv_detach_mcast(qp, &g, 0);
            }
            Ok(())
        })())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_groups_map_to_their_mapped_gid() {
        let g = mgid_of("239.1.2.3".parse().unwrap());
        assert_eq!(&g[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&g[12..], &[239, 1, 2, 3]);
    }

    fn last_errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// librdmacm's argument checks come first, then the kernel's id checks: an id
    /// neither bound nor resolved, or not UD, is EINVAL (no device needed).
    #[test]
    fn join_arguments_and_id_state_are_checked_as_librdmacm_and_the_kernel_do() {
        let mut group: libc::sockaddr_in = unsafe_zeroed();
        group.sin_family = libc::AF_INET as libc::sa_family_t;
        group.sin_addr.s_addr = u32::from_ne_bytes([239, 1, 2, 3]);
        let ga = &mut group as *mut libc::sockaddr_in as *mut libc::sockaddr;
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut ud: *mut rdma_cm_id = core::ptr::null_mut();
        let mut tcp: *mut rdma_cm_id = core::ptr::null_mut();
        let null = core::ptr::null_mut();
        assert_eq!(
            rdma_create_id(ch, &mut ud, null, c_int::from(RDMA_PS_UDP)),
            0
        );
        assert_eq!(
            rdma_create_id(ch, &mut tcp, null, c_int::from(RDMA_PS_TCP)),
            0
        );
        let mut attr = rdma_cm_join_mc_attr_ex {
            comp_mask: ATTR_RESERVED,
            join_flags: FLAG_FULLMEMBER,
            addr: ga,
        };
        let cases: [(u32, u32, c_int); 4] = [
            (ATTR_RESERVED | ATTR_ADDRESS, FLAG_FULLMEMBER, libc::ENOTSUP),
            (ATTR_JOIN_FLAGS, FLAG_FULLMEMBER, libc::EINVAL),
            (ATTR_ADDRESS, FLAG_FULLMEMBER, libc::EINVAL),
            (ATTR_ADDRESS | ATTR_JOIN_FLAGS, FLAG_RESERVED, libc::EINVAL),
        ];
        for (mask, flags, want) in cases {
            attr.comp_mask = mask;
            attr.join_flags = flags;
            assert_eq!(rdma_join_multicast_ex(ud, &mut attr, null), -1);
            assert_eq!(last_errno(), want, "mask {mask:#x} flags {flags}");
        }
        assert_eq!(rdma_join_multicast_ex(ud, core::ptr::null_mut(), null), -1);
        // Well-formed, but the id has no address (so no device) yet; a TCP id; a
        // pointer that is no id.
        attr.comp_mask = ATTR_ADDRESS | ATTR_JOIN_FLAGS;
        attr.join_flags = FLAG_SENDONLY_FULLMEMBER;
        assert_eq!(rdma_join_multicast_ex(ud, &mut attr, null), -1);
        assert_eq!(last_errno(), libc::EINVAL);
        assert_eq!(rdma_join_multicast(tcp, ga, null), -1);
        assert_eq!(last_errno(), libc::EINVAL);
        assert_eq!(rdma_join_multicast(ga as *mut rdma_cm_id, ga, null), -1);
        // Leaving a group never joined: EADDRNOTAVAIL (librdmacm).
        assert_eq!(rdma_leave_multicast(ud, ga), -1);
        assert_eq!(last_errno(), libc::EADDRNOTAVAIL);
        assert_eq!(rdma_leave_multicast(ud, core::ptr::null_mut()), -1);
        assert_eq!(last_errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(ud), 0);
        assert_eq!(rdma_destroy_id(tcp), 0);
        rdma_destroy_event_channel(ch);
    }

    fn unsafe_zeroed() -> libc::sockaddr_in {
        // SAFETY: sockaddr_in is plain C data; all-zero is valid.
        unsafe { core::mem::zeroed() }
    }
}

//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`) and the two helpers that build
//! one from a UD receive (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`), as
//! rdma-core's libibverbs/verbs.c does for RoCE v2: the GRH at the start of the buffer
//! is an IPv6 header, or 20 bytes and then an IPv4 header (told apart by the IPv6
//! version nibble, then the IPv4 header length and checksum); the source address of the
//! received packet becomes the destination GID, and the packet's destination address
//! names the source GID index (looked up in the GID table, RoCE v2 entries only).
//! Multicast destinations are EINVAL (xrnic has no multicast, docs/verbs-abi.md).

use core::ffi::c_int;
use core::sync::atomic::Ordering;

use xrnic::verbs::{self as xv, AddressVector, GidType};

use crate::context::{XAh, context, next_handle, xpd};
use crate::live::{self, Kind};
use crate::types::*;
use crate::{guard, ret, set_errno};

use xrnic::verbs::ibv::conv::FLOW_LABEL_MASK;

/// The address vector of an `ibv_ah_attr` (xrnic::verbs::ibv::conv: the GRH required,
/// port 1, the flow label's 20 bits), EINVAL otherwise.
pub fn av_of(a: &ibv_ah_attr) -> Result<AddressVector, c_int> {
    AddressVector::try_from(a).map_err(|e| xv::Error::Verbs(e).errno())
}

pub extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(core::ptr::null_mut(), || match create(pd, attr) {
        Ok(a) => a,
        Err(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
    })
}

fn create(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> Result<*mut ibv_ah, c_int> {
    // SAFETY: the program does not destroy the PD `pd` while this call uses it.
    let p = unsafe { xpd(pd) }.ok_or(libc::EINVAL)?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // rxe's create_ah goes to the kernel (ibv_cmd_create_ah), EIO once disassociated.
    if crate::context::ctx_gone(p.ibv.context) {
        return Err(libc::EIO);
    }
    // SAFETY: `attr` points to the caller's ibv_ah_attr (verbs.h contract).
    let av = av_of(unsafe { &*attr })?;
    let ah = p.pd.create_ah(&av).map_err(|e| {
        if std::env::var_os("XRNIC_DEBUG").is_some() {
            eprintln!("xrnic: ibv_create_ah: {e}");
        }
        e.errno()
    })?;
    p.users.fetch_add(1, Ordering::SeqCst);
    let x = Box::into_raw(Box::new(XAh {
        ibv: ibv_ah {
            context: p.ibv.context,
            pd,
            handle: next_handle(),
        },
        ah,
        pd: p,
    }));
    live::add(x, Kind::Ah);
    Ok(x as *mut ibv_ah)
}

pub extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        if !live::remove(ah, Kind::Ah) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: removed above: a leaked Box<XAh> freed once.
        let x = unsafe { Box::from_raw(ah as *mut XAh) };
        // SAFETY: an AH keeps its PD (ibv_dealloc_pd is EBUSY while `users` > 0).
        unsafe { &*x.pd }.users.fetch_sub(1, Ordering::SeqCst);
        0
    })
}

/// `get_grh_header_version` of rdma-core's verbs.c: 6, 4, or None (EPROTONOSUPPORT).
fn grh_version(g: &[u8; 40]) -> Option<u8> {
    let ip4 = &g[20..40];
    if g[0] >> 4 != 6 {
        return (ip4[0] >> 4 == 4).then_some(4);
    }
    if ip4[0] & 0xf != 5 {
        return Some(6);
    }
    // Both readings possible: believe IPv4 when its header checksum holds.
    let mut sum = 0u32;
    for (i, w) in ip4.chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = !(sum as u16);
    Some(if check == u16::from_be_bytes([ip4[10], ip4[11]]) {
        4
    } else {
        6
    })
}

fn mapped(ip: &[u8]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(ip);
    g
}

/// `ibv_find_gid_index` for a RoCE v2 GID: its index in the table, or None.
fn find_gid(dev: &xv::Device, gid: &[u8; 16]) -> Option<u8> {
    (0..dev.gid_table().len())
        .find(|&i| {
            dev.query_gid(i).as_ref() == Some(gid) && dev.gid_type(i) == Some(GidType::RoceV2)
        })
        .and_then(|i| u8::try_from(i).ok())
}

/// What `ibv_init_ah_from_wc` computes, from the 40 GRH bytes (None: no GRH).
fn ah_attr_from(
    dev: &xv::Device,
    port: u8,
    wc: &ibv_wc,
    grh: Option<&[u8; 40]>,
) -> Result<ibv_ah_attr, c_int> {
    let mut a = ibv_ah_attr {
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        port_num: port,
        ..Default::default()
    };
    let Some(g) = grh.filter(|_| wc.wc_flags & IBV_WC_GRH != 0) else {
        return Ok(a);
    };
    let flow = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
    a.grh.flow_label = flow & FLOW_LABEL_MASK;
    a.is_global = 1;
    match grh_version(g) {
        Some(4) => {
            let ip4 = &g[20..40];
            // No point searching multicast GIDs in the GID table (verbs.c).
            if ip4[16] & 0xf0 == 0xe0 {
                return Err(libc::EINVAL);
            }
            a.grh.sgid_index = find_gid(dev, &mapped(&ip4[16..20])).ok_or(libc::ENOENT)?;
            a.grh.dgid.raw = mapped(&ip4[12..16]);
            a.grh.hop_limit = ip4[8];
            a.grh.traffic_class = ip4[1];
        }
        Some(_) => {
            let (sgid, dgid): ([u8; 16], [u8; 16]) = (
                g[8..24].try_into().expect("16 bytes"),
                g[24..40].try_into().expect("16 bytes"),
            );
            if dgid[0] == 0xff {
                return Err(libc::EINVAL);
            }
            // Next header UDP: RoCE v2 (0x1b, RoCE v1, is not a GID type xrnic has).
            if g[6] != libc::IPPROTO_UDP as u8 {
                return Err(libc::EPROTONOSUPPORT);
            }
            a.grh.dgid.raw = sgid;
            a.grh.sgid_index = find_gid(dev, &dgid).ok_or(libc::ENOENT)?;
            a.grh.hop_limit = g[7];
            a.grh.traffic_class = ((flow >> 20) & 0xff) as u8;
        }
        None => return Err(libc::EPROTONOSUPPORT),
    }
    Ok(a)
}

const IBV_WC_GRH: u32 = 1 << 0;

/// `int ibv_init_ah_from_wc(ctx, port_num, wc, grh, ah_attr)`: 0, or -1 with errno
/// (rdma-core returns -1 from its GID lookup and from an unknown header).
pub extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        let r = if attr.is_null() {
            Err(libc::EINVAL)
        } else {
            init_from_wc(ctx, port, wc, grh)
        };
        match r {
            Ok(a) => {
                // SAFETY: `attr` is the caller's ibv_ah_attr (non-NULL, checked above).
                unsafe { attr.write(a) };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

fn init_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
) -> Result<ibv_ah_attr, c_int> {
    // SAFETY: the program does not close `ctx` while this call uses it.
    let x = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
    if wc.is_null() {
        return Err(libc::EINVAL);
    }
    // rdma-core's looks the GID up (ibv_query_gid / ibv_find_gid_index): -1 once the
    // device is gone.
    if crate::context::gone(x) {
        return Err(libc::EIO);
    }
    // SAFETY: `wc` points to the caller's completion (verbs.h contract).
    let w = unsafe { *wc };
    let g = if grh.is_null() {
        None
    } else {
        // SAFETY: `grh` points to the 40 bytes at the start of the receive buffer.
        Some(unsafe { (grh as *const [u8; 40]).read_unaligned() })
    };
    if w.wc_flags & IBV_WC_GRH != 0 && g.is_none() {
        return Err(libc::EINVAL);
    }
    ah_attr_from(&x.dev, port, &w, g.as_ref())
}

pub extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    guard(core::ptr::null_mut(), || {
        // SAFETY: the program does not destroy the PD `pd` while this call uses it.
        let Some(p) = (unsafe { xpd(pd) }) else {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        match init_from_wc(p.ibv.context, port, wc, grh) {
            Ok(mut a) => ibv_create_ah(pd, &mut a),
            Err(e) => {
                set_errno(e);
                core::ptr::null_mut()
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 40 GRH bytes of a RoCE v2 IPv4 datagram as rxe writes them: 20 zero bytes,
    /// then the IPv4 header (checksum valid).
    fn ipv4_grh(src: [u8; 4], dst: [u8; 4], ttl: u8, tos: u8) -> [u8; 40] {
        let mut g = [0u8; 40];
        let h = &mut g[20..];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[8] = ttl;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum = 0u32;
        for w in h.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        g
    }

    #[test]
    fn grh_version_tells_ipv4_from_ipv6() {
        let g4 = ipv4_grh([192, 0, 2, 1], [192, 0, 2, 2], 64, 0);
        assert_eq!(grh_version(&g4), Some(4));
        let mut g6 = [0u8; 40];
        g6[0] = 0x60;
        g6[6] = 17;
        assert_eq!(grh_version(&g6), Some(6));
        // Version 6 in the first nibble and a plausible IPv4 header with a bad checksum
        // at offset 20: IPv6 (verbs.c believes IPv4 only when the checksum holds).
        let mut both = ipv4_grh([192, 0, 2, 1], [192, 0, 2, 2], 64, 0);
        both[0] = 0x60;
        assert_eq!(grh_version(&both), Some(4));
        both[30] ^= 1;
        assert_eq!(grh_version(&both), Some(6));
        assert_eq!(grh_version(&[0u8; 40]), None);
    }

    #[test]
    fn mapped_is_the_ipv4_mapped_gid() {
        assert_eq!(
            mapped(&[192, 0, 2, 7]),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7]
        );
    }
}

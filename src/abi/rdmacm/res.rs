//! This process's cm_ids for `xrnic res cm_id` (`xrnic::cm::res`): the CM port's thread
//! calls [`publish`] on each turn of its loop (at least every 100 ms); the file is
//! rewritten only when the listing changed, and removed when no id is left.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use xrnic::cm::res::{CmFile, CmIdRecord, cm_file, start_time, write};
use xrnic::cm::{CmId, State};
use xrnic::wire::mad::{RDMA_PS_IPOIB, RDMA_PS_TCP, RDMA_PS_UDP};

use super::{XId, reg, sockaddr};
use crate::rdmacm_port::Port;

/// What was last written (`None`: no file), and whether a write failure was said.
static LAST: Mutex<(Option<Vec<CmIdRecord>>, bool)> = Mutex::new((None, false));

/// rdma_cm's state of an id the CM has no connection for (kernel cma.c `enum
/// rdma_cm_state`, the names `rdma resource show cm_id` prints), from its addresses.
fn idle_state(x: &XId) -> &'static str {
    let c = x.c();
    let has = |sa: &libc::sockaddr_storage| sa.ss_family != 0;
    if c.route.num_paths > 0 {
        "ROUTE_RESOLVED"
    } else if has(&c.route.addr.dst) {
        "ADDR_RESOLVED"
    } else if has(&c.route.addr.src) {
        "ADDR_BOUND"
    } else {
        "IDLE"
    }
}

fn addr(sa: &libc::sockaddr_storage) -> String {
    sockaddr(sa as *const _ as *const libc::sockaddr)
        .map_or_else(|| "0.0.0.0:0".to_string(), |a: SocketAddr| a.to_string())
}

fn ps_name(ps: libc::c_int) -> String {
    match ps {
        p if p == libc::c_int::from(RDMA_PS_TCP) => "TCP".into(),
        p if p == libc::c_int::from(RDMA_PS_UDP) => "UDP".into(),
        p if p == libc::c_int::from(RDMA_PS_IPOIB) => "IPOIB".into(),
        0x013f => "IB".into(),
        p => format!("{p:#x}"),
    }
}

/// An id's record and, when it has a connection, where the CM keeps it.
type Row = (CmIdRecord, Option<(Arc<Port>, CmId)>);

/// The ids now, sorted (a stable listing: rewritten only on a change).
fn records() -> Vec<CmIdRecord> {
    // Under the registry's lock no id is freed (rdma_destroy_id unregisters it first);
    // an id whose state another thread holds right now is left out of this turn.
    let rows: Vec<Row> = reg(|r| {
        r.ids
            .iter()
            .filter_map(|&a| {
                // SAFETY: a registered id is a live, leaked Box<XId> (see `xid`).
                let x = unsafe { &*(a as *const XId) };
                let st = x.st.try_lock().ok()?;
                let c = x.c();
                let port = st.port.clone().or_else(|| st.listen_ports.first().cloned());
                let rec = CmIdRecord {
                    ifname: port.as_ref().map_or_else(String::new, |p| p.ifname.clone()),
                    port: 1,
                    state: String::new(),
                    cm_state: None,
                    ps: ps_name(c.ps),
                    qp_type: if c.qp_type == super::ud::QPT_UD {
                        "UD".into()
                    } else {
                        "RC".into()
                    },
                    lqpn: None,
                    src_addr: addr(&c.route.addr.src),
                    dst_addr: addr(&c.route.addr.dst),
                };
                let conn = st.port.clone().zip(st.cm);
                let listening = st.listen.is_some();
                drop(st);
                let mut rec = rec;
                rec.state = if listening { "LISTEN" } else { idle_state(x) }.into();
                Some((rec, conn))
            })
            .collect()
    });
    let mut out: Vec<CmIdRecord> = rows
        .into_iter()
        .map(|(mut rec, conn)| {
            if let Some((p, id)) = conn {
                let cm = p.cm.lock().unwrap_or_else(|e| e.into_inner());
                let s = cm.state(id);
                rec.cm_state = s.map(|s| s.name().to_string());
                rec.lqpn = cm.local_qpn(id).filter(|q| *q != 0);
                rec.state = match s {
                    Some(State::DreqSent | State::DreqRcvd | State::Timewait) => "DISCONNECT",
                    Some(_) => "CONNECT",
                    // The CM is done with it (SIDR answered, timewait over).
                    None => "ROUTE_RESOLVED",
                }
                .into();
            }
            rec
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.ifname, &a.src_addr, &a.dst_addr, &a.state).cmp(&(
            &b.ifname,
            &b.src_addr,
            &b.dst_addr,
            &b.state,
        ))
    });
    out
}

/// Write this process's listing when it changed (see the module comment). A failure to
/// write is said once on stderr; the CM carries on.
pub(crate) fn publish() {
    let ids = records();
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let empty = ids.is_empty();
    if last.0.as_ref() == Some(&ids) || (empty && last.0.is_none()) {
        return;
    }
    let pid = std::process::id();
    let r = cm_file(std::path::Path::new(xrnic::verbs::STAT_DIR), pid).and_then(|path| {
        if empty {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            let comm = std::fs::read_to_string("/proc/self/comm")
                .map(|s| s.trim_end().to_string())
                .unwrap_or_default();
            write(
                &path,
                &CmFile {
                    pid,
                    comm,
                    start_time: start_time(pid).unwrap_or(0),
                    ids: ids.clone(),
                },
            )
        }
    });
    match r {
        Ok(()) => last.0 = (!empty).then_some(ids),
        // An unprivileged client of the device service may not write there (the
        // directory is root's): its ids are not listed, said in docs/rnic.md "Limits",
        // not on every stock tool's stderr.
        Err(e)
            if e.kind() == std::io::ErrorKind::PermissionDenied
                && crate::rdmacm_port::ports()
                    .iter()
                    .all(|p| p.dev.service_pid().is_some()) =>
        {
            last.1 = true;
        }
        Err(e) if !last.1 => {
            last.1 = true;
            eprintln!(
                "xrnic: cannot publish the cm_ids for `xrnic res cm_id` in {}/cm: {e}",
                xrnic::verbs::STAT_DIR
            );
        }
        Err(_) => {}
    }
}

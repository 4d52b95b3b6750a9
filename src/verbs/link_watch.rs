//! The port follows its interface's link: a thread per in-process device waits for the
//! kernel's link notifications ([`LinkWatch`], rtnetlink `RTNLGRP_LINK`); a link going
//! down makes the port DOWN ([`super::Device::query_port`]) and raises
//! IBV_EVENT_PORT_ERR, its return makes it ACTIVE and raises IBV_EVENT_PORT_ACTIVE
//! (IBTA vol. 1 §11.6.3.2, unaffiliated events; the kernel's rxe does the same from
//! netdev notifications: rxe_net.c `rxe_port_up` / `rxe_port_down`).
//!
//! The interface's deletion (`RTM_DELLINK`) makes the device fatal, as the kernel
//! unregisters an RNIC whose netdev goes (rxe_net.c `NETDEV_UNREGISTER`) and uverbs then
//! disassociates its programs (uverbs_main.c `ib_uverbs_free_hw_resources`): the port
//! DOWN, every QP to ERR with its work requests flushed, IBV_EVENT_DEVICE_FATAL raised
//! (src/proto/fatal.rs), the driver thread stopped and the AF_XDP socket closed
//! ([`Shared::release_port`]); the watcher ends.
//!
//! The thread is started while the device is opened (so it inherits the opener's blocked
//! signals, src/abi/device.rs) and ends within [`TICK`] of the device's engine going.
//! Without a watcher (the subscription failed: logged) the port keeps the state read at
//! open, as before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::driver::Shared;
use crate::io::link::{LinkNews, LinkWatch};

/// How often the thread looks whether its device is still there.
const TICK: Duration = Duration::from_millis(200);

/// Watch interface `ifindex` (`ifname`, in the calling thread's network namespace):
/// the port's link state, shared with the watcher, or `None` without a watcher.
pub(super) fn start(
    ifname: &str,
    ifindex: u32,
    up: bool,
    shared: Weak<Shared>,
) -> Option<Arc<AtomicBool>> {
    let watch = match LinkWatch::new(ifindex) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                "xrnic_{ifname}: no link watcher ({e}): the port keeps the state it had at \
                 open and raises no PORT_ACTIVE / PORT_ERR"
            );
            return None;
        }
    };
    let state = Arc::new(AtomicBool::new(up));
    let s = state.clone();
    let name = ifname.to_string();
    let spawned = std::thread::Builder::new()
        .name(format!("xrnic-link-{ifname}"))
        .spawn(move || run(&watch, &name, &s, &shared));
    match spawned {
        Ok(_) => Some(state),
        Err(e) => {
            tracing::warn!("xrnic_{ifname}: no link watcher thread ({e})");
            None
        }
    }
}

fn run(watch: &LinkWatch, ifname: &str, state: &AtomicBool, shared: &Weak<Shared>) {
    loop {
        let news = watch.wait(TICK);
        let Some(s) = shared.upgrade() else {
            return;
        };
        // The port was released (the program closed the device with objects left, see
        // `Device::close_leaving_objects`): nothing to watch for any more.
        if s.stopped() {
            return;
        }
        let up = match news {
            Ok(LinkNews::Quiet) => continue,
            Ok(LinkNews::Up(u)) => u,
            Ok(LinkNews::Gone) => {
                gone(ifname, state, &s);
                return;
            }
            Ok(LinkNews::Lost) => {
                tracing::warn!("xrnic_{ifname}: link notifications lost; waiting for the next");
                continue;
            }
            Err(e) => {
                tracing::warn!("xrnic_{ifname}: the link watcher stops: {e}");
                return;
            }
        };
        if state.swap(up, Ordering::SeqCst) != up {
            tracing::info!(
                "xrnic_{ifname}: link {}: port {}",
                if up { "up" } else { "down" },
                if up { "ACTIVE" } else { "DOWN" }
            );
            s.lock().rnic.raise_port_event(up);
        }
    }
}

/// The interface was deleted: the device is fatal (see the module comment).
fn gone(ifname: &str, state: &AtomicBool, s: &Shared) {
    tracing::warn!(
        "xrnic_{ifname}: the interface was deleted: IBV_EVENT_DEVICE_FATAL, every QP to \
         ERR, the port closed"
    );
    state.store(false, Ordering::SeqCst);
    // Released before the port: the guard runs the completion hook (the flushes and the
    // event reach the program's CQs, channels and async fd).
    s.lock().rnic.device_fatal();
    s.release_port();
    // Once more, in case the guard saw no change to report (the event queue was full).
    s.run_completion_hook();
}

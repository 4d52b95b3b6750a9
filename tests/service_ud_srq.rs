//! UD, address handles, UC and SRQs through the device service (`xrnic up IF`): stock
//! ibverbs-utils and perftest tools as nobody through `xrnic exec`, server and client on
//! one device; the Rust API for the UD completion fields, the isolation of two clients'
//! AHs and SRQs, and a dead client's AHs and SRQs freed (docs/rnic.md "One device, many
//! processes"). Root tests (`#[ignore = "needs root"]`, docs/testing.md); the library
//! must be built (`cargo build --workspace`).

mod common;
mod service_support;

use std::time::Duration;

use common::text;
use service_support::{Svc, out};

#[test]
#[ignore = "needs root"]
fn stock_ud_uc_and_srq_pingpongs_as_nobody_through_the_service() {
    let Some(s) = Svc::start() else { return };
    let (_, c) = s.pair_run(
        "ibv_ud_pingpong",
        &["-g", "1", "-n", "200", "-s", "1024"],
        18560,
    );
    assert!(out(&c).contains("200 iters in"), "{}", text(&c));
    let (_, c) = s.pair_run(
        "ibv_uc_pingpong",
        &["-g", "1", "-n", "200", "-s", "4096"],
        18561,
    );
    assert!(out(&c).contains("200 iters in"), "{}", text(&c));
    let (sv, c) = s.pair_run(
        "ibv_srq_pingpong",
        &["-g", "1", "-n", "200", "-q", "4"],
        18562,
    );
    assert!(out(&c).contains("200 iters in"), "{}", text(&c));
    assert!(out(&sv).contains("200 iters in"), "{}", text(&sv));
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
#[ignore = "needs root"]
fn stock_send_bw_over_ud_as_nobody_through_the_service() {
    let Some(s) = Svc::start() else { return };
    let (_, c) = s.pair_run(
        "ib_send_bw",
        &["-c", "UD", "-x", "1", "-n", "300", "-s", "1024"],
        18565,
    );
    assert!(out(&c).contains("1024       300"), "{}", text(&c));
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

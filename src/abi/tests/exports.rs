//! The built `libibverbs.so` against the real one: the same default-version symbols at
//! the same version nodes (objdump -T; what later releases add: symbol_versions.rs), the
//! SONAME, and stock binaries that load it (Debian links them with BIND_NOW: a missing
//! symbol or node kills them at start).
//!
//! Needs binutils (objdump) and rdma-core's libibverbs1 / ibverbs-utils / perftest, as
//! Debian 12 packages them; without them the checks show as ignored (src/abi/build.rs),
//! and under CI=true they run and fail.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::{all_listed_symbols, built_library, have, library_dir, require, versioned_exports};

const REAL: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

#[test]
#[cfg_attr(xrnic_no_real_libibverbs, ignore = "needs binutils and libibverbs1")]
fn exports_every_default_symbol_of_rdma_core_44_at_its_node() {
    require(have("objdump"), "objdump (binutils)");
    require(
        Path::new(REAL).exists(),
        "libibverbs1 (the real libibverbs.so.1)",
    );
    let real = versioned_exports(Path::new(REAL));
    // The same library also carries librdmacm's RDMACM_* symbols (rdmacm_exports.rs).
    let ours: BTreeSet<_> = versioned_exports(&built_library())
        .into_iter()
        .filter(|(_, v)| !v.starts_with("RDMACM_"))
        .collect();
    assert!(
        real.len() > 140,
        "the real library exports {} symbols",
        real.len()
    );
    let missing: Vec<_> = real.difference(&ours).collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    // Beyond rdma-core 44: only what a later listed release exports (symbol_versions.rs).
    let later = all_listed_symbols();
    let extra: Vec<_> = ours
        .difference(&real)
        .filter(|s| !later.contains(s))
        .collect();
    assert!(extra.is_empty(), "in no listed rdma-core: {extra:?}");
    // The ones stock binaries need, by name (a typo in the table fails here).
    for (n, v) in [
        ("ibv_get_device_list", "IBVERBS_1.1"),
        ("ibv_read_sysfs_file", "IBVERBS_1.0"),
        ("verbs_register_driver_34", "IBVERBS_PRIVATE_34"),
        ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
        ("_ibv_query_gid_ex", "IBVERBS_1.11"),
    ] {
        assert!(ours.contains(&(n.to_string(), v.to_string())), "{n}@@{v}");
    }
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(built_library())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&dynamic.stdout).contains("Library soname: [libibverbs.so.1]"),
        "SONAME libibverbs.so.1"
    );
}

#[test]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs ibverbs-utils")]
fn stock_ibv_devices_lists_the_xrnic_devices_of_xrnic_netdev() {
    require(have("ibv_devices"), "ibv_devices (ibverbs-utils)");
    require(have("ibv_devinfo"), "ibv_devinfo (ibverbs-utils)");
    let dir = library_dir("devices");
    let out = Command::new("ibv_devices")
        .env("LD_LIBRARY_PATH", &dir)
        .env("XRNIC_NETDEV", "xrtest0, xrtest1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ibv_devices: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<&str> = text
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["xrnic_xrtest0", "xrnic_xrtest1"], "{text}");

    // ibv_devinfo -l lists without opening.
    let out = Command::new("ibv_devinfo")
        .arg("-l")
        .env("LD_LIBRARY_PATH", &dir)
        .env("XRNIC_NETDEV", "xrtest0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 HCA found"), "{text}");
    assert!(text.contains("xrnic_xrtest0"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// perftest links libmlx5 and libefa: their constructors call verbs_register_driver_34
/// and they import private symbols; all must resolve against this library.
#[test]
#[cfg_attr(xrnic_no_perftest, ignore = "needs perftest")]
fn perftest_and_its_providers_load_against_it() {
    require(have("ib_write_bw"), "ib_write_bw (perftest)");
    let dir = library_dir("perftest");
    let out = Command::new("ib_write_bw")
        .arg("--help")
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!e.contains("version `"), "a symbol version is missing: {e}");
    assert!(!e.contains("symbol lookup error"), "{e}");
    assert!(o.contains("Usage:"), "ib_write_bw --help printed: {o}{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

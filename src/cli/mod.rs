//! The `xrnic` subcommands as library code, so that tests, fuzz targets and the binary
//! share one implementation. The binary (src/cli/main.rs, crate `xrnic-cli`) only parses the command line
//! with clap and calls in here.
//!
//! Contract: nothing here panics on bad input (a capture is untrusted data); every failure
//! is a value the binary turns into a clear message on stderr and a non-zero exit code.

pub mod cc;
pub mod cclog;
pub mod decode;
pub mod demo;
pub mod devinfo;
pub mod devview;
pub mod exec;
pub mod exec_service;
pub mod explain;
pub mod explain_svg;
pub mod perf;
pub mod perftest_buf;
pub mod pingpong;
pub mod plot;
pub mod plot_sweep;
pub mod res;
pub mod service;
pub mod sim;
pub mod stat;
pub mod summary;

/// The source GID a traffic tool uses: the requested index, or by default the first
/// IPv4-mapped GID (what `-g 1` means to an rxe user on an IPv4 network). `flag` names the
/// tool's option in the error message (`-g` for rc-pingpong, `-x` for perf).
pub(crate) fn pick_gid(
    dev: &crate::verbs::Device,
    ifname: &str,
    requested: Option<u8>,
    flag: &str,
) -> Result<(u8, crate::verbs::Gid), String> {
    let gidx = match requested {
        Some(g) => g,
        // RoCE v2 only: an RDMA device may list each address twice (v1 and v2).
        None => dev
            .gid_table()
            .iter()
            .enumerate()
            .position(|(i, g)| {
                crate::proto::gid_is_ipv4(g)
                    && dev.gid_type(i) == Some(crate::verbs::GidType::RoceV2)
            })
            .ok_or_else(|| format!("{ifname} has no IPv4 address: choose a GID with {flag}"))?
            as u8,
    };
    let gid = dev.query_gid(gidx.into()).ok_or_else(|| {
        format!(
            "can't read sgid of index {gidx} ({ifname} has {} GIDs)",
            dev.gid_table().len()
        )
    })?;
    Ok((gidx, gid))
}

/// For a command that opens a device (`rc-pingpong`, `perf`): on SIGINT/SIGTERM/SIGHUP,
/// flush every live capture tap (`--pcap`, [`crate::driver::tap::flush_all`]) and remove the
/// stat snapshots of the devices still open ([`crate::driver::remove_live_snapshots`]),
/// then exit with status 130: the capture holds every frame up to the signal, and
/// `xrnic stat` does not show a device that is gone. Does nothing when the process already
/// has a handler (the `ctrlc` crate allows one), e.g. inside `xrnic demo`, whose handler
/// does the same.
pub(crate) fn close_on_signal(prog: &'static str) {
    let _ = ctrlc::set_handler(move || {
        let taps = crate::driver::tap::flush_all(std::time::Duration::from_secs(5));
        crate::driver::remove_live_snapshots();
        let flushed = if taps > 0 {
            "; the capture is flushed"
        } else {
            ""
        };
        eprintln!("xrnic {prog}: interrupted{flushed}");
        std::process::exit(130);
    });
}

/// Open the device a traffic tool names (`--netdev IF`, `--device NAME`): the backend
/// choice is the library's ([`crate::verbs::Device::open_named`]). Returns the device and
/// how messages name it.
pub(crate) fn open_device(
    netdev: Option<&str>,
    device: Option<&str>,
    opts: &crate::verbs::DeviceOptions,
) -> Result<(crate::verbs::Device, String), String> {
    crate::verbs::Device::open_named(netdev, device, opts).map_err(|e| e.to_string())
}

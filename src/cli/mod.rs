//! The `xrnic` subcommands as library code, so that tests, fuzz targets and the binary
//! share one implementation. The binary (`src/bin/xrnic`) only parses the command line
//! with clap and calls in here.
//!
//! Contract: nothing here panics on bad input (a capture is untrusted data); every failure
//! is a value the binary turns into a clear message on stderr and a non-zero exit code.

pub mod cc;
pub mod cclog;
pub mod decode;
pub mod demo;
pub mod devinfo;
pub mod explain;
pub mod explain_svg;
pub mod perf;
pub mod pingpong;
pub mod plot;
pub mod res;
pub mod sim;
pub mod stat;

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
        None => dev
            .gid_table()
            .iter()
            .position(crate::proto::gid_is_ipv4)
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

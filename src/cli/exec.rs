//! `xrnic exec [--netdev IF]... [--lib DIR] -- PROGRAM ARGS`: run an unmodified libibverbs
//! program on xrnic. The program's dynamic loader finds xrnic's `libibverbs.so.1` (the
//! C-ABI library, src/abi, docs/verbs-abi.md) first through `LD_LIBRARY_PATH`, and the
//! library lists `xrnic_IF` for each `--netdev` (`XRNIC_NETDEV`); then this process
//! becomes the program (exec), so its exit status is the program's (or, when it started
//! device services, runs it as a child and exits with its status: below).
//!
//! Where the library is: `--lib DIR` (a directory holding `libibverbs.so.1`), else
//! `xrnic-verbs/` beside this binary, which holds a `libibverbs.so.1` link to the
//! `libibverbs.so` cargo builds there (`make verbs-lib`; created here when missing).
//! Neither found: a message naming both and exit 1.
//!
//! Before the exec it builds the device view (src/cli/devview.rs, docs/verbs-abi.md
//! "Where programs look for a device") in a private mount namespace (`--no-view`: none):
//! `/sys/class/infiniband/xrnic_IF`, `/sys/class/infiniband_verbs/uverbsN` and
//! `/dev/infiniband/uverbsN` for the interfaces the library lists. A user other than root
//! gets it in a user namespace of its own, where root's device service appears as the
//! overflow uid: the listeners of those interfaces are checked here first
//! (`xrnic::ipc::trusted`), and the pids that passed handed to the library
//! (`xrnic::ipc::VERIFIED_PIDS_ENV`). Where the kernel gives no namespace one line on
//! stderr says so and the program runs without the view.
//!
//! Several processes (src/cli/exec_service.rs): as root, before the view, a device
//! service is started for each interface named (`--netdev`, `XRNIC_NETDEV`) that has
//! none, and the program then runs as this process's child instead of replacing it, so
//! that the services stop after it (once their last client has gone); `--in-process`
//! starts none, and the program's library opens each device in its own process.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use super::{devview, exec_service};

#[derive(Clone, Debug, clap::Args)]
pub struct ExecArgs {
    /// An interface whose xrnic device the program sees (repeatable; default: every up
    /// Ethernet interface, or XRNIC_NETDEV when set).
    #[arg(long, value_name = "IF")]
    pub netdev: Vec<String>,
    /// The directory holding xrnic's libibverbs.so.1.
    #[arg(long, value_name = "DIR")]
    pub lib: Option<PathBuf>,
    /// No device view (/sys/class/infiniband, /dev/infiniband): no namespace is made.
    #[arg(long)]
    pub no_view: bool,
    /// Start no device service: the program's library opens each device in its own
    /// process (the fastest path; one process per interface). Without it, root starts a
    /// service for each interface named (--netdev, XRNIC_NETDEV) that has none, shared by
    /// every process, stopped when the program has exited and its last client gone.
    #[arg(long)]
    pub in_process: bool,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// The directory of xrnic's `libibverbs.so.1` beside `exe_dir`, made if needed.
fn default_lib_dir(exe_dir: &Path) -> Result<PathBuf, String> {
    let so = exe_dir.join("libibverbs.so");
    let dir = exe_dir.join("xrnic-verbs");
    let link = dir.join("libibverbs.so.1");
    // librdmacm.so.1 is the same library (src/abi/rdmacm.rs): the loader maps the one
    // file once under both names.
    let cm_link = dir.join("librdmacm.so.1");
    if link.exists() && cm_link.exists() {
        return Ok(dir);
    }
    if !so.exists() {
        return Err(format!(
            "xrnic's libibverbs is not built: neither {} nor {} exists (run `make \
             verbs-lib`, or give --lib DIR)",
            link.display(),
            so.display()
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // A link made by a concurrent `xrnic exec` is as good as ours.
    for l in [&link, &cm_link] {
        if let Err(e) = std::os::unix::fs::symlink("../libibverbs.so", l) {
            if !l.exists() {
                return Err(format!("{}: {e}", l.display()));
            }
        }
    }
    Ok(dir)
}

/// The environment change: `LD_LIBRARY_PATH` with `dir` first, and `XRNIC_NETDEV`
/// from `netdev` (unchanged when empty).
pub fn environment(dir: &Path, netdev: &[String], old_path: Option<&str>) -> Vec<(String, String)> {
    let mut path = dir.display().to_string();
    if let Some(p) = old_path.filter(|p| !p.is_empty()) {
        path.push(':');
        path.push_str(p);
    }
    let mut env = vec![("LD_LIBRARY_PATH".to_string(), path)];
    if !netdev.is_empty() {
        env.push(("XRNIC_NETDEV".to_string(), netdev.join(",")));
    }
    env
}

pub fn run(args: &ExecArgs) -> ExitCode {
    let dir = match &args.lib {
        Some(d) if d.join("libibverbs.so.1").exists() => d.clone(),
        Some(d) => {
            eprintln!("xrnic exec: {} holds no libibverbs.so.1", d.display());
            return ExitCode::from(1);
        }
        None => {
            let exe = std::env::current_exe().ok();
            match exe.as_deref().and_then(Path::parent).map(default_lib_dir) {
                Some(Ok(d)) => d,
                Some(Err(e)) => {
                    eprintln!("xrnic exec: {e}");
                    return ExitCode::from(1);
                }
                None => {
                    eprintln!("xrnic exec: cannot find this binary's directory: give --lib DIR");
                    return ExitCode::from(1);
                }
            }
        }
    };
    let (prog, rest) = args.command.split_first().expect("clap requires a command");
    let netdevs = listed(&args.netdev);
    // Services only for interfaces named (--netdev, XRNIC_NETDEV): the default list is
    // every up Ethernet interface, and a service on each would put xrnic's XDP program on
    // interfaces the program may never open. Before the view: the service sees the
    // system's mounts, not the program's.
    let named = !args.netdev.is_empty() || std::env::var_os("XRNIC_NETDEV").is_some();
    let started = if args.in_process || !named {
        None
    } else {
        exec_service::start(&netdevs)
    };
    let old = std::env::var("LD_LIBRARY_PATH").ok();
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .envs(environment(&dir, &args.netdev, old.as_deref()));
    if !args.no_view {
        match view(&netdevs) {
            Ok(env) => {
                cmd.envs(env);
            }
            Err(code) => return code,
        }
    }
    if let Some(started) = started {
        return exec_service::run(cmd, prog, started);
    }
    // exec only returns on failure.
    let e = cmd.exec();
    eprintln!("xrnic exec: cannot run {prog}: {e}");
    ExitCode::from(127)
}

/// The interfaces the library will list: `netdev` (each may itself be a list: it becomes
/// XRNIC_NETDEV, comma-separated), else [`xrnic::verbs::netdev::listed_netdevs`].
fn listed(netdev: &[String]) -> Vec<String> {
    if netdev.is_empty() {
        xrnic::verbs::netdev::listed_netdevs()
    } else {
        netdev
            .iter()
            .flat_map(|n| n.split(','))
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect()
    }
}

/// Build the device view for `netdevs` (the interfaces the library lists); the
/// environment the library needs in it. A failure after the namespace was entered is the
/// exit code.
fn view(netdevs: &[String]) -> Result<Vec<(String, String)>, ExitCode> {
    let mut env = Vec::new();
    let me = rustix::process::geteuid().as_raw();
    if me != 0 {
        let pids = verified_services(netdevs, me);
        if !pids.is_empty() {
            env.push((xrnic::ipc::VERIFIED_PIDS_ENV.to_string(), pids));
        }
    }
    match devview::enter(&devview::shown(netdevs)) {
        Ok(()) => Ok(env),
        Err(devview::Failure::NoNamespace(e)) => {
            eprintln!(
                "xrnic exec: no device view (/sys/class/infiniband, /dev/infiniband): the \
                 kernel gives this user no namespace to build it in ({e}); running without it"
            );
            // Still needed when a user namespace was entered but mounts were refused.
            Ok(env)
        }
        Err(devview::Failure::Build(e)) => {
            eprintln!("xrnic exec: building the device view failed: {e}");
            Err(ExitCode::from(1))
        }
    }
}

/// The pids (comma-separated) of the device services of `netdevs` this user trusts
/// ([`xrnic::ipc::trusted`]), seen from outside any user namespace.
fn verified_services(netdevs: &[String], me: u32) -> String {
    netdevs
        .iter()
        .filter_map(|n| xrnic::ipc::connect_any(n).ok().flatten())
        .filter(|(_, who)| xrnic::ipc::trusted(who.uid, me))
        .map(|(_, who)| who.pid.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_path_first_and_netdevs_joined() {
        let env = environment(
            Path::new("/x/lib"),
            &["veth0".into(), "eth1".into()],
            Some("/a"),
        );
        assert_eq!(
            env,
            [
                ("LD_LIBRARY_PATH".to_string(), "/x/lib:/a".to_string()),
                ("XRNIC_NETDEV".to_string(), "veth0,eth1".to_string())
            ]
        );
        let env = environment(Path::new("/x/lib"), &[], None);
        assert_eq!(env, [("LD_LIBRARY_PATH".to_string(), "/x/lib".to_string())]);
    }

    #[test]
    fn a_missing_library_is_an_error_naming_make_verbs_lib() {
        let dir = std::env::temp_dir().join(format!("xrnic-exec-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = default_lib_dir(&dir).unwrap_err();
        assert!(e.contains("make verbs-lib"), "{e}");
        std::fs::write(dir.join("libibverbs.so"), b"").unwrap();
        let d = default_lib_dir(&dir).unwrap();
        assert!(d.join("libibverbs.so.1").symlink_metadata().is_ok());
        assert!(d.join("librdmacm.so.1").symlink_metadata().is_ok());
        assert_eq!(default_lib_dir(&dir).unwrap(), d, "the link is reused");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

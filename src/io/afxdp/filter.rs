//! The XDP program `bpf/xrnic.bpf.c`, loaded with libbpf-rs: RoCE v2 (UDP 4791 over IPv4
//! or IPv6, optionally 802.1Q-tagged) goes to the AF_XDP socket registered for the receive
//! queue; everything else goes to the kernel stack.
//!
//! The object file is compiled by `build.rs` (libbpf-cargo) into `OUT_DIR` and embedded
//! here. Each [`RoceFilter`] is its own copy of the program and its maps; the attachment
//! is a bpf_link, so the program leaves the interface when the filter is dropped (or the
//! process dies). XDP links need Linux 5.9 ([`XDP_LINK_SINCE`]); when an attach fails, a
//! probe on a private namespace's loopback tells a kernel without them (the error then
//! names the feature and the version) from an interface that refuses.
//!
//! Attach mode ([`XdpMode`]): native (in the driver) by default; when the driver refuses
//! native XDP (virtio_net on Linux 6.1 at MTU 9000, drivers without XDP) the program is
//! attached in generic (skb) mode instead, with one log line, and the AF_XDP socket must
//! bind in copy mode. `XRNIC_XDP_MODE=native|skb|auto` ([`XDP_MODE_ENV`]) forces one.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder, ProgramInput};

use super::Error;

static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xrnic.bpf.o"));

const PROG: &str = "xrnic_filter";
const XSKS: &str = "xsks";
const STATS: &str = "stats";
/// `max_entries` of the XSKMAP: the highest receive queue index plus one.
pub const MAX_QUEUES: u32 = 64;

/// The program's verdict on a frame, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAction {
    Aborted,
    Drop,
    Pass,
    Tx,
    Redirect,
    Other(u32),
}

impl From<u32> for XdpAction {
    fn from(v: u32) -> Self {
        match v {
            0 => XdpAction::Aborted,
            1 => XdpAction::Drop,
            2 => XdpAction::Pass,
            3 => XdpAction::Tx,
            4 => XdpAction::Redirect,
            o => XdpAction::Other(o),
        }
    }
}

/// The program's per-CPU counters, summed over CPUs (indices as in `bpf/xrnic.bpf.c`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// RoCE v2 frames handed to an AF_XDP socket.
    pub redirected: u64,
    /// RoCE v2 frames that found no socket on their queue, passed to the kernel.
    pub no_socket: u64,
    /// Other traffic, passed to the kernel.
    pub not_roce: u64,
    /// Frames shorter than their headers, or IPv4 fragments, passed to the kernel.
    pub malformed: u64,
}

/// How the program runs on the interface (the kernel's XDP attach modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`), before any skb exists.
    Native,
    /// Generic XDP (`XDP_FLAGS_SKB_MODE`), after the kernel built an skb: any driver, any
    /// MTU, slower; AF_XDP sockets bind in copy mode (`XDP_COPY`).
    Skb,
}

impl XdpMode {
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Skb => "skb",
        }
    }
}

/// The attach mode asked for ([`XDP_MODE_ENV`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdpModeChoice {
    /// Native, or generic when the driver refuses native XDP (logged).
    #[default]
    Auto,
    /// Native or fail.
    Native,
    /// Generic (skb) mode always.
    Skb,
}

/// The environment variable that loads the XDP program without frags (`0`), as on a
/// kernel before 5.18: the port binds single-buffer and caps its MTU.
pub const XDP_FRAGS_ENV: &str = "XRNIC_XDP_FRAGS";

/// The environment variable that forces an attach mode: `native`, `skb` or `auto`.
pub const XDP_MODE_ENV: &str = "XRNIC_XDP_MODE";

impl XdpModeChoice {
    /// From [`XDP_MODE_ENV`] (unset: auto); any other value is an error naming it.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var(XDP_MODE_ENV) {
            Err(_) => Ok(XdpModeChoice::Auto),
            Ok(v) => match v.as_str() {
                "" | "auto" => Ok(XdpModeChoice::Auto),
                "native" => Ok(XdpModeChoice::Native),
                "skb" => Ok(XdpModeChoice::Skb),
                other => Err(Error::Config(format!(
                    "{XDP_MODE_ENV}={other:?}: expected native, skb or auto"
                ))),
            },
        }
    }
}

/// One loaded copy of the XDP filter, optionally attached to one interface.
pub struct RoceFilter {
    // Field order is drop order: detach (close the bpf_link) before the object goes.
    link: Option<OwnedFd>,
    mode: Option<XdpMode>,
    frags: bool,
    obj: Object,
}

impl std::fmt::Debug for RoceFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceFilter")
            .field("attached", &self.mode)
            .finish()
    }
}

fn libc_ebusy() -> i32 {
    rustix::io::Errno::BUSY.raw_os_error()
}

/// Whether a libbpf message goes to stderr. libbpf prints one line per refused attach,
/// and [`RoceFilter::attach`] retries EBUSY for up to a second (a queue still being
/// released): those lines would bury the one error we report at the end, so they go to
/// `tracing` at debug level. Every other message is printed as libbpf would.
fn libbpf_shows(msg: &str) -> bool {
    !(msg.contains("failed to attach") && msg.contains("Device or resource busy"))
}

fn libbpf_print(_level: libbpf_rs::PrintLevel, msg: String) {
    if libbpf_shows(&msg) {
        eprint!("{msg}");
    } else {
        tracing::debug!(target: "libbpf", "{}", msg.trim_end());
    }
}

/// The first kernel that loads frags-aware XDP programs (`SEC("xdp.frags")`,
/// `BPF_F_XDP_HAS_FRAGS`), as xrnic's is.
pub const XDP_FRAGS_SINCE: (u32, u32) = (5, 18);

/// Why a load may have failed on an older kernel, or nothing.
fn frags_hint() -> String {
    let release = super::features::kernel_release();
    match super::features::parse_release(&release) {
        Some(v) if v < XDP_FRAGS_SINCE => format!(
            " (xrnic's XDP program is frags-aware, BPF_F_XDP_HAS_FRAGS, which needs Linux \
             {}.{}+; this kernel is {release})",
            XDP_FRAGS_SINCE.0, XDP_FRAGS_SINCE.1
        ),
        _ => String::new(),
    }
}

impl RoceFilter {
    /// Load the program and its maps into the kernel (not attached anywhere yet). The
    /// program is frags-aware (`BPF_F_XDP_HAS_FRAGS`, Linux 5.18+); when the kernel refuses
    /// it that way, or [`XDP_FRAGS_ENV`]`=0` asks, the same program is loaded without the
    /// flag ([`RoceFilter::frags`] false: the port then binds single-buffer), with one
    /// warning naming the feature.
    pub fn load() -> Result<Self, Error> {
        super::sys::require_root("loading the XDP program")?;
        // libbpf's own default level: warnings and information, not debug.
        static PRINT: std::sync::Once = std::sync::Once::new();
        PRINT.call_once(|| {
            libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Info, libbpf_print)));
        });
        if std::env::var(XDP_FRAGS_ENV).is_ok_and(|v| v == "0") {
            let f = Self::load_with(false)?;
            tracing::warn!(
                "xrnic's XDP program loaded without frags ({XDP_FRAGS_ENV}=0): AF_XDP \
                 single-buffer, the port's MTU is capped to fit"
            );
            return Ok(f);
        }
        match Self::load_with(true) {
            Ok(f) => Ok(f),
            Err(e) => match Self::load_with(false) {
                Ok(f) => {
                    let (maj, min) = XDP_FRAGS_SINCE;
                    tracing::warn!(
                        kernel = %super::features::kernel_release(),
                        "xrnic's XDP program did not load frags-aware (BPF_F_XDP_HAS_FRAGS, \
                         Linux {maj}.{min}+: {e}); loaded without it: AF_XDP single-buffer, \
                         the port's MTU is capped to fit"
                    );
                    Ok(f)
                }
                Err(_) => Err(e),
            },
        }
    }

    fn load_with(frags: bool) -> Result<Self, Error> {
        let mut open = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| Error::LoadProgram(format!("{e:#}")))?;
        if !frags {
            for mut p in open.progs_mut() {
                // SAFETY: the pointer is the open object's live program, only read here.
                let flags = unsafe {
                    libbpf_sys::bpf_program__flags(
                        libbpf_rs::AsRawLibbpf::as_libbpf_object(&*p).as_ptr(),
                    )
                };
                p.set_flags(flags & !libbpf_sys::BPF_F_XDP_HAS_FRAGS);
            }
        }
        let obj = open
            .load()
            .map_err(|e| Error::LoadProgram(format!("{e:#}{}", frags_hint())))?;
        let f = RoceFilter {
            link: None,
            mode: None,
            frags,
            obj,
        };
        // Fail now, not at first use, if the object lacks what we expect.
        f.find_prog()?;
        f.find_map(XSKS)?;
        f.find_map(STATS)?;
        Ok(f)
    }

    /// Loaded frags-aware (multi-buffer frames reach the program whole)?
    pub fn frags(&self) -> bool {
        self.frags
    }

    fn find_prog(&self) -> Result<libbpf_rs::ProgramMut<'_>, Error> {
        self.obj
            .progs_mut()
            .find(|p| p.name() == PROG)
            .ok_or_else(|| Error::LoadProgram(format!("program {PROG} missing from the object")))
    }

    fn find_map(&self, name: &str) -> Result<libbpf_rs::Map<'_>, Error> {
        self.obj
            .maps()
            .find(|m| m.name() == name)
            .ok_or_else(|| Error::LoadProgram(format!("map {name} missing from the object")))
    }

    /// Attach to the interface `ifindex` in the mode [`XDP_MODE_ENV`] asks for (native
    /// by default, generic when the driver refuses native XDP: one warning says so).
    /// Replaces an earlier attachment of this filter. Returns the mode attached in.
    pub fn attach(&mut self, ifindex: u32, ifname: &str) -> Result<XdpMode, Error> {
        self.link = None;
        self.mode = None;
        let choice = XdpModeChoice::from_env()?;
        let idx = i32::try_from(ifindex).map_err(|_| Error::AttachRefused {
            ifname: ifname.to_string(),
            reason: format!("interface index {ifindex} out of range"),
        })?;
        let prog_fd = self.find_prog()?.as_fd().as_raw_fd();
        let refused = |mode: XdpMode, e: std::io::Error| Error::AttachRefused {
            ifname: ifname.to_string(),
            // A kernel without XDP links refuses every attach: say that, not "this
            // interface" (EBUSY is an attached program, never the kernel).
            reason: match (e.raw_os_error() != Some(libc_ebusy()))
                .then(|| link_refusal(prog_fd))
                .flatten()
            {
                Some(why) => format!("{} XDP: {e}; {why}", mode.as_str()),
                None => format!(
                    "{} XDP: {e} (another XDP program attached? an MTU too large for the \
                     driver's native XDP? {XDP_MODE_ENV}=skb attaches in generic mode)",
                    mode.as_str()
                ),
            },
        };
        let first = match choice {
            XdpModeChoice::Skb => XdpMode::Skb,
            _ => XdpMode::Native,
        };
        let (fd, mode) = match link_create(prog_fd, idx, first) {
            Ok(fd) => (fd, first),
            Err(e) if choice == XdpModeChoice::Auto && e.raw_os_error() != Some(libc_ebusy()) => {
                let fd = link_create(prog_fd, idx, XdpMode::Skb)
                    .map_err(|e2| refused(XdpMode::Skb, e2))?;
                tracing::warn!(
                    ifname,
                    "native XDP refused ({e}): xrnic's XDP program runs in generic (skb) \
                     mode, the AF_XDP socket binds in copy mode (slower; \
                     {XDP_MODE_ENV}=native makes this an error)"
                );
                (fd, XdpMode::Skb)
            }
            Err(e) => return Err(refused(first, e)),
        };
        self.link = Some(fd);
        self.mode = Some(mode);
        Ok(mode)
    }

    /// The mode the program is attached in, if attached.
    pub fn mode(&self) -> Option<XdpMode> {
        self.mode
    }

    /// Whether this kernel attaches XDP programs through a BPF link: `None` when it does
    /// (the probe attached the program to a private namespace's loopback), or the
    /// sentence naming the missing feature (`link_refusal`).
    pub fn xdp_link_refusal(&self) -> Result<Option<String>, Error> {
        Ok(link_refusal(self.find_prog()?.as_fd().as_raw_fd()))
    }

    /// Is the program attached to an interface?
    pub fn is_attached(&self) -> bool {
        self.link.is_some()
    }

    /// Send RoCE frames arriving on receive queue `queue` to the AF_XDP socket `fd`.
    pub fn register_socket(&self, queue: u32, fd: RawFd) -> Result<(), Error> {
        let err = |reason: String| Error::RegisterSocket { queue, reason };
        if queue >= MAX_QUEUES {
            return Err(err(format!(
                "queue index above the map's {MAX_QUEUES} slots"
            )));
        }
        self.find_map(XSKS)?
            .update(&queue.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| err(format!("{e:#}")))
    }

    /// Stop redirecting queue `queue`; its RoCE frames go to the kernel again.
    pub fn unregister_socket(&self, queue: u32) -> Result<(), Error> {
        match self.find_map(XSKS)?.delete(&queue.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::RegisterSocket {
                queue,
                reason: format!("{e:#}"),
            }),
        }
    }

    /// The program's counters, summed over CPUs.
    pub fn stats(&self) -> Result<FilterStats, Error> {
        let map = self.find_map(STATS)?;
        let mut sum = [0u64; 4];
        for (i, slot) in sum.iter_mut().enumerate() {
            let key = (i as u32).to_ne_bytes();
            let per_cpu = map
                .lookup_percpu(&key, MapFlags::ANY)
                .map_err(|e| Error::LoadProgram(format!("reading the stats map: {e:#}")))?
                .unwrap_or_default();
            *slot = per_cpu
                .iter()
                .filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                .map(u64::from_ne_bytes)
                .sum();
        }
        Ok(FilterStats {
            redirected: sum[0],
            no_socket: sum[1],
            not_roce: sum[2],
            malformed: sum[3],
        })
    }

    /// Run the program once on `frame` with BPF_PROG_TEST_RUN (receive queue 0) and return
    /// its verdict. Nothing is redirected for real. The kernel itself refuses frames shorter
    /// than an Ethernet header (EINVAL), which the error reports.
    pub fn test_run(&self, frame: &[u8]) -> Result<XdpAction, Error> {
        let prog = self.find_prog()?;
        let input = ProgramInput {
            data_in: Some(frame),
            ..Default::default()
        };
        let out = prog
            .test_run(input)
            .map_err(|e| Error::Io(std::io::Error::other(format!("BPF_PROG_TEST_RUN: {e:#}"))))?;
        Ok(XdpAction::from(out.return_value))
    }
}

/// bpf_link_create(BPF_XDP) of the program `prog_fd` with the mode's flag, retrying EBUSY
/// (a queue still being released); closing the returned fd detaches the program.
fn link_create(prog_fd: RawFd, ifindex: i32, mode: XdpMode) -> std::io::Result<OwnedFd> {
    let flags = match mode {
        XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
        XdpMode::Skb => libbpf_sys::XDP_FLAGS_SKB_MODE,
    };
    super::sys::retry_busy(
        || {
            // SAFETY: an all-zero bpf_link_create_opts is its documented default (libbpf
            // LIBBPF_OPTS); `sz` and `flags` are set before the call.
            let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
            opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
            opts.flags = flags;
            // SAFETY: `prog_fd` is the loaded program's fd, alive for the call; `opts`
            // lives across it. libbpf returns a new fd or a negative errno.
            let fd = unsafe {
                libbpf_sys::bpf_link_create(prog_fd, ifindex, libbpf_sys::BPF_XDP, &opts)
            };
            if fd < 0 {
                Err(std::io::Error::from_raw_os_error(-fd))
            } else {
                // SAFETY: `fd` is a new bpf_link fd that nothing else owns.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            }
        },
        |e: &std::io::Error| e.raw_os_error() == Some(libc_ebusy()),
    )
}

/// The first kernel that attaches XDP programs through a BPF link (`BPF_LINK_CREATE` with
/// `BPF_XDP`), as [`RoceFilter::attach`] does.
pub const XDP_LINK_SINCE: (u32, u32) = (5, 9);

/// Attach the program `prog_fd` in generic mode to `lo` of a private network namespace
/// (no other XDP user can be there) and detach it at once: whether the kernel has XDP
/// links at all, whatever the real interface refused. The sentence to tell the user when
/// it has not (see [`link_refusal_text`]).
fn link_refusal(prog_fd: RawFd) -> Option<String> {
    // The loopback interface is index 1 in every network namespace.
    let probe = super::sys::in_private_netns(|| link_create(prog_fd, 1, XdpMode::Skb).map(drop));
    link_refusal_text(probe, &super::features::kernel_release())
}

/// From the loopback probe's outcome: `None` when it attached (the kernel has XDP links:
/// the real interface refused for its own reasons); when the kernel refused even there,
/// or no private namespace could be made on a kernel older than [`XDP_LINK_SINCE`], the
/// sentence naming the feature and the first kernel with it.
fn link_refusal_text(
    probe: Result<std::io::Result<()>, rustix::io::Errno>,
    release: &str,
) -> Option<String> {
    let (maj, min) = XDP_LINK_SINCE;
    let needs = format!(
        "xrnic attaches its XDP program through a BPF link (BPF_LINK_CREATE with BPF_XDP), \
         which needs Linux {maj}.{min}+; this kernel is {release}"
    );
    match probe {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!(
            "the kernel refuses an XDP link even on a private loopback ({e}): {needs}"
        )),
        Err(_) => super::features::parse_release(release)
            .is_some_and(|v| v < XDP_LINK_SINCE)
            .then_some(needs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_xdp_links_is_named_with_the_first_version_that_has_them() {
        let einval = || std::io::Error::from_raw_os_error(rustix::io::Errno::INVAL.raw_os_error());
        // The probe attached: the interface refused, not the kernel.
        assert_eq!(link_refusal_text(Ok(Ok(())), "5.4.0-100-generic"), None);
        // The kernel refused a link even on the loopback: whatever its version says.
        for release in ["5.4.0-100-generic", "6.1.0-13-amd64"] {
            let t = link_refusal_text(Ok(Err(einval())), release).expect("a refusal");
            assert!(
                t.contains("BPF link") && t.contains("Linux 5.9+") && t.contains(release),
                "{t}"
            );
        }
        // No probe could run: the version decides.
        let no_ns = || Err(rustix::io::Errno::PERM);
        let t = link_refusal_text(no_ns(), "5.4.0-100-generic").expect("old kernel");
        assert!(
            t.contains("Linux 5.9+") && t.contains("5.4.0-100-generic"),
            "{t}"
        );
        assert_eq!(link_refusal_text(no_ns(), "6.1.0-13-amd64"), None);
        assert_eq!(link_refusal_text(no_ns(), "garbage"), None);
    }

    #[test]
    fn only_the_retried_busy_attach_lines_of_libbpf_are_kept_off_stderr() {
        assert!(!libbpf_shows(
            "libbpf: prog 'xrnic_filter': failed to attach to xdp: Device or resource busy\n"
        ));
        assert!(libbpf_shows(
            "libbpf: prog 'xrnic_filter': failed to attach to xdp: Invalid argument\n"
        ));
        assert!(libbpf_shows(
            "libbpf: prog 'xrnic_filter': BPF program load failed: Permission denied\n"
        ));
    }
}

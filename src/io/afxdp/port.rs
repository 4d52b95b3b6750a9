//! [`XskPort`]: one AF_XDP socket on one (interface, receive queue), with its own UMEM.
//!
//! Frame ownership. The UMEM is `frame_count` chunks of [`CHUNK_SIZE`] bytes. At any time
//! each chunk is in exactly one of three places, and the port counts them:
//! - `free`: owned by user space, ready to carry a frame to send;
//! - the kernel's receive side (fill ring, being written, rx ring): `in_fill`;
//! - the kernel's transmit side (tx ring, being sent, completion ring): `in_tx`.
//!
//! Received chunks are handed back to the fill ring as soon as the caller's closure has
//! seen them; sent chunks come back to `free` from the completion ring. So
//! `free + in_fill + in_tx == frame_count` always holds ([`XskPort::frame_counts`]).
//!
//! Frames longer than one chunk (a 4096-byte path MTU on a 9000-byte link) are sent and
//! received as several chunks chained with `XDP_PKT_CONTD` (AF_XDP multi-buffer,
//! `XDP_USE_SG`, kernel 6.6+); received chains are reassembled in a 64-byte-aligned
//! buffer. Single-chunk frames reach the closure without a copy. On a kernel without
//! multi-buffer ([`super::features`]), or when asked ([`PortOptions::single_buffer`],
//! `XRNIC_AF_XDP_SINGLE_BUFFER=1`), the socket is bound without `XDP_USE_SG` and a frame
//! is one chunk: [`XskPort::max_frame`] is [`CHUNK_DATA`] (4 KiB, the largest chunk an
//! aligned UMEM may have before 6.6), and the device above caps its MTU so that every
//! frame it sends or asks for fits ([`BufferMode`]).
//!
//! Copies into and out of the UMEM keep both sides 64-byte aligned where the port chooses
//! the address: chunk data starts 256 bytes (XDP headroom) into a 4 KiB chunk. glibc's
//! `rep movsb` path can be ~25x slower for >= 4 KiB copies between mutually misaligned
//! buffers on some AMD x86 CPUs (benches/afxdp_raw.rs and benches/transport.rs measure
//! it); callers should keep their frame buffers 64-byte aligned too, or run with
//! `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1000000`.

use std::io::Write;
use std::num::NonZeroU32;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Duration;

use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, TxQueue, Umem};

use super::filter::{FilterStats, RoceFilter};
use super::{Error, sys};

/// Bytes of one UMEM chunk: the largest the kernel takes in aligned mode (PAGE_SIZE).
pub const CHUNK_SIZE: u32 = 4096;
/// The headroom the kernel keeps in front of received data (XDP_PACKET_HEADROOM).
const XDP_HEADROOM: usize = 256;
/// Payload bytes one chunk carries.
pub const CHUNK_DATA: usize = CHUNK_SIZE as usize - XDP_HEADROOM;
/// The most chunks one frame may span: the kernel's default `net.core.max_skb_frags`
/// (17) bounds copy-mode transmit chains.
const MAX_CHAIN: usize = 17;
/// The largest frame the port accepts: a 9000-byte MTU frame with an 802.1Q tag fits.
pub const MAX_FRAME: usize = 9216;
/// `XDP_PKT_CONTD` from <linux/if_xdp.h>: more chunks of this packet follow.
const XDP_PKT_CONTD: u32 = 1;

/// The first kernel with AF_XDP zero-copy (`XDP_ZEROCOPY`, the i40e driver first; each
/// driver adds it on its own, veth never).
pub const ZERO_COPY_SINCE: (u32, u32) = (4, 20);

/// What a refused [`BindMode::ZeroCopy`] bind says after the kernel's error.
fn zero_copy_hint() -> String {
    let (maj, min) = ZERO_COPY_SINCE;
    format!(
        "no such queue? AF_XDP zero-copy (XDP_ZEROCOPY, Linux {maj}.{min}+) needs a driver \
         with zero-copy support, and veth has none; BindMode::Auto lets the kernel fall back \
         to copy mode"
    )
}

/// How the socket binds to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindMode {
    /// Zero-copy where the driver has it, copy mode otherwise (the kernel decides, and
    /// [`XskPort::zero_copy`] tells which it chose).
    #[default]
    Auto,
    /// Always copy mode (veth has no zero-copy).
    Copy,
    /// Zero-copy, or fail.
    ZeroCopy,
}

/// Options of [`XskPort::open`].
#[derive(Clone, Copy, Debug)]
pub struct PortOptions {
    /// UMEM chunks (each [`CHUNK_SIZE`] bytes). Half go to the fill ring, half carry sends.
    pub frame_count: u32,
    /// Entries of each of the four rings (power of two).
    pub ring_size: u32,
    /// Most descriptors moved per ring operation.
    pub batch_size: usize,
    /// Bind with `XDP_USE_NEED_WAKEUP`: the kernel says when it needs a kick, saving a
    /// system call per batch otherwise.
    pub need_wakeup: bool,
    pub bind_mode: BindMode,
    /// Load and attach xrnic's XDP filter and register the socket in it. Without it the
    /// socket receives nothing unless some other program redirects to it.
    pub attach_filter: bool,
    /// Bind single-buffer (no `XDP_USE_SG`) even where the kernel has multi-buffer, as
    /// on a kernel before 6.6: frames up to [`CHUNK_DATA`] bytes. The environment
    /// variable `XRNIC_AF_XDP_SINGLE_BUFFER=1` does the same for every port.
    pub single_buffer: bool,
}

/// The environment variable that forces single-buffer ports ([`PortOptions::single_buffer`]).
pub const SINGLE_BUFFER_ENV: &str = "XRNIC_AF_XDP_SINGLE_BUFFER";

/// Whether a port chains chunks into frames (multi-buffer) or carries one chunk per frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BufferMode {
    /// `XDP_USE_SG`: frames up to [`MAX_FRAME`].
    Multi,
    /// One chunk per frame: frames up to [`CHUNK_DATA`]; `why` says what decided it.
    Single { why: String },
}

impl BufferMode {
    /// The mode a port opened with `opts` uses (before the bind itself: see
    /// [`XskPort::buffer_mode`] for what it ended up with).
    pub fn for_options(opts: &PortOptions) -> BufferMode {
        let f = super::features::kernel_features();
        if opts.single_buffer {
            BufferMode::Single {
                why: "asked for (single_buffer)".into(),
            }
        } else if std::env::var(SINGLE_BUFFER_ENV).is_ok_and(|v| v == "1") {
            BufferMode::Single {
                why: format!("asked for ({SINGLE_BUFFER_ENV}=1)"),
            }
        } else if !f.multi_buffer.available() {
            let (maj, min) = super::features::MULTI_BUFFER_SINCE;
            let how = match &f.multi_buffer {
                super::Support::Guessed { why, .. } => format!(" ({why})"),
                _ => String::new(),
            };
            BufferMode::Single {
                why: format!(
                    "kernel {} has no AF_XDP multi-buffer (XDP_USE_SG, Linux {maj}.{min}+){how}",
                    f.release
                ),
            }
        } else {
            BufferMode::Multi
        }
    }

    /// The largest frame a port in this mode sends and receives.
    pub fn max_frame(&self) -> usize {
        match self {
            BufferMode::Multi => MAX_FRAME,
            BufferMode::Single { .. } => CHUNK_DATA,
        }
    }
}

impl PortOptions {
    /// Received frames of up to `frame_len` bytes the port holds without a drop when they
    /// all arrive before its driver drains one: the chunks on the fill ring
    /// (`frame_count / 2`), no more than the RX ring's descriptors (`ring_size`, one per
    /// chunk in multi-buffer mode), divided by the chunks one such frame spans.
    pub fn rx_frames(&self, frame_len: usize) -> u32 {
        let chunks = (self.frame_count / 2).min(self.ring_size);
        let per_frame = frame_len.div_ceil(CHUNK_DATA).max(1) as u32;
        chunks / per_frame
    }
}

impl Default for PortOptions {
    fn default() -> Self {
        PortOptions {
            // Measured (docs/performance.md, "Receive capacity"): a 4096-chunk fill ring
            // holds one whole 8 MiB message at path MTU 4096 (2 048 two-chunk frames), so
            // a UC message that size arrives even when the receiver drains nothing meanwhile;
            // with 2048 a burst of them lost frames on a veth pair. 32 MiB of UMEM.
            frame_count: 8192,
            ring_size: 4096,
            batch_size: 64,
            need_wakeup: true,
            bind_mode: BindMode::Auto,
            attach_filter: true,
            single_buffer: false,
        }
    }
}

/// Where the UMEM chunks are: see the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameCounts {
    pub total: u32,
    pub free: u32,
    pub in_fill: u32,
    pub in_tx: u32,
}

/// Counters kept by the port itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Sends refused for lack of a free chunk or tx ring slot (back-pressure).
    pub tx_backpressure: u64,
    /// Received chains longer than [`MAX_FRAME`], dropped.
    pub rx_oversize: u64,
    /// Wake-ups (`poll`) after refilling, because the kernel flagged the fill ring.
    pub fill_wakeups: u64,
    /// `sendto` kicks of the tx ring.
    pub tx_kicks: u64,
}

/// The kernel's counters for the socket (`XDP_STATISTICS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

/// An AF_XDP socket bound to one receive queue of one interface.
pub struct XskPort {
    ifname: String,
    queue: u32,
    ifindex: u32,
    opts: PortOptions,
    // Drop order is field order: the socket (all four rings hold it) closes first, which
    // also removes it from the XSKMAP; then the UMEM; then the filter detaches.
    tx_q: TxQueue,
    rx_q: RxQueue,
    fill_q: FillQueue,
    comp_q: CompQueue,
    umem: Umem,
    filter: Option<RoceFilter>,
    free: Vec<FrameDesc>,
    scratch: Vec<FrameDesc>,
    tx_descs: Vec<FrameDesc>,
    in_fill: u32,
    in_tx: u32,
    /// Of `in_tx`: put on the tx ring by `queue_batch` and not kicked yet.
    unkicked: u32,
    /// Reassembly of a multi-chunk received frame; `rx_off` aligns it to 64 bytes.
    rx_buf: Vec<u8>,
    rx_off: usize,
    rx_len: usize,
    /// The chain being reassembled is too long and is being dropped.
    rx_discard: bool,
    stats: PortStats,
    mode: BufferMode,
    /// The kernel's answer to `XDP_OPTIONS` after the bind: zero-copy or copy mode.
    zero_copy: Option<bool>,
}

impl std::fmt::Debug for XskPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskPort")
            .field("ifname", &self.ifname)
            .field("queue", &self.queue)
            .field("frames", &self.frame_counts())
            .finish()
    }
}

fn queue_size(n: u32, what: &str) -> Result<QueueSize, Error> {
    QueueSize::new(n).map_err(|e| Error::Config(format!("{what} {n}: {e}")))
}

/// The socket's descriptor, for `poll(2)` together with other descriptors (the driver
/// waits on it and on its wake-up eventfd at once). Readable when the rx ring has frames.
impl AsFd for XskPort {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is the socket owned by `self.rx_q` (xsk-rs closes it when
        // the queue drops); the returned borrow cannot outlive `self`, so it stays open for
        // as long as the borrow exists.
        unsafe { BorrowedFd::borrow_raw(self.rx_q.fd().as_raw_fd()) }
    }
}

/// Does a socket-creation error say the kernel or driver refused `XDP_USE_SG`?
fn refuses_sg(e: &xsk_rs::socket::SocketCreateError) -> bool {
    let inval = rustix::io::Errno::INVAL.raw_os_error();
    let notsupp = rustix::io::Errno::OPNOTSUPP.raw_os_error();
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .and_then(|io| io.raw_os_error())
        .is_some_and(|c| c == inval || c == notsupp)
}

fn errno_text(e: &xsk_rs::socket::SocketCreateError) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// The options [`XskPort::open`] refuses before touching the interface.
fn check_options(opts: &PortOptions) -> Result<(), Error> {
    if opts.frame_count < 2 || opts.batch_size == 0 {
        return Err(Error::Config(
            "frame_count must be at least 2 and batch_size at least 1".into(),
        ));
    }
    if opts.frame_count / 2 > opts.ring_size {
        return Err(Error::Config(format!(
            "ring_size {} cannot hold the {} chunks given to the fill ring (frame_count / 2)",
            opts.ring_size,
            opts.frame_count / 2
        )));
    }
    Ok(())
}

/// xrnic's XDP filter on `ifindex` when `opts` asks for it. Generic (skb) XDP hands
/// AF_XDP copies only: then the bind is in copy mode (and zero-copy is refused).
fn attach_filter(
    ifname: &str,
    ifindex: u32,
    opts: &mut PortOptions,
) -> Result<Option<RoceFilter>, Error> {
    let filter = if opts.attach_filter {
        let mut f = RoceFilter::load()?;
        f.attach(ifindex, ifname)?;
        Some(f)
    } else {
        None
    };
    let skb = filter.as_ref().and_then(|f| f.mode()) == Some(super::XdpMode::Skb);
    if skb {
        match opts.bind_mode {
            BindMode::ZeroCopy => {
                return Err(Error::Config(format!(
                    "zero-copy needs native XDP, but {ifname}'s XDP program runs in skb mode"
                )));
            }
            _ => opts.bind_mode = BindMode::Copy,
        }
    }
    Ok(filter)
}

/// A UMEM of `frame_count` chunks of [`CHUNK_SIZE`] bytes, with its fill and completion
/// rings of `ring_size`, and the descriptors of all its chunks.
fn create_umem(opts: &PortOptions) -> Result<(Umem, Vec<FrameDesc>), Error> {
    let frame_size =
        FrameSize::new(CHUNK_SIZE).map_err(|e| Error::Config(format!("chunk size: {e}")))?;
    let umem_cfg = UmemConfig::builder()
        .frame_size(frame_size)
        .fill_queue_size(queue_size(opts.ring_size, "ring_size")?)
        .comp_queue_size(queue_size(opts.ring_size, "ring_size")?)
        .frame_headroom(0)
        .build()
        .map_err(|e| Error::Config(e.to_string()))?;
    let count = NonZeroU32::new(opts.frame_count)
        .ok_or_else(|| Error::Config("frame_count must not be 0".into()))?;
    Umem::new(umem_cfg, count, false).map_err(|e| {
        Error::Umem(format!(
            "{e} ({} chunks of {CHUNK_SIZE} bytes; is the locked-memory limit too low?)",
            opts.frame_count
        ))
    })
}

/// `need_wakeup` off (with a warning) on a kernel without `XDP_USE_NEED_WAKEUP`.
fn settle_need_wakeup(ifname: &str, opts: &mut PortOptions) {
    let features = super::features::kernel_features();
    if opts.need_wakeup && !features.need_wakeup.available() {
        let (maj, min) = super::features::NEED_WAKEUP_SINCE;
        tracing::warn!(
            ifname,
            kernel = %features.release,
            "AF_XDP need_wakeup (XDP_USE_NEED_WAKEUP, Linux {maj}.{min}+) not available: \
             kicking the kernel after every batch"
        );
        opts.need_wakeup = false;
    }
}

/// The socket's configuration: its rings, and the bind flags for `mode` and `opts`.
fn socket_config(opts: &PortOptions, mode: &BufferMode) -> Result<SocketConfig, Error> {
    let mut bind = BindFlags::empty();
    if *mode == BufferMode::Multi {
        bind |= BindFlags::XDP_USE_SG;
    }
    if opts.need_wakeup {
        bind |= BindFlags::XDP_USE_NEED_WAKEUP;
    }
    match opts.bind_mode {
        BindMode::Auto => {}
        BindMode::Copy => bind |= BindFlags::XDP_COPY,
        BindMode::ZeroCopy => bind |= BindFlags::XDP_ZEROCOPY,
    }
    Ok(SocketConfig::builder()
        .rx_queue_size(queue_size(opts.ring_size, "ring_size")?)
        .tx_queue_size(queue_size(opts.ring_size, "ring_size")?)
        // We load our own program (the filter) instead of libxdp's default one.
        .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
        .bind_flags(bind)
        .build())
}

/// A bound socket's tx and rx rings, and its UMEM's fill and completion rings (`None`
/// when another socket took them), as `xsk_rs::Socket::new` returns them.
type SocketRings = (TxQueue, RxQueue, Option<(FillQueue, CompQueue)>);

/// [`Error::Socket`] for `ifname` queue `queue`.
fn socket_error(ifname: &str, queue: u32, reason: String) -> Error {
    Error::Socket {
        ifname: ifname.to_string(),
        queue,
        reason,
    }
}

/// The rings of a socket created on `umem` and bound to `ifname` queue `queue` in `mode`;
/// where the kernel or driver refuses multi-buffer, bound again single-buffer (and `mode`
/// says so).
fn bind_socket(
    ifname: &str,
    queue: u32,
    umem: &Umem,
    opts: &PortOptions,
    mode: &mut BufferMode,
) -> Result<SocketRings, Error> {
    let iface: Interface = ifname.parse().map_err(|_| Error::InterfaceMissing {
        ifname: ifname.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in name"),
    })?;
    let create = |cfg: SocketConfig| {
        sys::retry_busy(
            // SAFETY: the UMEM was created just above and is used by this socket only,
            // so the shared-UMEM double-free case of `Socket::new`'s contract cannot
            // arise (and INHIBIT_PROG_LOAD is set anyway). A failed attempt leaves no
            // socket behind.
            || unsafe { xsk_rs::Socket::new(cfg, umem, &iface, queue) },
            |e| sys::is_busy(e),
        )
    };
    let describe = |e: &xsk_rs::socket::SocketCreateError, hint: &str| {
        socket_error(
            ifname,
            queue,
            format!(
                "{e}{} ({hint})",
                std::error::Error::source(e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default()
            ),
        )
    };
    let hint = match opts.bind_mode {
        BindMode::ZeroCopy => zero_copy_hint(),
        _ => "no such queue?".to_string(),
    };
    match create(socket_config(opts, mode)?) {
        // A kernel that has multi-buffer but a driver whose zero-copy mode has not
        // (EOPNOTSUPP), or a kernel the probe misjudged (EINVAL): single-buffer.
        Err(e) if *mode == BufferMode::Multi && refuses_sg(&e) => {
            let single = BufferMode::Single {
                why: format!(
                    "binding {ifname} with XDP_USE_SG was refused: {}",
                    errno_text(&e)
                ),
            };
            match create(socket_config(opts, &single)?) {
                Ok(s) => {
                    *mode = single;
                    Ok(s)
                }
                Err(_) => Err(describe(&e, &hint)),
            }
        }
        r => r.map_err(|e| describe(&e, &hint)),
    }
}

impl XskPort {
    /// Open an AF_XDP socket on `ifname` queue `queue` in the calling thread's network
    /// namespace, with a fresh UMEM, and (by default) attach the XDP filter.
    pub fn open(ifname: &str, queue: u32, opts: PortOptions) -> Result<Self, Error> {
        sys::require_root("opening an AF_XDP socket")?;
        check_options(&opts)?;
        let ifindex = sys::ifindex(ifname)?;
        let mut opts = opts;
        let mut filter = attach_filter(ifname, ifindex, &mut opts)?;
        let (umem, descs) = create_umem(&opts)?;
        settle_need_wakeup(ifname, &mut opts);
        let mut mode = BufferMode::for_options(&opts);
        if mode == BufferMode::Multi && filter.as_ref().is_some_and(|f| !f.frags()) {
            let (maj, min) = super::filter::XDP_FRAGS_SINCE;
            mode = BufferMode::Single {
                why: format!(
                    "xrnic's XDP program runs without frags (BPF_F_XDP_HAS_FRAGS, Linux {maj}.{min}+)"
                ),
            };
        }
        let (tx_q, rx_q, rings) = bind_socket(ifname, queue, &umem, &opts, &mut mode)?;
        if let BufferMode::Single { why } = &mode {
            tracing::warn!(
                ifname,
                "AF_XDP single-buffer: {why}; frames up to {CHUNK_DATA} bytes, the port's MTU is capped to fit"
            );
        }
        let (fill_q, comp_q) = rings.ok_or_else(|| {
            socket_error(
                ifname,
                queue,
                "the UMEM's fill and completion rings were taken".into(),
            )
        })?;

        if let Some(f) = filter.as_mut() {
            f.register_socket(queue, rx_q.fd().as_raw_fd())?;
        }

        let mut port = XskPort {
            ifname: ifname.to_string(),
            queue,
            ifindex,
            opts,
            tx_q,
            rx_q,
            fill_q,
            comp_q,
            umem,
            filter,
            free: descs,
            scratch: vec![FrameDesc::default(); opts.batch_size.max(MAX_CHAIN)],
            tx_descs: Vec::with_capacity(opts.batch_size + MAX_CHAIN),
            in_fill: 0,
            in_tx: 0,
            unkicked: 0,
            rx_buf: vec![0; MAX_FRAME + 64],
            rx_off: 0,
            rx_len: 0,
            rx_discard: false,
            stats: PortStats::default(),
            mode,
            zero_copy: None,
        };
        port.rx_off = port.rx_buf.as_ptr().align_offset(64);
        // XDP_OPTIONS (Linux 5.3) says whether the kernel bound in zero-copy or copy mode
        // (BindMode::Auto leaves the choice to it); older kernels cannot tell.
        port.zero_copy = rustix::net::sockopt::xdp_options(port.as_fd())
            .ok()
            .map(|o| o.contains(rustix::net::xdp::XdpOptionsFlags::XDP_OPTIONS_ZEROCOPY));
        port.log_bound();
        port.fill_half_of_the_umem()?;
        Ok(port)
    }

    /// The log line of a bound socket: its copy, buffer and XDP modes.
    fn log_bound(&self) {
        tracing::info!(
            ifname = self.ifname.as_str(),
            queue = self.queue,
            copy = match self.zero_copy {
                Some(true) => "zero-copy",
                Some(false) => "copy",
                None => "unknown (no XDP_OPTIONS, Linux 5.3+)",
            },
            buffers = match &self.mode {
                BufferMode::Multi => "multi-buffer",
                BufferMode::Single { .. } => "single-buffer",
            },
            xdp = self.xdp_mode().map_or("none (no filter)", |m| m.as_str()),
            need_wakeup = self.opts.need_wakeup,
            "AF_XDP socket bound"
        );
    }

    /// Half the UMEM's chunks (`frame_count / 2`) onto the fill ring, for the kernel to
    /// receive into; the other half stays free for sends.
    fn fill_half_of_the_umem(&mut self) -> Result<(), Error> {
        let to_fill = (self.opts.frame_count / 2) as usize;
        let at = self.free.len() - to_fill;
        // SAFETY: the descriptors came from this UMEM and are owned by user space (none
        // has been given to the kernel yet).
        let n = unsafe { self.fill_q.produce(&self.free[at..]) };
        if n != to_fill {
            return Err(socket_error(
                &self.ifname,
                self.queue,
                format!("the fill ring took {n} of {to_fill} chunks"),
            ));
        }
        self.free.truncate(at);
        self.in_fill = to_fill as u32;
        Ok(())
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    pub fn queue(&self) -> u32 {
        self.queue
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The socket's file descriptor, to register it in another program's XSKMAP (when
    /// opened with `attach_filter: false`). It stays owned by the port.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.rx_q.fd().as_raw_fd()
    }

    /// The largest frame [`XskPort::send_batch`] takes and the port receives.
    pub fn max_frame(&self) -> usize {
        self.mode.max_frame()
    }

    /// Multi-buffer or single-buffer, and why.
    pub fn buffer_mode(&self) -> &BufferMode {
        &self.mode
    }

    /// Whether the kernel bound the socket in zero-copy mode (`XDP_OPTIONS`); `None` on
    /// a kernel that cannot say (before 5.3).
    pub fn zero_copy(&self) -> Option<bool> {
        self.zero_copy
    }

    /// The attach mode of the port's XDP filter (`None` without one).
    pub fn xdp_mode(&self) -> Option<super::XdpMode> {
        self.filter.as_ref().and_then(|f| f.mode())
    }

    pub fn options(&self) -> &PortOptions {
        &self.opts
    }

    /// Where the UMEM chunks are now. Completions not yet reaped count as `in_tx`.
    pub fn frame_counts(&self) -> FrameCounts {
        FrameCounts {
            total: self.opts.frame_count,
            free: self.free.len() as u32,
            in_fill: self.in_fill,
            in_tx: self.in_tx,
        }
    }

    pub fn stats(&self) -> PortStats {
        self.stats
    }

    /// The XDP filter's counters, when the port attached one.
    pub fn filter_stats(&self) -> Option<Result<FilterStats, Error>> {
        self.filter.as_ref().map(|f| f.stats())
    }

    /// The kernel's counters for this socket.
    pub fn kernel_stats(&self) -> Result<KernelStats, Error> {
        let s = self.rx_q.fd().xdp_statistics()?;
        Ok(KernelStats {
            rx_dropped: s.rx_dropped(),
            rx_invalid_descs: s.rx_invalid_descs(),
            tx_invalid_descs: s.tx_invalid_descs(),
            rx_ring_full: s.rx_ring_full(),
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs(),
            tx_ring_empty_descs: s.tx_ring_empty_descs(),
        })
    }

    /// Move finished transmissions from the completion ring back to `free`. Returns how
    /// many chunks came back.
    pub fn reap_completions(&mut self) -> usize {
        let mut total = 0;
        loop {
            let want = self.scratch.len().min(self.in_tx as usize);
            if want == 0 {
                break;
            }
            // SAFETY: every address on this completion ring is a chunk of our UMEM that
            // we put on the tx ring; the kernel is done with it once it shows up here.
            let n = unsafe { self.comp_q.consume(&mut self.scratch[..want]) };
            if n == 0 {
                break;
            }
            self.free.extend_from_slice(&self.scratch[..n]);
            self.in_tx -= n as u32;
            total += n;
        }
        total
    }

    /// Queue one frame for transmission. `Ok(false)`: no room now (back-pressure) —
    /// retry after [`XskPort::poll`].
    pub fn tx(&mut self, frame: &[u8]) -> Result<bool, Error> {
        Ok(self.send_batch(&[frame])? == 1)
    }

    /// Queue frames for transmission in order and kick the kernel once. Returns how many
    /// of the leading frames were queued; fewer than `frames.len()` means the UMEM or the
    /// tx ring is full for now (counted in [`PortStats::tx_backpressure`]). Frames left
    /// unkicked by [`XskPort::queue_batch`] leave in the same kick, ahead of these.
    pub fn send_batch(&mut self, frames: &[&[u8]]) -> Result<usize, Error> {
        self.put_batch(frames, true)
    }

    /// [`XskPort::send_batch`] without the kick: the frames wait on the tx ring until
    /// the next [`XskPort::send_batch`], [`XskPort::tx_with`] or [`XskPort::flush`]
    /// (or, in copy mode, a `poll(2)` on the socket, which also transmits). For frames
    /// that may leave a little later together with others, saving a `sendto` (copy mode
    /// sends inside the system call). [`XskPort::unkicked`] says how many wait.
    pub fn queue_batch(&mut self, frames: &[&[u8]]) -> Result<usize, Error> {
        self.put_batch(frames, false)
    }

    /// Frames put on the tx ring by [`XskPort::queue_batch`] since the last kick.
    pub fn unkicked(&self) -> u32 {
        self.unkicked
    }

    fn put_batch(&mut self, frames: &[&[u8]], kick: bool) -> Result<usize, Error> {
        let max = self.max_frame();
        if let Some(f) = frames.iter().find(|f| f.len() > max) {
            return Err(Error::FrameTooLarge { len: f.len(), max });
        }
        if frames.iter().any(|f| f.is_empty()) {
            return Err(Error::Config("cannot send an empty frame".into()));
        }
        if self.free.len() < self.opts.batch_size {
            self.reap_completions();
        }
        let mut ring_free = self.tx_q.nb_free(self.opts.batch_size as u32) as usize;
        let mut queued = 0;
        // Reused across calls: no allocation per batch.
        let mut descs = std::mem::take(&mut self.tx_descs);
        descs.clear();
        for frame in frames {
            let chain = frame.len().div_ceil(CHUNK_DATA);
            if chain > self.free.len() || chain > ring_free {
                // Put what is pending on the ring first, so that the fresh count of free
                // slots below is not also claimed by descriptors still in `descs`.
                self.submit_tx(&descs, kick)?;
                descs.clear();
                self.reap_completions();
                ring_free = self.tx_q.nb_free(chain as u32) as usize;
                if chain > self.free.len() || chain > ring_free {
                    self.stats.tx_backpressure += 1;
                    break;
                }
            }
            let at = self.free.len() - chain;
            for (i, part) in frame.chunks(CHUNK_DATA).enumerate() {
                let desc = &mut self.free[at + i];
                // SAFETY: `desc` is a chunk of our UMEM in the `free` list: neither the
                // kernel (fill/tx rings) nor any other reference of ours is using it.
                let mut data = unsafe { self.umem.data_mut(desc) };
                let mut cur = data.cursor();
                cur.set_pos(0);
                // Cannot fail: `part` is at most CHUNK_DATA, the chunk's data capacity.
                cur.write_all(part).map_err(Error::Io)?;
                desc.set_options(if i + 1 < chain { XDP_PKT_CONTD } else { 0 });
            }
            descs.extend(self.free.drain(at..));
            ring_free -= chain;
            queued += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += frame.len() as u64;
            if descs.len() >= self.opts.batch_size {
                // On the ring now, kicked once at the end with the rest: one `sendto`
                // per batch, not per `batch_size` descriptors.
                self.submit_tx(&descs, false)?;
                descs.clear();
            }
        }
        let r = self.submit_tx(&descs, false);
        descs.clear();
        self.tx_descs = descs;
        r?;
        if kick && self.unkicked > 0 {
            self.wake_tx()?;
        }
        Ok(queued)
    }

    /// Build one frame directly in a UMEM chunk and queue it, without a copy: `build`
    /// gets the chunk's [`CHUNK_DATA`] bytes and returns the frame length to send, or
    /// `None` to send nothing (the chunk stays free). `Ok(false)`: no free chunk or tx
    /// slot now. Suits `wire::FrameRepr::emit`, which writes the whole frame in place.
    pub fn tx_with(
        &mut self,
        build: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<bool, Error> {
        if self.free.is_empty() || self.tx_q.nb_free(1) == 0 {
            self.reap_completions();
            if self.free.is_empty() || self.tx_q.nb_free(1) == 0 {
                self.stats.tx_backpressure += 1;
                return Ok(false);
            }
        }
        let Some(mut desc) = self.free.pop() else {
            return Ok(false);
        };
        // SAFETY: `desc` was just taken off `free`: a chunk of our UMEM that neither the
        // kernel nor any other reference of ours is using.
        let mut data = unsafe { self.umem.data_mut(&mut desc) };
        let mut cur = data.cursor();
        let cap = cur.buf_len();
        cur.set_pos(cap);
        let len = build(data.contents_mut());
        let len = match len {
            Some(l) if l > cap => {
                self.free.push(desc);
                return Err(Error::FrameTooLarge { len: l, max: cap });
            }
            Some(l) if l > 0 => l,
            _ => {
                self.free.push(desc);
                return Ok(false);
            }
        };
        data.cursor().set_pos(len);
        desc.set_options(0);
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += len as u64;
        self.submit_tx(&[desc], true)?;
        Ok(true)
    }

    /// Put `descs` on the tx ring; with `kick`, wake the kernel (which then also sends
    /// any frames queued earlier without a kick).
    fn submit_tx(&mut self, descs: &[FrameDesc], kick: bool) -> Result<(), Error> {
        if descs.is_empty() {
            return Ok(());
        }
        // SAFETY: the descriptors are chunks of our UMEM taken off `free` and filled by
        // the caller; from here the kernel owns them until they come back on the
        // completion ring. The callers checked `nb_free` for room, and `produce` puts all
        // or none.
        let n = unsafe { self.tx_q.produce(descs) };
        if n != descs.len() {
            // Should not happen (room was checked); keep the chunks rather than leak them.
            self.free.extend_from_slice(descs);
            return Err(Error::Io(std::io::Error::other(
                "tx ring refused descriptors it had room for",
            )));
        }
        self.in_tx += n as u32;
        self.unkicked += n as u32;
        if kick {
            self.wake_tx()?;
        }
        Ok(())
    }

    /// After frames went on the tx ring: kick the kernel if it needs it.
    fn wake_tx(&mut self) -> Result<(), Error> {
        // Copy mode transmits only inside sendto(); with need_wakeup the kernel says when.
        if !self.opts.need_wakeup || self.tx_q.needs_wakeup() {
            self.kick()?;
        }
        // Without a wake-up needed the kernel is sending on its own (zero-copy drivers),
        // the unkicked frames too.
        self.unkicked = 0;
        Ok(())
    }

    /// `sendto`: transmit what is on the tx ring (copy mode: inside the call).
    fn kick(&mut self) -> Result<(), Error> {
        self.tx_q.wakeup()?;
        self.stats.tx_kicks += 1;
        self.unkicked = 0;
        Ok(())
    }

    /// Hand the frames waiting on the rx ring to `f`, then give their chunks back to the
    /// fill ring. Reads `batch_size` chunks per ring access until the ring is empty or
    /// `ring_size` chunks were read, so that a flood cannot keep the caller from its
    /// other work. Does not block. Returns the number of frames delivered.
    pub fn recv_batch(&mut self, mut f: impl FnMut(&[u8])) -> Result<usize, Error> {
        let mut delivered = 0;
        let mut budget = self.opts.ring_size as usize;
        while budget > 0 {
            let want = self.opts.batch_size.min(self.scratch.len()).min(budget);
            // SAFETY: descriptors on our rx ring are chunks of our UMEM that the kernel
            // has finished writing; they are ours until we put them on the fill ring.
            let n = unsafe { self.rx_q.consume(&mut self.scratch[..want]) };
            if n == 0 {
                break;
            }
            for i in 0..n {
                let desc = self.scratch[i];
                let more = desc.options() & XDP_PKT_CONTD != 0;
                // SAFETY: as above; the slice is dropped before the chunk is recycled.
                let data = unsafe { self.umem.data(&desc) };
                let bytes = data.contents();
                if !more && self.rx_len == 0 && !self.rx_discard {
                    // The common case: a whole frame in one chunk, no copy.
                    f(bytes);
                    delivered += 1;
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += bytes.len() as u64;
                    continue;
                }
                if !self.rx_discard {
                    let start = self.rx_off + self.rx_len;
                    if self.rx_len + bytes.len() > MAX_FRAME {
                        self.rx_discard = true;
                        self.stats.rx_oversize += 1;
                    } else {
                        self.rx_buf[start..start + bytes.len()].copy_from_slice(bytes);
                        self.rx_len += bytes.len();
                    }
                }
                if !more {
                    if !self.rx_discard {
                        let frame = &self.rx_buf[self.rx_off..self.rx_off + self.rx_len];
                        f(frame);
                        delivered += 1;
                        self.stats.rx_frames += 1;
                        self.stats.rx_bytes += frame.len() as u64;
                    }
                    self.rx_len = 0;
                    self.rx_discard = false;
                }
            }
            budget -= n;
            self.in_fill -= n as u32;
            self.refill(n)?;
        }
        Ok(delivered)
    }

    /// Put the first `n` scratch descriptors (just consumed from the rx ring) back on the
    /// fill ring.
    fn refill(&mut self, n: usize) -> Result<(), Error> {
        // SAFETY: the chunks came off our rx ring and nothing refers to them any more
        // (the closure's borrow ended); the fill ring hands them back to the kernel.
        let put = unsafe { self.fill_q.produce(&self.scratch[..n]) };
        if put == n {
            self.in_fill += n as u32;
        } else {
            // The fill ring is sized for every chunk we give it, so this is not expected;
            // park the chunks in `free` rather than lose them.
            self.free.extend_from_slice(&self.scratch[..n]);
        }
        if self.opts.need_wakeup && self.fill_q.needs_wakeup() {
            self.fill_q.wakeup(self.rx_q.fd_mut(), 0)?;
            self.stats.fill_wakeups += 1;
        }
        Ok(())
    }

    /// Wait until a frame can be received or `timeout` passes; reaps tx completions
    /// first. Returns whether the rx ring has something.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        self.reap_completions();
        if self.rx_q.nb_avail(1) > 0 {
            return Ok(true);
        }
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        Ok(self.rx_q.poll(ms)?)
    }

    /// Whether the rx ring holds a frame now (a read of the ring's producer index, no
    /// system call).
    pub fn rx_pending(&mut self) -> bool {
        self.rx_q.nb_avail(1) > 0
    }

    /// [`XskPort::wait`] without blocking.
    pub fn poll(&mut self) -> Result<bool, Error> {
        self.wait(Duration::ZERO)
    }

    /// Kick the tx ring (only needed when frames were queued while the kernel slept) and
    /// reap completions; returns the chunks still in flight.
    pub fn flush(&mut self) -> Result<u32, Error> {
        if self.in_tx > 0 {
            self.kick()?;
        }
        self.reap_completions();
        Ok(self.in_tx)
    }
}

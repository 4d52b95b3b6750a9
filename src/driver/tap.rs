//! The capture tap of a device: a pcapng of every frame the driver hands to the port and
//! every frame it takes from the port, written by a thread of its own.
//!
//! AF_XDP frames bypass the kernel's packet taps (tcpdump on the interface sees nothing
//! the RNIC sends or receives), so the capture is taken where the frames are: in the
//! driver loop ([`crate::driver`]).
//!
//! Contract:
//! - Off by default; when off the driver pays one branch per frame (`Option::is_some`).
//! - One interface (the netdev) per file, `if_tsresol` 9. Timestamps are wall-clock
//!   nanoseconds since the Unix epoch: the driver's one clock read of the loop iteration
//!   that moved the frame (all frames of a batch share it), mapped onto the wall clock
//!   read once when the tap starts.
//! - Each packet carries the pcapng direction (`epb_flags` inbound / outbound). Outbound
//!   frames that are not the obvious next packet carry the engine's [`TxReason`] as a
//!   comment (retransmissions start with `retransmission`); inbound frames the device did
//!   not take carry why: the `rx_drop` fault injector, or the engine's verdict
//!   ([`RxVerdict::reason`]) as `handle_frame` returned it. Inbound frames are recorded before the fault
//!   injector, so a frame it dropped is in the file, with that comment.
//! - The data path never waits for the disk: frames are copied into a per-iteration
//!   `Batch` and handed over a channel once per iteration. When more than
//!   [`QUEUE_LIMIT`] bytes wait for the writer, a batch is discarded and counted
//!   ([`Tap::lost`]); the next packet written says how many frames are missing before it.
//! - The writer flushes its buffer whenever it has nothing left to write, so that a file
//!   read while the device runs (or left by a killed process) holds every frame handed over
//!   up to then. [`Tap::finish`] (called when the driver stops) writes everything and
//!   joins the writer; [`flush_all`] (for a Ctrl-C handler) flushes every live tap of the
//!   process and waits for it.
//! - A write error is reported once on stderr and by [`Tap::finish`]; writing stops there
//!   and the device carries on.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::io::pcap_out::{Direction, Interface, PcapNgOut};
use crate::proto::trace::TxReason;
use crate::proto::{Rnic, RxVerdict};

/// Most bytes of frames that may wait for the writer before batches are discarded.
pub const QUEUE_LIMIT: usize = 64 << 20;

/// What became of a received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxFate {
    /// Dropped by the driver's fault injector (`rx_drop`) before the engine saw it.
    FaultDropped,
    /// Handed to the engine, with the verdict [`Rnic::handle_frame`] returned.
    Engine(RxVerdict),
}

impl RxFate {
    /// The capture comment; `None` for a frame the engine took.
    pub fn comment(self) -> Option<String> {
        match self {
            RxFate::FaultDropped => Some(
                "dropped on receipt by the fault injector (--rx-drop): the engine never saw it"
                    .to_string(),
            ),
            RxFate::Engine(v) => v.reason().map(|r| format!("dropped on receipt: {r}")),
        }
    }
}

/// Hand `frame` to the engine and record it with the engine's verdict.
pub fn handle_frame_tapped(
    rnic: &mut Rnic,
    now: crate::proto::Instant,
    frame: &[u8],
    tap: &mut Tap,
    ts_ns: u64,
) -> RxVerdict {
    let v = rnic.handle_frame(now, frame);
    tap.received(ts_ns, frame, RxFate::Engine(v));
    v
}

/// Why a frame is in the file.
#[derive(Clone, Copy, Debug)]
enum Note {
    Tx(TxReason),
    Rx(RxFate),
}

#[derive(Clone, Copy, Debug)]
struct Rec {
    ts_ns: u64,
    len: usize,
    note: Note,
}

/// Frames of one driver iteration, copied back to back into one buffer.
#[derive(Debug, Default)]
struct Batch {
    data: Vec<u8>,
    recs: Vec<Rec>,
    /// Frames discarded (queue full) between the previous batch handed over and this one.
    lost_before: u64,
}

enum Msg {
    Batch(Batch),
    /// Write everything received so far, flush, then answer.
    Flush(Sender<()>),
}

/// Every live tap of the process, for [`flush_all`].
static LIVE: Mutex<Vec<(u64, Sender<Msg>)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The tap of one device. Owned by the driver thread.
#[derive(Debug)]
pub struct Tap {
    id: u64,
    path: PathBuf,
    tx: Option<Sender<Msg>>,
    batch: Batch,
    queued: Arc<AtomicUsize>,
    lost: u64,
    recorded: u64,
    mono0: Instant,
    wall0_ns: u64,
    writer: Option<JoinHandle<Result<u64, String>>>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Batch(b) => write!(f, "Batch({} frames)", b.recs.len()),
            Msg::Flush(_) => write!(f, "Flush"),
        }
    }
}

impl Tap {
    /// Create (truncate) `path`, write the pcapng headers with one interface, and start
    /// the writer thread.
    pub fn create(path: &Path, netdev: &str, description: &str) -> io::Result<Tap> {
        let iface = Interface {
            name: netdev.to_string(),
            description: description.to_string(),
        };
        let out = PcapNgOut::create(path, &[iface]).map_err(io::Error::other)?;
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let q = queued.clone();
        let shown = path.display().to_string();
        let writer = std::thread::Builder::new()
            .name(format!("xrnic-pcap-{netdev}"))
            .spawn(move || write_loop(out, rx, &q, &shown))?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        live().push((id, tx.clone()));
        let wall0_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Ok(Tap {
            id,
            path: path.to_path_buf(),
            tx: Some(tx),
            batch: Batch::default(),
            queued,
            lost: 0,
            recorded: 0,
            mono0: Instant::now(),
            wall0_ns,
            writer: Some(writer),
        })
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The timestamp of a frame moved at `at`.
    pub fn timestamp(&self, at: Instant) -> u64 {
        self.wall0_ns
            .saturating_add(at.saturating_duration_since(self.mono0).as_nanos() as u64)
    }

    /// Record a frame the device sends, and why.
    pub fn transmitted(&mut self, ts_ns: u64, frame: &[u8], reason: TxReason) {
        self.push(ts_ns, frame, Note::Tx(reason));
    }

    /// Record a frame the device received, and what became of it.
    pub fn received(&mut self, ts_ns: u64, frame: &[u8], fate: RxFate) {
        self.push(ts_ns, frame, Note::Rx(fate));
    }

    fn push(&mut self, ts_ns: u64, frame: &[u8], note: Note) {
        self.batch.data.extend_from_slice(frame);
        self.batch.recs.push(Rec {
            ts_ns,
            len: frame.len(),
            note,
        });
    }

    /// Hand the frames recorded since the last call to the writer (once per driver
    /// iteration), or count them lost when the writer is too far behind.
    pub fn commit(&mut self) {
        if self.batch.recs.is_empty() {
            return;
        }
        let Some(tx) = &self.tx else {
            return;
        };
        let n = self.batch.recs.len() as u64;
        let bytes = self.batch.data.len();
        if self.queued.load(Ordering::Relaxed) + bytes > QUEUE_LIMIT {
            self.lost += n;
            self.batch.lost_before += n;
            self.batch.data.clear();
            self.batch.recs.clear();
            return;
        }
        self.queued.fetch_add(bytes, Ordering::Relaxed);
        let b = std::mem::take(&mut self.batch);
        if tx.send(Msg::Batch(b)).is_err() {
            // The writer is gone (it only stops when the channel closes): nothing to do.
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            self.lost += n;
        } else {
            self.recorded += n;
        }
    }

    /// Frames handed to the writer.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// Frames discarded because the writer fell behind.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Hand over what is left, let the writer write and flush everything, and wait for
    /// it. Returns the number of packets in the file.
    pub fn finish(mut self) -> Result<u64, String> {
        self.close()
    }

    fn close(&mut self) -> Result<u64, String> {
        self.commit();
        live().retain(|(id, _)| *id != self.id);
        // Closing the channel ends the writer's loop once it has written everything.
        self.tx = None;
        match self.writer.take() {
            Some(w) => w
                .join()
                .unwrap_or_else(|_| Err("the capture writer panicked".into())),
            None => Ok(0),
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = self.close();
        }
    }
}

fn live() -> std::sync::MutexGuard<'static, Vec<(u64, Sender<Msg>)>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Make every live tap of this process write and flush what it was handed, waiting at most
/// `timeout` in all. For a Ctrl-C handler that then exits: the files are complete up to
/// the last driver iteration. Returns how many taps confirmed.
pub fn flush_all(timeout: Duration) -> usize {
    let senders: Vec<Sender<Msg>> = live().iter().map(|(_, s)| s.clone()).collect();
    let (ack_tx, ack_rx) = mpsc::channel();
    let asked = senders
        .iter()
        .filter(|s| s.send(Msg::Flush(ack_tx.clone())).is_ok())
        .count();
    drop(ack_tx);
    let end = Instant::now() + timeout;
    let mut done = 0;
    while done < asked {
        let left = end.saturating_duration_since(Instant::now());
        if ack_rx.recv_timeout(left).is_err() {
            break;
        }
        done += 1;
    }
    done
}

fn write_loop(
    mut out: PcapNgOut<io::BufWriter<std::fs::File>>,
    rx: Receiver<Msg>,
    queued: &AtomicUsize,
    shown: &str,
) -> Result<u64, String> {
    let mut error: Option<String> = None;
    let fail = |e: String, error: &mut Option<String>| {
        if error.is_none() {
            eprintln!("xrnic: capture {shown}: {e}; no more frames are written to it");
            *error = Some(e);
        }
    };
    loop {
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(TryRecvError::Empty) => {
                // Nothing waits: a good moment to put the buffer on disk.
                if error.is_none() {
                    if let Err(e) = out.flush() {
                        fail(e.to_string(), &mut error);
                    }
                }
                match rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match msg {
            Msg::Batch(b) => {
                if error.is_none() {
                    if let Err(e) = write_batch(&mut out, &b) {
                        fail(e.to_string(), &mut error);
                    }
                }
                queued.fetch_sub(b.data.len(), Ordering::Relaxed);
            }
            Msg::Flush(ack) => {
                if error.is_none() {
                    if let Err(e) = out.flush() {
                        fail(e.to_string(), &mut error);
                    }
                }
                let _ = ack.send(());
            }
        }
    }
    let n = out.packets();
    match (error, out.finish()) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(e.to_string()),
        (None, Ok(_)) => Ok(n),
    }
}

fn write_batch(
    out: &mut PcapNgOut<io::BufWriter<std::fs::File>>,
    b: &Batch,
) -> Result<(), pcap_file::PcapError> {
    let mut at = 0;
    for (i, r) in b.recs.iter().enumerate() {
        let frame = &b.data[at..at + r.len];
        at += r.len;
        let (dir, note) = match r.note {
            Note::Tx(reason) => (Direction::Outbound, reason.comment()),
            Note::Rx(fate) => (Direction::Inbound, fate.comment()),
        };
        let comment = if i == 0 && b.lost_before > 0 {
            let gap = format!(
                "capture: {} frames before this one are missing (the capture writer fell behind)",
                b.lost_before
            );
            Some(match note {
                Some(n) => format!("{n}; {gap}"),
                None => gap,
            })
        } else {
            note
        };
        out.write(0, r.ts_ns, frame, Some(dir), comment.as_deref())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::NakCode;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("xrnic-tap-{}-{name}.pcapng", std::process::id()))
    }

    #[test]
    fn writes_directions_comments_and_times_in_order() {
        let p = tmp("order");
        let mut t = Tap::create(&p, "veth0", "test").unwrap();
        let ts = t.timestamp(Instant::now());
        t.transmitted(ts, &[1; 60], TxReason::Request);
        t.transmitted(ts, &[2; 60], TxReason::RetransmitTimeout);
        t.received(ts + 5, &[3; 70], RxFate::Engine(RxVerdict::UnknownQp));
        t.commit();
        t.received(ts + 9, &[4; 64], RxFate::FaultDropped);
        t.transmitted(ts + 9, &[5; 64], TxReason::Nak(NakCode::PsnSequenceError));
        assert_eq!(t.recorded(), 3);
        assert_eq!(t.finish(), Ok(5));
        let bytes = std::fs::read(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        let frames = crate::io::capture::read_bytes(&bytes).unwrap();
        let firsts: Vec<u8> = frames.iter().map(|f| f.data[0]).collect();
        assert_eq!(firsts, [1, 2, 3, 4, 5]);
        assert_eq!(frames[2].timestamp, Duration::from_nanos(ts + 5));
        assert_eq!(frames[2].data.len(), 70);
        let c = crate::io::pcap_out::packet_comments(&bytes);
        assert_eq!(c[0], None);
        assert!(c[1].as_deref().unwrap().starts_with("retransmission"));
        assert!(c[2].as_deref().unwrap().contains("no such QP"));
        assert!(c[3].as_deref().unwrap().contains("fault injector"));
        assert!(c[4].as_deref().unwrap().starts_with("NAK"));
        let flags = packet_flags(&bytes);
        assert_eq!(flags, [2, 2, 1, 1, 2]);
    }

    #[test]
    fn flush_all_puts_every_handed_frame_on_disk_while_the_tap_lives() {
        let p = tmp("flush");
        let mut t = Tap::create(&p, "veth1", "test").unwrap();
        for i in 0..10u8 {
            t.received(u64::from(i), &[i; 60], RxFate::Engine(RxVerdict::Taken));
        }
        t.commit();
        assert!(flush_all(Duration::from_secs(10)) >= 1);
        let frames = crate::io::capture::read_file(&p).unwrap();
        assert_eq!(frames.len(), 10);
        drop(t);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_full_queue_loses_batches_and_says_so_in_the_next_packet() {
        let p = tmp("lost");
        let mut t = Tap::create(&p, "veth2", "test").unwrap();
        // Pretend the writer is that far behind.
        t.queued.fetch_add(QUEUE_LIMIT, Ordering::Relaxed);
        t.transmitted(1, &[1; 60], TxReason::Request);
        t.transmitted(2, &[2; 60], TxReason::Request);
        t.commit();
        assert_eq!(t.lost(), 2);
        t.queued.fetch_sub(QUEUE_LIMIT, Ordering::Relaxed);
        t.transmitted(3, &[3; 60], TxReason::Request);
        t.commit();
        assert_eq!(t.finish(), Ok(1));
        let bytes = std::fs::read(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        let c = crate::io::pcap_out::packet_comments(&bytes);
        assert_eq!(c.len(), 1);
        assert!(
            c[0].as_deref()
                .unwrap()
                .contains("2 frames before this one are missing")
        );
    }

    #[test]
    fn every_refusing_verdict_has_a_comment_and_taken_has_none() {
        assert_eq!(RxFate::Engine(RxVerdict::Taken).comment(), None);
        for v in RxVerdict::ALL.into_iter().filter(|v| !v.is_taken()) {
            let c = RxFate::Engine(v).comment().unwrap();
            assert!(c.starts_with("dropped on receipt: "), "{v:?}: {c}");
        }
        assert!(
            RxFate::FaultDropped
                .comment()
                .unwrap()
                .contains("fault injector")
        );
    }

    #[test]
    fn creating_in_a_missing_directory_is_an_error() {
        let e = Tap::create(Path::new("/nonexistent-xrnic/dir/x.pcapng"), "v", "d").unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent-xrnic/dir/x.pcapng"),
            "{e}"
        );
    }

    /// The `epb_flags` of every packet (0 when absent).
    fn packet_flags(bytes: &[u8]) -> Vec<u32> {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
        use pcap_file::pcapng::{Block, PcapNgReader};
        let mut r = PcapNgReader::new(bytes).unwrap();
        let mut v = Vec::new();
        while let Some(b) = r.next_block() {
            if let Ok(Block::EnhancedPacket(p)) = b {
                v.push(
                    p.options
                        .iter()
                        .find_map(|o| match o {
                            EnhancedPacketOption::Flags(f) => Some(*f),
                            _ => None,
                        })
                        .unwrap_or(0),
                );
            }
        }
        v
    }
}

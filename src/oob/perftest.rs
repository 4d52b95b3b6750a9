//! The out-of-band exchange of the perftest bandwidth tests, as perftest 4.5-0.17 (Debian 12
//! package `perftest 4.5+0.17`, which announces itself as version "6.06") does it over
//! TCP, without `-R`/`--rdma_cm`, without `-b` (bidirectional), for RC.
//!
//! Sequence (file:function of perftest v4.5-0.17; see docs/oob.md for the full table):
//! 1. `establish_connection`: TCP connect, IPv4 only in 4.5 (`AF_INET`).
//! 2. `exchange_versions`: 16 bytes each way, the version string NUL-padded
//!    (`strncpy(version, VERSION, 16)`); `check_version_compatibility` refuses peers older
//!    than 5.70.
//! 3. `check_sys_data`: cycle buffer, then cache line size, 4-byte big-endian ints; each
//!    side keeps the larger of the two.
//! 4. `check_mtu`: the active MTU as an `enum ibv_mtu` code printed with `"%d"`, 2 bytes
//!    (the digit and its NUL, the `rem_vers >= 5.31` variant); each side keeps the smaller
//!    if the peer's code is valid.
//! 5. `ctx_hand_shake` per QP: a key message (`PerftestDest`, 108 bytes with GID, 59
//!    without) — then each side moves its QPs to RTR/RTS (`ctx_connect`) — then per QP
//!    again, plus one "sync" hand shake of QP 0; write/read/atomic do the per-QP round
//!    first, send does the sync first.
//! 6. The test. send_bw syncs once more before it (the server posts its receives first).
//! 7. write/read/atomic: a sync after the test, then `xchg_bw_reports` (5 fields of 8
//!    bytes, big-endian); send_bw exchanges no report (the server measures on its own).
//! 8. `ctx_close_connection`: one more sync, then each side writes `"done"` with its NUL
//!    and closes; nobody reads it.
//!
//! Every exchange is lock-step: the client writes then reads, the server reads then
//! writes (`ctx_xchg_data_ethernet`, `ctx_hand_shake`). Nothing else is exchanged: message
//! size, iterations, duration mode, tx depth, number of QPs, `-a`: the user must pass the
//! same flags on both sides, as with two perftest binaries.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use super::link::Link;
use super::{DEFAULT_TIMEOUT, Error, MessageError, c_buffer, c_text, hex_field};
use crate::wire::{Psn, Qpn, Rkey};

/// The version we announce: perftest 4.5-0.17's `VERSION` (configure.ac
/// `AC_INIT([perftest],[6.06])`). We behave as that version does towards any peer.
pub const VERSION: &str = "6.06";

/// Size of the version message (`char version[MAX_VERSION]`, `MAX_VERSION` 16).
pub const VERSION_LEN: usize = 16;

/// The oldest peer version perftest 6.06 accepts (`check_version_compatibility`).
pub const MIN_PEER_VERSION: f64 = 5.70;
const MIN_PEER_VERSION_TEXT: &str = "5.70";

/// Key message without GID (`KEY_MSG_SIZE`): 58 characters and the NUL.
pub const KEY_MSG_LEN: usize = 59;

/// Key message with GID (`KEY_MSG_SIZE_GID`): 107 characters and the NUL.
pub const KEY_MSG_LEN_GID: usize = 108;

/// The last message of each side (`ctx_close_connection`), NUL included.
pub const DONE: &[u8; 5] = b"done\0";

/// Number of message sizes `-a` runs for RC: 2^1 ..= 2^23 (send_bw.c `size_max_pow` 24).
pub const ALL_SIZES_RC: u32 = 23;

/// The message sizes of `-a` for RC, in order.
pub fn all_sizes_rc() -> impl Iterator<Item = u64> {
    (1..=ALL_SIZES_RC).map(|i| 1u64 << i)
}

/// Which key message both sides use. perftest uses the GID form whenever its `gid_index`
/// is not -1, which `check_link_and_mtu` forces on any Ethernet (RoCE) port; the form
/// without GID is what an InfiniBand port without `-x` uses. Both sides must agree, since
/// each reads the size its own setting implies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyFormat {
    WithGid,
    WithoutGid,
}

impl KeyFormat {
    pub const fn wire_len(self) -> usize {
        match self {
            KeyFormat::WithGid => KEY_MSG_LEN_GID,
            KeyFormat::WithoutGid => KEY_MSG_LEN,
        }
    }
}

/// What one side announces for one QP (perftest `struct pingpong_dest`, the fields that
/// travel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PerftestDest {
    /// Port LID; 0 on RoCE.
    pub lid: u16,
    /// The announcing side's `out_reads`: the peer uses it as its `max_rd_atomic`
    /// (`ctx_modify_qp_to_rts`), while the announcing side sets its own
    /// `max_dest_rd_atomic` to it (`ctx_modify_qp_to_rtr`). perftest sends 1 for write and
    /// send, and the device's `max_qp_rd_atom` (or `-o`) for read and atomic.
    pub out_reads: u16,
    pub qpn: Qpn,
    /// The first PSN the announcing side sends (the peer's RQ PSN).
    pub psn: Psn,
    /// The key of the buffer the peer may write, read or use atomics on.
    pub rkey: Rkey,
    /// The address in that buffer the peer targets (it cycles from there, see docs).
    pub vaddr: u64,
    /// The GID, network byte order. Not carried by [`KeyFormat::WithoutGid`].
    pub gid: [u8; 16],
    /// XRC/DC SRQ number; 0 for RC.
    pub srqn: u32,
}

impl PerftestDest {
    /// The key message: `KEY_PRINT_FMT_GID`
    /// `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 × "%02x:" + "%08x:"` (lid, out_reads,
    /// qpn, psn, rkey, vaddr, GID bytes, srqn — note the trailing colon), or `KEY_PRINT_FMT`
    /// `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"` without GID; NUL-padded to the fixed size.
    pub fn encode(&self, format: KeyFormat) -> Vec<u8> {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn.value(),
            self.psn.value(),
            self.rkey.0,
            self.vaddr
        );
        match format {
            KeyFormat::WithGid => {
                for b in self.gid {
                    text.push_str(&format!("{b:02x}:"));
                }
                text.push_str(&format!("{:08x}:", self.srqn));
                // Every field is at its full width by its type: always 107 characters.
                c_buffer::<KEY_MSG_LEN_GID>(&text)
                    .map(|b| b.to_vec())
                    .unwrap_or_default()
            }
            KeyFormat::WithoutGid => {
                text.push_str(&format!("{:08x}", self.srqn));
                c_buffer::<KEY_MSG_LEN>(&text)
                    .map(|b| b.to_vec())
                    .unwrap_or_default()
            }
        }
    }

    /// Parses a key message. Field widths are free (the C reader uses `strtol` per field),
    /// values are range-checked, the GID form must end with its trailing colon.
    pub fn decode(msg: &[u8], format: KeyFormat) -> Result<PerftestDest, MessageError> {
        let text = c_text(msg)?;
        let mut f = text.split(':');
        let mut d = PerftestDest {
            lid: hex_field(f.next(), "lid", 0xffff)? as u16,
            out_reads: hex_field(f.next(), "out_reads", 0xffff)? as u16,
            qpn: Qpn::new(hex_field(f.next(), "qpn", 0xff_ffff)? as u32),
            psn: Psn::new(hex_field(f.next(), "psn", u64::from(Psn::MAX))? as u32),
            rkey: Rkey(hex_field(f.next(), "rkey", u64::from(u32::MAX))? as u32),
            vaddr: hex_field(f.next(), "vaddr", u64::MAX)?,
            gid: [0; 16],
            srqn: 0,
        };
        if format == KeyFormat::WithGid {
            for b in d.gid.iter_mut() {
                *b = hex_field(f.next(), "gid", 0xff)? as u8;
            }
        }
        d.srqn = hex_field(f.next(), "srqn", u64::from(u32::MAX))? as u32;
        let rest: Vec<&str> = f.collect();
        if format == KeyFormat::WithGid && rest.is_empty() {
            return Err(MessageError::MissingField("final ':'"));
        }
        let trailing_ok = match format {
            // "…:%08x:" splits into the srqn and one empty piece.
            KeyFormat::WithGid => rest == [""],
            KeyFormat::WithoutGid => rest.is_empty(),
        };
        if !trailing_ok {
            return Err(MessageError::TrailingText(rest.join(":")));
        }
        Ok(d)
    }
}

/// One side's bandwidth result (perftest `struct bw_report_data`, the fields that travel).
/// Units are those of the *sender's* flags: bandwidth in MiB/s (2^20 bytes per second) by
/// default or Gb/s (10^9 bits) with `--report_gbits`; message rate in Mpps.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    pub iters: u64,
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate_avg: f64,
    /// Only exchanged with `--report-per-port`.
    pub bw_avg_p1: f64,
    pub msg_rate_avg_p1: f64,
    pub bw_avg_p2: f64,
    pub msg_rate_avg_p2: f64,
}

/// Number of 8-byte report fields on the wire.
pub const fn report_fields(per_port: bool) -> usize {
    if per_port { 9 } else { 5 }
}

impl BwReport {
    /// The report fields in wire order (`xchg_bw_reports`): size (`unsigned long`, 8 bytes
    /// on LP64), iters (8 bytes for peers ≥ 5.33), bw_peak, bw_avg, msgRate_avg, then with
    /// per-port reports bw_avg_p1, msgRate_avg_p1, bw_avg_p2, msgRate_avg_p2. Each is sent
    /// big-endian: `hton_long` and `hton_double` byte-swap all 8 bytes on little-endian
    /// hosts, which for a double is its IEEE-754 bits in big-endian order.
    pub fn encode_fields(&self, per_port: bool) -> Vec<[u8; 8]> {
        let mut v = vec![
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate_avg.to_bits().to_be_bytes(),
        ];
        if per_port {
            v.extend([
                self.bw_avg_p1.to_bits().to_be_bytes(),
                self.msg_rate_avg_p1.to_bits().to_be_bytes(),
                self.bw_avg_p2.to_bits().to_be_bytes(),
                self.msg_rate_avg_p2.to_bits().to_be_bytes(),
            ]);
        }
        v
    }

    /// The inverse of [`BwReport::encode_fields`]; fields not present stay 0.
    pub fn decode_fields(fields: &[[u8; 8]]) -> BwReport {
        let int = |i: usize| fields.get(i).map_or(0, |b| u64::from_be_bytes(*b));
        let dbl = |i: usize| f64::from_bits(int(i));
        BwReport {
            size: int(0),
            iters: int(1),
            bw_peak: dbl(2),
            bw_avg: dbl(3),
            msg_rate_avg: dbl(4),
            bw_avg_p1: dbl(5),
            msg_rate_avg_p1: dbl(6),
            bw_avg_p2: dbl(7),
            msg_rate_avg_p2: dbl(8),
        }
    }
}

/// Our version message: [`VERSION`] NUL-padded to 16 bytes, as `strncpy` leaves it.
pub fn version_message() -> [u8; VERSION_LEN] {
    c_buffer::<VERSION_LEN>(VERSION).unwrap_or([0; VERSION_LEN])
}

/// The peer's version text and its value as perftest's `atof` reads it (the leading
/// `digits[.digits]`).
pub fn parse_version(msg: &[u8]) -> Result<(String, f64), MessageError> {
    let text = c_text(msg)?;
    let t = text.trim_start();
    let int_len = t.bytes().take_while(u8::is_ascii_digit).count();
    let mut end = int_len;
    if t.as_bytes().get(end) == Some(&b'.') {
        end += 1 + t[end + 1..].bytes().take_while(u8::is_ascii_digit).count();
    }
    let not_number = || MessageError::NotNumber {
        field: "version",
        text: text.to_owned(),
    };
    if int_len == 0 {
        return Err(not_number());
    }
    let value: f64 = t[..end].parse().map_err(|_| not_number())?;
    Ok((text.to_owned(), value))
}

/// The `enum ibv_mtu` code of a path MTU in bytes: 256 → 1 … 4096 → 5.
pub fn mtu_code(bytes: u32) -> Option<u8> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// The path MTU in bytes of an `enum ibv_mtu` code.
pub fn mtu_bytes(code: u8) -> Option<u32> {
    match code {
        1..=5 => Some(128 << code),
        _ => None,
    }
}

/// The MTU message: `sprintf(cur, "%d", curr_mtu)` of the enum code, sent as 2 bytes
/// (`sizeof(char[2])`): the digit and the NUL.
pub fn mtu_message(code: u8) -> [u8; 2] {
    [b'0' + code % 10, 0]
}

/// The peer's MTU code as `strtol(rem, NULL, 10)` reads it: decimal digits up to the NUL.
pub fn parse_mtu_message(msg: &[u8; 2]) -> Result<u32, MessageError> {
    let digits: Vec<u8> = msg.iter().copied().take_while(|&b| b != 0).collect();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(MessageError::NotNumber {
            field: "mtu",
            text: String::from_utf8_lossy(msg).into_owned(),
        });
    }
    Ok(digits
        .iter()
        .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0')))
}

/// The MTU both sides end up with (`check_mtu`): the peer's if it is a valid code smaller
/// than ours, else ours.
pub fn agreed_mtu_code(ours: u8, peer: u32) -> u8 {
    match u8::try_from(peer) {
        Ok(p) if (1..=5).contains(&p) && ours > p => p,
        _ => ours,
    }
}

/// Which perftest bandwidth test runs; they differ in the order of the hand shakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwTest {
    /// ib_write_bw (write_bw.c)
    Write,
    /// ib_read_bw (read_bw.c)
    Read,
    /// ib_send_bw (send_bw.c)
    Send,
    /// ib_atomic_bw (atomic_bw.c)
    Atomic,
}

/// Who opened the TCP connection: the side given a server name is the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// What we announce and how long we wait.
#[derive(Clone, Debug)]
pub struct Config {
    pub test: BwTest,
    pub key_format: KeyFormat,
    /// Our active path MTU in bytes (256..4096), as perftest sends `set_mtu()`'s result.
    pub mtu: u32,
    /// perftest `cycle_buffer`: the page size (`sysconf(_SC_PAGESIZE)`) unless changed.
    pub cycle_buffer: u32,
    /// perftest `cache_line_size`: L1 data cache line, 64 by default.
    pub cache_line_size: u32,
    /// `--report-per-port`: 4 more report fields.
    pub report_per_port: bool,
    /// `-a`: send_bw syncs after every message size, see [`Session::end_run`].
    pub all_sizes: bool,
    /// Deadline for reads the peer answers at once.
    pub io_timeout: Duration,
    /// Deadline for reads that wait for the peer's test run to end (must exceed the test).
    pub test_timeout: Duration,
}

impl Config {
    /// The defaults perftest uses on a RoCE port with a 4 KiB page and 64-byte lines.
    pub fn new(test: BwTest) -> Config {
        Config {
            test,
            key_format: KeyFormat::WithGid,
            mtu: 1024,
            cycle_buffer: 4096,
            cache_line_size: 64,
            report_per_port: false,
            all_sizes: false,
            io_timeout: DEFAULT_TIMEOUT,
            test_timeout: Duration::from_secs(600),
        }
    }
}

/// What the first exchanges settled.
#[derive(Clone, Debug, PartialEq)]
pub struct Negotiated {
    /// The peer's version text, e.g. "6.06".
    pub peer_version: String,
    /// The larger of both cycle buffers: the peer cycles its remote addresses over this
    /// many bytes from the `vaddr` we announce (perftest `increase_rem_addr`).
    pub cycle_buffer: u32,
    /// The larger of both cache line sizes: the peer's address step for small messages.
    pub cache_line_size: u32,
    /// The path MTU both sides use, in bytes.
    pub mtu: u32,
    /// The MTU code the peer sent, as it sent it.
    pub peer_mtu_code: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Versions done; the first per-QP key round is next.
    Keys,
    /// First key round done; the caller connects its QPs, then `finish_setup`.
    Connecting,
    /// Set up; a run may start or the session may finish.
    Ready,
    /// Between `start_run` and `end_run`.
    Running,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Keys => "waiting for the first key exchange",
            State::Connecting => "waiting for finish_setup after the first key exchange",
            State::Ready => "ready for a run or finish",
            State::Running => "in a run",
        }
    }
}

/// The client side: connects, then exchanges versions, system data and MTU.
pub struct Client;

impl Client {
    pub fn connect<A: ToSocketAddrs + std::fmt::Debug>(
        addr: A,
        config: Config,
    ) -> Result<Session, Error> {
        check_config(&config)?;
        let link = Link::connect(addr, config.io_timeout)?;
        Session::open(link, Role::Client, config)
    }
}

/// The server side: a listening socket; each accepted client gets a [`Session`].
pub struct Server {
    listener: TcpListener,
}

impl Server {
    /// Listens on `addr`, e.g. `"0.0.0.0:18515"` (perftest 4.5 clients connect over IPv4).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> std::io::Result<Server> {
        Ok(Server {
            listener: TcpListener::bind(addr)?,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits for one client (without a deadline, like perftest), then exchanges versions,
    /// system data and MTU.
    pub fn accept(&self, config: Config) -> Result<Session, Error> {
        check_config(&config)?;
        let (stream, _) = self.listener.accept().map_err(|source| Error::Io {
            step: "accept",
            source,
        })?;
        let link = Link::from_stream(stream, config.io_timeout)?;
        Session::open(link, Role::Server, config)
    }
}

fn check_config(config: &Config) -> Result<(), Error> {
    if mtu_code(config.mtu).is_none() {
        return Err(Error::Usage(format!(
            "MTU {} is not one of 256, 512, 1024, 2048, 4096",
            config.mtu
        )));
    }
    for (name, v) in [
        ("cycle buffer", config.cycle_buffer),
        ("cache line size", config.cache_line_size),
    ] {
        if v == 0 || v > i32::MAX as u32 {
            return Err(Error::Usage(format!(
                "{name} {v} is not a positive 32-bit int"
            )));
        }
    }
    Ok(())
}

/// One perftest connection after the version, system-data and MTU exchanges. Call, in
/// this order, on both sides:
/// [`exchange_keys`](Session::exchange_keys) → connect the QPs →
/// [`finish_setup`](Session::finish_setup) → for each message size
/// { [`start_run`](Session::start_run) → traffic → [`end_run`](Session::end_run) } →
/// [`finish`](Session::finish). The session refuses calls out of this order. A perftest
/// server of write/read/atomic runs no traffic; ours may skip the runs too.
pub struct Session {
    link: Link,
    role: Role,
    config: Config,
    negotiated: Negotiated,
    state: State,
    qps: usize,
    my_qp0: PerftestDest,
    runs: u32,
}

impl Session {
    fn open(link: Link, role: Role, config: Config) -> Result<Session, Error> {
        let mut s = Session {
            link,
            role,
            negotiated: Negotiated {
                peer_version: String::new(),
                cycle_buffer: config.cycle_buffer,
                cache_line_size: config.cache_line_size,
                mtu: config.mtu,
                peer_mtu_code: 0,
            },
            config,
            state: State::Keys,
            qps: 0,
            my_qp0: PerftestDest::default(),
            runs: 0,
        };
        let io = s.config.io_timeout;

        // exchange_versions
        let mut peer = [0u8; VERSION_LEN];
        s.xchg("version", &version_message(), &mut peer, io)?;
        let (peer_version, value) = parse_version(&peer).map_err(|problem| Error::BadMessage {
            step: "version",
            problem,
            bytes: peer.to_vec(),
        })?;
        // check_version_compatibility. Being ≥ 5.70, the peer also passes the version
        // gates of the next steps: sys data (≥ 5.32), 2-byte MTU (≥ 5.31), 8-byte report
        // iterations (≥ 5.33).
        if value < MIN_PEER_VERSION {
            return Err(Error::IncompatibleVersion {
                peer: peer_version,
                minimum: MIN_PEER_VERSION_TEXT,
            });
        }
        s.negotiated.peer_version = peer_version;

        // check_sys_data: hton_int of each, the larger wins. The config check keeps ours
        // within i32, so the casts are exact.
        let mut b4 = [0u8; 4];
        let mine = (s.config.cycle_buffer as i32).to_be_bytes();
        s.xchg("cycle buffer", &mine, &mut b4, io)?;
        let peer_cycle = i32::from_be_bytes(b4);
        if peer_cycle > s.config.cycle_buffer as i32 {
            s.negotiated.cycle_buffer = peer_cycle as u32;
        }
        let mine = (s.config.cache_line_size as i32).to_be_bytes();
        s.xchg("cache line size", &mine, &mut b4, io)?;
        let peer_line = i32::from_be_bytes(b4);
        if peer_line > s.config.cache_line_size as i32 {
            s.negotiated.cache_line_size = peer_line as u32;
        }

        // check_mtu
        let ours = mtu_code(s.config.mtu).unwrap_or(3);
        let mut b2 = [0u8; 2];
        s.xchg("mtu", &mtu_message(ours), &mut b2, io)?;
        let peer_code = parse_mtu_message(&b2).map_err(|problem| Error::BadMessage {
            step: "mtu",
            problem,
            bytes: b2.to_vec(),
        })?;
        s.negotiated.peer_mtu_code = peer_code;
        s.negotiated.mtu = mtu_bytes(agreed_mtu_code(ours, peer_code)).unwrap_or(s.config.mtu);
        Ok(s)
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Number of runs ended so far.
    pub fn runs(&self) -> u32 {
        self.runs
    }

    /// The first key round, one message per QP (`ctx_hand_shake` in the first loop of each
    /// test's main). Returns the peer's values, QP by QP; connect the QPs with them.
    pub fn exchange_keys(&mut self, mine: &[PerftestDest]) -> Result<Vec<PerftestDest>, Error> {
        self.expect("exchange_keys", State::Keys)?;
        if mine.is_empty() {
            return Err(Error::Usage("perftest needs at least one QP".into()));
        }
        let io = self.config.io_timeout;
        let remote = mine
            .iter()
            .map(|d| self.hand_shake("keys", d, io))
            .collect::<Result<Vec<_>, _>>()?;
        self.qps = mine.len();
        self.my_qp0 = mine[0];
        self.state = State::Connecting;
        Ok(remote)
    }

    /// After the QPs are in RTS: the second key round (one message per QP; the peer takes
    /// the rkeys and addresses it targets from this round) and the "after RTR" sync, in
    /// the order the test uses. Returns the peer's values of the second round.
    ///
    /// The QPs and the memory behind the announced rkeys must be ready before this call:
    /// a perftest client of write/read/atomic starts its traffic as soon as the sync
    /// returns on its side.
    pub fn finish_setup(&mut self, mine: &[PerftestDest]) -> Result<Vec<PerftestDest>, Error> {
        self.expect("finish_setup", State::Connecting)?;
        if mine.len() != self.qps {
            return Err(Error::Usage(format!(
                "finish_setup got {} QPs, the first key exchange had {}",
                mine.len(),
                self.qps
            )));
        }
        let io = self.config.io_timeout;
        self.my_qp0 = mine[0];
        let remote = if self.config.test == BwTest::Send {
            // send_bw.c main: hand shake right after ctx_connect, then the second round.
            self.hand_shake("sync after RTR", &mine[0], io)?;
            self.key_round("keys again", mine)?
        } else {
            // write_bw.c / read_bw.c / atomic_bw.c main: second round, then "an additional
            // handshake is required after moving qp to RTR".
            let r = self.key_round("keys again", mine)?;
            self.hand_shake("sync after RTR", &mine[0], io)?;
            r
        };
        self.state = State::Ready;
        Ok(remote)
    }

    /// Before the traffic of one message size. send_bw syncs here; the other tests
    /// exchange nothing. A send_bw server must post its receives before this call (perftest
    /// `ctx_set_recv_wqes` precedes the hand shake): the client sends as soon as the sync
    /// returns.
    pub fn start_run(&mut self) -> Result<(), Error> {
        self.expect("start_run", State::Ready)?;
        if self.config.test == BwTest::Send {
            if !self.config.all_sizes && self.runs >= 1 {
                return Err(Error::OutOfOrder {
                    step: "start_run",
                    state: "done with the single run of a test without -a",
                });
            }
            let qp0 = self.my_qp0;
            self.hand_shake("sync before run", &qp0, self.config.io_timeout)?;
        }
        self.state = State::Running;
        Ok(())
    }

    /// After the traffic of one message size. send_bw with `-a` syncs here (send_bw.c
    /// `RUN_ALL` loop); nothing else exchanges anything.
    pub fn end_run(&mut self) -> Result<(), Error> {
        self.expect("end_run", State::Running)?;
        if self.config.test == BwTest::Send && self.config.all_sizes {
            let qp0 = self.my_qp0;
            self.hand_shake("sync after run", &qp0, self.config.test_timeout)?;
        }
        self.runs += 1;
        self.state = State::Ready;
        Ok(())
    }

    /// Ends the session. write/read/atomic: sync after the test, exchange reports (ours is
    /// `mine`; a perftest server sends whatever its report holds, the client ignores it),
    /// then close; returns the peer's report. send: close only, returns `None`.
    pub fn finish(mut self, mine: &BwReport) -> Result<Option<BwReport>, Error> {
        self.expect("finish", State::Ready)?;
        let qp0 = self.my_qp0;
        let wait = self.config.test_timeout;
        if self.config.test == BwTest::Send {
            if self.runs == 0 {
                return Err(Error::OutOfOrder {
                    step: "finish",
                    state: "before the run send_bw's peer waits for",
                });
            }
            self.close(wait)?;
            return Ok(None);
        }
        // The server waits here for the whole of the client's test.
        self.hand_shake("sync after test", &qp0, wait)?;
        let io = self.config.io_timeout;
        let mut theirs = Vec::new();
        for field in mine.encode_fields(self.config.report_per_port) {
            let mut b = [0u8; 8];
            self.xchg("reports", &field, &mut b, io)?;
            theirs.push(b);
        }
        self.close(io)?;
        Ok(Some(BwReport::decode_fields(&theirs)))
    }

    /// `ctx_close_connection`: a last sync, then `"done"`, then close. Nobody reads
    /// "done" (and perftest HEAD no longer sends it), so the peer's is drained, not
    /// checked.
    fn close(mut self, timeout: Duration) -> Result<(), Error> {
        let qp0 = self.my_qp0;
        self.hand_shake("close", &qp0, timeout)?;
        self.link.send_final("done", DONE)?;
        self.link.close_gracefully(self.config.io_timeout);
        Ok(())
    }

    fn key_round(
        &mut self,
        step: &'static str,
        mine: &[PerftestDest],
    ) -> Result<Vec<PerftestDest>, Error> {
        let io = self.config.io_timeout;
        mine.iter().map(|d| self.hand_shake(step, d, io)).collect()
    }

    fn expect(&self, step: &'static str, want: State) -> Result<(), Error> {
        if self.state == want {
            Ok(())
        } else {
            Err(Error::OutOfOrder {
                step,
                state: self.state.name(),
            })
        }
    }

    /// `ctx_xchg_data_ethernet`: the client writes then reads, the server reads then writes.
    fn xchg(
        &mut self,
        step: &'static str,
        mine: &[u8],
        theirs: &mut [u8],
        read_timeout: Duration,
    ) -> Result<(), Error> {
        match self.role {
            Role::Client => {
                self.link.send(step, mine)?;
                self.link.recv(step, theirs, read_timeout)
            }
            Role::Server => {
                self.link.recv(step, theirs, read_timeout)?;
                self.link.send(step, mine)
            }
        }
    }

    /// `ctx_hand_shake`: one key message each way, in the same lock-step.
    fn hand_shake(
        &mut self,
        step: &'static str,
        mine: &PerftestDest,
        read_timeout: Duration,
    ) -> Result<PerftestDest, Error> {
        let format = self.config.key_format;
        let mut buf = vec![0u8; format.wire_len()];
        self.xchg(step, &mine.encode(format), &mut buf, read_timeout)?;
        PerftestDest::decode(&buf, format).map_err(|problem| Error::BadMessage {
            step,
            problem,
            bytes: buf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PerftestDest {
        PerftestDest {
            lid: 0,
            out_reads: 0x80,
            qpn: Qpn::new(0x11),
            psn: Psn::new(0xabcdef),
            rkey: Rkey(0x1234),
            vaddr: 0x5555_d3b2_a000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
            srqn: 0,
        }
    }

    const SAMPLE_GID_TEXT: &[u8] = b"0000:0080:000011:abcdef:00001234:00005555d3b2a000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:c0:00:02:01:00000000:";

    #[test]
    fn golden_key_message_with_gid() {
        assert_eq!(SAMPLE_GID_TEXT.len(), KEY_MSG_LEN_GID - 1);
        let mut want = SAMPLE_GID_TEXT.to_vec();
        want.push(0);
        assert_eq!(sample().encode(KeyFormat::WithGid), want);
    }

    #[test]
    fn golden_key_message_without_gid() {
        let want: &[u8] = b"0000:0080:000011:abcdef:00001234:00005555d3b2a000:00000000\0";
        assert_eq!(want.len(), KEY_MSG_LEN);
        assert_eq!(sample().encode(KeyFormat::WithoutGid), want);
    }

    #[test]
    fn golden_key_message_maximum_values_keep_the_size() {
        let d = PerftestDest {
            lid: 0xffff,
            out_reads: 0xffff,
            qpn: Qpn::new(0xff_ffff),
            psn: Psn::new(0xff_ffff),
            rkey: Rkey(u32::MAX),
            vaddr: u64::MAX,
            gid: [0xff; 16],
            srqn: u32::MAX,
        };
        for f in [KeyFormat::WithGid, KeyFormat::WithoutGid] {
            let m = d.encode(f);
            assert_eq!(m.len(), f.wire_len());
            assert_eq!(m.iter().position(|&b| b == 0), Some(f.wire_len() - 1));
            assert_eq!(PerftestDest::decode(&m, f), Ok(d_for(f, d)));
        }
    }

    /// `d` as the format carries it (no GID without GID).
    fn d_for(f: KeyFormat, mut d: PerftestDest) -> PerftestDest {
        if f == KeyFormat::WithoutGid {
            d.gid = [0; 16];
        }
        d
    }

    #[test]
    fn key_decode_reads_back_encode() {
        for f in [KeyFormat::WithGid, KeyFormat::WithoutGid] {
            let m = sample().encode(f);
            assert_eq!(PerftestDest::decode(&m, f), Ok(d_for(f, sample())));
        }
    }

    #[test]
    fn key_decode_malformed_messages_are_errors() {
        let f = KeyFormat::WithGid;
        let good = sample().encode(f);
        // Short: the message cut before its NUL.
        assert_eq!(
            PerftestDest::decode(&good[..50], f),
            Err(MessageError::MissingNul)
        );
        // A GID message read as the short format has text after srqn.
        assert!(matches!(
            PerftestDest::decode(&good, KeyFormat::WithoutGid),
            Err(MessageError::OutOfRange { field: "srqn", .. })
                | Err(MessageError::TrailingText(_))
        ));
        // Non-hex field.
        let mut m = good.clone();
        m[7] = b'z';
        assert_eq!(
            PerftestDest::decode(&m, f),
            Err(MessageError::NotHex {
                field: "out_reads",
                text: "00z0".into()
            })
        );
        // Missing colons: the message collapses into fewer fields.
        let no_colons: Vec<u8> = good.iter().copied().filter(|&b| b != b':').collect();
        assert!(matches!(
            PerftestDest::decode(&no_colons, f),
            Err(MessageError::NotHex { field: "lid", .. })
        ));
        let mut m = good.clone();
        let last_colon = m.iter().rposition(|&b| b == b':').unwrap();
        m[last_colon] = 0;
        assert_eq!(
            PerftestDest::decode(&m, f),
            Err(MessageError::MissingField("final ':'"))
        );
        // Text after the trailing colon.
        let mut text = SAMPLE_GID_TEXT.to_vec();
        text.extend_from_slice(b"7\0");
        assert_eq!(
            PerftestDest::decode(&text, f),
            Err(MessageError::TrailingText("7".into()))
        );
        // GID byte out of range.
        let t = String::from_utf8(SAMPLE_GID_TEXT.to_vec())
            .unwrap()
            .replacen(":ff:ff:", ":ff:1ff:", 1)
            + "\0";
        assert_eq!(
            PerftestDest::decode(t.as_bytes(), f),
            Err(MessageError::OutOfRange {
                field: "gid",
                value: 0x1ff,
                max: 0xff
            })
        );
        // Too few GID bytes.
        let t = "0000:0080:000011:abcdef:00001234:00005555d3b2a000:00:00\0";
        assert_eq!(
            PerftestDest::decode(t.as_bytes(), f),
            Err(MessageError::MissingField("gid"))
        );
    }

    #[test]
    fn key_decode_refuses_truncated_and_damaged_messages() {
        for f in [KeyFormat::WithGid, KeyFormat::WithoutGid] {
            let good = sample().encode(f);
            // The form without a GID carries none: it reads back with a zero GID.
            let want = PerftestDest::decode(&good, f);
            assert!(want.is_ok(), "{f:?}: {want:?}");
            let nul = good.iter().position(|&b| b == 0).unwrap();
            for n in 0..=nul {
                assert_eq!(
                    PerftestDest::decode(&good[..n], f),
                    Err(MessageError::MissingNul),
                    "{f:?}, {n} bytes"
                );
            }
            for i in 0..good.len() {
                for b in [0u8, b':', b'g', 0x80] {
                    let mut m = good.clone();
                    m[i] = b;
                    let got = PerftestDest::decode(&m, f);
                    let at = format!("{f:?}, byte {i} = {b:#x}: {got:?}");
                    if m == good || i > nul {
                        // Unchanged, or only the padding after the first NUL changed.
                        assert_eq!(got, want, "{at}");
                        continue;
                    }
                    match (b, i == nul) {
                        (0x80, false) => assert_eq!(got, Err(MessageError::NotText), "{at}"),
                        (b'g', false) => {
                            assert!(matches!(got, Err(MessageError::NotHex { .. })), "{at}")
                        }
                        // A NUL shortens the text: only the last field's leading zeros may
                        // go (strtol reads "0000" as 0, as the C peer does); anything
                        // else is refused, never read as another value.
                        (0, false) => assert!(got.is_err() || got == want, "{at}"),
                        _ => assert!(got.is_err(), "{at}"),
                    }
                }
            }
        }
    }

    #[test]
    fn golden_version_message() {
        assert_eq!(&version_message(), b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(
            parse_version(&version_message()),
            Ok(("6.06".to_string(), 6.06))
        );
        assert_eq!(parse_version(b"5.70\0"), Ok(("5.70".to_string(), 5.70)));
        assert_eq!(parse_version(b"6\0"), Ok(("6".to_string(), 6.0)));
        assert!(matches!(
            parse_version(b"v6.06\0"),
            Err(MessageError::NotNumber { .. })
        ));
        assert!(matches!(
            parse_version(b"\0"),
            Err(MessageError::NotNumber { .. })
        ));
        assert_eq!(
            parse_version(b"6.0612345678901x"),
            Err(MessageError::MissingNul)
        );
    }

    #[test]
    fn golden_mtu_message_and_agreement() {
        assert_eq!(mtu_message(mtu_code(1024).unwrap()), *b"3\0");
        assert_eq!(mtu_message(mtu_code(4096).unwrap()), *b"5\0");
        assert_eq!(parse_mtu_message(b"3\0"), Ok(3));
        assert_eq!(parse_mtu_message(b"12"), Ok(12));
        assert!(parse_mtu_message(b"\0\0").is_err());
        assert!(parse_mtu_message(b"x\0").is_err());
        // The smaller valid code wins; an invalid peer code leaves ours.
        assert_eq!(agreed_mtu_code(5, 3), 3);
        assert_eq!(agreed_mtu_code(3, 5), 3);
        assert_eq!(agreed_mtu_code(3, 0), 3);
        assert_eq!(agreed_mtu_code(3, 9), 3);
        for b in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_code(b).unwrap()), Some(b));
        }
        assert_eq!(mtu_code(1500), None);
    }

    #[test]
    fn golden_report_fields_are_big_endian_ieee() {
        let r = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1.5,
            bw_avg: -2.0,
            msg_rate_avg: 0.25,
            bw_avg_p1: 1.0,
            msg_rate_avg_p1: 2.0,
            bw_avg_p2: 3.0,
            msg_rate_avg_p2: 4.0,
        };
        let f = r.encode_fields(false);
        assert_eq!(f.len(), report_fields(false));
        assert_eq!(f[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(f[1], [0, 0, 0, 0, 0, 0, 0x13, 0x88]);
        // 1.5 = 0x3FF8_0000_0000_0000, -2.0 = 0xC000_…, 0.25 = 0x3FD0_…
        assert_eq!(f[2], [0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
        assert_eq!(f[3], [0xc0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(f[4], [0x3f, 0xd0, 0, 0, 0, 0, 0, 0]);
        let back = BwReport::decode_fields(&f);
        assert_eq!(
            back,
            BwReport {
                bw_avg_p1: 0.0,
                msg_rate_avg_p1: 0.0,
                bw_avg_p2: 0.0,
                msg_rate_avg_p2: 0.0,
                ..r
            }
        );
        let f = r.encode_fields(true);
        assert_eq!(f.len(), report_fields(true));
        assert_eq!(f[8], [0x40, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(BwReport::decode_fields(&f), r);
    }

    #[test]
    fn all_sizes_rc_are_2_to_8_mib() {
        let v: Vec<u64> = all_sizes_rc().collect();
        assert_eq!(v.len(), 23);
        assert_eq!(v.first(), Some(&2));
        assert_eq!(v.last(), Some(&(8 << 20)));
    }
}

//! Out-of-band (TCP) exchanges of the standard RDMA test tools, so that `xrnic rc-pingpong`
//! and `xrnic perf …` can pair with the stock `ibv_rc_pingpong` (rdma-core 44.0) and the
//! perftest 4.5-0.17 bandwidth tests (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`,
//! `ib_atomic_bw`) running on Linux rxe.
//!
//! Before any RDMA traffic these tools exchange QP numbers, PSNs, GIDs, rkeys, addresses,
//! versions, MTU and bandwidth reports over one TCP connection (port 18515 by default).
//! This module speaks those exchanges byte for byte; it knows nothing about queue pairs or
//! the data path: the caller gives the values it announces and gets the peer's values back.
//!
//! Contract:
//! - Wire messages are produced and parsed by [`pingpong::PingpongDest`],
//!   [`perftest::PerftestDest`] and [`perftest::BwReport`]: fixed-size, NUL-terminated
//!   printf-style text (or big-endian binary for the reports), exactly as the C tools send
//!   them. Decoding never panics; a malformed message is a [`MessageError`] value.
//! - The exchange state machines ([`pingpong::client_exchange`], [`pingpong::Server`],
//!   [`perftest::Client`], [`perftest::Server`], [`perftest::Session`]) follow the exact
//!   order of writes and reads of the C tools (the client writes first, the server reads
//!   first, lock-step), send every message with a single `write` (the C peers read each
//!   message with one `read` of its exact size), and refuse to run steps out of order.
//! - Every read has a deadline: a peer that stalls gives [`Error::Timeout`], a peer that
//!   goes away gives [`Error::PeerClosed`], and both carry the bytes received so far.
//!   Only `accept` waits without a deadline, as the C servers do.
//!
//! The message sequences, with citations of the C sources, are in `docs/oob.md`.

mod link;
pub mod perftest;
pub mod pingpong;

use core::fmt;
use std::io;
use std::time::Duration;

/// The TCP port both ibv_rc_pingpong and perftest use by default.
pub const DEFAULT_PORT: u16 = 18515;

/// The read deadline used when the caller does not choose one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What is wrong with one received message (the text or bytes the peer sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageError {
    /// The message has no NUL terminator inside its fixed-size buffer.
    MissingNul,
    /// The text before the NUL is not printable ASCII.
    NotText,
    /// A `:`-separated field is absent.
    MissingField(&'static str),
    /// A field is not 1..=16 hexadecimal digits.
    NotHex { field: &'static str, text: String },
    /// A field holds a number too large for what it names (e.g. a 24-bit QPN).
    OutOfRange {
        field: &'static str,
        value: u64,
        max: u64,
    },
    /// A field is not a decimal number where one is expected (version, MTU).
    NotNumber { field: &'static str, text: String },
    /// Text after the last expected field.
    TrailingText(String),
    /// The message is not the one this step expects (e.g. "done").
    Unexpected { expected: &'static str },
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageError::MissingNul => write!(f, "no NUL terminator in the message"),
            MessageError::NotText => write!(f, "the message is not printable ASCII text"),
            MessageError::MissingField(name) => write!(f, "field `{name}` is missing"),
            MessageError::NotHex { field, text } => {
                write!(f, "field `{field}` is not hexadecimal: {text:?}")
            }
            MessageError::OutOfRange { field, value, max } => {
                write!(f, "field `{field}` = {value:#x} exceeds {max:#x}")
            }
            MessageError::NotNumber { field, text } => {
                write!(f, "field `{field}` is not a decimal number: {text:?}")
            }
            MessageError::TrailingText(t) => {
                write!(f, "unexpected text after the last field: {t:?}")
            }
            MessageError::Unexpected { expected } => write!(f, "expected {expected}"),
        }
    }
}

impl std::error::Error for MessageError {}

/// Why an out-of-band exchange failed. Each variant names the step (`"version"`, `"keys"`,
/// `"sync after test"`, …) so that a failed interop run says where the peers diverged.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No TCP connection to the peer (refused: nobody listens; unreachable; timed out).
    Connect { addr: String, source: io::Error },
    /// A socket error during a step.
    Io {
        step: &'static str,
        source: io::Error,
    },
    /// The peer sent nothing (or not all of a message) before the deadline.
    Timeout {
        step: &'static str,
        waited: Duration,
        expected: usize,
        received: Vec<u8>,
    },
    /// The peer closed the connection before sending a whole message.
    PeerClosed {
        step: &'static str,
        expected: usize,
        received: Vec<u8>,
    },
    /// The peer sent a whole message that does not parse.
    BadMessage {
        step: &'static str,
        problem: MessageError,
        bytes: Vec<u8>,
    },
    /// The perftest peer announces a version older than the one the version we speak
    /// accepts (perftest `check_version_compatibility`).
    IncompatibleVersion { peer: String, minimum: &'static str },
    /// A session method was called in a state where the peer does not expect it.
    OutOfOrder {
        step: &'static str,
        state: &'static str,
    },
    /// The caller passed arguments the exchange cannot carry (e.g. no QP, an MTU that is
    /// not 256..4096).
    Usage(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connect { addr, source } => write!(f, "cannot connect to {addr}: {source}"),
            Error::Io { step, source } => write!(f, "socket error during `{step}`: {source}"),
            Error::Timeout {
                step,
                waited,
                expected,
                received,
            } => write!(
                f,
                "peer silent during `{step}`: {} of {expected} bytes after {:?}: b\"{}\"",
                received.len(),
                waited,
                received.escape_ascii()
            ),
            Error::PeerClosed {
                step,
                expected,
                received,
            } => write!(
                f,
                "peer closed the connection during `{step}` after {} of {expected} bytes: b\"{}\"",
                received.len(),
                received.escape_ascii()
            ),
            Error::BadMessage {
                step,
                problem,
                bytes,
            } => write!(
                f,
                "bad message during `{step}`: {problem}: b\"{}\"",
                bytes.escape_ascii()
            ),
            Error::IncompatibleVersion { peer, minimum } => write!(
                f,
                "peer perftest version {peer:?} is older than {minimum}, which the version we \
                 speak refuses"
            ),
            Error::OutOfOrder { step, state } => {
                write!(f, "`{step}` is not the next exchange (session is {state})")
            }
            Error::Usage(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connect { source, .. } | Error::Io { source, .. } => Some(source),
            Error::BadMessage { problem, .. } => Some(problem),
            _ => None,
        }
    }
}

/// The text of a fixed-size C string buffer: everything before the first NUL, which must
/// exist (the C tools always send the terminator) and be printable ASCII.
fn c_text(buf: &[u8]) -> Result<&str, MessageError> {
    let end = buf
        .iter()
        .position(|&b| b == 0)
        .ok_or(MessageError::MissingNul)?;
    let text = &buf[..end];
    if !text.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return Err(MessageError::NotText);
    }
    // Checked ASCII above, so this cannot fail; map instead of unwrap all the same.
    core::str::from_utf8(text).map_err(|_| MessageError::NotText)
}

/// A hexadecimal field as the C peers' `strtol(…, 16)` / `sscanf("%x")` read it, but
/// strict: 1..=16 digits, no sign, no `0x`, and at most `max`.
fn hex_field(text: Option<&str>, field: &'static str, max: u64) -> Result<u64, MessageError> {
    let text = text.ok_or(MessageError::MissingField(field))?;
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(MessageError::NotHex {
            field,
            text: text.to_owned(),
        });
    }
    let value = u64::from_str_radix(text, 16).map_err(|_| MessageError::NotHex {
        field,
        text: text.to_owned(),
    })?;
    if value > max {
        return Err(MessageError::OutOfRange { field, value, max });
    }
    Ok(value)
}

/// `text` copied into a zero-filled buffer of `N` bytes; the NUL terminator and the C
/// padding come from the zero fill. Returns `None` when the text does not fit with its NUL.
fn c_buffer<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut buf = [0u8; N];
    if text.len() >= N {
        return None;
    }
    buf[..text.len()].copy_from_slice(text.as_bytes());
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_text_stops_at_the_first_nul_and_requires_one() {
        assert_eq!(c_text(b"6.06\0\0\0junk"), Ok("6.06"));
        assert_eq!(c_text(b"6.06"), Err(MessageError::MissingNul));
        assert_eq!(c_text(b"6.\x0106\0"), Err(MessageError::NotText));
    }

    #[test]
    fn hex_field_is_strict_about_digits_and_range() {
        assert_eq!(hex_field(Some("00ff"), "lid", 0xffff), Ok(0xff));
        assert_eq!(
            hex_field(Some("1000000"), "qpn", 0xff_ffff),
            Err(MessageError::OutOfRange {
                field: "qpn",
                value: 0x100_0000,
                max: 0xff_ffff
            })
        );
        for bad in ["", "0x12", "-1", "12g4", "00000000000000000"] {
            assert!(
                matches!(
                    hex_field(Some(bad), "f", u64::MAX),
                    Err(MessageError::NotHex { .. })
                ),
                "{bad:?} accepted"
            );
        }
        assert_eq!(
            hex_field(None, "psn", 1),
            Err(MessageError::MissingField("psn"))
        );
    }

    #[test]
    fn c_buffer_pads_with_nul_and_refuses_overflow() {
        assert_eq!(c_buffer::<5>("done"), Some(*b"done\0"));
        assert_eq!(c_buffer::<4>("done"), None);
        assert_eq!(c_buffer::<8>("ab"), Some(*b"ab\0\0\0\0\0\0"));
    }

    #[test]
    fn errors_show_the_bytes_received() {
        let e = Error::PeerClosed {
            step: "keys",
            expected: 108,
            received: b"0000:00\x01".to_vec(),
        };
        let s = e.to_string();
        assert!(s.contains("`keys`"), "{s}");
        assert!(s.contains("8 of 108"), "{s}");
        assert!(s.contains(r"0000:00\x01"), "{s}");
    }
}

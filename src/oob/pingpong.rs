//! The out-of-band exchange of `ibv_rc_pingpong` (rdma-core 44.0,
//! libibverbs/examples/rc_pingpong.c; unchanged at rdma-core HEAD).
//!
//! Sequence (one TCP connection, default port 18515):
//! 1. client → server: its [`PingpongDest`], 52 bytes (`pp_client_exch_dest`);
//! 2. the server moves its QP to RTR/RTS with the client's values, then
//!    server → client: its own [`PingpongDest`], 52 bytes (`pp_server_exch_dest`);
//! 3. client → server: `"done"` with its NUL, 5 bytes; both close.
//!
//! The server replies only after its QP is ready because the client starts sending as soon
//! as it has the reply; [`PendingReply`] makes the caller do the same: it gets the
//! client's values with [`Server::accept`], connects its QP, then calls
//! [`PendingReply::reply`].

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use super::link::Link;
use super::{DEFAULT_TIMEOUT, Error, MessageError, c_buffer, c_text, hex_field};
use crate::wire::{Psn, Qpn};

/// Size of the message buffer: `sizeof "0000:000000:000000:" + 32 GID digits`, i.e. 51
/// characters and the NUL (rc_pingpong.c `char msg[sizeof "0000:000000:000000:0000…"]`).
pub const MSG_LEN: usize = 52;

/// The closing message, sent by the client with its NUL (`write(sockfd, "done",
/// sizeof "done")`).
pub const DONE: &[u8; 5] = b"done\0";

/// What one side of ibv_rc_pingpong announces (rc_pingpong.c `struct pingpong_dest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PingpongDest {
    /// Port LID; 0 on RoCE.
    pub lid: u16,
    pub qpn: Qpn,
    /// The first PSN the announcing side will send (the peer's expected receive PSN).
    pub psn: Psn,
    /// The GID, in network byte order. All zero when ibv_rc_pingpong runs without `-g`.
    pub gid: [u8; 16],
}

impl PingpongDest {
    /// The message: `printf("%04x:%06x:%06x:%s", lid, qpn, psn, gid)` where the GID is
    /// 32 hex digits of its 16 bytes in order (pingpong.c `gid_to_wire_gid` prints each
    /// 32-bit word after `htobe32`, which on any host gives the bytes in memory order),
    /// NUL-padded to [`MSG_LEN`].
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut text = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn.value(),
            self.psn.value()
        );
        for b in self.gid {
            text.push_str(&format!("{b:02x}"));
        }
        // lid ≤ 0xffff, qpn and psn ≤ 0xffffff by their types: always 51 characters.
        c_buffer::<MSG_LEN>(&text).unwrap_or([0; MSG_LEN])
    }

    /// Parses a received message. Like the C `sscanf("%x:%x:%x:%s")` it accepts any width
    /// of the three numbers, but it requires exactly 32 hex digits of GID (what
    /// `wire_gid_to_gid` reads) and range-checks every field.
    pub fn decode(msg: &[u8]) -> Result<PingpongDest, MessageError> {
        let text = c_text(msg)?;
        let mut fields = text.split(':');
        let lid = hex_field(fields.next(), "lid", 0xffff)? as u16;
        let qpn = hex_field(fields.next(), "qpn", 0xff_ffff)?;
        let psn = hex_field(fields.next(), "psn", u64::from(Psn::MAX))?;
        let gid_text = fields.next().ok_or(MessageError::MissingField("gid"))?;
        if let Some(rest) = fields.next() {
            return Err(MessageError::TrailingText(rest.to_owned()));
        }
        Ok(PingpongDest {
            lid,
            qpn: Qpn::new(qpn as u32),
            psn: Psn::new(psn as u32),
            gid: parse_wire_gid(gid_text)?,
        })
    }

    /// True when rc_pingpong would address this peer through a GRH: it tests the GID's
    /// interface ID (bytes 8..16) for non-zero (`pp_connect_ctx`). RoCE needs a GRH, so a
    /// RoCE peer must run ibv_rc_pingpong with `-g <gid index>`.
    pub fn has_gid(&self) -> bool {
        self.gid[8..].iter().any(|&b| b != 0)
    }
}

fn parse_wire_gid(text: &str) -> Result<[u8; 16], MessageError> {
    let bad = || MessageError::NotHex {
        field: "gid",
        text: text.to_owned(),
    };
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut gid = [0u8; 16];
    for (i, byte) in gid.iter_mut().enumerate() {
        let pair = text.get(2 * i..2 * i + 2).ok_or_else(bad)?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(gid)
}

/// The client side: connects to an `ibv_rc_pingpong` server (or ours), sends `mine`,
/// returns the server's values after sending `"done"`. The caller then moves its QP to
/// RTR/RTS with them, as rc_pingpong's client does after the exchange.
pub fn client_exchange<A: ToSocketAddrs + std::fmt::Debug>(
    addr: A,
    mine: &PingpongDest,
    timeout: Duration,
) -> Result<PingpongDest, Error> {
    let mut link = Link::connect(addr, timeout)?;
    link.send("send local address", &mine.encode())?;
    let mut msg = [0u8; MSG_LEN];
    link.recv("read remote address", &mut msg, timeout)?;
    let remote = PingpongDest::decode(&msg).map_err(|problem| Error::BadMessage {
        step: "read remote address",
        problem,
        bytes: msg.to_vec(),
    })?;
    link.send("done", DONE)?;
    link.shutdown();
    Ok(remote)
}

/// The server side: a listening socket (the C server binds with `AI_PASSIVE`, address
/// family unspecified, and `SO_REUSEADDR`, which std sets on Unix too).
pub struct Server {
    listener: TcpListener,
    timeout: Duration,
}

impl Server {
    /// Listens on `addr`, e.g. `"0.0.0.0:18515"` or `"[::]:18515"`.
    pub fn bind<A: ToSocketAddrs>(addr: A) -> std::io::Result<Server> {
        Ok(Server {
            listener: TcpListener::bind(addr)?,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The deadline for each read after the client has connected.
    pub fn with_timeout(mut self, timeout: Duration) -> Server {
        self.timeout = timeout;
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits for one client (without a deadline, like the C server) and reads its values.
    pub fn accept(&self) -> Result<PendingReply, Error> {
        let (stream, _) = self.listener.accept().map_err(|source| Error::Io {
            step: "accept",
            source,
        })?;
        let mut link = Link::from_stream(stream, self.timeout)?;
        let mut msg = [0u8; MSG_LEN];
        link.recv("read remote address", &mut msg, self.timeout)?;
        let remote = PingpongDest::decode(&msg).map_err(|problem| Error::BadMessage {
            step: "read remote address",
            problem,
            bytes: msg.to_vec(),
        })?;
        Ok(PendingReply { link, remote })
    }
}

/// A client whose values have arrived and which waits for ours.
pub struct PendingReply {
    link: Link,
    remote: PingpongDest,
}

impl PendingReply {
    /// The client's values: move the QP to RTR/RTS with them before replying.
    pub fn remote(&self) -> &PingpongDest {
        &self.remote
    }

    /// Sends our values and waits for the client's `"done"`.
    pub fn reply(mut self, mine: &PingpongDest) -> Result<(), Error> {
        self.link.send("send local address", &mine.encode())?;
        let mut done = [0u8; DONE.len()];
        let timeout = self.link.io_timeout;
        self.link.recv("done", &mut done, timeout)?;
        self.link.shutdown();
        if &done != DONE {
            return Err(Error::BadMessage {
                step: "done",
                problem: MessageError::Unexpected {
                    expected: "\"done\\0\"",
                },
                bytes: done.to_vec(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PingpongDest {
        PingpongDest {
            lid: 0,
            qpn: Qpn::new(0x11),
            psn: Psn::new(0xabcdef),
            // fe80::5054:ff:fe12:3456
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56,
            ],
        }
    }

    #[test]
    fn golden_encoding_is_the_printf_text_nul_padded_to_52() {
        // printf("%04x:%06x:%06x:%s") with the GID as 32 hex digits, then the NUL.
        let expected = b"0000:000011:abcdef:fe80000000000000505400fffe123456\0";
        assert_eq!(expected.len(), MSG_LEN);
        assert_eq!(&sample().encode(), expected);
    }

    #[test]
    fn golden_ipv4_mapped_gid_and_maximum_values() {
        let d = PingpongDest {
            lid: 0xffff,
            qpn: Qpn::new(0xff_ffff),
            psn: Psn::new(0xff_ffff),
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
        };
        assert_eq!(
            &d.encode()[..],
            b"ffff:ffffff:ffffff:00000000000000000000ffffc0000201\0"
        );
    }

    #[test]
    fn decode_reads_back_what_encode_wrote() {
        let d = sample();
        assert_eq!(PingpongDest::decode(&d.encode()), Ok(d));
        assert!(d.has_gid());
        assert!(!PingpongDest::default().has_gid());
    }

    #[test]
    fn decode_accepts_what_sscanf_accepts_in_width() {
        // sscanf("%x") takes any width; a shorter field from a hand-written peer is fine.
        let msg = b"1:2:3:fe80000000000000505400fffe123456\0";
        let d = PingpongDest::decode(msg).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (1, Qpn::new(2), Psn::new(3)));
        // Bytes after the NUL are not looked at, as in C.
        let mut padded = sample().encode().to_vec();
        padded.extend_from_slice(b"junk");
        assert_eq!(PingpongDest::decode(&padded), Ok(sample()));
    }

    #[test]
    fn decode_malformed_messages_are_errors() {
        let cases: &[(&[u8], MessageError)] = &[
            (b"", MessageError::MissingNul),
            (
                b"0000:000011:abcdef:fe80000000000000505400fffe12345600",
                MessageError::MissingNul,
            ),
            (b"0000:000011\0", MessageError::MissingField("psn")),
            (b"0000:000011:abcdef\0", MessageError::MissingField("gid")),
            (
                b"000g:000011:abcdef:fe80000000000000505400fffe123456\0",
                MessageError::NotHex {
                    field: "lid",
                    text: "000g".into(),
                },
            ),
            (
                b"0000 000011 abcdef fe80000000000000505400fffe123456\0",
                MessageError::NotHex {
                    field: "lid",
                    text: "0000 000011 abcdef fe80000000000000505400fffe123456".into(),
                },
            ),
            (
                b"0000:1000000:abcdef:fe80000000000000505400fffe123456\0",
                MessageError::OutOfRange {
                    field: "qpn",
                    value: 0x100_0000,
                    max: 0xff_ffff,
                },
            ),
            (
                b"0000:000011:abcdef:fe80\0",
                MessageError::NotHex {
                    field: "gid",
                    text: "fe80".into(),
                },
            ),
            (
                b"0000:000011:abcdef:fe80000000000000505400fffe123456:7\0",
                MessageError::TrailingText("7".into()),
            ),
        ];
        for (msg, want) in cases {
            assert_eq!(
                PingpongDest::decode(msg).as_ref(),
                Err(want),
                "{}",
                msg.escape_ascii()
            );
        }
    }

    #[test]
    fn decode_refuses_truncated_and_damaged_messages() {
        let good = sample().encode();
        let nul = good.len() - 1;
        assert_eq!(good[nul], 0);
        for n in 0..good.len() {
            assert_eq!(
                PingpongDest::decode(&good[..n]),
                Err(MessageError::MissingNul),
                "{n} bytes"
            );
        }
        for i in 0..good.len() {
            for b in [0u8, b':', b'x', 0xff] {
                let mut m = good;
                m[i] = b;
                let got = PingpongDest::decode(&m);
                if m == good {
                    assert_eq!(got, Ok(sample()), "byte {i} unchanged");
                    continue;
                }
                match (b, i == nul) {
                    // The only NUL overwritten: no end of text.
                    (_, true) => assert_eq!(got, Err(MessageError::MissingNul), "byte {i}"),
                    (0xff, false) => assert_eq!(got, Err(MessageError::NotText), "byte {i}"),
                    (b'x', false) => assert!(
                        matches!(got, Err(MessageError::NotHex { .. })),
                        "byte {i} = 'x': {got:?}"
                    ),
                    // A NUL cuts a field short, a ':' splits one: always refused.
                    _ => assert!(got.is_err(), "byte {i} = {b:#x}: {got:?}"),
                }
            }
        }
    }
}

//! One TCP connection carrying fixed-size messages, with a deadline on every read.
//!
//! The C peers write each message with one `write()` and read it with one `read()` of the
//! exact size (rc_pingpong.c `pp_*_exch_dest`, perftest_communication.c
//! `ethernet_read_keys` / `ethernet_read_data`): a message split across TCP segments that
//! arrive apart would fail on their side. So [`Link::send`] hands each whole message to the
//! kernel in one call and sets `TCP_NODELAY`, so that Nagle never holds the tail of a
//! message back. Reads on our side loop until the message is complete or the deadline
//! passes; the deadline is measured from the start of the message, never reset by a
//! trickle of bytes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::Error;

pub(crate) struct Link {
    stream: TcpStream,
    /// Deadline for reads that the peer answers without doing other work first, and for
    /// writes.
    pub(crate) io_timeout: Duration,
}

impl Link {
    /// Connects to the first address of `addr` that accepts, each try bounded by `timeout`.
    pub(crate) fn connect<A: ToSocketAddrs + std::fmt::Debug>(
        addr: A,
        timeout: Duration,
    ) -> Result<Link, Error> {
        let name = format!("{addr:?}");
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|source| Error::Connect {
                addr: name.clone(),
                source,
            })?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name has no address");
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(stream) => return Link::from_stream(stream, timeout),
                Err(e) => last = e,
            }
        }
        Err(Error::Connect {
            addr: name,
            source: last,
        })
    }

    pub(crate) fn from_stream(stream: TcpStream, io_timeout: Duration) -> Result<Link, Error> {
        let setup = |source| Error::Io {
            step: "socket setup",
            source,
        };
        stream.set_nodelay(true).map_err(setup)?;
        stream
            .set_write_timeout(Some(nonzero(io_timeout)))
            .map_err(setup)?;
        Ok(Link { stream, io_timeout })
    }

    /// Writes one whole message.
    pub(crate) fn send(&mut self, step: &'static str, msg: &[u8]) -> Result<(), Error> {
        self.stream
            .write_all(msg)
            .map_err(|source| match source.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout {
                    step,
                    waited: self.io_timeout,
                    expected: msg.len(),
                    received: Vec::new(),
                },
                _ => Error::Io { step, source },
            })
    }

    /// Reads exactly `buf.len()` bytes within `timeout`.
    pub(crate) fn recv(
        &mut self,
        step: &'static str,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<(), Error> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut got = 0;
        while got < buf.len() {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    step,
                    waited: now - start,
                    expected: buf.len(),
                    received: buf[..got].to_vec(),
                });
            }
            self.stream
                .set_read_timeout(Some(nonzero(deadline - now)))
                .map_err(|source| Error::Io { step, source })?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(Error::PeerClosed {
                        step,
                        expected: buf.len(),
                        received: buf[..got].to_vec(),
                    });
                }
                Ok(n) => got += n,
                // SO_RCVTIMEO expiry shows up as EAGAIN; the loop head decides whether the
                // deadline has really passed.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                // A peer that dies with our data unread resets instead of closing.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    return Err(Error::PeerClosed {
                        step,
                        expected: buf.len(),
                        received: buf[..got].to_vec(),
                    });
                }
                Err(source) => return Err(Error::Io { step, source }),
            }
        }
        Ok(())
    }

    /// Best-effort last message: a peer that has already closed (perftest HEAD closes
    /// without reading; see docs/oob.md) must not turn a finished exchange into an error.
    pub(crate) fn send_final(&mut self, step: &'static str, msg: &[u8]) -> Result<(), Error> {
        match self.send(step, msg) {
            Err(Error::Io { source, .. })
                if matches!(
                    source.kind(),
                    io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    /// Ends our side after the last message: FIN, then read whatever the peer still sends
    /// (perftest 4.5 sends an unread "done") until it closes too, so that neither kernel
    /// answers unread data with a reset. Bounded by `timeout`; the outcome changes nothing.
    pub(crate) fn close_gracefully(&mut self, timeout: Duration) {
        let _ = self.stream.shutdown(Shutdown::Write);
        let deadline = Instant::now() + timeout;
        let mut sink = [0u8; 64];
        loop {
            let now = Instant::now();
            if now >= deadline
                || self
                    .stream
                    .set_read_timeout(Some(nonzero(deadline - now)))
                    .is_err()
            {
                break;
            }
            match self.stream.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    pub(crate) fn shutdown(&self) {
        // The peer may already be gone; there is nothing left to report either way.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Socket timeouts of zero mean "block forever" to the kernel and are refused by std.
fn nonzero(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

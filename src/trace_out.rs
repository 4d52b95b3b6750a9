//! `--trace FILE`: the engine's events (see [`crate::proto::trace`]) as JSON lines.
//!
//! Contract: [`json_lines`] builds a `tracing` subscriber (tracing-subscriber's JSON
//! formatter) that writes one flat JSON object per event to the file: the event's fields
//! (`now_ns`, `dev`, `qpn`, `ev`, and the fields of that kind) at the top level, no
//! wall-clock timestamp, level or target (virtual time is the only clock). Install it for a
//! run with `tracing::subscriber::with_default`; the file is flushed when the subscriber is
//! dropped at the end of the run. Without a subscriber the engine's hooks cost a
//! relaxed atomic load each. Reading a trace back, [`event_of`] gives a line's kind as an
//! [`Event`].

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::Mutex;

use crate::proto::trace::Event;

/// A subscriber writing the engine's events to `path` (created or truncated).
pub fn json_lines(path: &Path) -> Result<impl tracing::Subscriber + Send + Sync, String> {
    let f = File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    Ok(json_lines_to(Mutex::new(BufWriter::new(f))))
}

/// The same subscriber over any writer factory (tests use an in-memory buffer).
pub fn json_lines_to<W>(w: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(w)
        .finish()
}

/// The kind of one parsed trace line: its `ev` field read back as an [`Event`]; `None`
/// when the line has no `ev` or names no kind.
pub fn event_of(line: &serde_json::Value) -> Option<Event> {
    line["ev"].as_str()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON lines carry each kind's text in `ev`, and [`event_of`] reads it back.
    #[test]
    fn a_traced_event_reads_back_as_its_kind() {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let w = buf.clone();
        let qpn = crate::wire::Qpn::new(17);
        tracing::subscriber::with_default(json_lines_to(move || w.clone()), || {
            for &e in Event::ALL {
                crate::proto::trace::qp_event!(5u64, "A", qpn, e, psn = 3u32);
            }
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), Event::ALL.len(), "{text}");
        for (l, &e) in lines.iter().zip(Event::ALL) {
            assert_eq!(l["ev"], e.as_str(), "{l}");
            assert_eq!(event_of(l), Some(e), "{l}");
            assert_eq!(
                (l["now_ns"].as_u64(), l["qpn"].as_u64()),
                (Some(5), Some(17))
            );
        }
        assert_eq!(event_of(&serde_json::json!({"ev": "nope"})), None);
        assert_eq!(event_of(&serde_json::json!({"now_ns": 1})), None);
    }
}

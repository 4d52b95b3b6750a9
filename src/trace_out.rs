//! `--trace FILE`: the engine's events (see [`crate::proto::trace`]) as JSON lines.
//!
//! Contract: [`json_lines`] builds a `tracing` subscriber (tracing-subscriber's JSON
//! formatter) that writes one flat JSON object per event to the file: the event's fields
//! (`now_ns`, `dev`, `qpn`, `ev`, and the fields of that kind) at the top level, no
//! wall-clock timestamp, level or target (virtual time is the only clock). Install it for a
//! run with `tracing::subscriber::with_default`; the file is flushed when the subscriber is
//! dropped at the end of the run. Without a subscriber the engine's hooks cost a
//! relaxed atomic load each.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::Mutex;

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

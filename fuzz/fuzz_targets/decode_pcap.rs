//! Fuzz target `decode_pcap`: any bytes given to the capture reader (pcap or pcapng) give
//! frames or an error, never a panic; the frames then go through exactly what
//! `xrnic decode` does with them (`xrnic_cli::cli::decode::decode_frames`), in text and in JSON.
#![no_main]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::io;

use libfuzzer_sys::fuzz_target;
use xrnic::io::capture;
use xrnic_cli::cli::decode::{Format, decode_frames};

fuzz_target!(|data: &[u8]| {
    let frames = match capture::read_bytes(data) {
        Ok(f) => f,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.number, i + 1, "frame numbers are 1-based and dense");
    }
    for format in [Format::Text, Format::Json] {
        let sum =
            decode_frames(&frames, format, &mut io::sink()).expect("writing to a sink cannot fail");
        assert_eq!(sum.packets, frames.len(), "every frame is counted once");
    }
});

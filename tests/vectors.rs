//! The real captures in ../shared/vectors: every RoCE packet parses, has a valid ICRC, and
//! re-emits byte for byte.

use std::path::PathBuf;

use xrnic::io::capture;
use xrnic::wire::{Error, FrameRepr, FrameView};

/// The folder; the test using it is ignored where build.rs found it missing.
fn vectors_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors");
    assert!(d.is_dir(), "{} is missing", d.display());
    d
}

fn all_vector_files() -> Vec<PathBuf> {
    let d = vectors_dir();
    let mut v = Vec::new();
    for sub in std::fs::read_dir(&d).unwrap() {
        let sub = sub.unwrap().path();
        if sub.is_dir() {
            for f in std::fs::read_dir(&sub).unwrap() {
                v.push(f.unwrap().path());
            }
        }
    }
    v.sort();
    v
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn every_roce_packet_parses_verifies_and_reemits_exactly() {
    let files = all_vector_files();
    let mut roce = 0;
    for f in &files {
        for fr in capture::read_file(f).unwrap() {
            let view = match FrameView::parse(&fr.data) {
                Ok(v) => v,
                Err(Error::NotRoce(_)) => continue,
                Err(e) => panic!("{} frame {}: {e}", f.display(), fr.number),
            };
            roce += 1;
            view.verify_icrc()
                .unwrap_or_else(|e| panic!("{} #{}: {e}", f.display(), fr.number));
            let repr = view.repr();
            let mut out = vec![0xa5u8; repr.buffer_len()];
            let n = repr.emit(&mut out).unwrap();
            // Anything after the IP datagram is Ethernet padding, not ours to reproduce.
            assert_eq!(
                &out[..n],
                &fr.data[..n],
                "{} frame {}",
                f.display(),
                fr.number
            );
            assert!(
                fr.data[n..].iter().all(|b| *b == 0),
                "{} #{}",
                f.display(),
                fr.number
            );
            assert_eq!(FrameRepr::parse(&out).unwrap(), repr);
        }
    }
    if !files.is_empty() {
        assert!(roce >= 130, "only {roce} RoCE packets in the vectors");
    }
}

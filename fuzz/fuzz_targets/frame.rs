//! Fuzz target `frame`: any bytes given to `FrameView::parse` either fail with an error or
//! give a view whose accessors, ICRC check and `repr()` never panic; and the repr re-emits
//! into a frame that parses, carries a valid ICRC and gives back an equal repr. The same
//! bytes read as RoCE v1 (`V1View`, decode only) fail or give a view whose accessors and
//! transport check never panic.
#![no_main]
#![warn(clippy::undocumented_unsafe_blocks)]

use libfuzzer_sys::fuzz_target;
use xrnic::wire::{Ext, FrameRepr, FrameView, V1View};

fuzz_target!(|data: &[u8]| {
    if let Ok(v1) = V1View::parse(data) {
        let _ = (v1.grh(), v1.bth().psn(), v1.vlan_tci(), v1.icrc_wire());
        let _ = v1.icrc_computed();
        if let Ok(t) = v1.transport() {
            assert!(t.payload.len() <= v1.after_bth().len());
        }
    }
    let Ok(view) = FrameView::parse(data) else {
        return;
    };
    // Whatever the ICRC says, the other accessors must work: `xrnic decode` shows frames
    // with a bad ICRC too.
    let icrc_ok = view.verify_icrc().is_ok();
    assert_eq!(icrc_ok, view.icrc_computed() == view.icrc_wire());
    let _ = (
        view.bth().psn(),
        view.ip_ecn(),
        view.info().name,
        view.is_ipv6(),
    );
    for e in Ext::ORDER {
        if let Some(b) = view.ext_bytes(e) {
            assert_eq!(b.len(), e.wire_len());
        }
    }
    let repr = view.repr();
    assert_eq!(repr.roce.payload, view.payload());

    let len = repr.buffer_len();
    let mut out = vec![0u8; len];
    let n = repr
        .emit(&mut out)
        .unwrap_or_else(|e| panic!("a parsed frame must re-emit: {e}; {repr:?}"));
    assert_eq!(n, len, "emit wrote other than buffer_len()");

    let back = FrameView::parse(&out[..n])
        .unwrap_or_else(|e| panic!("re-emitted frame does not parse: {e}; {repr:?}"));
    back.verify_icrc()
        .unwrap_or_else(|e| panic!("re-emitted frame has a bad ICRC: {e}; {repr:?}"));
    assert_eq!(back.repr(), repr, "repr changed across emit + parse");
    assert_eq!(FrameRepr::parse(&out[..n]).ok(), Some(repr));

    // Emitting is deterministic: the re-parsed repr writes the very same bytes.
    let mut again = vec![0xa5u8; len];
    assert_eq!(back.repr().emit(&mut again).ok(), Some(n));
    assert_eq!(again, out, "emit(parse(emit(r))) != emit(r)");
});

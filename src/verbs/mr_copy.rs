//! How [`super::Mr::with`] and [`super::Mr::with_mut`] reach a region's bytes on both
//! backends: through a copy, with no lock held while the caller's closure runs (so the
//! closure may call any verb, and the NIC never writes under a Rust reference).
//!
//! `with` copies the region out and lends the copy; `with_mut` copies it out, lends the
//! copy mutably, and writes back only the bytes the closure changed, so that bytes the
//! NIC wrote meanwhile elsewhere in the region (a remote WRITE into another part of it)
//! are kept.

/// Call `put(offset, bytes)` for each run of bytes where `new` differs from `old` (equal
/// lengths), in order.
pub(super) fn changed_runs(old: &[u8], new: &[u8], mut put: impl FnMut(usize, &[u8])) {
    debug_assert_eq!(old.len(), new.len());
    let mut i = 0;
    let n = old.len().min(new.len());
    while i < n {
        if old[i] == new[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < n && old[i] != new[i] {
            i += 1;
        }
        put(start, &new[start..i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_runs_are_written_back() {
        let old = [0u8, 1, 2, 3, 4, 5, 6, 7];
        let new = [9u8, 1, 2, 8, 8, 5, 6, 9];
        let mut runs = Vec::new();
        changed_runs(&old, &new, |o, b| runs.push((o, b.to_vec())));
        assert_eq!(runs, [(0, vec![9]), (3, vec![8, 8]), (7, vec![9])]);
        let mut none = 0;
        changed_runs(&old, &old, |_, _| none += 1);
        assert_eq!(none, 0);
    }
}

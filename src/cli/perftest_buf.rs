//! What the stock perftest tools keep in their buffers, so that `xrnic perf --verify-stock`
//! can check, byte for byte, the data a stock `ib_write_bw` / `ib_send_bw` client put into
//! our buffer, or that we read from a stock `ib_read_bw` server.
//!
//! Contract:
//! - perftest 4.5-0.17 (perftest_resources.c `create_single_mr`) fills every buffer with
//!   `(char)rand()` after `srand(time(NULL))`, one byte per call from the buffer's start:
//!   byte `i` is the low byte of the `i + 1`-th `rand()` of glibc seeded with the peer's
//!   clock in seconds. [`GlibcRand`] is glibc's `rand()` (the default `TYPE_3` additive
//!   feedback generator, `random_r.c`); [`perftest_bytes`] the buffer.
//! - The seed is not exchanged: [`find_seed`] tries every second within
//!   [`SEED_WINDOW_SECS`] of our clock (the guest's clock comes from the same host),
//!   nearest first, and returns the first whose bytes match every sample given; the caller
//!   then checks the whole buffer against it. A match of 16 bytes by chance is out of the
//!   question (2^-128 per candidate, a few thousand candidates).

/// How far (seconds) from our clock the peer's `time(NULL)` may have been.
pub const SEED_WINDOW_SECS: u64 = 3600;

/// glibc's `rand()` after `srand(seed)`: `r[0] = seed`, `r[1..31]` by the Park-Miller
/// step `16807 * r[i-1] mod (2^31 - 1)`, `r[31..34] = r[0..3]`, then
/// `r[i] = r[i-31] + r[i-3]` (mod 2^32); the 310 first values of the feedback are
/// discarded and each output is `r[i] >> 1`.
pub struct GlibcRand {
    /// The last 31 values of `r`, `r[i-31]` at `pos`.
    ring: [u32; 31],
    pos: usize,
}

impl GlibcRand {
    pub fn new(seed: u32) -> GlibcRand {
        // srandom_r: a seed of 0 is taken as 1.
        let seed = if seed == 0 { 1 } else { seed };
        let mut r = [0u32; 31];
        r[0] = seed;
        for i in 1..31 {
            // The signed Schrage form glibc uses (random_r.c `__srandom_r`).
            let word = r[i - 1] as i32 as i64;
            let hi = word / 127_773;
            let lo = word % 127_773;
            let mut w = 16_807 * lo - 2_836 * hi;
            if w < 0 {
                w += 2_147_483_647;
            }
            r[i] = w as u32;
        }
        // r[31..34] = r[0..3]; the ring holds r[i-31..i] for the first i = 34, i.e.
        // r[3..34].
        let mut g = GlibcRand {
            ring: [0; 31],
            pos: 0,
        };
        for (k, v) in g.ring.iter_mut().enumerate() {
            *v = r[(k + 3) % 31];
        }
        // r[34..344] are discarded (srandom_r: 10 × the degree of 31): the first rand()
        // is r[344] >> 1.
        for _ in 0..310 {
            g.step();
        }
        g
    }

    /// The next `r[i]`.
    fn step(&mut self) -> u32 {
        // ring[pos] = r[i-31]; r[i-3] is 28 places further.
        let v = self.ring[self.pos].wrapping_add(self.ring[(self.pos + 28) % 31]);
        self.ring[self.pos] = v;
        self.pos = (self.pos + 1) % 31;
        v
    }

    /// The next `rand()`, 0 ..= 2^31 - 1.
    pub fn next_rand(&mut self) -> u32 {
        self.step() >> 1
    }
}

/// The first `len` bytes of a perftest buffer filled after `srand(seed)`.
pub fn perftest_bytes(seed: u32, len: usize) -> Vec<u8> {
    let mut g = GlibcRand::new(seed);
    (0..len).map(|_| g.next_rand() as u8).collect()
}

/// The seed nearest to `now` (seconds since the epoch), within [`SEED_WINDOW_SECS`], whose
/// perftest buffer holds `bytes` at `offset` for every `(offset, bytes)` sample. Seeds are
/// tried outwards from `now` (the peer seeded its buffer a few seconds before we look),
/// so the usual cost is a handful of generator runs.
pub fn find_seed(now: u64, samples: &[(usize, &[u8])]) -> Option<u32> {
    let need = samples
        .iter()
        .map(|(off, b)| off + b.len())
        .max()
        .unwrap_or(0);
    let matches = |seed: u32| {
        let buf = perftest_bytes(seed, need);
        samples
            .iter()
            .all(|(off, b)| &buf[*off..*off + b.len()] == *b)
    };
    (0..=SEED_WINDOW_SECS)
        .flat_map(|d| [now.checked_sub(d), (d > 0).then(|| now + d)])
        .flatten()
        .filter_map(|s| u32::try_from(s).ok())
        .find(|&seed| matches(seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference values printed by a C program calling glibc 2.36's srand()/rand() on this
    // Debian 12 host.
    #[test]
    fn matches_glibc_rand() {
        let mut g = GlibcRand::new(1);
        let got: Vec<u32> = (0..8).map(|_| g.next_rand()).collect();
        assert_eq!(
            got,
            [
                1804289383, 846930886, 1681692777, 1714636915, 1957747793, 424238335, 719885386,
                1649760492
            ]
        );
        let mut g = GlibcRand::new(1764428400);
        let got: Vec<u32> = (0..8).map(|_| g.next_rand()).collect();
        assert_eq!(
            got,
            [
                95169999, 1420898664, 1679982025, 1811088067, 415163309, 2083978175, 1296420216,
                1873330001
            ]
        );
    }

    #[test]
    fn buffer_bytes_are_the_low_bytes() {
        let b = perftest_bytes(1764428400, 16);
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex, "cf68c9c3adbf785114809133368a3f25");
        // srand(0) is srand(1).
        assert_eq!(perftest_bytes(0, 32), perftest_bytes(1, 32));
    }

    #[test]
    fn finds_the_seed_near_now_only() {
        let seed = 1764428400u32;
        let buf = perftest_bytes(seed, 8192);
        let s = [(0, &buf[0..8]), (4096, &buf[4096..4104])];
        assert_eq!(find_seed(u64::from(seed) + 1000, &s), Some(seed));
        assert_eq!(find_seed(u64::from(seed) - 5, &s), Some(seed));
        // Outside the window: not found.
        assert_eq!(find_seed(u64::from(seed) + SEED_WINDOW_SECS + 1, &s), None);
        // A changed byte: no seed explains it.
        let mut bad = buf[0..8].to_vec();
        bad[3] ^= 1;
        assert_eq!(find_seed(u64::from(seed), &[(0, &bad)]), None);
    }
}

//! `--verify` and `--verify-stock`: after a run, the buffer regions messages landed in hold
//! what the peer sent (our pattern, or the stock perftest's `rand()` bytes), and atomic
//! counters hold the number of operations that targeted them.

use super::report::pattern;
use super::{ATOMIC_ADD, AtomicType, Geometry, Lane, Plan};

/// Every offset one of `iters` messages used holds the pattern.
pub(super) fn verify_slots(
    lanes: &[Lane],
    g: Geometry,
    iters: u64,
    what: &str,
) -> Result<(), String> {
    let used = g.slots().min(iters);
    let size = g.size as usize;
    for (q, lane) in lanes.iter().enumerate() {
        lane.mr
            .with(|b| -> Result<(), String> {
                for k in 0..used {
                    let off = g.offset(k) as usize;
                    let msg = &b[off..off + size];
                    if let Some((i, &x)) = msg
                        .iter()
                        .enumerate()
                        .find(|&(i, &x)| x != pattern(q, off + i))
                    {
                        return Err(format!(
                            "verify ({what}): qp {q} offset {} is 0x{x:02x}, expected 0x{:02x}",
                            off + i,
                            pattern(q, off + i)
                        ));
                    }
                }
                Ok(())
            })
            .map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// `--verify-stock`: every offset messages landed at holds the stock peer's bytes at the
/// same offset of the part of its buffer they came from. perftest has one buffer of parts
/// of `max(size, cycle buffer)` bytes: QP `q` sends and writes from part `q` (`create_mr`,
/// `ctx_set_send_wqes`) and announces part `qps + q` as its target (`set_up_connection`:
/// what our READs read); sends, writes and reads use the same offsets on both sides
/// (`increase_loc_addr` / `increase_rem_addr`).
pub(super) fn verify_stock(
    lanes: &[Lane],
    g: Geometry,
    iters: u64,
    what: &str,
) -> Result<(), String> {
    use crate::cli::perftest_buf::{SEED_WINDOW_SECS, find_seed, perftest_bytes};
    let used = g.slots().min(iters);
    let size = g.size as usize;
    let part = (u64::from(g.size).max(g.cycle)) as usize;
    let first_part = if what == "read" { lanes.len() } else { 0 };
    let copies: Vec<Vec<u8>> = lanes
        .iter()
        .map(|l| l.mr.with(|b| b.to_vec()).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    // Samples for the seed search: the first bytes of QP 0's first two messages.
    let k = size.min(16);
    let base0 = first_part * part;
    let mut samples: Vec<(usize, &[u8])> = vec![(base0, &copies[0][..k])];
    if used > 1 {
        let off = g.offset(1) as usize;
        samples.push((base0 + off, &copies[0][off..off + k]));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let Some(seed) = find_seed(now, &samples) else {
        return Err(format!(
            "verify ({what}): the data is not a perftest buffer of a seed within \
             {SEED_WINDOW_SECS} s of now (first bytes {:02x?})",
            &copies[0][..k]
        ));
    };
    let need = part * (first_part + lanes.len());
    let theirs = perftest_bytes(seed, need);
    for (q, b) in copies.iter().enumerate() {
        for n in 0..used {
            let off = g.offset(n) as usize;
            let base = (first_part + q) * part + off;
            if let Some(i) = (0..size).find(|&i| b[off + i] != theirs[base + i]) {
                return Err(format!(
                    "verify ({what}): qp {q} offset {} is 0x{:02x}, the peer's buffer \
                     (srand({seed})) holds 0x{:02x}",
                    off + i,
                    b[off + i],
                    theirs[base + i]
                ));
            }
        }
    }
    println!("verify: {used} offset(s) × {size} B per QP as in the peer's buffer (srand({seed}))");
    Ok(())
}

/// Each 8-byte target holds ATOMIC_ADD × the FETCH_AND_ADDs that hit it (0 for
/// CMP_AND_SWAP of 0 with 0), and nothing else in the buffer changed.
pub(super) fn verify_atomics(lanes: &[Lane], g: Geometry, p: &Plan) -> Result<(), String> {
    let iters = p.iters.unwrap_or(0);
    let slots = g.slots();
    for (q, lane) in lanes.iter().enumerate() {
        lane.mr
            .with(|b| -> Result<(), String> {
                for k in 0..slots {
                    let hits = iters / slots + u64::from(k < iters % slots);
                    let want = match p.atomic {
                        AtomicType::FetchAndAdd => hits * ATOMIC_ADD,
                        AtomicType::CmpAndSwap => 0,
                    };
                    let off = g.offset(k) as usize;
                    let mut v = [0u8; 8];
                    v.copy_from_slice(&b[off..off + 8]);
                    // Atomics operate on host-order 64-bit words in memory (IBTA §9.4.5
                    // leaves the representation to the host; rxe and mlx5 use host order).
                    let got = u64::from_ne_bytes(v);
                    if got != want {
                        return Err(format!(
                            "verify (atomic): qp {q} counter at offset {off} is {got}, \
                             expected {want} ({hits} operations)"
                        ));
                    }
                }
                let touched = b
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| {
                        let k = *i as u64 / g.line.max(1);
                        !(i % (g.line.max(1) as usize) < 8 && k < slots)
                    })
                    .find(|(_, x)| **x != 0);
                match touched {
                    Some((i, x)) => Err(format!(
                        "verify (atomic): qp {q} byte {i} outside the counters is 0x{x:02x}"
                    )),
                    None => Ok(()),
                }
            })
            .map_err(|e| e.to_string())??;
    }
    Ok(())
}

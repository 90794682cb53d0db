//! Times the barrier master's interval comparison ([`dsm_race::plan`], page-indexed) against
//! the pairwise reference ([`dsm_race::plan_pairwise`]) on synthetic epochs of 8 nodes x
//! 1000 intervals, and prints the figures (nothing is asserted: timings vary by machine).
//!
//! `cargo run --release -p dsm-race --example plan_bench [nodes] [intervals-per-node] [case]`
//!
//! The paper bounds the comparison by O(i^2 p^2) for p nodes of i intervals each: the
//! `pairs considered` column is that term; the pairwise planner's time follows the
//! `concurrent` column, the indexed planner's the bitmap count and the `overlapping` one.

use dsm_proto::{IntervalRecord, NodeId, PageRuns, RaceNotices, SyncCause, VectorTime};
use dsm_race::Plan;
use std::time::{Duration, Instant};

/// A small deterministic generator, so that runs compare like with like.
struct Rng(u64);

impl Rng {
    fn below(&mut self, m: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as u32) % m.max(1)
    }
}

/// One epoch: `intervals` per node, interval `j` of node `k` touching `touch(k, j)` =
/// (reads, writes). With `handoff` > 0, each interval ends with that probability (in
/// percent) in a lock handoff from a random node, which orders intervals as Water's
/// molecule locks do; otherwise every cross-node pair is concurrent (a barrier-only epoch).
fn epoch(
    nodes: usize,
    intervals: usize,
    handoff: u32,
    rng: &mut Rng,
    mut touch: impl FnMut(usize, usize, &mut Rng) -> (PageRuns, PageRuns),
) -> Vec<IntervalRecord> {
    let mut vt = vec![vec![0u32; nodes]; nodes];
    for (k, v) in vt.iter_mut().enumerate() {
        v[k] = 1;
    }
    let mut done = vec![0usize; nodes];
    let mut all = Vec::with_capacity(nodes * intervals);
    // Nodes progress round-robin-ish at random, so handoffs see each other's recent past.
    while all.len() < nodes * intervals {
        let k = rng.below(nodes as u32) as usize;
        if done[k] == intervals {
            continue;
        }
        let (reads, writes) = touch(k, done[k], rng);
        all.push(IntervalRecord {
            node: k as NodeId,
            index: vt[k][k],
            vt: VectorTime::from(vt[k].clone()),
            writes: PageRuns::new(),
            race: Some(RaceNotices {
                reads,
                writes,
                ..Default::default()
            }),
            began_with: SyncCause::Barrier(1),
        });
        done[k] += 1;
        vt[k][k] += 1;
        if rng.below(100) < handoff {
            let j = rng.below(nodes as u32) as usize;
            if j != k {
                let mut known = vt[j].clone();
                known[j] -= 1;
                for (x, y) in vt[k].iter_mut().zip(&known) {
                    *x = (*x).max(*y);
                }
            }
        }
    }
    all
}

fn pages(rng: &mut Rng, count: u32, of: u32) -> PageRuns {
    PageRuns::from_pages((0..count).map(|_| rng.below(of)))
}

/// Best of `reps` runs of `planner` on the epoch, in milliseconds (the minimum is the least
/// noisy figure on a shared machine). The copies are made beforehand: the runtime hands the
/// planner an owned list, so copying is not part of its cost.
fn best(reps: usize, ivs: &[IntervalRecord], planner: fn(u32, Vec<IntervalRecord>) -> Plan) -> f64 {
    (0..reps)
        .map(|_| {
            let input = ivs.to_vec();
            let t = Instant::now();
            std::hint::black_box(planner(1, input));
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
        * 1e3
}

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().map_or(8, |a| a.parse().expect("nodes"));
    let per: usize = args.next().map_or(1000, |a| a.parse().expect("intervals"));
    // Only the cases whose name contains this (for profiling one of them).
    let only = args.next().unwrap_or_default();
    let cases: Vec<(&str, Vec<IntervalRecord>)> = vec![
        (
            // Water: each interval reads 3 and writes 2 of 300 pages (molecule records),
            // intervals ordered in part by molecule-lock handoffs.
            "water-like, lock handoffs 30%",
            epoch(nodes, per, 30, &mut Rng(1), |_, _, r| {
                (pages(r, 3, 300), pages(r, 2, 300))
            }),
        ),
        (
            "water-like, no handoffs",
            epoch(nodes, per, 0, &mut Rng(2), |_, _, r| {
                (pages(r, 3, 300), pages(r, 2, 300))
            }),
        ),
        (
            // SOR: node k writes its band of 32 pages and reads the neighbours' edge pages.
            "sor-like, 32-page runs",
            epoch(nodes, per, 0, &mut Rng(3), |k, _, _| {
                let band = 32 * k as u32 + 1;
                (
                    PageRuns::from_pages([band - 1, band + 32]),
                    PageRuns::from_runs([(band, 32)]),
                )
            }),
        ),
    ];
    println!("synthetic epochs: {nodes} nodes x {per} intervals; best of several runs");
    println!(
        "{:<32} {:>12} {:>11} {:>11} {:>10} {:>10} {:>11} {:>11} {:>8}",
        "case",
        "pairs consid",
        "concurrent",
        "overlapping",
        "bitmaps",
        "wanted",
        "pairwise ms",
        "indexed ms",
        "speedup"
    );
    for (name, ivs) in cases.into_iter().filter(|c| c.0.contains(&only)) {
        let new = dsm_race::plan(1, ivs.clone());
        let old = dsm_race::plan_pairwise(1, ivs.clone());
        assert_eq!(new.stats, old.stats, "{name}: planners disagree");
        assert_eq!(new.wanted, old.wanted, "{name}: planners disagree");
        let t_old = best(3, &ivs, dsm_race::plan_pairwise);
        let t_new = best(10, &ivs, dsm_race::plan);
        let s = &new.stats;
        println!(
            "{:<32} {:>12} {:>11} {:>11} {:>10} {:>10} {:>11.2} {:>11.2} {:>7.0}x",
            name,
            s.pairs_considered,
            s.concurrent_pairs,
            s.overlapping_pairs,
            s.bitmaps_total,
            s.bitmaps_wanted,
            t_old,
            t_new,
            t_old / t_new
        );
    }
}

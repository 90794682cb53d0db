//! The paper's Table 1 beside this analysis: random traces generated as in its Figure 5,
//! the share of traces where the bounded analysis misses at least one ordering the brute
//! force finds, at depths 0 (rewind only) to 3, and the time per trace.
//!
//! `cargo run --release -p dsm-ahb --example table1 [TRACES] [MAX_TASKS] [MAX_SEMS]`
//! (defaults 5000, 4, 3; the paper does not give its MaxTasks and MaxSemaphores).

use dsm_ahb::{analyse, brute_force, generate, is_subset, paper::analyse_as_printed, GenParams};
use rand::SeedableRng;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a number"));
    let traces = args.next().unwrap_or(5000);
    let max_tasks = args.next().unwrap_or(4);
    let max_sems = args.next().unwrap_or(3);
    let paper = [
        (30, [54.0, 3.0, 0.26, 0.05]),
        (35, [58.0, 3.7, 1.4, 1.1]),
        (40, [59.0, 3.4, 0.75, 0.56]),
    ];
    println!("MaxTasks {max_tasks}, MaxSemaphores {max_sems}, {traces} traces per row; % of traces missing at least one ordering");
    println!("events | paper: original  d1     d2     d3   | here: d0 (rewind)  d1      d2      d3    | us/trace d0 d1 d2 d3 | brute force us/trace");
    for (events, p) in paper {
        let mut rng = rand::rngs::StdRng::seed_from_u64(events as u64);
        let mut missed = [0usize; 4];
        let mut time = [Duration::ZERO; 4];
        let mut brute = Duration::ZERO;
        let mut punsound = [0usize; 4];
        let mut pmissed = [0usize; 4];
        for _ in 0..traces {
            let t = generate(
                GenParams {
                    max_tasks,
                    max_sems,
                    events,
                    max_initial: 0,
                },
                &mut rng,
            );
            let s = Instant::now();
            let exact = brute_force(&t, 1 << 26).expect("small enough");
            brute += s.elapsed();
            for d in 0..4 {
                let s = Instant::now();
                let a = analyse(&t, d as u32).expect("feasible");
                time[d] += s.elapsed();
                assert!(is_subset(&a, &exact), "UNSOUND at depth {d}: {t:?}");
                if a != exact {
                    missed[d] += 1;
                }
                let pa = analyse_as_printed(&t, d as u32).expect("feasible");
                if !is_subset(&pa, &exact) {
                    punsound[d] += 1;
                }
                if !is_subset(&exact, &pa) {
                    pmissed[d] += 1;
                }
            }
        }
        let pct = |m: usize| 100.0 * m as f64 / traces as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / traces as f64;
        println!(
            "{events:>6} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} | {:.0} {:.0} {:.0} {:.0} | {:.0}",
            p[0], p[1], p[2], p[3],
            pct(missed[0]), pct(missed[1]), pct(missed[2]), pct(missed[3]),
            us(time[0]), us(time[1]), us(time[2]), us(time[3]), us(brute)
        );
        println!(
            "   printed: missed {:?} unsound {:?}",
            pmissed.map(pct),
            punsound.map(pct)
        );
    }
}

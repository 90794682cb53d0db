//! Time per trace of the bounded analysis at 30, 40, 100 and 1000 operations and depths 0
//! to 3 (Figure 5 traces, MaxTasks 4, MaxSemaphores 3). Prints figures; asserts nothing.
//!
//! `cargo run --release -p dsm-ahb --example timing [MAX_DEPTH_AT_1000]` (default 2: depth
//! 3 at 1000 operations takes minutes).

use dsm_ahb::{analyse, generate, GenParams};
use rand::SeedableRng;
use std::time::Instant;

fn main() {
    let max_big: u32 = std::env::args()
        .nth(1)
        .map_or(2, |a| a.parse().expect("a depth"));
    println!("operations  traces  depth 0 (ms)  depth 1 (ms)  depth 2 (ms)  depth 3 (ms)");
    for (events, traces) in [(30usize, 200usize), (40, 200), (100, 20), (1000, 3)] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(events as u64 + 1);
        let ts: Vec<_> = (0..traces)
            .map(|_| {
                generate(
                    GenParams {
                        max_tasks: 4,
                        max_sems: 3,
                        events,
                        max_initial: 0,
                    },
                    &mut rng,
                )
            })
            .collect();
        let mut cells = Vec::new();
        for d in 0..=3u32 {
            if events >= 1000 && d > max_big {
                cells.push(format!("{:>12}", "skipped"));
                continue;
            }
            let s = Instant::now();
            for t in &ts {
                analyse(t, d).expect("feasible");
            }
            let per = s.elapsed().as_secs_f64() / traces as f64;
            cells.push(format!("{:>12.3}", per * 1e3));
        }
        println!("{events:>10}  {traces:>6}  {}", cells.join("  "));
    }
}

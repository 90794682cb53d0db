//! Time per trace of the bounded analysis at 30, 40 and 1000 operations and depths 0 to 3
//! (Figure 5 traces, MaxTasks 4, MaxSemaphores 3).
//!
//! `cargo run --release -p dsm-ahb --example timing [MAX_DEPTH_AT_1000]`

use dsm_ahb::{analyse, generate, GenParams};
use rand::SeedableRng;
use std::time::Instant;

fn main() {
    let max_big: u32 = std::env::args()
        .nth(1)
        .map_or(2, |a| a.parse().expect("a depth"));
    for (events, traces) in [(30usize, 200usize), (40, 200), (100, 50), (1000, 3)] {
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
        for d in 0..=3u32 {
            if events >= 1000 && d > max_big {
                println!(
                    "{events:>5} events, depth {d}: skipped (pass a larger MAX_DEPTH_AT_1000)"
                );
                continue;
            }
            let s = Instant::now();
            for t in &ts {
                analyse(t, d).expect("feasible");
            }
            let per = s.elapsed().as_secs_f64() / traces as f64;
            println!(
                "{events:>5} events, depth {d}: {:>10.3} ms per trace ({traces} traces)",
                per * 1e3
            );
        }
    }
}

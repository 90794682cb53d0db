//! The analysis never reports an ordering the exhaustive search rejects: 5000 random traces
//! of 30 to 40 operations generated as in the paper's Figure 5 (and, beyond the paper, with
//! initial counts), at depths 0 to 3. Zero tolerance: one unsound edge fails the test.

use dsm_ahb::{analyse, brute_force, generate, is_subset, observed, GenParams};
use rand::{Rng, SeedableRng};

#[test]
fn analysis_is_sound_against_brute_force_on_5000_traces() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5e_4a_f0_12);
    let mut missed = [0u32; 4];
    let traces = 5000;
    for i in 0..traces {
        let events = rng.gen_range(30..=40);
        let params = GenParams {
            max_tasks: 4,
            max_sems: 3,
            events,
            // Every fifth trace models initial counts explicitly.
            max_initial: if i % 5 == 4 { 2 } else { 0 },
        };
        let t = generate(params, &mut rng);
        let exact = brute_force(&t, 1 << 24).expect("small trace");
        let obs = observed(&t).expect("generated pairings are acyclic");
        assert!(
            is_subset(&exact, &obs),
            "trace {i}: an always-ordering the run lacks"
        );
        for d in 0..=3u32 {
            let a = analyse(&t, d).expect("feasible");
            assert!(
                is_subset(&a, &exact),
                "trace {i}: depth {d} reports an ordering the brute force rejects: {t:?}"
            );
            if a != exact {
                missed[d as usize] += 1;
            }
        }
    }
    for (d, m) in missed.iter().enumerate() {
        println!(
            "depth {d}: {m} of {traces} traces missed at least one ordering ({:.2}%)",
            100.0 * *m as f64 / traces as f64
        );
    }
    // More depth never finds less.
    assert!(missed.windows(2).all(|w| w[1] <= w[0]), "{missed:?}");
}

//! The paper's Table 1 for this analysis: random traces generated as in its Figure 5, and
//! the share of them where the analysis at depths 0 (rewind only) to a chosen depth (3 in
//! the paper's table) misses at least one ordering of the brute force (reachable states,
//! the paper's relation). Every trace is also checked for soundness (no ordering beyond
//! the brute force's).

use crate::paper::analyse_as_printed;
use crate::{analyse, brute_force, brute_force_complete, generate, is_subset, GenParams};
use crate::{AnalysisError, Order};
use rand::SeedableRng;
use std::time::{Duration, Instant};

/// Depths in the paper's table: 0 (its "original" column) to 3.
pub const DEPTHS: usize = 4;

/// The paper's Table 1: operations, percentage of traces missing an ordering for its
/// "original" algorithm and depths 1 to 3, and its number of traces.
pub const PAPER: [(usize, [f64; DEPTHS], usize); 3] = [
    (30, [54.0, 3.0, 0.26, 0.05], 5726),
    (35, [58.0, 3.7, 1.4, 1.1], 840),
    (40, [59.0, 3.4, 0.75, 0.56], 1070),
];

/// The depth tried on the traces the deepest measured depth misses, to tell a depth limit
/// from a rule limit.
pub const DEEP: u32 = 8;

/// Brute-force states allowed per trace.
const MAX_STATES: u64 = 1 << 26;

/// One measured row.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// Traces generated.
    pub traces: usize,
    /// Per depth (0 to the deepest measured), traces where [`analyse`] misses at least
    /// one ordering.
    pub missed: Vec<usize>,
    /// Per depth, traces where [`analyse`] reports an ordering the brute force lacks.
    pub unsound: Vec<usize>,
    /// Per depth, traces where the paper's Algorithm 2 as printed
    /// ([`crate::paper::analyse_as_printed`]) misses at least one ordering.
    pub printed_missed: Vec<usize>,
    /// Per depth, traces where the printed algorithm reports an ordering the brute force
    /// lacks.
    pub printed_unsound: Vec<usize>,
    /// Traces the deepest measured depth misses that depth [`DEEP`] finds whole (the rest
    /// are beyond the expansion's rules at any depth tried); 0 when that depth is at least
    /// [`DEEP`].
    pub deeper_finds: usize,
    /// Traces whose order over complete executions differs from the paper's relation.
    pub complete_differs: usize,
    /// Per depth, total time of [`analyse`].
    pub time: Vec<Duration>,
    /// Total time of the brute force.
    pub brute_time: Duration,
}

impl Row {
    /// `count` as a percentage of the traces.
    pub fn pct(&self, count: usize) -> f64 {
        100.0 * count as f64 / self.traces.max(1) as f64
    }
}

/// Measures one row: `traces` traces of `params` from `seed`, at depths 0 to `max_depth`.
pub fn measure(
    params: GenParams,
    traces: usize,
    seed: u64,
    max_depth: u32,
) -> Result<Row, AnalysisError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let depths = max_depth as usize + 1;
    let mut row = Row {
        traces,
        missed: vec![0; depths],
        unsound: vec![0; depths],
        printed_missed: vec![0; depths],
        printed_unsound: vec![0; depths],
        time: vec![Duration::ZERO; depths],
        ..Row::default()
    };
    for _ in 0..traces {
        let t = generate(params, &mut rng);
        let start = Instant::now();
        let exact = brute_force(&t, MAX_STATES)?;
        row.brute_time += start.elapsed();
        if brute_force_complete(&t, MAX_STATES)? != exact {
            row.complete_differs += 1;
        }
        let judge = |a: &Order, missed: &mut usize, unsound: &mut usize| {
            *missed += usize::from(!is_subset(&exact, a));
            *unsound += usize::from(!is_subset(a, &exact));
        };
        for d in 0..depths {
            let start = Instant::now();
            let a = analyse(&t, d as u32)?;
            row.time[d] += start.elapsed();
            judge(&a, &mut row.missed[d], &mut row.unsound[d]);
            let p = analyse_as_printed(&t, d as u32)?;
            judge(&p, &mut row.printed_missed[d], &mut row.printed_unsound[d]);
            if d == depths - 1
                && max_depth < DEEP
                && !is_subset(&exact, &a)
                && is_subset(&exact, &analyse(&t, DEEP)?)
            {
                row.deeper_finds += 1;
            }
        }
    }
    Ok(row)
}

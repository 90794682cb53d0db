//! The paper's Algorithm 2 as printed (its appendix), kept beside [`crate::analyse`] to
//! measure what the printed algorithm finds: `modify` recurses over every signal of every
//! semaphore and takes the `k`-th smallest of their bounds, `k` the waits known to come
//! first. Its one unreadable condition (`R(σ)`'s "τ(e_s) < τ_base", which would keep only
//! signals already known to precede, so nothing could ever be added) is read as "not
//! known to come after the wait being expanded" (`τ(e_s) ≱ τ_base`).

use crate::{leq, max_into, rewind, AnalysisError, Op, Order, Trace};

/// Rewind, then the printed Algorithm 2 at `depth` (the paper's "depth of recursion"),
/// to a fixpoint. Traces with initial tokens are outside the paper (it counts none).
pub fn analyse_as_printed(trace: &Trace, depth: u32) -> Result<Order, AnalysisError> {
    let mut tau = rewind(trace)?;
    let mut waits = vec![Vec::new(); trace.initial.len()];
    let mut signals = vec![Vec::new(); trace.initial.len()];
    for (j, evs) in trace.events.iter().enumerate() {
        for (c, e) in evs.iter().enumerate() {
            match e.op {
                Op::Wait => waits[e.sem].push((j, c)),
                Op::Signal => signals[e.sem].push((j, c)),
            }
        }
    }
    let p = Printed {
        waits: &waits,
        signals: &signals,
    };
    loop {
        let mut changed = false;
        for j in 0..trace.nodes() {
            for c in 0..trace.events[j].len() {
                let mut v = tau[j][c].clone();
                if c > 0 {
                    max_into(&mut v, &tau[j][c - 1]);
                }
                if trace.events[j][c].op == Op::Wait && depth > 0 {
                    let own = tau[j][c].clone();
                    let m = p.modify(&tau, &own, &own, (j, c), depth);
                    max_into(&mut v, &m);
                }
                if v != tau[j][c] {
                    tau[j][c] = v;
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(tau);
        }
    }
}

struct Printed<'a> {
    waits: &'a [Vec<(usize, usize)>],
    signals: &'a [Vec<(usize, usize)>],
}

impl Printed<'_> {
    fn modify(
        &self,
        tau: &Order,
        base: &[u32],
        tin: &[u32],
        hat: (usize, usize),
        depth: u32,
    ) -> Vec<u32> {
        let th = &tau[hat.0][hat.1];
        let mut m = th.clone();
        if depth == 0 {
            return m;
        }
        let mut amalgam = tin.to_vec();
        max_into(&mut amalgam, th);
        // `a ≱ b`: some component of `a` is below `b`'s (Definition 1).
        let not_geq = |a: &[u32], b: &[u32]| a.iter().zip(b).any(|(x, y)| x < y);
        for (ws, ss) in self.waits.iter().zip(self.signals) {
            let k = ws
                .iter()
                .filter(|&&(i, c)| leq(&tau[i][c], tin) || leq(&tau[i][c], th))
                .count();
            if k == 0 {
                continue;
            }
            let t: Vec<Vec<u32>> = ss
                .iter()
                .filter(|&&(i, c)| not_geq(&tau[i][c], tin) && not_geq(&tau[i][c], base))
                .map(|&s| self.modify(tau, base, &amalgam, s, depth - 1))
                .collect();
            // Fewer candidates than waits cannot happen in a feasible trace; the printed
            // algorithm leaves min_k undefined there, so nothing is added.
            if t.len() >= k {
                let s = crate::expand::min_k(&t, k, m.len());
                max_into(&mut m, &s);
            }
        }
        m
    }
}

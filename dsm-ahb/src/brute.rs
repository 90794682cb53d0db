//! The exact orders, by exhaustive search of the trace's state space (a state is a prefix
//! of each node's operations; a wait may complete only while its semaphore has a token).

use crate::{AnalysisError, Op, Order, Prefixes, Trace};
use std::collections::VecDeque;

/// The paper's "must happen before" (its Section 3): `a` precedes `b` iff `a` has completed
/// in every *reachable* state in which `b` has, deadlocked prefixes included. `v(e)[i]` is
/// the least number of node `i`'s operations over the reachable states where `e` has just
/// completed. This is the reference of the soundness tests and of Table 1. Fails when more
/// than `max_states` states would be visited.
pub fn brute_force(trace: &Trace, max_states: u64) -> Result<Order, AnalysisError> {
    search(trace, max_states, false)
}

/// The order over *complete* executions only: as [`brute_force`], but over the reachable
/// states from which every operation of the trace can still complete (a state that can
/// only deadlock does not count). It holds every ordering of [`brute_force`] and, on about
/// a third of 30-40-operation Figure 5 traces, more; it is not the paper's relation and no
/// analysis here is checked against it.
pub fn brute_force_complete(trace: &Trace, max_states: u64) -> Result<Order, AnalysisError> {
    search(trace, max_states, true)
}

fn search(trace: &Trace, max_states: u64, complete_only: bool) -> Result<Order, AnalysisError> {
    let n = trace.nodes();
    let lens: Vec<usize> = trace.events.iter().map(Vec::len).collect();
    let mut total: u64 = 1;
    for &l in &lens {
        total = total.saturating_mul(l as u64 + 1);
    }
    if total > max_states {
        return Err(AnalysisError::TooManyStates(max_states));
    }
    let prefixes = Prefixes::new(trace);
    let index = |x: &[u32]| -> usize {
        x.iter()
            .zip(&lens)
            .fold(0usize, |acc, (&c, &l)| acc * (l + 1) + c as usize)
    };
    // Breadth first, so `visited` lists states by increasing operation count and every
    // transition goes from an earlier entry to a later one.
    let mut seen = vec![false; total as usize];
    let start = vec![0u32; n];
    seen[index(&start)] = true;
    let mut visited = vec![start.clone()];
    let mut queue = VecDeque::from([start]);
    while let Some(x) = queue.pop_front() {
        for j in 0..n {
            if !enabled(trace, &prefixes, &x, j) {
                continue;
            }
            let mut y = x.clone();
            y[j] += 1;
            let i = index(&y);
            if !seen[i] {
                seen[i] = true;
                visited.push(y.clone());
                queue.push_back(y);
            }
        }
    }
    let counts = if complete_only {
        // A state counts iff the final state is reachable from it: decide in reverse
        // breadth-first order, each state after all its successors.
        let mut live = vec![false; total as usize];
        let full: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
        live[index(&full)] = seen[index(&full)];
        for x in visited.iter().rev() {
            let i = index(x);
            if live[i] {
                continue;
            }
            live[i] = (0..n).any(|j| {
                enabled(trace, &prefixes, x, j) && {
                    let mut y = x.clone();
                    y[j] += 1;
                    live[index(&y)]
                }
            });
        }
        live
    } else {
        seen
    };
    let mut best: Vec<Vec<Option<Vec<u32>>>> = lens.iter().map(|&l| vec![None; l]).collect();
    for x in visited.iter().filter(|x| counts[index(x)]) {
        for (j, &c) in x.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let slot = &mut best[j][c as usize - 1];
            match slot {
                Some(b) => {
                    for (a, &y) in b.iter_mut().zip(x) {
                        *a = (*a).min(y);
                    }
                }
                None => *slot = Some(x.clone()),
            }
        }
    }
    best.into_iter()
        .enumerate()
        .map(|(j, evs)| {
            evs.into_iter()
                .enumerate()
                .map(|(c, v)| {
                    v.ok_or_else(|| {
                        AnalysisError::Infeasible(format!(
                            "operation {} of node {j} is in no reachable state",
                            c + 1
                        ))
                    })
                })
                .collect()
        })
        .collect()
}

/// Whether node `j`'s next operation can complete in state `x`.
fn enabled(trace: &Trace, prefixes: &Prefixes, x: &[u32], j: usize) -> bool {
    let c = x[j] as usize;
    if c == trace.events[j].len() {
        return false;
    }
    let e = &trace.events[j][c];
    e.op == Op::Signal || prefixes.deficit(trace, x, e.sem) < 0
}

//! Semaphore traces and the orderings that hold in *every* execution of them.
//!
//! This crate owns one thing: given the completed semaphore operations of a run (per node,
//! in program order, with the signal each wait consumed and each semaphore's initial
//! count), which pairs of operations are ordered in every feasible execution of the same
//! straight-line program ("always happens before", Helmbold, McDowell and Wang). It has
//! the trace file format ([`mod@format`]), the observed order of the run ([`observed`]), the
//! paper's vector-clock analysis ([`analyse`]: rewind to a fixpoint, then a bounded-depth
//! expand), an exact brute-force search for small traces ([`brute_force`]), and the random
//! trace generator of the paper's Figure 5 ([`generate`]). It does no I/O of its own except
//! through the `Read`/`Write` handles given to [`mod@format`].
//!
//! An ordering is represented as one vector per event: `v[i]` is how many events of node
//! `i` precede or are the event in the order (for the event's own node, its own 1-based
//! position). Event `a` (node `i`, position `p`) is ordered before `b` iff `v(b)[i] >= p`.

#![warn(missing_docs)]

mod brute;
pub mod epoch;
mod expand;
pub mod format;
pub mod paper;
pub mod table1;

pub use brute::{brute_force, brute_force_complete};

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use thiserror::Error;

/// A semaphore operation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// P: take a token, waiting for one if there is none.
    Wait,
    /// V: add a token.
    Signal,
}

/// One completed operation of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Wait or signal.
    pub op: Op,
    /// Index of the semaphore in [`Trace::sem_names`].
    pub sem: usize,
    /// For a signal, its number among its node's signals of this semaphore.
    pub seq: Option<u32>,
    /// For a wait, the signal it consumed in the run as `(node, seq)`; `None` for an
    /// initial token.
    pub paired: Option<(usize, u32)>,
}

/// The semaphore operations of a run, per node in program order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// Semaphore names, indexed by [`TraceEvent::sem`].
    pub sem_names: Vec<String>,
    /// Initial count of each semaphore.
    pub initial: Vec<u32>,
    /// Per node, its operations in program order.
    pub events: Vec<Vec<TraceEvent>>,
    /// Per node, for each barrier it passed in order, how many of its operations precede
    /// it (every node passes the same barriers).
    pub barriers: Vec<Vec<usize>>,
}

/// One barrier epoch of a trace ([`Trace::epochs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// The epoch's operations as a trace of their own: initial counts are the tokens left
    /// at the barrier that opens it, a wait that consumed an earlier epoch's signal took
    /// one of those, and signal numbers count from the epoch's start.
    pub trace: Trace,
    /// Per node, how many of its operations precede the epoch (add it to a position in
    /// the epoch to get the position in the whole trace).
    pub offset: Vec<usize>,
}

/// One vector per event, per node in program order (see the crate documentation).
pub type Order = Vec<Vec<Vec<u32>>>;

/// Why an analysis could not be done.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AnalysisError {
    /// The pairing of waits with signals admits no execution (a wait would have to follow a
    /// signal that follows it).
    #[error("the trace's pairing of waits with signals is cyclic: no execution produces it")]
    CyclicPairing,
    /// The brute-force search would visit more states than allowed.
    #[error("the brute-force search has more than {0} states; use the bounded analysis")]
    TooManyStates(u64),
    /// The analysis found an event of the trace infeasible, which cannot happen for a trace
    /// a run produced (the run is a feasible execution).
    #[error("the trace is not feasible: {0}")]
    Infeasible(String),
}

impl Trace {
    /// An empty trace of `nodes` nodes.
    pub fn new(nodes: usize) -> Trace {
        Trace {
            sem_names: Vec::new(),
            initial: Vec::new(),
            events: vec![Vec::new(); nodes],
            barriers: vec![Vec::new(); nodes],
        }
    }

    /// The trace cut at its barriers, one [`Epoch`] per stretch between two barriers (one
    /// for a trace without barriers). A barrier orders everything before it before
    /// everything after it, so an execution of the trace is the executions of its epochs
    /// one after the other, each starting from the counts the previous one left (which
    /// every execution agrees on: all of the previous epoch's operations are done), and
    /// the orderings within an epoch are those of the epoch's trace alone.
    pub fn epochs(&self) -> Vec<Epoch> {
        let n = self.nodes();
        let s = self.initial.len();
        let count = self.barriers.first().map_or(0, Vec::len);
        let bound = |j: usize, k: usize| -> usize {
            if k < count {
                self.barriers[j][k]
            } else {
                self.events[j].len()
            }
        };
        let mut tokens: Vec<i64> = self.initial.iter().map(|&c| c as i64).collect();
        // Per node and semaphore, its signals in earlier epochs.
        let mut before = vec![vec![0u32; s]; n];
        let mut out = Vec::new();
        for k in 0..=count {
            let offset: Vec<usize> = (0..n)
                .map(|j| if k == 0 { 0 } else { bound(j, k - 1) })
                .collect();
            let mut t = Trace::new(n);
            t.sem_names = self.sem_names.clone();
            t.initial = tokens.iter().map(|&c| c.max(0) as u32).collect();
            for j in 0..n {
                for e in &self.events[j][offset[j]..bound(j, k).max(offset[j])] {
                    let mut e = e.clone();
                    match e.op {
                        Op::Signal => {
                            e.seq = e.seq.map(|q| q - before[j][e.sem]);
                        }
                        Op::Wait => {
                            e.paired = e
                                .paired
                                .and_then(|(i, q)| q.checked_sub(before[i][e.sem]).map(|q| (i, q)));
                        }
                    }
                    t.events[j].push(e);
                }
            }
            for (j, evs) in t.events.iter().enumerate() {
                for e in evs {
                    match e.op {
                        Op::Signal => {
                            tokens[e.sem] += 1;
                            before[j][e.sem] += 1;
                        }
                        Op::Wait => tokens[e.sem] -= 1,
                    }
                }
            }
            out.push(Epoch { trace: t, offset });
        }
        out
    }

    /// Nodes in the trace.
    pub fn nodes(&self) -> usize {
        self.events.len()
    }

    /// Total number of operations.
    pub fn len(&self) -> usize {
        self.events.iter().map(Vec::len).sum()
    }

    /// Whether the trace has no operation.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where signal `seq` of `node` on `sem` is in the node's events.
    fn signal_position(&self, sem: usize, node: usize, seq: u32) -> Option<usize> {
        self.events
            .get(node)?
            .iter()
            .position(|e| e.op == Op::Signal && e.sem == sem && e.seq == Some(seq))
    }
}

/// The order the run itself established: program order plus each wait after the signal
/// it consumed (vector clocks of the observed pairing, Fidge/Mattern).
pub fn observed(trace: &Trace) -> Result<Order, AnalysisError> {
    let n = trace.nodes();
    let mut order: Order = trace
        .events
        .iter()
        .map(|evs| vec![Vec::new(); evs.len()])
        .collect();
    let mut done = vec![0usize; n];
    loop {
        let mut progress = false;
        for j in 0..n {
            while done[j] < trace.events[j].len() {
                let c = done[j];
                let e = &trace.events[j][c];
                let mut v = if c == 0 {
                    vec![0; n]
                } else {
                    order[j][c - 1].clone()
                };
                v[j] = c as u32 + 1;
                if let (Op::Wait, Some((node, seq))) = (e.op, e.paired) {
                    let pos = trace
                        .signal_position(e.sem, node, seq)
                        .ok_or(AnalysisError::CyclicPairing)?;
                    if done[node] <= pos {
                        break;
                    }
                    max_into(&mut v, &order[node][pos]);
                }
                order[j][c] = v;
                done[j] += 1;
                progress = true;
            }
        }
        if (0..n).all(|j| done[j] == trace.events[j].len()) {
            return Ok(order);
        }
        if !progress {
            return Err(AnalysisError::CyclicPairing);
        }
    }
}

fn max_into(v: &mut [u32], w: &[u32]) {
    for (a, &b) in v.iter_mut().zip(w) {
        *a = (*a).max(b);
    }
}

fn leq(v: &[u32], w: &[u32]) -> bool {
    v.iter().zip(w).all(|(a, b)| a <= b)
}

/// Per node, per prefix length, per semaphore: waits and signals in the prefix.
struct Prefixes {
    waits: Vec<Vec<Vec<u32>>>,
    signals: Vec<Vec<Vec<u32>>>,
}

impl Prefixes {
    fn new(trace: &Trace) -> Prefixes {
        let s = trace.initial.len();
        let mut waits = Vec::new();
        let mut signals = Vec::new();
        for evs in &trace.events {
            let mut w = vec![vec![0u32; s]];
            let mut g = vec![vec![0u32; s]];
            for e in evs {
                let mut nw = w.last().expect("non-empty").clone();
                let mut ng = g.last().expect("non-empty").clone();
                match e.op {
                    Op::Wait => nw[e.sem] += 1,
                    Op::Signal => ng[e.sem] += 1,
                }
                w.push(nw);
                g.push(ng);
            }
            waits.push(w);
            signals.push(g);
        }
        Prefixes { waits, signals }
    }

    /// Tokens of `sem` a state with prefix `v` has used beyond its initial count and the
    /// signals in the prefix (negative: tokens left).
    fn deficit(&self, trace: &Trace, v: &[u32], sem: usize) -> i64 {
        let mut d = -(trace.initial[sem] as i64);
        for (j, &c) in v.iter().enumerate() {
            d += self.waits[j][c as usize][sem] as i64 - self.signals[j][c as usize][sem] as i64;
        }
        d
    }
}

/// The "always happens before" order, safely approximated: every ordering it reports
/// holds in every feasible execution of the trace's program (given the same straight-line
/// code per node), and at higher `depth` it finds more of them.
///
/// Depth 0 is the rewind alone ([`rewind`], Algorithm 1: from the observed clocks down to a
/// fixpoint where a wait follows the earliest, per component, of its semaphore's signals).
/// Depth `d >= 1` then expands to a fixpoint (Algorithm 2) with first-order inference
/// (Observations 1 and 3: counting tokens on every semaphore) and `d - 1` levels of case
/// splits on the signal that serves a missing token (Observations 2 and 4, chained), so
/// depth 1 corresponds to the paper's `modify` at depth 1. The rules are in the `expand`
/// module; ARCHITECTURE.md says how they read the paper's garbled Algorithm 2.
pub fn analyse(trace: &Trace, depth: u32) -> Result<Order, AnalysisError> {
    expand::expand(trace, rewind(trace)?, depth)
}

/// [`analyse`] for a trace without the pairing of waits with signals (the rewind starts
/// from the top instead of the observed clocks; see [`rewind`] for why that is safe).
pub fn analyse_unpaired(trace: &Trace, depth: u32) -> Result<Order, AnalysisError> {
    expand::expand(trace, rewind_unpaired(trace)?, depth)
}

/// Algorithm 1 (rewind): from the vector clocks of the observed pairing down to a
/// fixpoint of "an operation is at least its predecessor and itself; a wait is at least the
/// component-wise minimum over every signal of its semaphore (an initial token counting as
/// a signal bounded by zero)".
///
/// Why any fixpoint of that rule is safe although the iteration starts from the observed,
/// unsafe clocks: take any feasible execution E and write `P(e)` for the operations of
/// each node up to `e` in E. By induction along E, `τ(e) <= P(e)`: the predecessor comes
/// before `e` in E, and for a wait, the signal it consumed in E comes before it, so the
/// minimum over all signals is at most that signal's `τ <= P(signal) <= P(e)`. Hence
/// every ordering the fixpoint reports holds in E. The rule is monotone and the observed
/// clocks are above it, so the iteration only decreases and ends.
pub fn rewind(trace: &Trace) -> Result<Order, AnalysisError> {
    rewind_from(trace, observed(trace)?)
}

/// [`rewind`] from the top (every operation after everything) instead of the observed
/// clocks, for traces that do not say which signal each wait consumed: the fixpoint it
/// reaches is safe by the same argument.
fn rewind_unpaired(trace: &Trace) -> Result<Order, AnalysisError> {
    let top: Vec<u32> = trace.events.iter().map(|e| e.len() as u32).collect();
    let start = trace
        .events
        .iter()
        .map(|evs| vec![top.clone(); evs.len()])
        .collect();
    rewind_from(trace, start)
}

fn rewind_from(trace: &Trace, mut tau: Order) -> Result<Order, AnalysisError> {
    let n = trace.nodes();
    let mut signals = vec![Vec::new(); trace.initial.len()];
    for (j, evs) in trace.events.iter().enumerate() {
        for (c, e) in evs.iter().enumerate() {
            if e.op == Op::Signal {
                signals[e.sem].push((j, c));
            }
        }
    }
    loop {
        let mut changed = false;
        for j in 0..n {
            for c in 0..trace.events[j].len() {
                let e = &trace.events[j][c];
                let mut v = if c > 0 {
                    tau[j][c - 1].clone()
                } else {
                    vec![0; n]
                };
                v[j] = c as u32 + 1;
                if e.op == Op::Wait && trace.initial[e.sem] == 0 {
                    for i in 0..n {
                        let m = signals[e.sem]
                            .iter()
                            .map(|&(node, pos)| tau[node][pos][i])
                            .min()
                            .unwrap_or(0);
                        v[i] = v[i].max(m);
                    }
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

/// The orderings between operations of different nodes an order contains, as pairs
/// `((node, position), (node, position))` with 0-based positions, first before second.
pub fn edges(order: &Order) -> Vec<((usize, usize), (usize, usize))> {
    let mut out = Vec::new();
    for (j, evs) in order.iter().enumerate() {
        for (c, v) in evs.iter().enumerate() {
            for (i, &k) in v.iter().enumerate() {
                if i != j {
                    // Only the latest predecessor of each node, so transitive edges are
                    // implied rather than listed.
                    let prev = if c > 0 { order[j][c - 1][i] } else { 0 };
                    if k > prev {
                        out.push(((i, k as usize - 1), (j, c)));
                    }
                }
            }
        }
    }
    out
}

/// Whether `a` reports no ordering that `b` lacks (every vector of `a` at most `b`'s).
pub fn is_subset(a: &Order, b: &Order) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| x.iter().zip(y).all(|(v, w)| leq(v, w)))
}

/// Parameters of the random trace generator (the paper's Figure 5).
#[derive(Clone, Copy, Debug)]
pub struct GenParams {
    /// Nodes are drawn uniformly from `2..=max_tasks`.
    pub max_tasks: usize,
    /// Semaphores are drawn uniformly from `1..=max_sems`.
    pub max_sems: usize,
    /// Operations in the trace.
    pub events: usize,
    /// Initial counts are drawn uniformly from `0..=max_initial` (the paper uses 0).
    pub max_initial: u32,
}

/// A random trace of a non-blocking execution, generated as in the paper's Figure 5: pick
/// a node and a semaphore at random; if the semaphore has a token, flip a coin between a
/// wait and a signal, else signal. Waits consume tokens first come, first served (initial
/// tokens first), which fixes the observed pairing.
pub fn generate(p: GenParams, rng: &mut impl Rng) -> Trace {
    let tasks = rng.gen_range(2..=p.max_tasks.max(2));
    let sems = rng.gen_range(1..=p.max_sems.max(1));
    let mut t = Trace::new(tasks);
    let mut tokens: Vec<VecDeque<Option<(usize, u32)>>> = Vec::new();
    let mut seqs = vec![vec![0u32; sems]; tasks];
    for s in 0..sems {
        t.sem_names.push(format!("s{s}"));
        let init = rng.gen_range(0..=p.max_initial);
        t.initial.push(init);
        tokens.push((0..init).map(|_| None).collect());
    }
    for _ in 0..p.events {
        let task = rng.gen_range(0..tasks);
        let sem = rng.gen_range(0..sems);
        if !tokens[sem].is_empty() && rng.gen_bool(0.5) {
            let paired = tokens[sem].pop_front().expect("non-empty");
            t.events[task].push(TraceEvent {
                op: Op::Wait,
                sem,
                seq: None,
                paired,
            });
        } else {
            let seq = seqs[task][sem];
            seqs[task][sem] += 1;
            tokens[sem].push_back(Some((task, seq)));
            t.events[task].push(TraceEvent {
                op: Op::Signal,
                sem,
                seq: Some(seq),
                paired: None,
            });
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn ev(op: Op, sem: usize, seq: Option<u32>, paired: Option<(usize, u32)>) -> TraceEvent {
        TraceEvent {
            op,
            sem,
            seq,
            paired,
        }
    }

    /// Figure 2 of the paper, in spirit: a wait preceded by two waits on semaphore 0 needs
    /// two signals of it, so it follows both signalling nodes.
    #[test]
    fn counting_waits_orders_after_both_signals() {
        let mut t = Trace::new(3);
        t.sem_names = vec!["a".into()];
        t.initial = vec![0];
        t.events[0] = vec![ev(Op::Signal, 0, Some(0), None)];
        t.events[1] = vec![ev(Op::Signal, 0, Some(0), None)];
        t.events[2] = vec![
            ev(Op::Wait, 0, None, Some((0, 0))),
            ev(Op::Wait, 0, None, Some((1, 0))),
        ];
        let exact = brute_force(&t, 1 << 20).unwrap();
        assert_eq!(exact[2][1], vec![1, 1, 2]);
        assert_eq!(exact[2][0], vec![0, 0, 1]);
        let d1 = analyse(&t, 1).unwrap();
        assert_eq!(d1, exact);
        // The rewind alone cannot see it: either signal could have served either wait.
        let d0 = analyse(&t, 0).unwrap();
        assert_eq!(d0[2][1], vec![0, 0, 2]);
        let obs = observed(&t).unwrap();
        assert_eq!(obs[2][0], vec![1, 0, 1]);
    }

    /// The paper's relation counts deadlocked states: node 2 may take node 0's token
    /// first, after which node 1 deadlocks, so node 1's wait need not precede node 2's;
    /// over complete executions it must.
    #[test]
    fn deadlocked_prefixes_count() {
        let mut t = Trace::new(3);
        t.sem_names = vec!["a".into()];
        t.initial = vec![0];
        t.events[0] = vec![ev(Op::Signal, 0, Some(0), None)];
        t.events[1] = vec![
            ev(Op::Wait, 0, None, Some((0, 0))),
            ev(Op::Signal, 0, Some(0), None),
        ];
        t.events[2] = vec![ev(Op::Wait, 0, None, Some((1, 0)))];
        assert_eq!(brute_force(&t, 100).unwrap()[2][0], vec![1, 0, 1]);
        assert_eq!(brute_force_complete(&t, 100).unwrap()[2][0], vec![1, 2, 1]);
        for d in 0..4 {
            assert!(is_subset(
                &analyse(&t, d).unwrap(),
                &brute_force(&t, 100).unwrap()
            ));
        }
    }

    /// A trace of `nodes` (ops as "V0", "P1", ...; no initial tokens), paired by the first
    /// complete execution a depth-first search finds (tokens first come, first served).
    fn paired_trace(nodes: &[&str]) -> Trace {
        let ops: Vec<Vec<(Op, usize)>> = nodes
            .iter()
            .map(|n| {
                n.split_whitespace()
                    .map(|o| {
                        let op = if o.starts_with('P') {
                            Op::Wait
                        } else {
                            Op::Signal
                        };
                        (op, o[1..].parse().unwrap())
                    })
                    .collect()
            })
            .collect();
        let sems = ops.iter().flatten().map(|o| o.1 + 1).max().unwrap_or(0);
        fn dfs(
            ops: &[Vec<(Op, usize)>],
            at: &mut Vec<usize>,
            tokens: &mut Vec<i64>,
        ) -> Option<Vec<usize>> {
            if (0..ops.len()).all(|j| at[j] == ops[j].len()) {
                return Some(Vec::new());
            }
            for j in 0..ops.len() {
                let Some(&(op, sem)) = ops[j].get(at[j]) else {
                    continue;
                };
                let d = if op == Op::Wait { -1 } else { 1 };
                if tokens[sem] + d < 0 {
                    continue;
                }
                tokens[sem] += d;
                at[j] += 1;
                if let Some(mut rest) = dfs(ops, at, tokens) {
                    rest.insert(0, j);
                    return Some(rest);
                }
                at[j] -= 1;
                tokens[sem] -= d;
            }
            None
        }
        let schedule = dfs(&ops, &mut vec![0; ops.len()], &mut vec![0; sems]).expect("feasible");
        let mut t = Trace::new(nodes.len());
        t.sem_names = (0..sems).map(|s| format!("s{s}")).collect();
        t.initial = vec![0; sems];
        let mut queue: Vec<VecDeque<(usize, u32)>> = vec![VecDeque::new(); sems];
        let mut seqs = vec![vec![0u32; sems]; nodes.len()];
        let mut at = vec![0; nodes.len()];
        for j in schedule {
            let (op, sem) = ops[j][at[j]];
            at[j] += 1;
            t.events[j].push(match op {
                Op::Signal => {
                    let seq = seqs[j][sem];
                    seqs[j][sem] += 1;
                    queue[sem].push_back((j, seq));
                    ev(Op::Signal, sem, Some(seq), None)
                }
                Op::Wait => ev(Op::Wait, sem, None, queue[sem].pop_front()),
            });
        }
        t
    }

    /// Rule 10 (forced servers, depth 3): node 2's wait on s1 can only take node 1's one
    /// signal of s1, so node 0's first wait on s1 must take one of node 2's later ones;
    /// then node 2's wait on s0 precedes node 0's waits on s0, whose tokens (node 0's own
    /// signal and node 2's) run out before node 0's later signals unless node 1 signals
    /// s0. So node 1's second operation precedes node 0's last in every execution, which
    /// depth 2's rules do not see.
    #[test]
    fn forced_servers_find_what_matching_alone_cannot() {
        let t = paired_trace(&[
            "V0 P1 P0 P0 V0 V0 P1",
            "V1 V0 P0 P1 V0",
            "V0 P0 P1 V1 V1 V1",
        ]);
        let exact = brute_force(&t, 1 << 20).unwrap();
        assert_eq!(exact[0][6][1], 2, "node 1's V0 precedes node 0's last P1");
        let d3 = analyse(&t, 3).unwrap();
        assert_eq!(d3[0][6][1], 2);
        assert_eq!(d3, exact);
    }

    /// Epochs: the leftover token becomes an initial count, pairings with an earlier
    /// epoch's signal become initial tokens, signal numbers restart, and each epoch's
    /// analysis is sound and (here) exact for it.
    #[test]
    fn epochs_cut_at_barriers() {
        let mut t = Trace::new(2);
        t.sem_names = vec!["a".into(), "b".into()];
        t.initial = vec![1, 0];
        t.events[0] = vec![
            ev(Op::Signal, 0, Some(0), None),
            ev(Op::Signal, 0, Some(1), None),
            ev(Op::Wait, 1, None, Some((1, 0))),
        ];
        t.events[1] = vec![
            ev(Op::Wait, 0, None, None),
            ev(Op::Wait, 0, None, Some((0, 1))),
            ev(Op::Signal, 1, Some(0), None),
        ];
        t.barriers = vec![vec![2], vec![1]];
        let e = t.epochs();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].offset, vec![0, 0]);
        assert_eq!(e[1].offset, vec![2, 1]);
        assert_eq!(e[0].trace.initial, vec![1, 0]);
        // a: 1 initial + 2 signals - 1 wait; b: none yet.
        assert_eq!(e[1].trace.initial, vec![2, 0]);
        assert_eq!(e[1].trace.events[1][0].paired, None);
        assert_eq!(e[1].trace.events[1][1].seq, Some(0));
        assert_eq!(e[1].trace.events[0][0].paired, Some((1, 0)));
        for ep in &e {
            let exact = brute_force(&ep.trace, 1000).unwrap();
            assert_eq!(analyse(&ep.trace, 2).unwrap(), exact);
        }
        assert_eq!(brute_force(&e[1].trace, 1000).unwrap()[0][0], vec![1, 2]);
        // Without barriers: one epoch, the trace itself.
        t.barriers = vec![Vec::new(); 2];
        assert_eq!(
            t.epochs(),
            vec![Epoch {
                trace: t.clone(),
                offset: vec![0, 0]
            }]
        );
    }

    #[test]
    fn initial_tokens_order_nothing() {
        let mut t = Trace::new(2);
        t.sem_names = vec!["a".into()];
        t.initial = vec![1];
        t.events[0] = vec![ev(Op::Signal, 0, Some(0), None)];
        t.events[1] = vec![ev(Op::Wait, 0, None, Some((0, 0)))];
        let exact = brute_force(&t, 100).unwrap();
        assert_eq!(exact[1][0], vec![0, 1]);
        for d in 0..4 {
            assert_eq!(analyse(&t, d).unwrap(), exact, "depth {d}");
        }
        // The run paired it with the signal, so the observed order has the edge.
        assert_eq!(observed(&t).unwrap()[1][0], vec![1, 1]);
    }

    #[test]
    fn cyclic_pairing_is_an_error() {
        let mut t = Trace::new(2);
        t.sem_names = vec!["a".into(), "b".into()];
        t.initial = vec![0, 0];
        t.events[0] = vec![
            ev(Op::Wait, 0, None, Some((1, 0))),
            ev(Op::Signal, 1, Some(0), None),
        ];
        t.events[1] = vec![
            ev(Op::Wait, 1, None, Some((0, 0))),
            ev(Op::Signal, 0, Some(0), None),
        ];
        assert_eq!(observed(&t), Err(AnalysisError::CyclicPairing));
    }

    #[test]
    fn brute_force_refuses_huge_traces() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let t = generate(
            GenParams {
                max_tasks: 8,
                max_sems: 2,
                events: 200,
                max_initial: 0,
            },
            &mut rng,
        );
        assert!(matches!(
            brute_force(&t, 1000),
            Err(AnalysisError::TooManyStates(1000))
        ));
    }

    /// Soundness at every depth on a few hundred small traces; the property test in
    /// `tests/` runs the full 5000.
    #[test]
    fn analysis_is_sound_on_small_random_traces() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let t = generate(
                GenParams {
                    max_tasks: 4,
                    max_sems: 3,
                    events: 16,
                    max_initial: 1,
                },
                &mut rng,
            );
            let exact = brute_force(&t, 1 << 22).unwrap();
            let obs = observed(&t).unwrap();
            assert!(is_subset(&exact, &obs));
            for d in 0..=3 {
                let a = analyse(&t, d).unwrap();
                assert!(is_subset(&a, &exact), "depth {d} unsound on {t:?}");
            }
        }
    }
}

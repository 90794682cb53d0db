//! `--sem-order=safe`: the vector times of one barrier epoch's intervals rebuilt from the
//! "always happens before" order of its semaphore operations instead of the pairing the run
//! happened to take, so the race detector reports every race some other pairing makes
//! possible.
//!
//! In race mode every interval a semaphore operation opens is logged (its `began_with` is
//! `SemWait` or `SemSignal`), so the epoch's intervals list each node's completed
//! semaphore operations in order. Barriers order everything across epochs; tokens left
//! over from earlier epochs are the epoch's initial counts. The order is computed without
//! the pairing ([`crate::analyse_unpaired`]), and interval `I` of node
//! `p` gets, for each other node `q`, the last interval of `q` closed by an operation that
//! precedes, in every execution, the semaphore operation that opened `I` (or that began
//! the epoch).

use crate::{analyse_unpaired, AnalysisError, Op, Trace, TraceEvent};
use dsm_proto::{IntervalRecord, SemId, SyncCause};
use std::collections::BTreeMap;
use thiserror::Error;

/// Why an epoch keeps its observed order.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SafeOrderError {
    /// Locks ordered some intervals of the epoch; their edges cannot be told apart from
    /// the semaphores' in the observed vector times.
    #[error("locks were used in the epoch; its semaphore edges are kept as observed")]
    LocksInEpoch,
    /// A semaphore operation on a semaphore with no known count.
    #[error("semaphore #{0:x} has no known count")]
    UnknownSemaphore(SemId),
    /// The analysis failed (a bug: the run is a feasible execution).
    #[error(transparent)]
    Analysis(#[from] AnalysisError),
}

/// Each semaphore's tokens left over at the end of the epoch: `start` plus the epoch's
/// signals less its waits, as its intervals record them.
pub fn tokens_after(
    intervals: &[IntervalRecord],
    start: &BTreeMap<SemId, u32>,
) -> BTreeMap<SemId, u32> {
    let mut t: BTreeMap<SemId, i64> = start.iter().map(|(&k, &v)| (k, v as i64)).collect();
    for r in intervals {
        match r.began_with {
            SyncCause::SemSignal(s) => *t.entry(s).or_insert(0) += 1,
            SyncCause::SemWait(s) => *t.entry(s).or_insert(0) -= 1,
            _ => {}
        }
    }
    t.into_iter().map(|(k, v)| (k, v.max(0) as u32)).collect()
}

/// The expansion depth for an epoch of `ops` semaphore operations: deeper expansion costs
/// more than linearly in the operations, so the depth falls as the epoch grows, keeping
/// rank 0's analysis at a barrier well under a second (docs/measurements.md has the
/// times per depth and size).
pub fn depth_for(ops: usize) -> u32 {
    match ops {
        0..=200 => 2,
        201..=1500 => 1,
        _ => 0,
    }
}

/// What [`make_safe`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SafeOrder {
    /// Intervals whose vector time changed.
    pub changed: usize,
    /// Semaphore operations in the epoch.
    pub ops: usize,
    /// The expansion depth used ([`depth_for`] of `ops`, at most the depth asked for).
    pub depth: u32,
}

/// Rewrites the vector times of the epoch's `intervals` (all of them, of `nodes` nodes) to
/// the always-happens-before order of its semaphore operations at `max_depth` or, for a
/// large epoch, the smaller depth [`depth_for`] picks, given the tokens each semaphore
/// held when the epoch began.
pub fn make_safe(
    intervals: &mut [IntervalRecord],
    tokens: &BTreeMap<SemId, u32>,
    nodes: usize,
    max_depth: u32,
) -> Result<SafeOrder, SafeOrderError> {
    if intervals
        .iter()
        .any(|r| matches!(r.began_with, SyncCause::Acquire(_) | SyncCause::Release(_)))
    {
        return Err(SafeOrderError::LocksInEpoch);
    }
    // Each node's semaphore operations: (interval it opened, op, semaphore).
    let mut ops: Vec<Vec<(u32, Op, SemId)>> = vec![Vec::new(); nodes];
    let mut first: Vec<Option<u32>> = vec![None; nodes];
    for r in intervals.iter() {
        let node = r.node as usize;
        if node >= nodes {
            continue;
        }
        first[node] = Some(first[node].map_or(r.index, |f| f.min(r.index)));
        match r.began_with {
            SyncCause::SemSignal(s) => ops[node].push((r.index, Op::Signal, s)),
            SyncCause::SemWait(s) => ops[node].push((r.index, Op::Wait, s)),
            _ => {}
        }
    }
    for o in &mut ops {
        o.sort_unstable_by_key(|&(i, _, _)| i);
    }
    let mut trace = Trace::new(nodes);
    let mut sem_index: BTreeMap<SemId, usize> = BTreeMap::new();
    for (node, list) in ops.iter().enumerate() {
        for &(_, op, sem) in list {
            let idx = match sem_index.get(&sem) {
                Some(&i) => i,
                None => {
                    let count = *tokens
                        .get(&sem)
                        .ok_or(SafeOrderError::UnknownSemaphore(sem))?;
                    trace.sem_names.push(format!("#{sem:x}"));
                    trace.initial.push(count);
                    sem_index.insert(sem, trace.initial.len() - 1);
                    trace.initial.len() - 1
                }
            };
            trace.events[node].push(TraceEvent {
                op,
                sem: idx,
                seq: None,
                paired: None,
            });
        }
    }
    let op_count = trace.len();
    let depth = depth_for(op_count).min(max_depth);
    let order = analyse_unpaired(&trace, depth)?;
    let mut changed = 0;
    for r in intervals.iter_mut() {
        let p = r.node as usize;
        if p >= nodes || r.vt.len() != nodes {
            continue;
        }
        // The last semaphore operation of p that opened this interval or an earlier one.
        let c = ops[p].partition_point(|&(i, _, _)| i <= r.index);
        let mut vt = r.vt.clone();
        for q in (0..nodes).filter(|&q| q != p) {
            let Some(start) = first[q] else { continue };
            let must = if c == 0 {
                0
            } else {
                order[p][c - 1][q] as usize
            };
            let safe = if must == 0 {
                start.saturating_sub(1)
            } else {
                ops[q][must - 1].0 - 1
            };
            // Never more than observed: every execution includes the observed one.
            vt.set(q as u16, safe.min(r.vt.get(q as u16)));
        }
        if vt != r.vt {
            r.vt = vt;
            changed += 1;
        }
    }
    Ok(SafeOrder {
        changed,
        ops: op_count,
        depth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsm_proto::{PageRuns, VectorTime};

    fn rec(node: u16, index: u32, vt: Vec<u32>, cause: SyncCause) -> IntervalRecord {
        IntervalRecord {
            node,
            index,
            vt: VectorTime::from(vt),
            writes: PageRuns::default(),
            race: None,
            began_with: cause,
        }
    }

    /// Rank 0 signals after writing, rank 2 signals without writing, rank 1 waits once
    /// and reads. The run paired the wait with rank 0's signal; in another execution it
    /// takes rank 2's, so the safe order drops the edge from rank 0.
    #[test]
    fn a_wait_another_signal_could_serve_loses_its_observed_edge() {
        let b = SyncCause::Barrier(1);
        let mut intervals = vec![
            rec(0, 2, vec![2, 1, 1], b),
            rec(0, 3, vec![3, 1, 1], SyncCause::SemSignal(7)),
            rec(1, 2, vec![1, 2, 1], b),
            rec(1, 3, vec![2, 3, 1], SyncCause::SemWait(7)),
            rec(2, 2, vec![1, 1, 2], b),
            rec(2, 3, vec![1, 1, 3], SyncCause::SemSignal(7)),
        ];
        let tokens = BTreeMap::from([(7, 0)]);
        let done = make_safe(&mut intervals, &tokens, 3, 2).unwrap();
        assert_eq!(
            done,
            SafeOrder {
                changed: 1,
                ops: 3,
                depth: 2
            }
        );
        assert_eq!(intervals[3].vt, VectorTime::from(vec![1, 3, 1]));
        assert_eq!(tokens_after(&intervals, &tokens)[&7], 1);
        // With only one signaller the edge is certain and stays.
        let mut one = intervals[..4].to_vec();
        one[3].vt = VectorTime::from(vec![2, 3, 1]);
        make_safe(&mut one, &tokens, 3, 2).unwrap();
        assert_eq!(one[3].vt, VectorTime::from(vec![2, 3, 1]));
    }

    #[test]
    fn large_epochs_get_a_smaller_depth() {
        assert_eq!(depth_for(40), 2);
        assert!(depth_for(1000) < depth_for(40));
        assert_eq!(depth_for(1_000_000), 0);
        assert!((1..5000).all(|n| depth_for(n + 1) <= depth_for(n)));
    }

    #[test]
    fn epochs_with_locks_keep_their_observed_order() {
        let mut intervals = vec![rec(0, 2, vec![2, 1], SyncCause::Acquire(1))];
        assert_eq!(
            make_safe(&mut intervals, &BTreeMap::new(), 2, 2),
            Err(SafeOrderError::LocksInEpoch)
        );
    }
}

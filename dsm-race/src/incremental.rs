//! Race detection between barriers (the paper's section 6.3: analysis only at barriers
//! fails programs that have few), for programs that synchronize through locks alone.
//!
//! Every node ships its closed intervals with all their bitmaps to the race master in
//! batches (`Msg::RaceBatch`), each with the vector time the node had reached. The master
//! keeps the intervals it has received and not yet discarded (`pending`). A new batch's
//! intervals are planned against the pending ones of every other node, exactly as at a
//! barrier (same planner, same comparison), so each pair of intervals is checked when the
//! later of the two arrives. An interval of node p is discarded once every other node's
//! latest batch says it has seen it (`known[q][p] >= index`): every later interval of
//! those nodes follows it, and every earlier one has already been checked against it.
//! Memory is therefore bounded by the intervals not yet seen by everybody, not by the run.
//!
//! A batch costs what it shares with the others, not what is pending: only the pending
//! intervals of other nodes that touch a page the batch touches are planned with it (a
//! pair on no common page cannot race, and pending pairs were checked when the later one
//! arrived), and the intervals every other node has seen leave as a prefix of each node's
//! list. A node that runs ahead of the others thus keeps the master's work flat, where
//! re-planning everything pending made each batch cost more than the last and let the
//! master fall ever further behind (issue 36).
//!
//! At the next barrier the master plans the whole epoch as usual but skips pairs of
//! intervals that were both shipped (already checked), and takes the pending intervals'
//! bitmaps from here instead of fetching them (the nodes no longer have them): the races
//! reported are those barrier-time analysis alone would report, each once.
//!
//! In schedule mode lock edges do not order anything within an epoch, so nothing can be
//! discarded before the barrier.
//!
//! With [`Incremental::keep_oracle`] (tests), every shipped interval and bitmap is also
//! kept apart, with the races found, so that the barrier can run the full barrier-time
//! analysis on the same run and check that the union of incremental and barrier results
//! is exactly what it finds.

use crate::detect::{plan_fresh, Bitmaps, Race, VarTable};
use dsm_proto::{BitmapColumns, IntervalRecord, NodeId, PageNo, PageRuns, VectorTime};

/// The race master's state between two barriers.
pub struct Incremental {
    nodes: usize,
    schedule: bool,
    /// Received intervals with race notices not yet discarded: per node, in index order.
    pending: Vec<Vec<IntervalRecord>>,
    /// The pending intervals' bitmaps.
    bitmaps: Bitmaps,
    /// Each node's vector time at its latest batch.
    known: Vec<Option<VectorTime>>,
    /// Nodes whose last batch before the barrier has arrived (see [`Incremental::absorb`]).
    done: Vec<bool>,
    /// Each node's last interval shipped in this epoch (0: none).
    shipped: Vec<u32>,
    /// Test oracle: every shipped interval, bitmap and incremental race of the epoch.
    oracle: Option<(Vec<IntervalRecord>, Bitmaps, Vec<Race>)>,
    /// Batches absorbed since the run began.
    pub batches: u64,
    /// Most intervals pending at once.
    pub peak_pending: usize,
}

impl Incremental {
    /// State for a job of `nodes` nodes; `schedule` for schedule mode.
    pub fn new(nodes: usize, schedule: bool) -> Self {
        Incremental {
            nodes,
            schedule,
            pending: vec![Vec::new(); nodes],
            bitmaps: Bitmaps::new(),
            known: vec![None; nodes],
            done: vec![false; nodes],
            shipped: vec![0; nodes],
            oracle: None,
            batches: 0,
            peak_pending: 0,
        }
    }

    /// Keeps everything shipped (and the races found) until the barrier, for
    /// [`Incremental::oracle`].
    pub fn keep_oracle(&mut self) {
        self.oracle = Some(Default::default());
    }

    /// Test oracle: the epoch's shipped intervals, all their bitmaps and the races the
    /// incremental analysis reported, when [`Incremental::keep_oracle`] was called.
    pub fn oracle(&self) -> Option<(&[IntervalRecord], &Bitmaps, &[Race])> {
        self.oracle
            .as_ref()
            .map(|(i, b, r)| (i.as_slice(), b, r.as_slice()))
    }

    /// Takes in node `from`'s batch and returns the races between its intervals and the
    /// pending intervals of the other nodes (`epoch` is the epoch under way, for reports).
    pub fn absorb(
        &mut self,
        epoch: u32,
        vars: &VarTable,
        from: NodeId,
        known: VectorTime,
        mut intervals: Vec<IntervalRecord>,
        bitmaps: BitmapColumns,
    ) -> Vec<Race> {
        self.batches += 1;
        let from_idx = from as usize;
        if from_idx >= self.nodes || known.len() != self.nodes {
            return Vec::new();
        }
        if let Some((_, all, _)) = self.oracle.as_mut() {
            all.insert_columns(from, bitmaps.clone());
        }
        self.bitmaps.insert_columns(from, bitmaps);
        let already = self.shipped[from_idx];
        // Filtered in place: records are moved only past one that leaves.
        intervals.retain(|r| r.node == from && r.index > already);
        if let Some(last) = intervals.last() {
            self.shipped[from_idx] = last.index;
        }
        self.shipped[from_idx] = self.shipped[from_idx].max(known.get(from));
        intervals.retain(|r| r.race.is_some());
        let new = intervals;
        if let Some((all, _, _)) = self.oracle.as_mut() {
            all.extend(new.iter().cloned());
        }
        let races = self.plan_batch(epoch, vars, from, already, new);
        if let Some((_, _, found)) = self.oracle.as_mut() {
            found.extend(races.iter().cloned());
        }
        self.known[from_idx] = Some(known);
        self.peak_pending = self.peak_pending.max(self.pending());
        self.discard_seen();
        races
    }

    /// Compares node `from`'s new intervals (`new`, in index order, each with notices)
    /// with the other nodes' pending ones and keeps them pending. Only what can race is
    /// planned: the pending intervals that may be concurrent with some new one (outside
    /// schedule mode, each node's are a window of its list, see [`Incremental::window`])
    /// and touch a page the batch touches, and the new intervals concurrent with one of
    /// those that touches a page they touch, one of the two writing it. The others cannot race
    /// with anything pending (later intervals are planned against them when they come).
    /// Planned intervals are moved through the plan, not copied.
    fn plan_batch(
        &mut self,
        epoch: u32,
        vars: &VarTable,
        from: NodeId,
        already: u32,
        new: Vec<IntervalRecord>,
    ) -> Vec<Race> {
        let from_idx = from as usize;
        let (Some(first), Some(last)) = (new.first(), new.last()) else {
            return Vec::new();
        };
        let touched = touched_pages(&new);
        let mut others: Vec<IntervalRecord> = Vec::new();
        for (node, list) in self.pending.iter().enumerate() {
            if node != from_idx {
                let window = self.window(list, node, first, from, last.index);
                others.extend(
                    list[window]
                        .iter()
                        .filter(|r| touches(r, &touched))
                        .cloned(),
                );
            }
        }
        if others.is_empty() {
            self.pending[from_idx].extend(new);
            return Vec::new();
        }
        let contested = touched_pages(&others);
        // Each new interval's window lies inside the batch's (both bounds only grow along
        // a node's intervals), so the signatures of the batch's window serve them all.
        let signed: Vec<(usize, Vec<Signature>)> = self
            .pending
            .iter()
            .enumerate()
            .map(|(node, list)| {
                if node == from_idx {
                    return (0, Vec::new());
                }
                let window = self.window(list, node, first, from, last.index);
                let signatures = list[window.clone()].iter().map(Signature::of).collect();
                (window.start, signatures)
            })
            .collect();
        let (mut all, quiet): (Vec<IntervalRecord>, Vec<IntervalRecord>) =
            new.into_iter().partition(|a| {
                let mine = Signature::of(a);
                touches(a, &contested)
                    && self.pending.iter().enumerate().any(|(node, list)| {
                        if node == from_idx {
                            return false;
                        }
                        let window = self.window(list, node, a, from, a.index);
                        if window.is_empty() {
                            return false;
                        }
                        let (base, signatures) = &signed[node];
                        let theirs = &signatures[window.start - base..window.end - base];
                        list[window]
                            .iter()
                            .zip(theirs)
                            .any(|(r, &s)| mine.may_conflict(s) && conflict(a, r))
                    })
            });
        if all.is_empty() {
            self.pending[from_idx].extend(quiet);
            return Vec::new();
        }
        all.extend(others);
        let plan = plan_fresh(epoch, all, self.schedule, |r| {
            r.node == from && r.index > already
        });
        let races = plan.compare(&self.bitmaps, vars);
        // The plan holds them sorted by node and index: this node's are the planned new
        // ones, in order; merged back with the quiet ones by index.
        let planned = plan.into_intervals().into_iter().filter(|r| r.node == from);
        let list = &mut self.pending[from_idx];
        let mut quiet = quiet.into_iter().peekable();
        for r in planned {
            while let Some(q) = quiet.next_if(|q| q.index < r.index) {
                list.push(q);
            }
            list.push(r);
        }
        list.extend(quiet);
        races
    }

    /// The positions in node `node`'s pending `list` of the intervals that may be
    /// concurrent with a new interval of node `from` between `earliest` (the one that
    /// knows least) and the one numbered `latest`: those `earliest` has not seen, up to
    /// the first that has seen `latest`. A node's intervals know ever more, so both
    /// bounds are binary searches. In schedule mode lock edges order nothing: all of it.
    fn window(
        &self,
        list: &[IntervalRecord],
        node: usize,
        earliest: &IntervalRecord,
        from: NodeId,
        latest: u32,
    ) -> std::ops::Range<usize> {
        if self.schedule {
            return 0..list.len();
        }
        let seen = earliest.vt.get(node as NodeId);
        let lo = list.partition_point(|r| r.index <= seen);
        let hi = list.partition_point(|r| r.vt.get(from) < latest);
        lo..hi.max(lo)
    }

    /// `node` (whose batches were all absorbed) is entering the barrier and closes no
    /// more intervals with accesses before it: nothing it does later in the epoch can be
    /// concurrent with what the others do, so their intervals need not wait for it to
    /// learn of them.
    pub fn entered_barrier(&mut self, node: NodeId) {
        if let Some(done) = self.done.get_mut(node as usize) {
            *done = true;
            self.discard_seen();
        }
    }

    /// Drops the intervals every other node has seen, and their bitmaps: of each node's
    /// list, the prefix up to the least index the others' latest batches say they know.
    fn discard_seen(&mut self) {
        if self.schedule {
            return;
        }
        let seen: Vec<u32> = (0..self.nodes)
            .map(|p| {
                (0..self.nodes)
                    .filter(|&q| q != p && !self.done[q])
                    .map(|q| self.known[q].as_ref().map_or(0, |k| k.get(p as NodeId)))
                    .min()
                    .unwrap_or(u32::MAX)
            })
            .collect();
        for (node, (list, &upto)) in self.pending.iter_mut().zip(&seen).enumerate() {
            let k = list.partition_point(|r| r.index <= upto);
            list.drain(..k);
            self.bitmaps.discard_through(node as NodeId, upto);
        }
    }

    /// Whether interval `index` of `node` was shipped in this epoch (its pairs with other
    /// shipped intervals are checked already).
    pub fn shipped(&self, node: NodeId, index: u32) -> bool {
        self.shipped.get(node as usize).is_some_and(|&s| index <= s)
    }

    /// Whether any batch arrived in this epoch.
    pub fn active(&self) -> bool {
        self.shipped.iter().any(|&s| s > 0)
    }

    /// The pending intervals and their bitmaps, moved out for the barrier's analysis (the
    /// nodes no longer send their access notices), which ends the epoch: moved rather than
    /// copied, since at a barrier of a lock-heavy epoch they are most of what rank 0
    /// holds. Whether an interval was shipped ([`Incremental::shipped`]) is still answered
    /// until [`Incremental::reset`].
    pub fn take_pending(&mut self) -> (Vec<IntervalRecord>, Bitmaps) {
        let intervals = self.pending.iter_mut().flat_map(std::mem::take).collect();
        (intervals, std::mem::take(&mut self.bitmaps))
    }

    /// Intervals pending now.
    pub fn pending(&self) -> usize {
        self.pending.iter().map(Vec::len).sum()
    }

    /// After a barrier: everything before it is ordered before everything after it.
    pub fn reset(&mut self) {
        self.pending.iter_mut().for_each(Vec::clear);
        self.bitmaps = Bitmaps::new();
        self.known = vec![None; self.nodes];
        self.done = vec![false; self.nodes];
        self.shipped = vec![0; self.nodes];
        if self.oracle.is_some() {
            self.oracle = Some(Default::default());
        }
    }
}

/// Every page the intervals' notices name, as sorted, disjoint runs.
fn touched_pages(intervals: &[IntervalRecord]) -> PageRuns {
    PageRuns::from_runs(
        intervals
            .iter()
            .filter_map(|r| r.race.as_ref())
            .flat_map(|n| n.reads.runs().iter().chain(n.writes.runs()))
            .copied(),
    )
}

/// Whether interval `r`'s notices name a page of `pages`.
fn touches(r: &IntervalRecord, pages: &PageRuns) -> bool {
    r.race.as_ref().is_some_and(|n| {
        runs_meet(n.reads.runs(), pages.runs()) || runs_meet(n.writes.runs(), pages.runs())
    })
}

/// An interval's pages folded into 64 bits (page `p` sets bit `p % 64`; a run of 64 pages
/// or more sets them all), for reads and for writes: two intervals whose signatures do
/// not meet share no page, so a batch's new intervals are compared page by page only with
/// the pending ones that may conflict (a lock-heavy epoch pends thousands).
#[derive(Clone, Copy, Default)]
struct Signature {
    reads: u64,
    writes: u64,
}

impl Signature {
    fn of(r: &IntervalRecord) -> Signature {
        let bits = |runs: &[(PageNo, u32)]| {
            runs.iter().fold(0u64, |m, &(first, count)| match count {
                64.. => u64::MAX,
                _ => m | ((1u64 << count) - 1).rotate_left(first % 64),
            })
        };
        r.race
            .as_ref()
            .map_or_else(Signature::default, |n| Signature {
                reads: bits(n.reads.runs()),
                writes: bits(n.writes.runs()),
            })
    }

    /// Whether the two may share a page that one of them writes ([`conflict`] decides).
    fn may_conflict(self, other: Signature) -> bool {
        self.writes & (other.writes | other.reads) != 0 || self.reads & other.writes != 0
    }
}

/// Whether intervals `a` and `b` touch a common page and one of them writes it.
fn conflict(a: &IntervalRecord, b: &IntervalRecord) -> bool {
    let (Some(a), Some(b)) = (a.race.as_ref(), b.race.as_ref()) else {
        return false;
    };
    runs_meet(a.writes.runs(), b.writes.runs())
        || runs_meet(a.writes.runs(), b.reads.runs())
        || runs_meet(a.reads.runs(), b.writes.runs())
}

/// Whether two sorted lists of disjoint page runs `(first, count)` share a page.
fn runs_meet(a: &[(PageNo, u32)], b: &[(PageNo, u32)]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (af, ac) = a[i];
        let (bf, bc) = b[j];
        if af < bf + bc && bf < af + ac {
            return true;
        }
        if af + ac <= bf + bc {
            i += 1;
        } else {
            j += 1;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_notices(reads: &[(PageNo, u32)], writes: &[(PageNo, u32)]) -> IntervalRecord {
        IntervalRecord {
            node: 0,
            index: 1,
            vt: VectorTime::zero(1),
            writes: PageRuns::new(),
            race: Some(dsm_proto::RaceNotices {
                reads: PageRuns::from_runs(reads.iter().copied()),
                writes: PageRuns::from_runs(writes.iter().copied()),
                ..Default::default()
            }),
            began_with: dsm_proto::SyncCause::Start,
        }
    }

    proptest::proptest! {
        /// Signatures never rule out a conflict: whenever two intervals share a page one
        /// of them writes, their signatures meet.
        #[test]
        fn signatures_keep_every_conflict(
            a_reads in proptest::collection::vec((0u32..400, 1u32..80), 0..4),
            a_writes in proptest::collection::vec((0u32..400, 1u32..80), 0..4),
            b_reads in proptest::collection::vec((0u32..400, 1u32..80), 0..4),
            b_writes in proptest::collection::vec((0u32..400, 1u32..80), 0..4),
        ) {
            let a = with_notices(&a_reads, &a_writes);
            let b = with_notices(&b_reads, &b_writes);
            if conflict(&a, &b) {
                proptest::prop_assert!(Signature::of(&a).may_conflict(Signature::of(&b)));
                proptest::prop_assert!(Signature::of(&b).may_conflict(Signature::of(&a)));
            }
        }
    }

    #[test]
    fn runs_meet_only_on_a_common_page() {
        assert!(runs_meet(&[(0, 2)], &[(1, 1)]));
        assert!(!runs_meet(&[(0, 2)], &[(2, 3)]));
        assert!(runs_meet(&[(0, 1), (10, 5)], &[(3, 2), (14, 9)]));
        assert!(!runs_meet(&[(0, 1), (10, 5)], &[(3, 2), (15, 9)]));
        assert!(!runs_meet(&[], &[(0, 9)]));
    }
}

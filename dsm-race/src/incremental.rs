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
use dsm_proto::{EncodedBitmap, IntervalRecord, NodeId, VectorTime};

/// The race master's state between two barriers.
pub struct Incremental {
    nodes: usize,
    schedule: bool,
    /// Received intervals not yet discarded, by node then index.
    pending: Vec<IntervalRecord>,
    /// The pending intervals' bitmaps.
    bitmaps: Bitmaps,
    /// Each node's vector time at its latest batch.
    known: Vec<Option<VectorTime>>,
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
            pending: Vec::new(),
            bitmaps: Bitmaps::new(),
            known: vec![None; nodes],
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
        intervals: Vec<IntervalRecord>,
        bitmaps: Vec<EncodedBitmap>,
    ) -> Vec<Race> {
        self.batches += 1;
        let from_idx = from as usize;
        if from_idx >= self.nodes || known.len() != self.nodes {
            return Vec::new();
        }
        for b in bitmaps {
            if let Some((_, all, _)) = self.oracle.as_mut() {
                all.insert(from, b.clone());
            }
            self.bitmaps.insert(from, b);
        }
        let already = self.shipped[from_idx];
        let new: Vec<IntervalRecord> = intervals
            .into_iter()
            .filter(|r| r.node == from && r.index > already)
            .collect();
        if let Some(last) = new.last() {
            self.shipped[from_idx] = last.index;
        }
        self.shipped[from_idx] = self.shipped[from_idx].max(known.get(from));
        let mut races = Vec::new();
        if !new.is_empty() {
            let mut all = self.pending.clone();
            all.extend(new.iter().cloned());
            let plan = plan_fresh(epoch, all, self.schedule, |r| {
                r.node == from && r.index > already
            });
            races = plan.compare(&self.bitmaps, vars);
            if let Some((all, _, found)) = self.oracle.as_mut() {
                all.extend(new.iter().filter(|r| r.race.is_some()).cloned());
                found.extend(races.iter().cloned());
            }
            self.pending
                .extend(new.into_iter().filter(|r| r.race.is_some()));
            self.pending.sort_by_key(|r| (r.node, r.index));
        }
        self.known[from_idx] = Some(known);
        self.peak_pending = self.peak_pending.max(self.pending.len());
        self.discard_seen();
        races
    }

    /// Drops the intervals every other node has seen, and their bitmaps.
    fn discard_seen(&mut self) {
        if self.schedule {
            return;
        }
        let known = &self.known;
        let nodes = self.nodes;
        let seen_by_all = |node: NodeId, index: u32| {
            (0..nodes)
                .filter(|&q| q != node as usize)
                .all(|q| known[q].as_ref().is_some_and(|k| k.get(node) >= index))
        };
        let before = self.pending.len();
        self.pending.retain(|r| !seen_by_all(r.node, r.index));
        if self.pending.len() != before {
            self.bitmaps
                .retain(|node, key| !seen_by_all(node, key.interval));
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

    /// The pending intervals, for the barrier's analysis (the nodes no longer send their
    /// access notices).
    pub fn pending_intervals(&self) -> &[IntervalRecord] {
        &self.pending
    }

    /// The pending intervals' bitmaps, for the barrier's analysis.
    pub fn bitmaps(&self) -> &Bitmaps {
        &self.bitmaps
    }

    /// Intervals pending now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// After a barrier: everything before it is ordered before everything after it.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.bitmaps = Bitmaps::new();
        self.known = vec![None; self.nodes];
        self.shipped = vec![0; self.nodes];
        if self.oracle.is_some() {
            self.oracle = Some(Default::default());
        }
    }
}

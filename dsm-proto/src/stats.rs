//! The counters a rank writes at finish (`DSM_STATS_FILE`) that other tools read back: the
//! schema shared by the runtime that writes them and the benchmark driver that reads them.

/// Counters of one barrier's race analysis (the paper's Table 3 inputs), as the barrier
/// master's planner computes them; a rank's run totals are the sums over its barriers.
/// Also the schema of the `race.analysis` block of `DSM_STATS_FILE`, which the benchmark
/// driver reads back (missing fields read as 0). All counts are plain numbers of items.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PlanStats {
    /// Intervals of the epoch that carry read or write notices, i.e. that the analysis
    /// looked at (intervals without accesses to shared memory are left out).
    pub intervals: u64,
    /// Interval pairs of different nodes: every pair a pairwise search would weigh (the
    /// paper's i^2 p^2 term), counted as before the planner indexed intervals by page. The
    /// indexed planner examines only pairs sharing a page and never walks these, but the
    /// count keeps its meaning so that figures stay comparable across versions.
    pub pairs_considered: u64,
    /// Of those, the pairs ordered neither way by happens-before-1: their accesses could
    /// race.
    pub concurrent_pairs: u64,
    /// Of the concurrent pairs, those where a page written by one is read or written by the
    /// other: only these need their access bitmaps compared.
    pub overlapping_pairs: u64,
    /// Intervals in at least one concurrent, page-overlapping pair.
    pub intervals_in_overlap: u64,
    /// Distinct access bitmaps (node, interval, page, read or write) the comparison needs,
    /// whether shipped with the barrier arrivals or fetched afterwards.
    pub bitmaps_wanted: u64,
    /// Access bitmaps that exist for the epoch: one per page in each interval's read
    /// notices plus one per page in its write notices: what a detector fetching every
    /// bitmap would move, against the [`bitmaps_wanted`](Self::bitmaps_wanted) it needs.
    pub bitmaps_total: u64,
}

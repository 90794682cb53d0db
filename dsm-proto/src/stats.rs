//! The counters a rank writes at finish (`DSM_STATS_FILE`) that other tools read back: the
//! schema shared by the runtime that writes them and the benchmark driver that reads them.

/// Counters of one analysis (the paper's Table 3 inputs). Also the schema of the
/// `race.analysis` block of `DSM_STATS_FILE`, which the benchmark driver reads back.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PlanStats {
    pub intervals: u64,
    /// Interval pairs of different nodes that had to be considered at all.
    pub pairs_considered: u64,
    pub concurrent_pairs: u64,
    pub overlapping_pairs: u64,
    /// Intervals in at least one concurrent, page-overlapping pair.
    pub intervals_in_overlap: u64,
    pub bitmaps_wanted: u64,
    pub bitmaps_total: u64,
}

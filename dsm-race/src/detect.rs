//! The barrier master's algorithm, sans I/O. Given every interval of an epoch (vector
//! timestamps, read and write notices), [`plan`] finds the concurrent interval pairs,
//! keeps the pages where one writes and the other reads or writes (the check list) and
//! names exactly the bitmaps to fetch. Given those bitmaps, [`Plan::compare`] finds the
//! granules both touched with at least one write: the data races.
//!
//! Concurrency is decided from vector timestamps: for an interval `a` of node p, the
//! intervals of node q concurrent with it form one contiguous index range (q's intervals
//! up to `a.vt[q]` precede `a`; those whose `vt[p]` has reached `a.index` follow it, and
//! `vt[p]` only grows along q's intervals), found with two binary searches. Pairs that
//! share no page are never looked at: the intervals are indexed by page, and on each page
//! either the concurrent accessors from each other node (a slice of the page's entries) or
//! the accessors whose byte bounds overlap are walked, whichever are fewer (see [`plan`]). Walking every concurrent pair instead ([`plan_pairwise`], the paper's
//! O(i^2 p^2) for p nodes of i intervals) took 300 ms a barrier at Water's scale.

use crate::record::decode_words;
use dsm_proto::{
    AccessKind, BitmapColumns, BitmapKey, EncodedBitmap, IntervalRecord, NodeId, PageExtent,
    PageNo, PageRuns, PlanStats, SourceSite, SyncCause, PAGE_SIZE,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// A named shared allocation, for turning addresses into variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VarInfo {
    /// The name the program gave the allocation.
    pub name: String,
    /// Its first page in the segment (allocations are page-aligned).
    pub first_page: PageNo,
    /// Number of pages it spans.
    pub pages: u32,
    /// Address of its first element in the app's view of the segment (the same on every
    /// node), for reports.
    pub base_addr: usize,
    /// Bytes per element.
    pub elem_size: usize,
    /// Number of elements.
    pub len: usize,
    /// Columns, for 2-D arrays (reports give row and column).
    pub cols: Option<usize>,
    /// `log2` of the bytes per bitmap bit for this allocation, as
    /// [`granule_shift`](crate::granule_shift) computes it from the element size; must
    /// match what the recorder used.
    pub granule_shift: u32,
}

/// The job's allocations by page, to name the variable a racing page belongs to. Rank 0
/// builds it as allocations are made; allocations do not overlap.
#[derive(Clone, Debug, Default)]
pub struct VarTable {
    vars: Vec<VarInfo>,
}

impl VarTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an allocation (in any order; the table stays sorted by first page).
    pub fn push(&mut self, v: VarInfo) {
        self.vars.push(v);
        self.vars.sort_by_key(|v| v.first_page);
    }

    /// The allocation that contains `page`, if any.
    pub fn lookup(&self, page: PageNo) -> Option<&VarInfo> {
        let i = self.vars.partition_point(|v| v.first_page <= page);
        let v = self.vars.get(i.checked_sub(1)?)?;
        (page < v.first_page + v.pages).then_some(v)
    }
}

/// Which conflicting accesses make a race.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum RaceKind {
    /// Both sides wrote the element.
    #[serde(rename = "write-write")]
    WriteWrite,
    /// One side read it and the other wrote it (either way round; see [`Access::write`]).
    #[serde(rename = "read-write")]
    ReadWrite,
}

impl RaceKind {
    /// The name used in reports and in the JSON log: `write-write` or `read-write`.
    pub fn as_str(self) -> &'static str {
        match self {
            RaceKind::WriteWrite => "write-write",
            RaceKind::ReadWrite => "read-write",
        }
    }
}

/// What a reported conflict means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum RaceClass {
    /// The two accesses are concurrent under the full happens-before order (locks and
    /// barriers): a data race.
    #[default]
    #[serde(rename = "data-race")]
    DataRace,
    /// Schedule mode only: the accesses are ordered by lock acquire/release edges but not
    /// by barriers, so which comes first depends on which node got a lock first. The
    /// program is race-free there, but its result may depend on the schedule.
    #[serde(rename = "lock-order")]
    LockOrder,
}

impl RaceClass {
    /// The name used in the JSON log: `data-race` or `lock-order`.
    pub fn as_str(self) -> &'static str {
        match self {
            RaceClass::DataRace => "data-race",
            RaceClass::LockOrder => "lock-order",
        }
    }
}

/// One side of a race.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Access {
    /// The node that made the access.
    pub node: NodeId,
    /// The index of that node's interval in which it happened.
    pub interval: u32,
    /// Whether this side wrote the element (otherwise it only read it).
    pub write: bool,
    /// The synchronization operation that opened the interval.
    pub began_with: SyncCause,
}

impl Access {
    /// "after acquire of lock 3", "after barrier 7", "from the start".
    pub fn sync_text(&self) -> String {
        sync_text(self.began_with, &|_| None, &|_| None)
    }
}

/// Describes what began an interval; `name_of` gives the names of named locks it knows and
/// `sync_name` the program's name of a runtime synchronization epoch (`barrier 3`).
pub fn sync_text(
    cause: SyncCause,
    name_of: &dyn Fn(u64) -> Option<String>,
    sync_name: &dyn Fn(u32) -> Option<String>,
) -> String {
    let lock = |l: u64| match name_of(l) {
        Some(name) => format!("lock \"{name}\""),
        None if l >= 1 << 63 => format!("named lock #{:x}", l & !(1 << 63)),
        None => format!("lock {l}"),
    };
    let semaphore = |s: u64| match name_of(s) {
        Some(name) => format!("semaphore \"{name}\""),
        None => format!("semaphore #{s:x}"),
    };
    match cause {
        SyncCause::Start => "from the start of the run".into(),
        SyncCause::Barrier(e) => match sync_name(e) {
            Some(name) => format!("after {name}"),
            None => format!("after synchronization {e}"),
        },
        SyncCause::Acquire(l) => format!("after acquire of {}", lock(l)),
        SyncCause::Release(l) => format!("after release of {}", lock(l)),
        SyncCause::SemWait(s) => format!("after wait on {}", semaphore(s)),
        SyncCause::SemSignal(s) => format!("after signal of {}", semaphore(s)),
        SyncCause::SemTryFailed(s) => format!("after a failed try-wait on {}", semaphore(s)),
    }
}

/// A data race on one element: two accesses from concurrent intervals of different nodes,
/// at least one a write, to the same granule of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Race {
    /// The epoch (number of the barrier that ended it) in which both accesses happened.
    pub epoch: u32,
    /// The allocation's name, or `<unnamed>` for pages outside every known allocation.
    pub variable: String,
    /// Element index within the variable; for `<unnamed>`, the byte offset in the segment.
    pub index: usize,
    /// `(row, column)` of the element, for 2-D arrays.
    pub row_col: Option<(usize, usize)>,
    /// Address of the element in the app's view of the segment (0 for `<unnamed>`).
    pub addr: usize,
    /// Bytes of the element both sides touched (within the element), as a half-open range
    /// `(start, end)`, at granule resolution.
    pub bytes: (usize, usize),
    /// Write-write or read-write.
    pub kind: RaceKind,
    /// The access from the lower-numbered node.
    pub first: Access,
    /// The access from the higher-numbered node.
    pub second: Access,
    /// A data race, or (schedule mode) a lock-order dependence.
    pub class: RaceClass,
    /// The source sites of the two accesses (`first`, `second`), where the bitmaps named
    /// them.
    pub sites: [Option<SourceSite>; 2],
}

#[derive(Debug, PartialEq, Eq)]
struct Check {
    a: usize,
    b: usize,
    page: PageNo,
}

/// The check list of one epoch and the bitmaps it needs.
#[derive(Debug)]
pub struct Plan {
    /// The epoch analyzed (reported in every [`Race`]).
    pub epoch: u32,
    intervals: Vec<IntervalRecord>,
    checks: Vec<Check>,
    /// Bitmaps to fetch, per owning node: every bitmap some check compares, sorted and
    /// without duplicates. Those already shipped with the barrier arrivals need no fetch.
    pub wanted: BTreeMap<NodeId, Vec<BitmapKey>>,
    /// What the planning found (pairs considered, concurrent, overlapping; bitmaps wanted
    /// out of all that exist).
    pub stats: PlanStats,
}

/// The pages of `intervals`' notices (each of node group `group_of[i]`) that at least two
/// groups touch and at least one writes, as sorted disjoint runs `(first, end)`: a sweep
/// over the runs' ends, so its cost follows the number of runs, not of pages.
fn contested_pages(intervals: &[IntervalRecord], group_of: &[usize]) -> Vec<(PageNo, PageNo)> {
    let groups = group_of.last().map_or(0, |g| g + 1);
    // Per group, the union of the runs it touches and of those it writes.
    let mut touched: Vec<Vec<(PageNo, u32)>> = vec![Vec::new(); groups];
    let mut written: Vec<Vec<(PageNo, u32)>> = vec![Vec::new(); groups];
    for (r, &g) in intervals.iter().zip(group_of) {
        let Some((rd, wr)) = notices(r) else { continue };
        touched[g].extend(rd.runs().iter().chain(wr.runs()));
        written[g].extend(wr.runs());
    }
    // Sweep events (page, change in touching groups, change in writing groups): each
    // group's unions are disjoint, so the counts are numbers of groups.
    let mut events: Vec<(PageNo, i32, i32)> = Vec::new();
    for (runs, touch) in touched
        .into_iter()
        .map(|t| (t, 1))
        .chain(written.into_iter().map(|w| (w, 0)))
    {
        for &(first, count) in PageRuns::from_runs(runs).runs() {
            events.push((first, touch, 1 - touch));
            events.push((first + count, -touch, touch - 1));
        }
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut out: Vec<(PageNo, PageNo)> = Vec::new();
    let (mut touching, mut writing) = (0i32, 0i32);
    let mut k = 0;
    while k < events.len() {
        let at = events[k].0;
        while k < events.len() && events[k].0 == at {
            touching += events[k].1;
            writing += events[k].2;
            k += 1;
        }
        let open = out.last().is_some_and(|r| r.1 == PageNo::MAX);
        let hot = touching >= 2 && writing >= 1;
        if hot && !open {
            out.push((at, PageNo::MAX));
        } else if !hot && open {
            out.last_mut().expect("open run").1 = at;
        }
    }
    out
}

/// Calls `f` for every page of `runs` inside `within` (sorted disjoint `(first, end)`
/// runs), in increasing order.
fn for_each_page_within(runs: &PageRuns, within: &[(PageNo, PageNo)], mut f: impl FnMut(PageNo)) {
    for &(first, count) in runs.runs() {
        let end = first + count;
        let mut i = within.partition_point(|w| w.1 <= first);
        while i < within.len() && within[i].0 < end {
            for page in first.max(within[i].0)..end.min(within[i].1) {
                f(page);
            }
            i += 1;
        }
    }
}

/// Where in one page an interval read and wrote (see
/// [`RaceNotices::extent`](dsm_proto::RaceNotices::extent)).
#[derive(Clone, Copy)]
struct Blocks {
    read: PageExtent,
    write: PageExtent,
}

impl Blocks {
    fn of(r: &IntervalRecord, page: PageNo) -> Blocks {
        r.race.as_ref().map_or(
            Blocks {
                read: PageExtent::none(page),
                write: PageExtent::none(page),
            },
            |n| Blocks {
                read: n.extent(page, false),
                write: n.extent(page, true),
            },
        )
    }

    /// The bytes of the page either extent covers, as one range (empty for none).
    fn span(self) -> (u16, u16) {
        [self.read, self.write]
            .into_iter()
            .filter(|x| x.blocks != 0)
            .map(|x| (x.start, x.end))
            .reduce(|x, y| (x.0.min(y.0), x.1.max(y.1)))
            .unwrap_or((0, 0))
    }

    /// Whether a write of one side may share a byte with an access of the other: only
    /// then can their bitmaps of the page hold a race.
    fn meet(self, other: Blocks) -> bool {
        self.write.meets(&other.read)
            || self.write.meets(&other.write)
            || self.read.meets(&other.write)
    }
}

fn notices(r: &IntervalRecord) -> Option<(&PageRuns, &PageRuns)> {
    r.race.as_ref().map(|n| (&n.reads, &n.writes))
}

/// The page index's entries (see [`plan_fresh`]): one `u64` per (page, interval), page in
/// the high half, the interval's position in the next 30 bits, whether it read and
/// whether it wrote the page in the low two.
const READ: u64 = 1;
/// See [`READ`].
const WRITE: u64 = 2;

fn entry_pos(e: u64) -> usize {
    ((e >> 2) & ((1 << 30) - 1)) as usize
}

fn entry_page(e: u64) -> PageNo {
    (e >> 32) as PageNo
}

/// How the pair search walks a page's entries. The runtime always takes `Cheaper`; the
/// single walks are there for the tests that hold each to the pairwise planner.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(test), allow(dead_code))]
enum Walk {
    /// Per page, whichever of the two below visits fewer entries.
    Cheaper,
    /// For each entry, the other nodes' entries concurrent with it: cheap where locks
    /// order most accesses to the page (a shared counter).
    Concurrent,
    /// For each entry, the entries whose byte bounds overlap its own: cheap where the
    /// accesses are to different elements (Water's per-molecule locks, where nearly
    /// every pair is concurrent but none touch the same bytes).
    Overlapping,
}

/// A check the pair search found: intervals `a` (of group `pk`) and `b` (of a later
/// group `qk`) may race on `page`, through their index entries `ja` and `jb`. Ordered
/// as the pairwise planner emits its checks.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    pk: u32,
    qk: u32,
    a: u32,
    b: u32,
    page: PageNo,
    ja: u32,
    jb: u32,
}

/// What the pair search of [`plan_fresh`] reads: the page index and, per entry, its
/// interval's extents on the page; per interval its node group, whether it is fresh, and
/// the range of each other group's intervals concurrent with it.
struct PairSearch<'a> {
    index: &'a [u64],
    blocks: &'a [Blocks],
    group_of: &'a [usize],
    ranges: &'a [(u32, u32)],
    groups: usize,
    is_fresh: &'a [bool],
}

impl PairSearch<'_> {
    /// The candidates of one page, whose entries are `segments` (per node group in group
    /// order: group, first and end entry, whether any entry writes).
    fn page(&self, segments: &[Segment], walk: Walk, out: &mut Vec<Candidate>) {
        let (Some(first), Some(last)) = (segments.first(), segments.last()) else {
            return;
        };
        if segments.len() < 2 {
            return;
        }
        let entries = first.1..last.2;
        match walk {
            Walk::Concurrent => self.by_concurrency(segments, out),
            Walk::Overlapping => self.by_overlap(entries, out),
            Walk::Cheaper => {
                let spans = self.spans(entries);
                let overlap = self.overlap_cost(&spans);
                if self.concurrency_cost_exceeds(segments, overlap) {
                    self.walk_spans(&spans, out);
                } else {
                    self.by_concurrency(segments, out);
                }
            }
        }
    }

    /// For each entry, the slice of each later group's entries concurrent with it (one
    /// contiguous slice, the page's entries being in interval order).
    fn by_concurrency(&self, segments: &[Segment], out: &mut Vec<Candidate>) {
        for (i, &(_, s, t, _)) in segments.iter().enumerate() {
            for ja in s..t {
                self.concurrent_slices(ja, &segments[i + 1..], |from, to| {
                    for jb in from..to {
                        self.consider(ja, jb, out);
                    }
                });
            }
        }
    }

    /// Entry `ja`'s concurrent entries in each of `later` segments (those that could
    /// race with it: a reader needs a writer on the other side), as `slice(from, to)`.
    fn concurrent_slices(&self, ja: usize, later: &[Segment], mut slice: impl FnMut(usize, usize)) {
        let e = self.index[ja];
        let a = entry_pos(e);
        for &(qk, s, t, q_writes) in later {
            if e & WRITE == 0 && !q_writes {
                continue;
            }
            let (lo, hi) = self.ranges[a * self.groups + qk];
            let seg = &self.index[s..t];
            if lo >= hi
                || entry_pos(seg[0]) >= hi as usize
                || entry_pos(seg[seg.len() - 1]) < lo as usize
            {
                continue;
            }
            let from = s + seg.partition_point(|&f| entry_pos(f) < lo as usize);
            let to = s + seg.partition_point(|&f| entry_pos(f) < hi as usize);
            slice(from, to);
        }
    }

    /// Whether [`PairSearch::by_concurrency`] would visit more than `limit` entries on this
    /// page. Counting stops there: on a page of neighbouring elements (Water's molecules)
    /// nearly every pair is concurrent, and counting them all costs as much as the walk.
    fn concurrency_cost_exceeds(&self, segments: &[Segment], limit: usize) -> bool {
        let mut cost = 0;
        for (i, &(_, s, t, _)) in segments.iter().enumerate() {
            for ja in s..t {
                self.concurrent_slices(ja, &segments[i + 1..], |from, to| cost += to - from);
                if cost > limit {
                    return true;
                }
            }
        }
        false
    }

    /// The page's entries with the bytes each interval touched there (reads and writes
    /// together), sorted by their first byte.
    fn spans(&self, entries: std::ops::Range<usize>) -> Vec<(u16, u16, u32)> {
        let mut spans: Vec<(u16, u16, u32)> = entries
            .map(|j| {
                let (start, end) = self.blocks[j].span();
                (start, end, j as u32)
            })
            .collect();
        spans.sort_unstable();
        spans
    }

    /// How many entries [`PairSearch::walk_spans`] would visit on this page.
    fn overlap_cost(&self, spans: &[(u16, u16, u32)]) -> usize {
        (0..spans.len())
            .map(|t| spans[t + 1..].partition_point(|o| o.0 < spans[t].1))
            .sum()
    }

    fn by_overlap(&self, entries: std::ops::Range<usize>, out: &mut Vec<Candidate>) {
        self.walk_spans(&self.spans(entries), out);
    }

    /// For each entry, the later-sorted entries whose spans start before its own ends:
    /// every pair whose spans overlap, once.
    fn walk_spans(&self, spans: &[(u16, u16, u32)], out: &mut Vec<Candidate>) {
        for (t, &(_, end, j)) in spans.iter().enumerate() {
            let rest = &spans[t + 1..];
            for &(_, _, k) in &rest[..rest.partition_point(|o| o.0 < end)] {
                let (j, k) = (j as usize, k as usize);
                let (gj, gk) = (
                    self.group_of[entry_pos(self.index[j])],
                    self.group_of[entry_pos(self.index[k])],
                );
                if gj < gk {
                    self.consider(j, k, out);
                } else if gk < gj {
                    self.consider(k, j, out);
                }
            }
        }
    }

    /// Keeps entries `ja` and `jb` (of a later group) of one page if their intervals may
    /// race there: one writes, they are concurrent, one is fresh and their extents meet.
    fn consider(&self, ja: usize, jb: usize, out: &mut Vec<Candidate>) {
        let (e, f) = (self.index[ja], self.index[jb]);
        let (a, b) = (entry_pos(e), entry_pos(f));
        let qk = self.group_of[b];
        let (lo, hi) = self.ranges[a * self.groups + qk];
        if (e | f) & WRITE != 0
            && (lo as usize..hi as usize).contains(&b)
            && (self.is_fresh[a] || self.is_fresh[b])
            && self.blocks[ja].meet(self.blocks[jb])
        {
            out.push(Candidate {
                pk: self.group_of[a] as u32,
                qk: qk as u32,
                a: a as u32,
                b: b as u32,
                page: entry_page(e),
                ja: ja as u32,
                jb: jb as u32,
            });
        }
    }
}

/// Builds the check list for an epoch's intervals: for every concurrent pair of intervals
/// of different nodes, the pages where one writes and the other reads or writes, and the
/// read and write bitmaps those pages need. Intervals without race notices are ignored.
///
/// `intervals` are the epoch's intervals from all nodes, in any order. The pair search
/// relies on what real executions guarantee: along one node's intervals, the vector time
/// entries for other nodes never decrease.
///
/// Only pairs that share a page are examined: the intervals are indexed by page (one entry
/// per page of each interval's notices, so the index is as large as the epoch's bitmap
/// count). On each page the search then walks one of two ways, whichever visits fewer
/// entries: for each entry, the concurrent entries of each other node (one contiguous
/// slice of the page's entries, found by binary search within the node's concurrency
/// range), or the entries whose byte bounds overlap its own (a sweep over the entries
/// sorted by first byte). Locks that order most accesses to a page make the first short;
/// locks on neighbouring elements of a page (nearly every pair concurrent, no two touching
/// the same bytes) make the second short. The result is the one [`plan_pairwise`]
/// computes.
pub fn plan(epoch: u32, intervals: Vec<IntervalRecord>) -> Plan {
    plan_with(epoch, intervals, false)
}

/// [`plan`], or with `schedule` the plan of schedule mode (Hood, Kennedy and
/// Mellor-Crummey): lock acquire/release edges are left out of the happens-before order,
/// barriers kept. Within one epoch that makes every pair of intervals of different nodes
/// concurrent, so every such pair that shares a page is checked; [`Plan::compare`] then
/// labels each conflict a data race when the pair is concurrent under the full order too,
/// and a lock-order dependence otherwise. Without `schedule` this is exactly [`plan`].
pub fn plan_with(epoch: u32, intervals: Vec<IntervalRecord>, schedule: bool) -> Plan {
    plan_fresh(epoch, intervals, schedule, |_| true)
}

/// [`plan_with`] restricted to pairs with at least one `fresh` interval: the incremental
/// analysis plans new intervals against those it keeps without checking the kept pairs
/// again. The cost still includes indexing every interval.
pub fn plan_fresh(
    epoch: u32,
    intervals: Vec<IntervalRecord>,
    schedule: bool,
    fresh: impl Fn(&IntervalRecord) -> bool,
) -> Plan {
    plan_walking(epoch, intervals, schedule, fresh, Walk::Cheaper)
}

fn plan_walking(
    epoch: u32,
    mut intervals: Vec<IntervalRecord>,
    schedule: bool,
    fresh: impl Fn(&IntervalRecord) -> bool,
    walk: Walk,
) -> Plan {
    intervals.retain(|r| r.race.is_some());
    // Keys are unique (one record per interval), so an unstable sort orders them the same
    // without a scratch copy of half the epoch's records.
    intervals.sort_unstable_by_key(|r| (r.node, r.index));
    let n = intervals.len();
    let is_fresh: Vec<bool> = intervals.iter().map(&fresh).collect();
    // Entries pack the interval position in 30 bits (see below).
    assert!(n < 1 << 30, "too many intervals in one epoch: {n}");
    let (groups, group_of) = node_groups(&intervals);
    let mut stats = PlanStats {
        intervals: n as u64,
        bitmaps_total: bitmaps_total(&intervals),
        ..Default::default()
    };
    let ranges = concurrency_ranges(&intervals, &groups, schedule, &mut stats);
    let index = page_index(&intervals, &group_of);
    // Per entry, the 64-byte blocks its interval read and wrote on its page.
    let blocks: Vec<Blocks> = index
        .iter()
        .map(|&e| Blocks::of(&intervals[entry_pos(e)], entry_page(e)))
        .collect();
    let (segments, page_segs) = page_segments(&index, &group_of);
    let search = PairSearch {
        index: &index,
        blocks: &blocks,
        group_of: &group_of,
        ranges: &ranges,
        groups: groups.len(),
        is_fresh: &is_fresh,
    };
    let mut found: Vec<Candidate> = Vec::new();
    for &(s0, s1) in &page_segs {
        search.page(&segments[s0..s1], walk, &mut found);
    }
    // The pairwise planner's order: node pair, then a, b and page.
    found.sort_unstable();
    let (checks, want) = checks_and_wants(&found, &index, n, &mut stats);
    let wanted = wanted_keys(&intervals, &groups, &index, &want);
    Plan::new(epoch, intervals, checks, wanted, stats)
}

/// Bitmaps the intervals' notices stand for: a read and a write one per page noticed.
fn bitmaps_total(intervals: &[IntervalRecord]) -> u64 {
    intervals
        .iter()
        .filter_map(notices)
        .map(|(r, w)| r.page_count() + w.page_count())
        .sum()
}

/// Each node's intervals as one contiguous slice of the sorted list, `(node, start,
/// end)`, and each interval's group.
fn node_groups(intervals: &[IntervalRecord]) -> (Vec<(NodeId, usize, usize)>, Vec<usize>) {
    let mut groups: Vec<(NodeId, usize, usize)> = Vec::new();
    let mut group_of = Vec::with_capacity(intervals.len());
    for (i, r) in intervals.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if g.0 == r.node => g.2 = i + 1,
            _ => groups.push((r.node, i, i + 1)),
        }
        group_of.push(groups.len() - 1);
    }
    (groups, group_of)
}

/// `ranges[a * groups + k]`: the positions of group k's intervals concurrent with
/// interval a, as a half-open range (empty for a's own group): the pairwise planner's two
/// binary searches, done as one sweep per node pair since both bounds only grow with a.
fn concurrency_ranges(
    intervals: &[IntervalRecord],
    groups: &[(NodeId, usize, usize)],
    schedule: bool,
    stats: &mut PlanStats,
) -> Vec<(u32, u32)> {
    let (n, ng) = (intervals.len(), groups.len());
    // The vector times as one flat table, vt[i * ng + k] = interval i's entry for group
    // k's node, so that the sweeps below read memory in order.
    let own: Vec<u32> = intervals.iter().map(|r| r.index).collect();
    let mut vt = Vec::with_capacity(n * ng);
    for r in intervals {
        vt.extend(groups.iter().map(|g| r.vt.get(g.0)));
    }
    let mut ranges = vec![(0u32, 0u32); n * ng];
    for (pk, &(_, ps, pe)) in groups.iter().enumerate() {
        for (qk, &(_, qs, qe)) in groups.iter().enumerate() {
            if pk == qk {
                continue;
            }
            let (mut lo, mut hi) = (qs, qs);
            for ai in ps..pe {
                // q's intervals with index <= a.vt[q] precede a.
                while lo < qe && own[lo] <= vt[ai * ng + qk] {
                    lo += 1;
                }
                // From the first q interval that has seen a, all later ones follow a.
                while hi < qe && vt[hi * ng + pk] < own[ai] {
                    hi += 1;
                }
                let (lo, hi) = if schedule { (qs, qe) } else { (lo, hi.max(lo)) };
                ranges[ai * ng + qk] = (lo as u32, hi as u32);
                if pk < qk {
                    stats.concurrent_pairs += (hi - lo) as u64;
                }
            }
            if pk < qk {
                // Kept with its meaning: every cross-node pair a pairwise search weighs.
                stats.pairs_considered += ((pe - ps) * (qe - qs)) as u64;
            }
        }
    }
    ranges
}

/// The page index: one u64 per (page, interval, read or write), page in the high half so
/// that sorting groups pages and, within a page, orders intervals by position (and so by
/// node); an interval's read and write entries for one page merged. Packed integers sort
/// several times faster than tuples. Only pages that two nodes touch and one writes can
/// hold a conflict: a node working on its own band of pages adds its few runs here, not
/// its many pages.
fn page_index(intervals: &[IntervalRecord], group_of: &[usize]) -> Vec<u64> {
    let contested = contested_pages(intervals, group_of);
    let mut index: Vec<u64> = Vec::new();
    for (i, r) in intervals.iter().enumerate() {
        let (rd, wr) = notices(r).expect("filtered");
        for (runs, flag) in [(rd, READ), (wr, WRITE)] {
            for_each_page_within(runs, &contested, |page| {
                index.push((page as u64) << 32 | (i as u64) << 2 | flag);
            });
        }
    }
    index.sort_unstable();
    index.dedup_by(|later, kept| {
        if *later >> 2 == *kept >> 2 {
            *kept |= *later;
            true
        } else {
            false
        }
    });
    index
}

/// A page's entries of one node group: (group, first entry, end entry, whether any entry
/// writes).
type Segment = (usize, usize, usize, bool);

/// Per page, the slices of its entries that belong to each node: `segments`, and per page
/// the range of its segments in it.
fn page_segments(index: &[u64], group_of: &[usize]) -> (Vec<Segment>, Vec<(usize, usize)>) {
    let mut segments: Vec<Segment> = Vec::new();
    let mut page_segs: Vec<(usize, usize)> = Vec::new();
    let mut start = 0;
    while start < index.len() {
        let page = entry_page(index[start]);
        let end = start + index[start..].partition_point(|&e| entry_page(e) == page);
        let first = segments.len();
        for (j, &e) in index.iter().enumerate().take(end).skip(start) {
            let k = group_of[entry_pos(e)];
            let w = e & WRITE != 0;
            match segments[first..].last_mut() {
                Some(s) if s.0 == k => {
                    s.2 = j + 1;
                    s.3 |= w;
                }
                _ => segments.push((k, j, j + 1, w)),
            }
        }
        page_segs.push((first, segments.len()));
        start = end;
    }
    (segments, page_segs)
}

/// The checks of the candidates `found` (sorted), and the bitmaps wanted as bits on the
/// index entries (an entry is one interval's page, wanted by however many partners).
fn checks_and_wants(
    found: &[Candidate],
    index: &[u64],
    n: usize,
    stats: &mut PlanStats,
) -> (Vec<Check>, Vec<u8>) {
    let mut want = vec![0u8; index.len()];
    let mut in_overlap = vec![false; n];
    let mut last_pair = None;
    let checks = found
        .iter()
        .map(|c| {
            if last_pair != Some((c.a, c.b)) {
                last_pair = Some((c.a, c.b));
                stats.overlapping_pairs += 1;
                in_overlap[c.a as usize] = true;
                in_overlap[c.b as usize] = true;
            }
            let (e, f) = (index[c.ja as usize], index[c.jb as usize]);
            // Each side touches the page, so its writes always meet the other's
            // accesses; a read matters only against the other's write.
            want[c.ja as usize] |= (e & WRITE) as u8 | (e & f >> 1 & READ) as u8;
            want[c.jb as usize] |= (f & WRITE) as u8 | (f & e >> 1 & READ) as u8;
            Check {
                a: c.a as usize,
                b: c.b as usize,
                page: c.page,
            }
        })
        .collect();
    stats.intervals_in_overlap = in_overlap.iter().filter(|&&x| x).count() as u64;
    (checks, want)
}

/// The bitmaps to fetch, per node: the keys `want` marks on the index entries. Walking
/// intervals in order and each one's entries in page order (a CSR layout over the index)
/// yields every node's keys already sorted (interval, page, then Read before Write).
fn wanted_keys(
    intervals: &[IntervalRecord],
    groups: &[(NodeId, usize, usize)],
    index: &[u64],
    want: &[u8],
) -> BTreeMap<NodeId, Vec<BitmapKey>> {
    let n = intervals.len();
    let mut first_entry = vec![0usize; n + 1];
    for &e in index {
        first_entry[entry_pos(e) + 1] += 1;
    }
    for i in 0..n {
        first_entry[i + 1] += first_entry[i];
    }
    let mut entries_of = vec![0u32; index.len()];
    let mut fill = first_entry.clone();
    for (j, &e) in index.iter().enumerate() {
        entries_of[fill[entry_pos(e)]] = j as u32;
        fill[entry_pos(e)] += 1;
    }
    let mut wanted: BTreeMap<NodeId, Vec<BitmapKey>> = BTreeMap::new();
    for &(node, ps, pe) in groups {
        let mut keys = Vec::new();
        for (i, r) in intervals.iter().enumerate().take(pe).skip(ps) {
            for &j in &entries_of[first_entry[i]..first_entry[i + 1]] {
                let w = want[j as usize] as u64;
                let page = entry_page(index[j as usize]);
                for (bit, kind) in [(READ, AccessKind::Read), (WRITE, AccessKind::Write)] {
                    if w & bit != 0 {
                        keys.push(BitmapKey {
                            interval: r.index,
                            page,
                            kind,
                        });
                    }
                }
            }
        }
        debug_assert!(keys.windows(2).all(|k| k[0] < k[1]));
        if !keys.is_empty() {
            wanted.insert(node, keys);
        }
    }
    wanted
}

/// The pairwise planner that [`plan`] replaced, kept as its reference: it walks every
/// concurrent interval pair and intersects their page notices, so its cost grows with the
/// number of concurrent pairs (the paper's O(i^2 p^2)) even when few share a page. It
/// returns exactly the same [`Plan`] as [`plan`]; the property test and the
/// `plan_bench` example compare the two. Not used by the runtime.
pub fn plan_pairwise(epoch: u32, mut intervals: Vec<IntervalRecord>) -> Plan {
    intervals.retain(|r| r.race.is_some());
    intervals.sort_by_key(|r| (r.node, r.index));
    let mut by_node: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    for (i, r) in intervals.iter().enumerate() {
        by_node.entry(r.node).or_default().push(i);
    }
    let nodes: Vec<NodeId> = by_node.keys().copied().collect();
    let mut stats = PlanStats {
        intervals: intervals.len() as u64,
        bitmaps_total: bitmaps_total(&intervals),
        ..Default::default()
    };
    let mut checks = Vec::new();
    let mut wanted: BTreeMap<NodeId, BTreeSet<BitmapKey>> = BTreeMap::new();
    let mut in_overlap = vec![false; intervals.len()];
    for (pi, &p) in nodes.iter().enumerate() {
        for &q in &nodes[pi + 1..] {
            let qs = &by_node[&q];
            for &ai in &by_node[&p] {
                let a = &intervals[ai];
                // q's intervals with index <= a.vt[q] precede a.
                let lo = qs.partition_point(|&bi| intervals[bi].index <= a.vt.get(q));
                // From the first q interval that has seen a, all later ones follow a.
                let hi = qs.partition_point(|&bi| intervals[bi].vt.get(p) < a.index);
                stats.pairs_considered += qs.len() as u64;
                if lo >= hi {
                    continue;
                }
                let (ar, aw) = notices(a).expect("filtered");
                for &bi in &qs[lo..hi] {
                    let b = &intervals[bi];
                    debug_assert!(a.concurrent_with(b));
                    stats.concurrent_pairs += 1;
                    let (br, bw) = notices(b).expect("filtered");
                    // Most concurrent pairs share no page; find out without allocating.
                    if !(aw.overlaps(bw) || aw.overlaps(br) || ar.overlaps(bw)) {
                        continue;
                    }
                    let ww = aw.intersect(bw);
                    let wr = aw.intersect(br);
                    let rw = ar.intersect(bw);
                    let want = |wanted: &mut BTreeMap<NodeId, BTreeSet<BitmapKey>>,
                                r: &IntervalRecord,
                                page: PageNo,
                                kind: AccessKind| {
                        wanted.entry(r.node).or_default().insert(BitmapKey {
                            interval: r.index,
                            page,
                            kind,
                        });
                    };
                    let pages: Vec<PageNo> = ww
                        .union(&wr)
                        .union(&rw)
                        .iter()
                        .filter(|&p| Blocks::of(a, p).meet(Blocks::of(b, p)))
                        .collect();
                    if pages.is_empty() {
                        continue;
                    }
                    for page in pages {
                        let a_w = ww.contains(page) || wr.contains(page);
                        let b_w = ww.contains(page) || rw.contains(page);
                        if a_w {
                            want(&mut wanted, a, page, AccessKind::Write);
                        }
                        if b_w {
                            want(&mut wanted, b, page, AccessKind::Write);
                        }
                        if rw.contains(page) {
                            want(&mut wanted, a, page, AccessKind::Read);
                        }
                        if wr.contains(page) {
                            want(&mut wanted, b, page, AccessKind::Read);
                        }
                        checks.push(Check { a: ai, b: bi, page });
                    }
                    stats.overlapping_pairs += 1;
                    in_overlap[ai] = true;
                    in_overlap[bi] = true;
                }
            }
        }
    }
    stats.intervals_in_overlap = in_overlap.iter().filter(|&&x| x).count() as u64;
    let wanted: BTreeMap<NodeId, Vec<BitmapKey>> = wanted
        .into_iter()
        .map(|(n, s)| (n, s.into_iter().collect()))
        .collect();
    Plan::new(epoch, intervals, checks, wanted, stats)
}

/// A multiply-rotate hasher (after rustc's FxHash) for bitmap keys: [`Plan::compare`]
/// looks up four bitmaps per check, tens of thousands of checks a barrier at Water's scale,
/// and SipHash made those lookups most of the comparison. The keys are small integers the
/// nodes chose, not attacker-controlled, so no flooding resistance is needed.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }

    fn write_u16(&mut self, i: u16) {
        self.write_u64(i as u64);
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Turns a code address into file, line and column (see [`set_code_resolver`]).
pub type CodeResolver = Box<dyn Fn(u64) -> Option<SourceSite> + Send + Sync>;

static CODE_RESOLVER: std::sync::OnceLock<CodeResolver> = std::sync::OnceLock::new();

/// Sets, once per process, how the reporting rank symbolises the sites that a
/// ThreadSanitizer-ABI runtime recorded as code addresses ([`crate::record::Site::Code`]).
/// A process-wide setting because every [`Bitmaps`] of the run needs it and only the
/// runtime, which knows the executable, can provide it. Later calls are ignored.
pub fn set_code_resolver(resolver: CodeResolver) {
    let _ = CODE_RESOLVER.set(resolver);
}

/// `site` with its file, line and column filled in from its code address, where a
/// resolver is set and knows the address; Rust sites unchanged. An address nobody could
/// symbolise is named as such (`<code 0x...>`), so the report still tells sites apart.
fn resolve_code_site(site: SourceSite) -> SourceSite {
    let Some(addr) = site.code.filter(|_| site.line == 0) else {
        return site;
    };
    CODE_RESOLVER
        .get()
        .and_then(|resolve| resolve(addr))
        .unwrap_or_else(|| SourceSite {
            file: format!("<code {addr:#x}>"),
            ..site
        })
}

/// Bitmaps received from the nodes, by owner and key, decoded to words. A bitmap that was
/// never inserted reads as all zeros (nothing accessed).
///
/// Bitmaps fetched or shipped one by one are held in a map; those that came in a race
/// batch stay together, per node in interval order, each batch's entries sorted: the
/// master between barriers holds every bitmap until every node has seen its interval but
/// compares few of them, so a batch costs one sort to take in and leaves whole
/// ([`Bitmaps::discard_through`]), and a lookup is two binary searches.
#[derive(Default)]
pub struct Bitmaps {
    map: HashMap<(NodeId, BitmapKey), Held, BuildHasherDefault<KeyHasher>>,
    /// Race batches' bitmaps, per node, ordered by their first interval.
    batches: HashMap<NodeId, VecDeque<HeldBatch>>,
    /// The source sites the inserted bitmaps defined, by node and the node's number, code
    /// addresses not yet symbolised.
    sites: HashMap<(NodeId, u32), Arc<SourceSite>>,
}

/// One bitmap as held: its words, and its sites' spans.
#[derive(Clone, Default)]
struct Held {
    words: Vec<u64>,
    sites: HeldSites,
}

/// A site's span as held: first and last granule, and the node's number for the site
/// (named through [`Bitmaps`]'s table only when a race needs it).
type HeldSpan = (u16, u16, u32);

/// A bitmap's site spans; most bitmaps have one, kept without an allocation of its own.
#[derive(Clone, Default)]
enum HeldSites {
    #[default]
    None,
    One(HeldSpan),
    Many(Vec<HeldSpan>),
}

impl HeldSites {
    fn as_slice(&self) -> &[HeldSpan] {
        match self {
            HeldSites::None => &[],
            HeldSites::One(s) => std::slice::from_ref(s),
            HeldSites::Many(v) => v,
        }
    }
}

/// The bitmaps of one race batch: entries sorted by key, each naming its ranges of the
/// words and the spans.
#[derive(Clone)]
struct HeldBatch {
    /// The lowest and the highest interval of its bitmaps.
    first: u32,
    last: u32,
    entries: Vec<BatchEntry>,
    words: Vec<u64>,
    spans: Vec<HeldSpan>,
}

#[derive(Clone, Copy)]
struct BatchEntry {
    key: BitmapKey,
    words: (u32, u32),
    spans: (u32, u32),
}

/// A held bitmap, wherever it is held.
struct HeldRef<'a> {
    words: &'a [u64],
    sites: &'a [HeldSpan],
}

impl HeldBatch {
    /// The batch of `columns` (entries beyond what the columns hold are left out: the
    /// receiver checked them, see [`BitmapColumns::is_consistent`]); `None` if empty.
    fn new(columns: &BitmapColumns) -> Option<HeldBatch> {
        let mut batch = HeldBatch {
            first: u32::MAX,
            last: 0,
            entries: Vec::with_capacity(columns.len()),
            words: Vec::with_capacity(columns.words.len()),
            spans: Vec::with_capacity(columns.sites.len()),
        };
        for (e, w, spans) in columns.iter() {
            let start = batch.words.len();
            e.spread_into(w, &mut batch.words);
            let first_span = batch.spans.len();
            batch
                .spans
                .extend(spans.iter().map(|s| (s.first, s.last, s.site)));
            batch.entries.push(BatchEntry {
                key: e.key,
                words: (start as u32, batch.words.len() as u32),
                spans: (first_span as u32, batch.spans.len() as u32),
            });
            batch.first = batch.first.min(e.key.interval);
            batch.last = batch.last.max(e.key.interval);
        }
        // Stored interval by interval, each interval's pages by kind: nearly sorted.
        batch.entries.sort_unstable_by_key(|e| e.key);
        (!batch.entries.is_empty()).then_some(batch)
    }

    fn get(&self, key: &BitmapKey) -> Option<HeldRef<'_>> {
        let e = &self.entries[self.entries.binary_search_by_key(key, |e| e.key).ok()?];
        Some(HeldRef {
            words: self.words.get(e.words.0 as usize..e.words.1 as usize)?,
            sites: self.spans.get(e.spans.0 as usize..e.spans.1 as usize)?,
        })
    }
}

impl Bitmaps {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `node`'s bitmap `b`, replacing any earlier one with the same key.
    pub fn insert(&mut self, node: NodeId, b: EncodedBitmap) {
        // Kept as sent: a code address is symbolised only when a race names it
        // ([`Bitmaps::site`]). Reading the executable's debug information takes tens of
        // milliseconds per address, on the master, inside the barrier that fetched the
        // bitmaps, and a program whose bands overlap fetches some at every barrier.
        for (site, def) in b.defs {
            self.sites.insert((node, site), Arc::new(def));
        }
        let span = |s: &dsm_proto::SiteSpan| (s.first, s.last, s.site);
        let sites = match b.sites.as_slice() {
            [] => HeldSites::None,
            [one] => HeldSites::One(span(one)),
            many => HeldSites::Many(many.iter().map(span).collect()),
        };
        let held = Held {
            words: decode_words(&b.bits),
            sites,
        };
        self.map.insert((node, b.key), held);
    }

    /// Adds `node`'s bitmaps in columns (a race batch), kept together; a uniform bitmap's
    /// word is spread over its page.
    pub fn insert_columns(&mut self, node: NodeId, columns: BitmapColumns) {
        for (site, def) in &columns.defs {
            self.sites.insert((node, *site), Arc::new(def.clone()));
        }
        if let Some(batch) = HeldBatch::new(&columns) {
            self.insert_batch(node, batch);
        }
    }

    fn insert_batch(&mut self, node: NodeId, batch: HeldBatch) {
        let queue = self.batches.entry(node).or_default();
        let at = queue.partition_point(|b| b.first <= batch.first);
        queue.insert(at, batch);
    }

    /// Drops `node`'s race batches whose intervals all lie at or before `upto` (a batch
    /// that reaches past it stays whole: its earlier bitmaps are never asked for again).
    pub fn discard_through(&mut self, node: NodeId, upto: u32) {
        if let Some(queue) = self.batches.get_mut(&node) {
            while queue.front().is_some_and(|b| b.last <= upto) {
                queue.pop_front();
            }
        }
    }

    /// Adds every bitmap of `other`, moving them.
    pub fn append(&mut self, other: Bitmaps) {
        self.map.extend(other.map);
        self.sites.extend(other.sites);
        for (node, queue) in other.batches {
            for batch in queue {
                self.insert_batch(node, batch);
            }
        }
    }

    /// Adds every bitmap of `other`.
    pub fn extend(&mut self, other: &Bitmaps) {
        self.map
            .extend(other.map.iter().map(|(k, v)| (*k, v.clone())));
        self.sites
            .extend(other.sites.iter().map(|(k, v)| (*k, v.clone())));
        for (&node, queue) in &other.batches {
            for batch in queue {
                self.insert_batch(node, batch.clone());
            }
        }
    }

    /// Number of bitmaps held.
    pub fn len(&self) -> usize {
        let batched: usize = self
            .batches
            .values()
            .flatten()
            .map(|b| b.entries.len())
            .sum();
        self.map.len() + batched
    }

    /// Whether no bitmap is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `node`'s bitmap `key` has been inserted (to fetch only what is missing).
    pub fn contains(&self, node: NodeId, key: &BitmapKey) -> bool {
        self.lookup(node, key).is_some()
    }

    pub(crate) fn get(&self, r: &IntervalRecord, page: PageNo, kind: AccessKind) -> &[u64] {
        self.held(r, page, kind).map_or(&[], |h| h.words)
    }

    fn held(&self, r: &IntervalRecord, page: PageNo, kind: AccessKind) -> Option<HeldRef<'_>> {
        let key = BitmapKey {
            interval: r.index,
            page,
            kind,
        };
        self.lookup(r.node, &key)
    }

    fn lookup(&self, node: NodeId, key: &BitmapKey) -> Option<HeldRef<'_>> {
        if let Some(h) = self.map.get(&(node, *key)) {
            return Some(HeldRef {
                words: &h.words,
                sites: h.sites.as_slice(),
            });
        }
        let queue = self.batches.get(&node)?;
        // The batches that may hold it begin at or before its interval: normally one.
        let end = queue.partition_point(|b| b.first <= key.interval);
        queue
            .range(..end)
            .rev()
            .filter(|b| key.interval <= b.last)
            .find_map(|b| b.get(key))
    }

    /// The source site of `r`'s access of `kind` to granule `granule` of `page`: the site
    /// of the narrowest span holding it (a span over the whole page is a site whose
    /// granules were not tracked, and yields to any site known to have touched it).
    pub fn site(
        &self,
        r: &IntervalRecord,
        page: PageNo,
        kind: AccessKind,
        granule: usize,
    ) -> Option<SourceSite> {
        let held = self.held(r, page, kind)?;
        let (_, _, site) = held
            .sites
            .iter()
            .filter(|(first, last, _)| (*first as usize..=*last as usize).contains(&granule))
            .min_by_key(|(first, last, _)| last - first)?;
        // A site whose definition was lost with another list is left unnamed.
        self.sites
            .get(&(r.node, *site))
            .map(|s| resolve_code_site((**s).clone()))
    }
}

/// Word `i` of a bitmap; a missing word is all zeros (nothing accessed).
pub(crate) fn word(bits: &[u64], i: usize) -> u64 {
    bits.get(i).copied().unwrap_or(0)
}

impl Plan {
    /// A plan of `checks` needing `wanted`, with the count of wanted bitmaps in `stats`.
    fn new(
        epoch: u32,
        intervals: Vec<IntervalRecord>,
        checks: Vec<Check>,
        wanted: BTreeMap<NodeId, Vec<BitmapKey>>,
        mut stats: PlanStats,
    ) -> Plan {
        stats.bitmaps_wanted = wanted.values().map(|v| v.len() as u64).sum();
        Plan {
            epoch,
            intervals,
            checks,
            wanted,
            stats,
        }
    }

    /// The planned intervals, sorted by node and index, once the plan has been compared.
    pub fn into_intervals(self) -> Vec<IntervalRecord> {
        self.intervals
    }

    /// Compares the fetched bitmaps and returns every race, one per element and interval
    /// pair, ordered by variable, element and interval pair.
    pub fn compare(&self, bitmaps: &Bitmaps, vars: &VarTable) -> Vec<Race> {
        let mut races: BTreeMap<(String, usize, Access, Access), Race> = BTreeMap::new();
        for c in &self.checks {
            let (a, b) = (&self.intervals[c.a], &self.intervals[c.b]);
            let class = if a.concurrent_with(b) {
                RaceClass::DataRace
            } else {
                RaceClass::LockOrder
            };
            let aw = bitmaps.get(a, c.page, AccessKind::Write);
            let ar = bitmaps.get(a, c.page, AccessKind::Read);
            let bw = bitmaps.get(b, c.page, AccessKind::Write);
            let br = bitmaps.get(b, c.page, AccessKind::Read);
            let words = aw.len().max(ar.len()).max(bw.len()).max(br.len());
            let var = vars.lookup(c.page);
            let shift = var.map_or(3, |v| v.granule_shift);
            for i in 0..words {
                let ww = word(aw, i) & word(bw, i);
                let wr = word(aw, i) & word(br, i);
                let rw = word(ar, i) & word(bw, i);
                let mut any = ww | wr | rw;
                while any != 0 {
                    let bit = any.trailing_zeros() as usize;
                    any &= any - 1;
                    let m = 1u64 << bit;
                    let (a_write, b_write) = if ww & m != 0 {
                        (true, true)
                    } else if wr & m != 0 {
                        (true, false)
                    } else {
                        (false, true)
                    };
                    let granule = i * 64 + bit;
                    let page_offset = granule << shift;
                    let granule_bytes = 1usize << shift;
                    let mut race = describe(
                        self.epoch,
                        var,
                        c.page,
                        page_offset,
                        granule_bytes,
                        Access {
                            node: a.node,
                            interval: a.index,
                            write: a_write,
                            began_with: a.began_with,
                        },
                        Access {
                            node: b.node,
                            interval: b.index,
                            write: b_write,
                            began_with: b.began_with,
                        },
                    );
                    race.class = class;
                    // Named when a side first needs one (most granules of a race fall
                    // into an element already reported).
                    let site = |side: usize| {
                        let (r, w) = if side == 0 {
                            (a, a_write)
                        } else {
                            (b, b_write)
                        };
                        let kind = if w {
                            AccessKind::Write
                        } else {
                            AccessKind::Read
                        };
                        bitmaps.site(r, c.page, kind, granule)
                    };
                    let key = (race.variable.clone(), race.index, race.first, race.second);
                    match races.get_mut(&key) {
                        Some(r) => {
                            r.bytes.0 = r.bytes.0.min(race.bytes.0);
                            r.bytes.1 = r.bytes.1.max(race.bytes.1);
                            // A side's site is that of its write where it wrote.
                            for (side, (had, now)) in
                                [(r.first.write, a_write), (r.second.write, b_write)]
                                    .into_iter()
                                    .enumerate()
                            {
                                if r.sites[side].is_none() || (now && !had) {
                                    r.sites[side] = site(side).or(r.sites[side].take());
                                }
                            }
                            r.first.write |= race.first.write;
                            r.second.write |= race.second.write;
                            if r.first.write && r.second.write {
                                r.kind = RaceKind::WriteWrite;
                            }
                        }
                        None => {
                            race.sites = [site(0), site(1)];
                            races.insert(key, race);
                        }
                    }
                }
            }
        }
        races.into_values().collect()
    }

    /// The intervals the plan was built from.
    pub fn intervals(&self) -> &[IntervalRecord] {
        &self.intervals
    }

    /// Keeps only the checks of interval pairs `keep` accepts (in either order), and
    /// narrows [`Plan::wanted`] to the bitmaps those still need.
    pub fn retain_pairs(&mut self, keep: impl Fn(&IntervalRecord, &IntervalRecord) -> bool) {
        let intervals = &self.intervals;
        self.checks
            .retain(|c| keep(&intervals[c.a], &intervals[c.b]));
        let needed: std::collections::HashSet<(NodeId, u32, PageNo)> = self
            .checks
            .iter()
            .flat_map(|c| [c.a, c.b].map(|i| (intervals[i].node, intervals[i].index, c.page)))
            .collect();
        for (node, keys) in self.wanted.iter_mut() {
            keys.retain(|k| needed.contains(&(*node, k.interval, k.page)));
        }
        self.wanted.retain(|_, keys| !keys.is_empty());
        self.stats.bitmaps_wanted = self.wanted.values().map(|v| v.len() as u64).sum();
    }
}

fn describe(
    epoch: u32,
    var: Option<&VarInfo>,
    page: PageNo,
    page_offset: usize,
    granule_bytes: usize,
    first: Access,
    second: Access,
) -> Race {
    let kind = if first.write && second.write {
        RaceKind::WriteWrite
    } else {
        RaceKind::ReadWrite
    };
    match var {
        Some(v) => {
            let byte = (page - v.first_page) as usize * PAGE_SIZE + page_offset;
            let index = byte / v.elem_size.max(1);
            let within = byte % v.elem_size.max(1);
            Race {
                epoch,
                variable: v.name.clone(),
                index,
                row_col: v.cols.map(|c| (index / c.max(1), index % c.max(1))),
                addr: v.base_addr + index * v.elem_size,
                bytes: (within, (within + granule_bytes).min(v.elem_size.max(1))),
                kind,
                first,
                second,
                class: RaceClass::DataRace,
                sites: Default::default(),
            }
        }
        None => Race {
            epoch,
            variable: "<unnamed>".into(),
            index: page as usize * PAGE_SIZE + page_offset,
            row_col: None,
            addr: 0,
            bytes: (0, granule_bytes),
            kind,
            first,
            second,
            class: RaceClass::DataRace,
            sites: Default::default(),
        },
    }
}

/// Keeps only first races (paper, section 6.4): races not affected by another race, where
/// a race affects another when one of its intervals precedes one of the other's in
/// happens-before-1. Races can affect each other in a cycle: node p's race on x precedes
/// its race on y in program order while node q's race on y precedes its race on x. Such a
/// group is kept whole when nothing outside it affects it (the races of every source
/// strongly connected component of the affects graph); dropping every race that anything
/// affects would leave nothing of an epoch that has races. A race in an earlier epoch
/// precedes every race of later epochs, so callers apply this to the first epoch with
/// races and drop the rest.
pub fn first_races(races: Vec<Race>, intervals: &[IntervalRecord]) -> Vec<Race> {
    type Pair = ((NodeId, u32), (NodeId, u32));
    let pair_of = |r: &Race| {
        (
            (r.first.node, r.first.interval),
            (r.second.node, r.second.interval),
        )
    };
    // Races of one interval pair affect and are affected alike: work on the pairs.
    let pairs: Vec<Pair> = races
        .iter()
        .map(pair_of)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let ends: Vec<[Option<&IntervalRecord>; 2]> = pairs
        .iter()
        .map(|&((n1, i1), (n2, i2))| {
            [
                intervals.iter().find(|r| r.node == n1 && r.index == i1),
                intervals.iter().find(|r| r.node == n2 && r.index == i2),
            ]
        })
        .collect();
    let affects = |x: usize, y: usize| {
        ends[x].iter().flatten().any(|o| {
            ends[y]
                .iter()
                .flatten()
                .any(|m| o.precedes(m) && !(o.node == m.node && o.index == m.index))
        })
    };
    // The graph can be dense (program order relates most pairs of a node's intervals):
    // its edges are recomputed when needed rather than stored.
    let n = pairs.len();
    let component = strong_components(n, affects);
    let mut affected = vec![false; n];
    for x in 0..n {
        for y in 0..n {
            if component[x] != component[y] && affects(x, y) {
                affected[component[y]] = true;
            }
        }
    }
    let first: BTreeSet<Pair> = pairs
        .iter()
        .enumerate()
        .filter(|&(x, _)| !affected[component[x]])
        .map(|(_, &p)| p)
        .collect();
    races
        .into_iter()
        .filter(|r| first.contains(&pair_of(r)))
        .collect()
}

/// Strongly connected components of the directed graph on vertices `0..n` with an edge
/// `x -> y` where `edge(x, y)` (Kosaraju, without recursion): the component number of each
/// vertex. Edges are asked for, never stored: O(n^2) calls, O(n) memory.
fn strong_components(n: usize, edge: impl Fn(usize, usize) -> bool) -> Vec<usize> {
    // Vertices in the order a depth-first search finishes them.
    let mut finished = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for root in 0..n {
        if seen[root] {
            continue;
        }
        seen[root] = true;
        let mut stack = vec![(root, 0)];
        while let Some(top) = stack.last_mut() {
            let x = top.0;
            match (top.1..n).find(|&y| !seen[y] && edge(x, y)) {
                Some(y) => {
                    top.1 = y + 1;
                    seen[y] = true;
                    stack.push((y, 0));
                }
                None => {
                    finished.push(x);
                    stack.pop();
                }
            }
        }
    }
    // Each search of the reversed graph, latest finisher first, collects one component.
    let mut component = vec![usize::MAX; n];
    let mut count = 0;
    for &root in finished.iter().rev() {
        if component[root] != usize::MAX {
            continue;
        }
        component[root] = count;
        let mut stack = vec![root];
        while let Some(x) = stack.pop() {
            for (y, c) in component.iter_mut().enumerate() {
                if *c == usize::MAX && edge(y, x) {
                    *c = count;
                    stack.push(y);
                }
            }
        }
        count += 1;
    }
    component
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{encode_words, Recorder};
    use dsm_proto::{RaceNotices, VectorTime};

    /// One bitmap for [`columns`]: interval, page, kind, words, uniform count, site.
    type TestBitmap = (u32, PageNo, AccessKind, Vec<u64>, u32, u32);

    /// Columns of one bitmap per entry of `bitmaps`.
    fn columns(bitmaps: &[TestBitmap]) -> BitmapColumns {
        let mut c = BitmapColumns::default();
        for (interval, page, kind, words, uniform, site) in bitmaps {
            c.entries.push(dsm_proto::ColumnEntry {
                key: BitmapKey {
                    interval: *interval,
                    page: *page,
                    kind: *kind,
                },
                words: words.len() as u32,
                uniform: *uniform,
                sites: 1,
            });
            c.words.extend(words);
            c.sites.push(dsm_proto::SiteSpan {
                site: *site,
                first: 0,
                last: 511,
            });
        }
        c.defs.push((
            7,
            SourceSite {
                file: "a.rs".into(),
                line: 3,
                column: 1,
                code: None,
            },
        ));
        c
    }

    #[test]
    fn batched_bitmaps_are_found_and_leave_by_batch() {
        use AccessKind::{Read, Write};
        let mut b = Bitmaps::new();
        // Out of order within the batch (writes before reads, pages descending).
        b.insert_columns(
            1,
            columns(&[
                (3, 9, Write, vec![1, 2], 0, 7),
                (3, 4, Read, vec![5; 8], 0, 7),
                (2, 4, Write, vec![u64::MAX], 8, 7),
            ]),
        );
        b.insert_columns(1, columns(&[(5, 4, Write, vec![6], 0, 7)]));
        b.insert_columns(2, columns(&[(3, 9, Write, vec![8], 0, 7)]));
        let r = |node, index| iv(node, index, vec![0; 3], &[], &[]);
        assert_eq!(b.get(&r(1, 3), 9, Write), &[1, 2]);
        assert_eq!(b.get(&r(1, 3), 4, Read), &[5; 8]);
        assert_eq!(
            b.get(&r(1, 2), 4, Write),
            &[u64::MAX; 8],
            "a uniform bitmap spreads"
        );
        assert_eq!(b.get(&r(1, 5), 4, Write), &[6]);
        assert_eq!(b.get(&r(2, 3), 9, Write), &[8]);
        assert!(b.get(&r(1, 3), 9, Read).is_empty());
        assert!(b.get(&r(1, 4), 4, Write).is_empty());
        assert_eq!(b.len(), 5);
        assert_eq!(
            b.site(&r(1, 3), 9, Write, 5).map(|s| s.line),
            Some(3),
            "sites are named through the batch's definitions"
        );
        // A batch that reaches past `upto` stays; one wholly before it leaves.
        b.discard_through(1, 4);
        assert_eq!(b.len(), 2);
        assert!(!b.contains(
            1,
            &BitmapKey {
                interval: 3,
                page: 9,
                kind: Write
            }
        ));
        assert!(b.contains(
            1,
            &BitmapKey {
                interval: 5,
                page: 4,
                kind: Write
            }
        ));
        // Moved into another collection, with a batch of an earlier interval after it.
        let mut all = Bitmaps::new();
        all.insert_columns(1, columns(&[(1, 4, Read, vec![9], 0, 7)]));
        all.append(b);
        assert_eq!(all.get(&r(1, 1), 4, Read), &[9]);
        assert_eq!(all.get(&r(1, 5), 4, Write), &[6]);
        assert_eq!(all.len(), 3);
    }

    fn iv(node: NodeId, index: u32, vt: Vec<u32>, reads: &[u32], writes: &[u32]) -> IntervalRecord {
        IntervalRecord {
            node,
            index,
            vt: VectorTime::from(vt),
            writes: PageRuns::new(),
            race: Some(RaceNotices {
                reads: PageRuns::from_pages(reads.iter().copied()),
                writes: PageRuns::from_pages(writes.iter().copied()),
                ..Default::default()
            }),
            began_with: SyncCause::Barrier(1),
        }
    }

    fn vars() -> VarTable {
        let mut t = VarTable::new();
        t.push(VarInfo {
            name: "grid".into(),
            first_page: 0,
            pages: 16,
            base_addr: 0x1000_0000,
            elem_size: 8,
            len: 16 * 512,
            cols: Some(512),
            granule_shift: 3,
        });
        t
    }

    fn bitmap(
        node: NodeId,
        interval: u32,
        page: u32,
        kind: AccessKind,
        elems: &[usize],
    ) -> (NodeId, EncodedBitmap) {
        let mut words = vec![0u64; 8];
        for &e in elems {
            words[e / 64] |= 1 << (e % 64);
        }
        (
            node,
            EncodedBitmap {
                key: BitmapKey {
                    interval,
                    page,
                    kind,
                },
                bits: encode_words(&words),
                sites: Default::default(),
                defs: Vec::new(),
            },
        )
    }

    #[test]
    fn ordered_pairs_are_skipped() {
        // node 0 interval 1 releases to node 1's interval 2; node 1 interval 1 is concurrent.
        let a = iv(0, 1, vec![1, 0], &[], &[3]);
        let b1 = iv(1, 1, vec![0, 1], &[3], &[]);
        let b2 = iv(1, 2, vec![1, 2], &[3], &[]);
        let p = plan(1, vec![a, b1, b2]);
        assert_eq!(p.stats.concurrent_pairs, 1);
        assert_eq!(p.stats.overlapping_pairs, 1);
        assert_eq!(
            p.wanted[&0],
            vec![BitmapKey {
                interval: 1,
                page: 3,
                kind: AccessKind::Write
            }]
        );
        assert_eq!(
            p.wanted[&1],
            vec![BitmapKey {
                interval: 1,
                page: 3,
                kind: AccessKind::Read
            }]
        );
    }

    #[test]
    fn schedule_mode_checks_lock_ordered_pairs_as_lock_order() {
        // Node 0's interval 1 writes grid[0][3] and releases a lock that node 1's interval
        // 2 acquires; node 1 writes the same element there, and in its concurrent interval
        // 1 it writes grid[0][5], which node 0 also writes: a real data race.
        let a = iv(0, 1, vec![1, 0], &[], &[0]);
        let b1 = iv(1, 1, vec![0, 1], &[], &[0]);
        let mut b2 = iv(1, 2, vec![1, 2], &[], &[0]);
        b2.began_with = SyncCause::Acquire(7);
        let all = vec![a, b1, b2];
        let mut bitmaps = Bitmaps::new();
        for (node, b) in [
            bitmap(0, 1, 0, AccessKind::Write, &[3, 5]),
            bitmap(1, 1, 0, AccessKind::Write, &[5]),
            bitmap(1, 2, 0, AccessKind::Write, &[3]),
        ] {
            bitmaps.insert(node, b);
        }
        let plain = plan(1, all.clone());
        let races = plain.compare(&bitmaps, &vars());
        assert_eq!(races.len(), 1);
        assert_eq!((races[0].index, races[0].class), (5, RaceClass::DataRace));
        let sched = plan_with(1, all, true);
        assert_eq!(sched.stats.concurrent_pairs, 2);
        let races = sched.compare(&bitmaps, &vars());
        assert_eq!(races.len(), 2, "{races:?}");
        assert_eq!((races[0].index, races[0].class), (3, RaceClass::LockOrder));
        assert_eq!(races[0].second.began_with, SyncCause::Acquire(7));
        assert_eq!((races[1].index, races[1].class), (5, RaceClass::DataRace));
    }

    /// Sets `b`'s site spans (site, first, last) and the sites it defines (site, line).
    fn with_sites(b: &mut EncodedBitmap, spans: &[(u32, u16, u16)], defs: &[(u32, u32)]) {
        b.sites = spans
            .iter()
            .map(|&(site, first, last)| dsm_proto::SiteSpan { site, first, last })
            .collect();
        b.defs = defs
            .iter()
            .map(|&(site, line)| {
                let at = SourceSite {
                    file: "src/k.rs".into(),
                    line,
                    column: 9,
                    code: None,
                };
                (site, at)
            })
            .collect();
    }

    #[test]
    fn races_name_the_site_of_each_side_granule_by_granule() {
        // Node 0 touched grid[0][0..4] from line 10 and grid[0][4..10] from line 11; node 1
        // wrote the whole row from line 20. Races on [3] and [5] name different lines on
        // node 0's side. A later list from node 0 names site 1 without its definition.
        let a = iv(0, 1, vec![1, 0], &[], &[0]);
        let b = iv(1, 1, vec![0, 1], &[], &[0]);
        let mut bitmaps = Bitmaps::new();
        let (_, mut a_bits) = bitmap(0, 1, 0, AccessKind::Write, &[3, 5]);
        with_sites(&mut a_bits, &[(0, 0, 3), (1, 4, 9)], &[(0, 10), (1, 11)]);
        let (_, mut b_bits) = bitmap(1, 1, 0, AccessKind::Write, &[3, 5]);
        with_sites(&mut b_bits, &[(0, 0, 511)], &[(0, 20)]);
        bitmaps.insert(0, a_bits);
        bitmaps.insert(1, b_bits);
        let races = plan(1, vec![a.clone(), b.clone()]).compare(&bitmaps, &vars());
        let lines: Vec<(usize, Option<u32>, Option<u32>)> = races
            .iter()
            .map(|r| {
                let line = |i: usize| r.sites[i].as_ref().map(|s| s.line);
                (r.index, line(0), line(1))
            })
            .collect();
        assert_eq!(
            lines,
            vec![(3, Some(10), Some(20)), (5, Some(11), Some(20))]
        );
        let mut later = Bitmaps::new();
        later.extend(&bitmaps);
        let (_, mut again) = bitmap(0, 1, 0, AccessKind::Write, &[5]);
        with_sites(&mut again, &[(1, 5, 5), (7, 0, 0)], &[]);
        later.insert(0, again);
        let r = &plan(1, vec![a, b]).compare(&later, &vars())[0];
        assert_eq!(r.sites[0].as_ref().map(|s| s.line), Some(11));
    }

    #[test]
    fn code_sites_are_symbolised_only_when_a_race_names_them() {
        // The only test of this process that sets the (process-wide) resolver.
        static LOOKUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        set_code_resolver(Box::new(|addr| {
            LOOKUPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(SourceSite {
                file: "k.c".into(),
                line: addr as u32,
                column: 3,
                code: None,
            })
        }));
        let a = iv(0, 1, vec![1, 0], &[], &[0]);
        let b = iv(1, 1, vec![0, 1], &[], &[0]);
        let code = |addr: u64| SourceSite {
            file: String::new(),
            line: 0,
            column: 0,
            code: Some(addr),
        };
        let mut bitmaps = Bitmaps::new();
        for (node, granules, addr) in [(0, &[3][..], 41), (1, &[3, 6][..], 42)] {
            let (_, mut bits) = bitmap(node, 1, 0, AccessKind::Write, granules);
            bits.sites = std::iter::once(dsm_proto::SiteSpan {
                site: 0,
                first: 0,
                last: 511,
            })
            .collect();
            bits.defs = vec![(0, code(addr))];
            bitmaps.insert(node, bits);
        }
        assert_eq!(LOOKUPS.load(std::sync::atomic::Ordering::SeqCst), 0);
        let races = plan(1, vec![a, b]).compare(&bitmaps, &vars());
        assert_eq!(races.len(), 1);
        let lines = races[0].sites.clone().map(|s| s.map(|s| (s.file, s.line)));
        assert_eq!(
            lines,
            [Some(("k.c".to_string(), 41)), Some(("k.c".to_string(), 42))]
        );
        assert!(LOOKUPS.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    }

    #[test]
    fn disjoint_pages_need_no_bitmaps() {
        let a = iv(0, 1, vec![1, 0], &[1], &[2]);
        let b = iv(1, 1, vec![0, 1], &[5], &[6]);
        let p = plan(1, vec![a, b]);
        assert_eq!(p.stats.concurrent_pairs, 1);
        assert_eq!(p.stats.overlapping_pairs, 0);
        assert!(p.wanted.is_empty());
        assert!(p.compare(&Bitmaps::new(), &vars()).is_empty());
    }

    #[test]
    fn read_read_is_not_a_race() {
        let a = iv(0, 1, vec![1, 0], &[2], &[]);
        let b = iv(1, 1, vec![0, 1], &[2], &[]);
        let p = plan(1, vec![a, b]);
        assert_eq!(p.stats.overlapping_pairs, 0);
    }

    #[test]
    fn false_sharing_vs_true_sharing() {
        let a = iv(0, 1, vec![1, 0], &[], &[2]);
        let b = iv(1, 1, vec![0, 1], &[], &[2]);
        let p = plan(1, vec![a, b]);
        // False sharing: different elements of page 2.
        let mut bm = Bitmaps::new();
        let (n, x) = bitmap(0, 1, 2, AccessKind::Write, &[0, 1]);
        bm.insert(n, x);
        let (n, x) = bitmap(1, 1, 2, AccessKind::Write, &[2, 3]);
        bm.insert(n, x);
        assert!(p.compare(&bm, &vars()).is_empty());
        // True sharing on element 3 of page 2 = grid index 2*512+3 = row 2, col 3.
        let (n, x) = bitmap(0, 1, 2, AccessKind::Write, &[0, 1, 3]);
        bm.insert(n, x);
        let races = p.compare(&bm, &vars());
        assert_eq!(races.len(), 1);
        let r = &races[0];
        assert_eq!(r.variable, "grid");
        assert_eq!(r.index, 2 * 512 + 3);
        assert_eq!(r.row_col, Some((2, 3)));
        assert_eq!(r.kind, RaceKind::WriteWrite);
        assert_eq!(r.bytes, (0, 8));
        assert_eq!(r.addr, 0x1000_0000 + (2 * 512 + 3) * 8);
    }

    #[test]
    fn read_write_race_sides() {
        let a = iv(0, 1, vec![1, 0], &[4], &[]);
        let b = iv(1, 1, vec![0, 1], &[], &[4]);
        let p = plan(1, vec![a, b]);
        let mut bm = Bitmaps::new();
        let (n, x) = bitmap(0, 1, 4, AccessKind::Read, &[7]);
        bm.insert(n, x);
        let (n, x) = bitmap(1, 1, 4, AccessKind::Write, &[7]);
        bm.insert(n, x);
        let races = p.compare(&bm, &vars());
        assert_eq!(races.len(), 1);
        assert_eq!(races[0].kind, RaceKind::ReadWrite);
        assert!(!races[0].first.write && races[0].second.write);
    }

    #[test]
    fn concurrency_ranges_match_brute_force() {
        // Random-ish lock-ordered histories on 3 nodes: compare the range-based pair search
        // with checking every pair.
        let mut seed = 12345u64;
        let mut rnd = |m: u32| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as u32) % m
        };
        for _ in 0..50 {
            let n = 3usize;
            let mut vt = vec![vec![0u32; n]; n];
            for (k, v) in vt.iter_mut().enumerate() {
                v[k] = 1;
            }
            let mut all = Vec::new();
            for _ in 0..30 {
                let k = rnd(n as u32) as usize;
                // close interval on k, all touching page 0 (write) so every concurrent pair overlaps
                let rec = iv(k as NodeId, vt[k][k], vt[k].clone(), &[0], &[0]);
                all.push(rec);
                vt[k][k] += 1;
                if rnd(2) == 0 {
                    // k acquires from j: learns j's closed intervals
                    let j = rnd(n as u32) as usize;
                    if j != k {
                        let mut known = vt[j].clone();
                        known[j] -= 1;
                        for (x, y) in vt[k].iter_mut().zip(&known) {
                            *x = (*x).max(*y);
                        }
                    }
                }
            }
            let brute = all
                .iter()
                .enumerate()
                .flat_map(|(i, a)| all[i + 1..].iter().map(move |b| (a, b)))
                .filter(|(a, b)| a.node != b.node && a.concurrent_with(b))
                .count() as u64;
            let p = plan(1, all);
            assert_eq!(p.stats.concurrent_pairs, brute);
        }
    }

    /// A random epoch on `nodes` nodes: lock handoffs order some intervals (vector times
    /// stay monotone along each node, as in real runs), each interval reads and writes a
    /// few random page runs out of `pages`, and some carry no notices at all.
    fn random_epoch(seed: u64, nodes: usize, steps: usize, pages: u32) -> Vec<IntervalRecord> {
        let mut seed = seed | 1;
        let mut rnd = |m: u32| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as u32) % m.max(1)
        };
        let mut vt = vec![vec![0u32; nodes]; nodes];
        for (k, v) in vt.iter_mut().enumerate() {
            v[k] = 1 + rnd(3);
        }
        let mut all = Vec::new();
        for _ in 0..steps {
            let k = rnd(nodes as u32) as usize;
            let mut runs = |count: u32| {
                PageRuns::from_runs(
                    (0..rnd(count + 1))
                        .map(|_| (rnd(pages), 1 + rnd(4)))
                        .collect::<Vec<_>>(),
                )
            };
            let (reads, writes) = (runs(3), runs(2));
            // Some pages narrowed to a few 64-byte blocks and bounds, as the recorder
            // leaves them.
            let mut extents = |pages: &PageRuns| -> dsm_proto::Extents {
                let mut out = dsm_proto::Extents::new();
                for page in pages.iter() {
                    if rnd(2) == 0 {
                        let (b0, b1) = (rnd(4), rnd(4));
                        let start = (64 * b0.min(b1) + rnd(64)) as u16;
                        out.push(PageExtent {
                            page,
                            blocks: 1u64 << b0 | 1u64 << b1,
                            start,
                            end: (64 * b0.max(b1) + 1 + rnd(64)).max(u32::from(start) + 1) as u16,
                        });
                    }
                }
                out
            };
            let (read_extents, write_extents) = (extents(&reads), extents(&writes));
            let race = (rnd(8) != 0).then_some(RaceNotices {
                reads,
                writes,
                read_extents,
                write_extents,
            });
            all.push(IntervalRecord {
                node: k as NodeId,
                index: vt[k][k],
                vt: VectorTime::from(vt[k].clone()),
                writes: PageRuns::new(),
                race,
                began_with: SyncCause::Barrier(1),
            });
            vt[k][k] += 1;
            if rnd(3) == 0 {
                let j = rnd(nodes as u32) as usize;
                if j != k {
                    let mut known = vt[j].clone();
                    known[j] -= 1;
                    for (x, y) in vt[k].iter_mut().zip(&known) {
                        *x = (*x).max(*y);
                    }
                }
            }
        }
        // The planners must not depend on arrival order.
        let len = all.len();
        for i in 0..len {
            all.swap(i, rnd(len as u32) as usize);
        }
        all
    }

    proptest::proptest! {
        #[test]
        fn schedule_plan_checks_every_cross_node_overlap(
            seed in proptest::prelude::any::<u64>(),
            nodes in 1usize..5,
            steps in 0usize..40,
            pages in 1u32..12,
        ) {
            let epoch = random_epoch(seed, nodes, steps, pages);
            let sched = plan_with(1, epoch.clone(), true);
            // Brute force: every pair of intervals of different nodes, and every page one
            // writes and the other reads or writes where their extents meet.
            let mut want = BTreeSet::new();
            for a in epoch.iter().filter(|r| r.race.is_some()) {
                for b in epoch.iter().filter(|r| r.race.is_some() && r.node > a.node) {
                    let (ar, aw) = notices(a).unwrap();
                    let (br, bw) = notices(b).unwrap();
                    let pages = aw.intersect(bw).union(&aw.intersect(br)).union(&ar.intersect(bw));
                    for page in pages.iter() {
                        let (na, nb) = (a.race.as_ref().unwrap(), b.race.as_ref().unwrap());
                        let meet = na.extent(page, true).meets(&nb.extent(page, false))
                            || na.extent(page, true).meets(&nb.extent(page, true))
                            || na.extent(page, false).meets(&nb.extent(page, true));
                        if meet {
                            want.insert((a.node, a.index, b.node, b.index, page));
                        }
                    }
                }
            }
            let got: BTreeSet<(NodeId, u32, NodeId, u32, PageNo)> = sched
                .checks
                .iter()
                .map(|c| {
                    let (a, b) = (&sched.intervals[c.a], &sched.intervals[c.b]);
                    (a.node, a.index, b.node, b.index, c.page)
                })
                .collect();
            proptest::prop_assert_eq!(got.len(), sched.checks.len());
            proptest::prop_assert_eq!(got, want);
        }

        #[test]
        fn indexed_plan_equals_pairwise(
            seed in proptest::prelude::any::<u64>(),
            nodes in 1usize..6,
            steps in 0usize..80,
            pages in 1u32..40,
        ) {
            let epoch = random_epoch(seed, nodes, steps, pages);
            let old = plan_pairwise(3, epoch.clone());
            for walk in [Walk::Cheaper, Walk::Concurrent, Walk::Overlapping] {
                let new = plan_walking(3, epoch.clone(), false, |_| true, walk);
                proptest::prop_assert_eq!(&new.stats, &old.stats, "{:?}", walk);
                proptest::prop_assert_eq!(&new.wanted, &old.wanted, "{:?}", walk);
                proptest::prop_assert_eq!(&new.checks, &old.checks, "{:?}", walk);
                proptest::prop_assert_eq!(&new.intervals, &old.intervals, "{:?}", walk);
            }
        }
    }

    #[test]
    fn recorder_to_detector_end_to_end() {
        // Two nodes record through the real recorder; the detector finds exactly the
        // shared element.
        let mut r0 = Recorder::new();
        let mut r1 = Recorder::new();
        let a0 = r0.add_alloc(0, 16 * PAGE_SIZE, 8).unwrap();
        let a1 = r1.add_alloc(0, 16 * PAGE_SIZE, 8).unwrap();
        r0.alloc(a0).write(8 * 100, 8);
        r0.alloc(a0).read(8 * 600, 8);
        r1.alloc(a1).write(8 * 101, 8);
        r1.alloc(a1).write(8 * 600, 8);
        let n0 = r0.close_interval();
        let n1 = r1.close_interval();
        let mk = |node, race| IntervalRecord {
            node,
            index: 1,
            vt: VectorTime::from(if node == 0 { vec![1, 0] } else { vec![0, 1] }),
            writes: PageRuns::new(),
            race: Some(race),
            began_with: SyncCause::Start,
        };
        let p = plan(1, vec![mk(0, n0), mk(1, n1)]);
        let mut bm = Bitmaps::new();
        for (node, keys) in &p.wanted {
            let rec = if *node == 0 { &mut r0 } else { &mut r1 };
            for b in rec.bitmaps(keys) {
                bm.insert(*node, b);
            }
        }
        let races = p.compare(&bm, &vars());
        assert_eq!(races.len(), 1, "{races:?}");
        assert_eq!(races[0].index, 600);
        assert_eq!(races[0].kind, RaceKind::ReadWrite);
    }

    #[test]
    fn first_races_drop_later_ones() {
        // Race 1 between (0,1) and (1,1); (1,1) precedes (1,2) by program order, so a race
        // between (0,2) and (1,2) is not first... unless its own ends are unordered with
        // race 1's ends: (0,1) precedes (0,2) too.
        let i01 = iv(0, 1, vec![1, 0], &[], &[0]);
        let i11 = iv(1, 1, vec![0, 1], &[], &[0]);
        let i02 = iv(0, 2, vec![2, 0], &[], &[1]);
        let i12 = iv(1, 2, vec![0, 2], &[], &[1]);
        let all = vec![i01, i11, i02, i12];
        let mk = |n1, i1, n2, i2, idx| Race {
            epoch: 1,
            variable: "v".into(),
            index: idx,
            row_col: None,
            addr: 0,
            bytes: (0, 8),
            kind: RaceKind::WriteWrite,
            first: Access {
                node: n1,
                interval: i1,
                write: true,
                began_with: SyncCause::Start,
            },
            second: Access {
                node: n2,
                interval: i2,
                write: true,
                began_with: SyncCause::Start,
            },
            class: RaceClass::DataRace,
            sites: Default::default(),
        };
        let races = vec![mk(0, 1, 1, 1, 0), mk(0, 2, 1, 2, 600)];
        let first = first_races(races, &all);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].index, 0);
    }

    #[test]
    fn crossing_races_are_both_first() {
        // Node 0 writes x in interval 1 and y in interval 2; node 1 writes y in interval 1
        // and x in interval 2, all concurrent. Each race affects the other through one
        // node's program order; nothing else affects them, so both are first races.
        let i01 = iv(0, 1, vec![1, 0], &[], &[0]);
        let i02 = iv(0, 2, vec![2, 0], &[], &[0]);
        let i11 = iv(1, 1, vec![0, 1], &[], &[0]);
        let i12 = iv(1, 2, vec![0, 2], &[], &[0]);
        // A later race that the crossing pair affects: node 0 interval 3 against node 1
        // interval 3.
        let i03 = iv(0, 3, vec![3, 0], &[], &[1]);
        let i13 = iv(1, 3, vec![0, 3], &[], &[1]);
        let all = vec![i01, i02, i11, i12, i03, i13];
        let mk = |i0, i1, idx| Race {
            epoch: 1,
            variable: "v".into(),
            index: idx,
            row_col: None,
            addr: 0,
            bytes: (0, 8),
            kind: RaceKind::WriteWrite,
            first: Access {
                node: 0,
                interval: i0,
                write: true,
                began_with: SyncCause::Start,
            },
            second: Access {
                node: 1,
                interval: i1,
                write: true,
                began_with: SyncCause::Start,
            },
            class: RaceClass::DataRace,
            sites: Default::default(),
        };
        let x = mk(1, 2, 0);
        let y = mk(2, 1, 1);
        let later = mk(3, 3, 600);
        let first = first_races(vec![x.clone(), y.clone(), later], &all);
        assert_eq!(first, vec![x, y]);
    }

    #[test]
    fn strong_components_of_a_small_graph() {
        // 0 <-> 1 -> 2 <-> 3, 4 alone.
        let edges = [(0, 1), (1, 0), (1, 2), (2, 3), (3, 2)];
        let c = strong_components(5, |x, y| edges.contains(&(x, y)));
        assert_eq!(c[0], c[1]);
        assert_eq!(c[2], c[3]);
        assert_ne!(c[0], c[2]);
        assert_ne!(c[4], c[0]);
        assert_ne!(c[4], c[2]);
    }
}

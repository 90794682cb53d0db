//! The messages nodes exchange and the value types they carry: vector timestamps, page
//! lists (as sorted runs, because apps touch long contiguous ranges), interval records with
//! write notices (and read notices in race mode), and the page, diff, lock, barrier and
//! bitmap messages of the protocol. Payloads whose layout belongs to another crate (diff
//! encodings, access bitmaps) travel as opaque byte strings.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node's rank within the job.
pub type NodeId = u16;
/// Index of a page within the shared segment.
pub type PageNo = u32;
/// Identifies a lock; plain small integers are app-chosen ids, named locks hash into the
/// upper half of the space.
pub type LockId = u64;

/// Protocol version spoken in the handshake; bump it when any message layout changes.
pub const PROTOCOL_VERSION: u32 = 4;

/// A vector timestamp: entry `n` is the index of the latest interval of node `n` that is
/// known (has been "seen"). Intervals are numbered from 1, so 0 means "nothing seen".
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Hash, Default)]
pub struct VectorTime(pub Vec<u32>);

impl VectorTime {
    pub fn zero(nodes: usize) -> Self {
        VectorTime(vec![0; nodes])
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, node: NodeId) -> u32 {
        self.0[node as usize]
    }

    pub fn set(&mut self, node: NodeId, value: u32) {
        self.0[node as usize] = value;
    }

    /// Entry-wise maximum, in place.
    pub fn merge(&mut self, other: &VectorTime) {
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            if *theirs > *mine {
                *mine = *theirs;
            }
        }
    }

    /// `self <= other` entry-wise: everything `self` knows, `other` knows too.
    pub fn dominated_by(&self, other: &VectorTime) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a <= b)
    }
}

impl fmt::Debug for VectorTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<")?;
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            write!(f, "{v}")?;
        }
        write!(f, ">")
    }
}

/// A set of pages as sorted, disjoint, non-adjacent runs `(first, count)`. Apps mostly touch
/// long contiguous ranges, so this is far smaller on the wire than a page list.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Default)]
pub struct PageRuns(Vec<(PageNo, u32)>);

impl PageRuns {
    pub fn new() -> Self {
        PageRuns(Vec::new())
    }

    /// Builds runs from any page list (duplicates and disorder allowed).
    pub fn from_pages(pages: impl IntoIterator<Item = PageNo>) -> Self {
        let mut v: Vec<PageNo> = pages.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self::from_sorted_unique(&v)
    }

    /// Builds runs from a strictly increasing page list.
    pub fn from_sorted_unique(pages: &[PageNo]) -> Self {
        let mut runs: Vec<(PageNo, u32)> = Vec::new();
        for &p in pages {
            match runs.last_mut() {
                Some((first, count)) if *first + *count == p => *count += 1,
                _ => runs.push((p, 1)),
            }
        }
        PageRuns(runs)
    }

    /// Builds from runs that may be unsorted, overlapping or adjacent.
    pub fn from_runs(runs: impl IntoIterator<Item = (PageNo, u32)>) -> Self {
        let mut v: Vec<(PageNo, u32)> = runs.into_iter().filter(|r| r.1 > 0).collect();
        v.sort_unstable();
        let mut out: Vec<(PageNo, u32)> = Vec::with_capacity(v.len());
        for (first, count) in v {
            match out.last_mut() {
                Some((f, c)) if *f + *c >= first => {
                    let end = (*f + *c).max(first + count);
                    *c = end - *f;
                }
                _ => out.push((first, count)),
            }
        }
        PageRuns(out)
    }

    pub fn runs(&self) -> &[(PageNo, u32)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of pages in the set.
    pub fn page_count(&self) -> u64 {
        self.0.iter().map(|r| r.1 as u64).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = PageNo> + '_ {
        self.0.iter().flat_map(|&(f, c)| f..f + c)
    }

    pub fn contains(&self, page: PageNo) -> bool {
        match self.0.binary_search_by(|&(f, _)| f.cmp(&page)) {
            Ok(_) => true,
            Err(0) => false,
            Err(i) => {
                let (f, c) = self.0[i - 1];
                page < f + c
            }
        }
    }

    /// Pages in both sets, as runs (linear merge).
    pub fn intersect(&self, other: &PageRuns) -> PageRuns {
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j) = (0, 0);
        let mut out = Vec::new();
        while i < a.len() && j < b.len() {
            let (af, ac) = a[i];
            let (bf, bc) = b[j];
            let lo = af.max(bf);
            let hi = (af + ac).min(bf + bc);
            if lo < hi {
                out.push((lo, hi - lo));
            }
            if af + ac < bf + bc {
                i += 1;
            } else {
                j += 1;
            }
        }
        PageRuns(out)
    }

    /// Whether the two sets share any page, without building the intersection.
    pub fn overlaps(&self, other: &PageRuns) -> bool {
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            let (af, ac) = a[i];
            let (bf, bc) = b[j];
            if af.max(bf) < (af + ac).min(bf + bc) {
                return true;
            }
            if af + ac < bf + bc {
                i += 1;
            } else {
                j += 1;
            }
        }
        false
    }

    pub fn union(&self, other: &PageRuns) -> PageRuns {
        PageRuns::from_runs(self.0.iter().chain(other.0.iter()).copied())
    }
}

impl fmt::Debug for PageRuns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, (first, count)) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            if *count == 1 {
                write!(f, "{first}")?;
            } else {
                write!(f, "{first}..{}", first + count)?;
            }
        }
        write!(f, "}}")
    }
}

/// The synchronization operation that began an interval; race reports name it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyncCause {
    /// The first interval of the run.
    Start,
    /// Departure from barrier number `epoch` (barriers are numbered from 1).
    Barrier(u32),
    /// Acquire of a lock.
    Acquire(LockId),
    /// Release of a lock.
    Release(LockId),
}

/// Pages read and written in an interval, as recorded by the typed access API when race
/// detection is on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct RaceNotices {
    pub reads: PageRuns,
    pub writes: PageRuns,
}

/// An interval: a stretch of one node's execution between synchronization operations.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct IntervalRecord {
    pub node: NodeId,
    pub index: u32,
    /// What the node had seen when the interval began (`vt[node] == index`).
    pub vt: VectorTime,
    /// Write notices: pages this node modified in the interval (coherence).
    pub writes: PageRuns,
    /// Read and write notices from the access recorder, present in race mode.
    pub race: Option<RaceNotices>,
    pub began_with: SyncCause,
}

impl IntervalRecord {
    /// Happens-before-1: `self` precedes `other` if `other` began after seeing `self`.
    pub fn precedes(&self, other: &IntervalRecord) -> bool {
        if self.node == other.node {
            self.index < other.index
        } else {
            other.vt.get(self.node) >= self.index
        }
    }

    pub fn concurrent_with(&self, other: &IntervalRecord) -> bool {
        !self.precedes(other) && !other.precedes(self)
    }
}

/// "Before serving this page, have the diff of `writer`'s interval `interval` applied."
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub page: PageNo,
    pub writer: NodeId,
    pub interval: u32,
}

/// A page's contents, sent by its home.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PageCopy {
    pub page: PageNo,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// The encoded modifications of one page in one interval (encoding owned by dsm-core).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PageDiff {
    pub page: PageNo,
    #[serde(with = "serde_bytes")]
    pub runs: Vec<u8>,
}

/// Which access bitmap of an interval's page.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AccessKind {
    Read,
    Write,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BitmapKey {
    pub interval: u32,
    pub page: PageNo,
    pub kind: AccessKind,
}

/// An access bitmap (encoding owned by dsm-race).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EncodedBitmap {
    pub key: BitmapKey,
    #[serde(with = "serde_bytes")]
    pub bits: Vec<u8>,
}

/// Every message exchanged between nodes once the mesh is up.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Msg {
    /// Fetch pages from their home; the home first applies the required diffs.
    PageRequest {
        pages: Vec<PageNo>,
        required: Vec<Requirement>,
    },
    PageReply {
        pages: Vec<PageCopy>,
    },
    /// Diffs of one interval, sent by the writer to the pages' home at interval end.
    Diffs {
        interval: u32,
        diffs: Vec<PageDiff>,
    },
    /// Sent to a lock's manager, which forwards it to the last requester.
    LockRequest {
        lock: LockId,
        requester: NodeId,
        known: VectorTime,
    },
    LockForward {
        lock: LockId,
        requester: NodeId,
        known: VectorTime,
    },
    /// The lock token, with every interval the grantor knows and the acquirer lacks.
    LockGrant {
        lock: LockId,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
    },
    /// Arrival at barrier `epoch`, with the sender's own intervals since the last barrier.
    /// `check` is a digest of the sender's allocation table, so diverging collective
    /// allocations are caught. In race mode `bitmaps` carries, unasked, the access bitmaps
    /// of the epoch's pages that other nodes could also have touched, so the master can
    /// usually skip the extra bitmap round.
    BarrierArrive {
        epoch: u32,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
        check: u64,
        finishing: bool,
        bitmaps: Vec<EncodedBitmap>,
    },
    BarrierRelease {
        epoch: u32,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
        races: u64,
    },
    /// The barrier master stops the job (e.g. ranks disagree on allocations).
    Abort {
        reason: String,
    },
    BitmapRequest {
        epoch: u32,
        wanted: Vec<BitmapKey>,
    },
    BitmapReply {
        epoch: u32,
        bitmaps: Vec<EncodedBitmap>,
    },
}

impl Msg {
    /// Short name for logs and statistics.
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::PageRequest { .. } => "page-request",
            Msg::PageReply { .. } => "page-reply",
            Msg::Diffs { .. } => "diffs",
            Msg::LockRequest { .. } => "lock-request",
            Msg::LockForward { .. } => "lock-forward",
            Msg::LockGrant { .. } => "lock-grant",
            Msg::BarrierArrive { .. } => "barrier-arrive",
            Msg::BarrierRelease { .. } => "barrier-release",
            Msg::Abort { .. } => "abort",
            Msg::BitmapRequest { .. } => "bitmap-request",
            Msg::BitmapReply { .. } => "bitmap-reply",
        }
    }
}

/// First frame on every connection, from the connecting side.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub magic: [u8; 4],
    pub version: u32,
    pub secret: String,
    pub rank: NodeId,
    pub size: u16,
    /// Where the sender accepts mesh connections from higher ranks.
    pub listen: String,
}

pub const HELLO_MAGIC: [u8; 4] = *b"DSM!";

/// The accepting side's answer to a [`Hello`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum HelloReply {
    /// Accepted. From rank 0 this carries every rank's listen address (indexed by rank);
    /// from other ranks it is empty.
    Welcome {
        listen: Vec<String>,
    },
    Refused {
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(runs: &PageRuns) -> std::collections::BTreeSet<u32> {
        runs.iter().collect()
    }

    proptest! {
        #[test]
        fn runs_roundtrip_page_sets(pages in proptest::collection::vec(0u32..200, 0..80)) {
            let runs = PageRuns::from_pages(pages.iter().copied());
            let set: std::collections::BTreeSet<u32> = pages.iter().copied().collect();
            prop_assert_eq!(naive(&runs), set.clone());
            for w in runs.runs().windows(2) {
                prop_assert!(w[0].0 + w[0].1 < w[1].0, "runs must be disjoint and non-adjacent");
            }
            for p in 0..210 {
                prop_assert_eq!(runs.contains(p), set.contains(&p));
            }
        }

        #[test]
        fn intersect_and_union_match_sets(a in proptest::collection::vec(0u32..100, 0..40),
                                          b in proptest::collection::vec(0u32..100, 0..40)) {
            let ra = PageRuns::from_pages(a.iter().copied());
            let rb = PageRuns::from_pages(b.iter().copied());
            let sa: std::collections::BTreeSet<u32> = a.into_iter().collect();
            let sb: std::collections::BTreeSet<u32> = b.into_iter().collect();
            let inter: std::collections::BTreeSet<u32> = sa.intersection(&sb).copied().collect();
            prop_assert_eq!(naive(&ra.intersect(&rb)), inter.clone());
            prop_assert_eq!(ra.overlaps(&rb), !inter.is_empty());
            let uni: std::collections::BTreeSet<u32> = sa.union(&sb).copied().collect();
            prop_assert_eq!(naive(&ra.union(&rb)), uni);
        }

        #[test]
        fn from_runs_normalizes(runs in proptest::collection::vec((0u32..100, 0u32..10), 0..20)) {
            let r = PageRuns::from_runs(runs.iter().copied());
            let expect: std::collections::BTreeSet<u32> =
                runs.iter().flat_map(|&(f, c)| f..f + c).collect();
            prop_assert_eq!(naive(&r), expect);
        }

        #[test]
        fn vector_merge_is_upper_bound(a in proptest::collection::vec(0u32..50, 4),
                                       b in proptest::collection::vec(0u32..50, 4)) {
            let va = VectorTime(a);
            let vb = VectorTime(b);
            let mut m = va.clone();
            m.merge(&vb);
            prop_assert!(va.dominated_by(&m));
            prop_assert!(vb.dominated_by(&m));
            // least upper bound: every entry equals one of the inputs
            for i in 0..4 {
                prop_assert!(m.0[i] == va.0[i] || m.0[i] == vb.0[i]);
            }
        }
    }

    fn interval(node: NodeId, index: u32, vt: Vec<u32>) -> IntervalRecord {
        IntervalRecord {
            node,
            index,
            vt: VectorTime(vt),
            writes: PageRuns::new(),
            race: None,
            began_with: SyncCause::Start,
        }
    }

    #[test]
    fn happens_before_from_vector_times() {
        // node 0 interval 1 released a lock that node 1 acquired to begin its interval 2.
        let a = interval(0, 1, vec![1, 0]);
        let b1 = interval(1, 1, vec![0, 1]);
        let b2 = interval(1, 2, vec![1, 2]);
        let a2 = interval(0, 2, vec![2, 0]);
        assert!(a.precedes(&b2));
        assert!(!b2.precedes(&a));
        assert!(a.concurrent_with(&b1));
        assert!(a2.concurrent_with(&b2));
        assert!(b1.precedes(&b2), "program order");
        assert!(!a.concurrent_with(&a2));
    }
}

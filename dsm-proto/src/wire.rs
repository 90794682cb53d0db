//! The messages nodes exchange and the value types they carry: vector timestamps, page
//! lists (as sorted runs, because apps touch long contiguous ranges), interval records with
//! write notices (and read notices in race mode), and the page, diff, lock, barrier and
//! bitmap messages of the protocol. Payloads whose layout belongs to another crate (diff
//! encodings, access bitmaps) travel as opaque byte strings.

use serde::{Deserialize, Serialize};
pub use smallvec::SmallVec;
use std::fmt;

mod columns;
pub mod interval_list;

/// The bytes of a byte string that a self-describing format without a bytes type (JSON)
/// gives as a sequence; for the compact wire forms' visitors.
fn seq_bytes<'de, A: serde::de::SeqAccess<'de>>(mut seq: A) -> Result<Vec<u8>, A::Error> {
    let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
    while let Some(b) = seq.next_element::<u8>()? {
        bytes.push(b);
    }
    Ok(bytes)
}
pub use columns::{BitmapColumns, ColumnEntry, MAX_PAGE_WORDS};

/// A node's rank within the job, `0..size` (at most [`MAX_NODES`](crate::MAX_NODES)).
pub type NodeId = u16;
/// Index of a page within the shared segment: page `p` covers segment bytes
/// `p * PAGE_SIZE .. (p + 1) * PAGE_SIZE` (see [`PAGE_SIZE`](crate::PAGE_SIZE)).
pub type PageNo = u32;
/// Identifies a lock; plain small integers are app-chosen ids, named locks hash into the
/// upper half of the space.
pub type LockId = u64;
/// Identifies a counting semaphore: the hash of its name (see `Dsm::semaphore`).
pub type SemId = u64;

/// Protocol version spoken in the handshake; bump it when any message layout changes.
pub const PROTOCOL_VERSION: u32 = 20;

/// Where a node's program is when it arrives at a barrier, numbered as the program counts:
/// its own `barrier()` calls, from 1. Every message a user reads about a barrier names this,
/// never the protocol's epoch number, which also counts allocations and dsm's own barriers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncPoint {
    /// Before the node's first barrier-like call.
    Start,
    /// The program's `n`-th `barrier()` call.
    Barrier(u32),
    /// A collective allocation (or semaphore creation), after `after` barriers.
    Allocation {
        /// What is allocated.
        name: String,
        /// The program's barriers passed before it.
        after: u32,
    },
    /// `finish()`, after `after` barriers.
    Finish {
        /// The program's barriers passed before it.
        after: u32,
    },
    /// A barrier dsm adds itself (value tracing), after `after` of the program's.
    Internal {
        /// The program's barriers passed before it.
        after: u32,
    },
}

impl fmt::Display for SyncPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncPoint::Start => write!(f, "the start of the run"),
            SyncPoint::Barrier(n) => write!(f, "barrier {n}"),
            SyncPoint::Allocation { name, after } => {
                write!(f, "the allocation of '{name}' ({})", after_barriers(*after))
            }
            SyncPoint::Finish { after } => write!(f, "finish ({})", after_barriers(*after)),
            SyncPoint::Internal { after } => {
                write!(f, "a barrier of dsm's own ({})", after_barriers(*after))
            }
        }
    }
}

/// Where a point lies among the program's barriers, as messages and reports word it:
/// `before the first barrier` or `after barrier N`.
pub fn after_barriers(after: u32) -> String {
    match after {
        0 => "before the first barrier".into(),
        n => format!("after barrier {n}"),
    }
}

/// A vector timestamp: entry `n` is the index of the latest interval of node `n` that is
/// known (has been "seen"). Intervals are numbered from 1, so 0 means "nothing seen".
///
/// Knowing interval `i` of node `n` implies knowing all of `n`'s earlier intervals, so one
/// number per node describes everything a node has seen. Every vector in a job has one entry
/// per node; receivers reject messages whose vectors have another length. In messages
/// (`known` fields) the sender's own entry counts only its closed intervals; in an
/// [`IntervalRecord`] it is the interval's own index.
///
/// The entries are held inline up to [`VT_INLINE`] nodes: a node creates and receives a
/// vector with every interval, and a job that size costs no allocation for them. The wire
/// form is a sequence, as for a `Vec`.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Hash, Default)]
pub struct VectorTime(pub SmallVec<[u32; VT_INLINE]>);

/// Entries a [`VectorTime`] holds without allocating.
pub const VT_INLINE: usize = 8;

impl From<Vec<u32>> for VectorTime {
    fn from(entries: Vec<u32>) -> Self {
        VectorTime(SmallVec::from_vec(entries))
    }
}

impl From<&[u32]> for VectorTime {
    fn from(entries: &[u32]) -> Self {
        VectorTime(SmallVec::from_slice(entries))
    }
}

impl VectorTime {
    /// The timestamp of a job of `nodes` nodes that has seen nothing (every entry 0).
    pub fn zero(nodes: usize) -> Self {
        VectorTime(smallvec::smallvec![0; nodes])
    }

    /// Number of entries, i.e. nodes in the job.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the vector has no entries (only a default-constructed one; real timestamps
    /// have one entry per node).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Latest interval of `node` seen. Panics if `node` is not below [`len`](Self::len).
    #[inline]
    pub fn get(&self, node: NodeId) -> u32 {
        self.0[node as usize]
    }

    /// Sets the latest interval of `node` seen. Panics if `node` is not below
    /// [`len`](Self::len).
    #[inline]
    pub fn set(&mut self, node: NodeId, value: u32) {
        self.0[node as usize] = value;
    }

    /// Entry-wise maximum, in place: afterwards `self` knows what either vector knew.
    /// Only the entries both vectors have are merged.
    #[inline]
    pub fn merge(&mut self, other: &VectorTime) {
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            if *theirs > *mine {
                *mine = *theirs;
            }
        }
    }

    /// `self <= other` entry-wise: everything `self` knows, `other` knows too.
    #[inline]
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
///
/// Invariant: runs are in increasing order of `first`, every `count` is at least 1, and a
/// run ends strictly before the next one starts (`first + count < next_first`), so every
/// set has exactly one representation and equal sets compare equal. The constructors
/// establish it; the set operations rely on it. A value decoded from the wire is trusted
/// to hold it (peers build theirs with the same constructors).
///
/// Most sets an interval names are one or two runs (an element's page, a band of rows):
/// those are held inline, so notices cost no allocation to build, copy or decode.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Default)]
pub struct PageRuns(SmallVec<[(PageNo, u32); 2]>);

impl PageRuns {
    /// The empty set.
    pub fn new() -> Self {
        PageRuns(SmallVec::new())
    }

    /// Builds runs from any page list (duplicates and disorder allowed).
    pub fn from_pages(pages: impl IntoIterator<Item = PageNo>) -> Self {
        let mut v: Vec<PageNo> = pages.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self::from_sorted_unique(&v)
    }

    /// Builds runs from a strictly increasing page list, in one pass. The order is not
    /// checked: an unsorted or repeating list gives runs that break the invariant (use
    /// [`from_pages`](Self::from_pages) for those).
    pub fn from_sorted_unique(pages: &[PageNo]) -> Self {
        let mut runs: SmallVec<[(PageNo, u32); 2]> = SmallVec::new();
        let Some((&first, rest)) = pages.split_first() else {
            return PageRuns(runs);
        };
        // The open run in locals: through the vector's last element, a page cost a
        // check of where its storage is (a recorder's interval lists hundreds of pages).
        let (mut start, mut count) = (first, 1u32);
        for &p in rest {
            if start + count == p {
                count += 1;
            } else {
                runs.push((start, count));
                (start, count) = (p, 1);
            }
        }
        runs.push((start, count));
        PageRuns(runs)
    }

    /// Builds from runs `(first, count)` that may be unsorted, overlapping or adjacent;
    /// empty runs are dropped and the rest merged.
    pub fn from_runs(runs: impl IntoIterator<Item = (PageNo, u32)>) -> Self {
        let mut v: Vec<(PageNo, u32)> = runs.into_iter().filter(|r| r.1 > 0).collect();
        v.sort_unstable();
        let mut out: SmallVec<[(PageNo, u32); 2]> = SmallVec::with_capacity(v.len());
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

    /// The runs `(first, count)`, in increasing page order (see the type's invariant).
    #[inline]
    pub fn runs(&self) -> &[(PageNo, u32)] {
        &self.0
    }

    /// Whether the set has no page.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of pages in the set.
    #[inline]
    pub fn page_count(&self) -> u64 {
        self.0.iter().map(|r| r.1 as u64).sum()
    }

    /// Every page of the set, in increasing order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = PageNo> + '_ {
        self.0.iter().flat_map(|&(f, c)| f..f + c)
    }

    /// Whether `page` is in the set (binary search over the runs).
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
        let mut out = SmallVec::new();
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

    /// Pages in either set, as runs (adjacent runs of the two sets are merged).
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
    /// Completion of a wait (P) on a semaphore: an acquire of the signal it consumed.
    SemWait(SemId),
    /// A signal (V) on a semaphore: a release.
    SemSignal(SemId),
    /// A try-wait on a semaphore that found no token (ordered after nothing new).
    SemTryFailed(SemId),
}

/// Pages read and written in an interval, as recorded by the typed access API when race
/// detection is on. For every page named here the recording node holds an access bitmap
/// (see [`BitmapKey`]) until the next barrier, where the master may ask for it.
///
/// These are the detector's notices, distinct from the coherence write notices in
/// [`IntervalRecord::writes`]: they count accesses through views (including reads and home
/// pages), not pages that produced a diff.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct RaceNotices {
    /// Read notices: pages with at least one recorded read in the interval.
    pub reads: PageRuns,
    /// Write notices: pages with at least one recorded write in the interval.
    pub writes: PageRuns,
    /// Where in a page of `reads` the interval read, for the pages it did not read in
    /// every 64-byte block, sorted by page. The barrier master compares two intervals'
    /// bitmaps of a page only where their extents meet, so locks guarding neighbouring
    /// elements of one page cost no bitmap.
    pub read_extents: Extents,
    /// The same for `writes`.
    pub write_extents: Extents,
}

/// The narrowed pages of one kind of an interval's notices, sorted by page: held inline
/// for the common one (a lock-protected element), so building and decoding them costs no
/// allocation.
pub type Extents = SmallVec<[PageExtent; 1]>;

/// Where an interval read or wrote within one page: two over-approximations of the bytes
/// it accessed, each cheap to intersect. Blocks alone let neighbouring elements whose
/// sizes are not multiples of 64 bytes (a 72-byte record, say) meet in the block they
/// share; the bounds tell them apart, and the blocks tell apart accesses at both ends of
/// a page.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageExtent {
    /// The page.
    pub page: PageNo,
    /// The 64-byte blocks accessed (bit `i`: bytes `64 i..64 i + 64`).
    pub blocks: u64,
    /// The accessed bytes lie in `start..end` (offsets in the page).
    pub start: u16,
    /// See `start`.
    pub end: u16,
}

impl PageExtent {
    /// No access to `page`.
    pub fn none(page: PageNo) -> PageExtent {
        PageExtent {
            page,
            blocks: 0,
            start: 0,
            end: 0,
        }
    }

    /// Accesses anywhere in `page`.
    pub fn whole(page: PageNo) -> PageExtent {
        PageExtent {
            page,
            blocks: u64::MAX,
            start: 0,
            end: crate::PAGE_SIZE as u16,
        }
    }

    /// Whether the accesses of both extents may share a byte.
    pub fn meets(&self, other: &PageExtent) -> bool {
        self.blocks & other.blocks != 0 && self.start < other.end && other.start < self.end
    }
}

impl RaceNotices {
    /// Where the interval wrote (`write`) or read in `page`: the whole page for a page of
    /// the notices that `read_extents`/`write_extents` do not narrow, nothing for a page
    /// they do not name.
    pub fn extent(&self, page: PageNo, write: bool) -> PageExtent {
        let (pages, narrowed) = if write {
            (&self.writes, &self.write_extents)
        } else {
            (&self.reads, &self.read_extents)
        };
        if !pages.contains(page) {
            return PageExtent::none(page);
        }
        match narrowed.binary_search_by_key(&page, |e| e.page) {
            Ok(i) => narrowed[i],
            Err(_) => PageExtent::whole(page),
        }
    }
}

/// An interval: a stretch of one node's execution between synchronization operations.
///
/// Every acquire, release and barrier arrival (allocations included) closes the node's
/// open interval and opens the next. Only intervals that carry a notice (a write notice,
/// or a read or write notice in race mode) are recorded and travel in lock grants and
/// barrier messages, so the indices a peer sees may have gaps. Records are dropped at every
/// barrier, once every node has seen them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct IntervalRecord {
    /// The node that executed the interval.
    pub node: NodeId,
    /// Its position in that node's execution: 1 for the first interval, one more for each
    /// synchronization operation since.
    pub index: u32,
    /// What the node had seen when the interval began (`vt[node] == index`).
    pub vt: VectorTime,
    /// Write notices: pages this node modified in the interval (coherence). For pages
    /// homed elsewhere, those whose diff was non-empty (the diff went to the home when the
    /// interval closed); for its own home pages, those it wrote after serving a copy of
    /// them (pages nobody copied need no notice). A node learning of the interval
    /// invalidates its copies of these pages.
    pub writes: PageRuns,
    /// Read and write notices from the access recorder, present in race mode when the
    /// interval accessed shared memory through the typed API; `None` otherwise.
    pub race: Option<RaceNotices>,
    /// The synchronization operation that opened the interval, for race reports.
    pub began_with: SyncCause,
}

impl IntervalRecord {
    /// The record as coherence needs it: the same, without race notices (cloned without
    /// them, not cloned and dropped).
    pub fn without_race(&self) -> IntervalRecord {
        IntervalRecord {
            node: self.node,
            index: self.index,
            vt: self.vt.clone(),
            writes: self.writes.clone(),
            race: None,
            began_with: self.began_with,
        }
    }

    /// Happens-before-1: `self` precedes `other` if `other` began after seeing `self`
    /// (`other.vt[self.node] >= self.index`), or, on the same node, if it came earlier in
    /// program order.
    pub fn precedes(&self, other: &IntervalRecord) -> bool {
        if self.node == other.node {
            self.index < other.index
        } else {
            other.vt.get(self.node) >= self.index
        }
    }

    /// Neither interval precedes the other: their accesses are not ordered by any
    /// synchronization, so conflicting ones are data races. Meant for intervals of
    /// different nodes (an interval counts as concurrent with itself).
    pub fn concurrent_with(&self, other: &IntervalRecord) -> bool {
        !self.precedes(other) && !other.precedes(self)
    }
}

/// "Before serving this page, have the diff of `writer`'s interval `interval` applied."
///
/// A requester knows, from write notices, which diffs a page it fetches must already
/// contain; a diff can still be on its way from the writer to the home, so the home parks
/// the request until, for each requirement, it has applied a diff of `page` from `writer`
/// for `interval` or a later interval.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// The page the diff applies to (one of the requested pages).
    pub page: PageNo,
    /// The node that wrote the page and sends its diff to the home.
    pub writer: NodeId,
    /// The writer's interval whose diff must be in the copy (later ones also satisfy it).
    pub interval: u32,
}

/// A page's contents, sent by its home.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PageCopy {
    /// Which page.
    pub page: PageNo,
    /// The whole page: exactly [`PAGE_SIZE`](crate::PAGE_SIZE) bytes (receivers reject any
    /// other length).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Per writer other than the home, the latest interval whose diff of the page is in
    /// `data`, as in [`PushedPage::applied`]: the copy may hold diffs its receiver has not
    /// heard of yet, which a diff pushed to it later must not be laid over again.
    pub applied: Vec<(NodeId, u32)>,
}

/// A page's contents pushed by its home, unasked, with a lock grant or a barrier arrival,
/// to a node that holds (or held) a copy, so that the write notices arriving with it need
/// not invalidate that copy. The receiver installs it only if it covers every write notice
/// it knows for the page (see `applied`); otherwise it invalidates as without the push.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PushedPage {
    /// Which page (homed at the sender).
    pub page: PageNo,
    /// The whole page: exactly [`PAGE_SIZE`](crate::PAGE_SIZE) bytes (receivers reject any
    /// other length).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Per writer other than the home, the latest interval whose diff of the page is in
    /// `data` (the home's own writes up to the push are always in it).
    pub applied: Vec<(NodeId, u32)>,
}

/// A diff the sender made of a page homed at a third node, pushed with a lock grant to
/// bring the acquirer's copy up to date (the page's home is neither the grantor nor the
/// acquirer, so the grantor has no whole copy to send, only its own changes). The acquirer
/// applies a page's diffs only if its copy is valid and every new write notice naming the
/// page is the grantor's, with its diff here; otherwise it invalidates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PushedDiff {
    /// The page (homed neither at the sender nor at the receiver).
    pub page: PageNo,
    /// The sender's interval that made the diff.
    pub interval: u32,
    /// The changed byte runs, as sent to the home (`dsm_core::diff`'s encoding).
    #[serde(with = "serde_bytes")]
    pub runs: Vec<u8>,
}

/// The encoded modifications of one page in one interval (encoding owned by dsm-core).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PageDiff {
    /// The modified page, homed at the receiver.
    pub page: PageNo,
    /// The changed byte runs of the page against its twin, in `dsm_core::diff`'s encoding;
    /// the home validates it before applying it. Never empty (unchanged pages send no
    /// diff).
    #[serde(with = "serde_bytes")]
    pub runs: Vec<u8>,
}

/// Which access bitmap of an interval's page: a recording node keeps one for reads and one
/// for writes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AccessKind {
    /// The granules of the page the interval read.
    Read,
    /// The granules of the page the interval wrote.
    Write,
}

/// Names one access bitmap on the node that recorded it: that node's interval, the page
/// and whether reads or writes. The node itself is implied by who is asked or who answers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BitmapKey {
    /// Index of the recording node's interval (as in [`IntervalRecord::index`]).
    pub interval: u32,
    /// The page, one of that interval's read or write notices.
    pub page: PageNo,
    /// Read or write bitmap.
    pub kind: AccessKind,
}

/// An access bitmap (encoding owned by dsm-race).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EncodedBitmap {
    /// Which bitmap this is.
    pub key: BitmapKey,
    /// One bit per granule of the page, in `dsm_race::record`'s encoding (little-endian
    /// 64-bit words, or a compact form for bitmaps whose words are all equal). Empty when
    /// the node has no such bitmap: nothing was accessed.
    #[serde(with = "serde_bytes")]
    pub bits: Vec<u8>,
    /// Where in the program the accesses of this bitmap were made: one span per source
    /// site, with the granules of the page it touched (sorted by first granule). Most
    /// bitmaps have one or two, held without an allocation of their own.
    pub sites: SmallVec<[SiteSpan; 2]>,
    /// The sites of `sites` that this bitmap is the first of its list to name, defined,
    /// so that every message that carries bitmaps is readable alone (sites are numbered
    /// per node). Usually empty.
    pub defs: Vec<(u32, SourceSite)>,
}

/// A source location of the program, as the compiler names it (`#[track_caller]`), or,
/// for a program compiled with ThreadSanitizer instrumentation, the instrumented
/// instruction's address, which the reporting rank turns into file, line and column.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceSite {
    /// The source file (empty while only `code` is known).
    pub file: String,
    /// Line, from 1 (0 while only `code` is known).
    pub line: u32,
    /// Column, from 1 (0 when unknown).
    pub column: u32,
    /// The access's code address relative to the executable's load address, for sites
    /// recorded by a ThreadSanitizer-ABI runtime; `None` for Rust sites.
    pub code: Option<u64>,
}

/// The granules `first..=last` of a bitmap's page that accesses from one source site
/// touched (a site's accesses between its first and last granule on the page; the whole
/// page when it was the page's only site).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteSpan {
    /// The recording node's number for the site.
    pub site: u32,
    /// First granule of the page (bitmap bit) the site touched.
    pub first: u16,
    /// Last granule of the page the site touched.
    pub last: u16,
}

/// Every message exchanged between nodes once the mesh is up.
///
/// Messages between two nodes arrive in the order they were sent (one TCP connection per
/// pair). Vector timestamps in a message have one entry per node; a receiver treats any
/// malformed message (wrong vector length, pages it does not home, unexpected replies) as
/// fatal for the job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Msg {
    /// Fetch pages from their home; the home first applies the required diffs.
    ///
    /// Sent by a node that faults on invalid pages, or prefetches a range of them, to each
    /// home involved (one request per home). The home answers with a
    /// [`PageReply`](Msg::PageReply) once every requirement is met.
    PageRequest {
        /// The pages wanted, all homed at the receiver.
        pages: Vec<PageNo>,
        /// Diffs the copies must already contain, from write notices the requester has
        /// seen for these pages.
        required: Vec<Requirement>,
        /// The requester's faulting thread waits for this one page in the page lane of
        /// the shared-memory link between the two (a co-located requester): the home may
        /// answer with [`LanePageReply`](Msg::LanePageReply) instead of a
        /// [`PageReply`](Msg::PageReply).
        lane: bool,
    },
    /// The home's answer to a [`PageRequest`](Msg::PageRequest).
    ///
    /// Before copying, the home write-protects its own pages, so that its next write to
    /// one of them faults and produces the write notice that will invalidate this copy.
    PageReply {
        /// A copy of every requested page.
        pages: Vec<PageCopy>,
    },
    /// A [`PageReply`](Msg::PageReply) whose one page, with its `applied` entries, the
    /// home left in the page lane of the link just before sending this frame. The
    /// requester's faulting thread may take the page from the lane as soon as it has
    /// delivered every frame sent before this one; otherwise its comm thread takes it when
    /// this frame arrives.
    LanePageReply {
        /// The page in the lane.
        page: PageNo,
    },
    /// Diffs of one interval, sent by the writer to the pages' home at interval end.
    ///
    /// One message per home; pages the interval left unchanged send nothing. The home
    /// applies the diffs in place (once the diffs in `after` are applied), notes
    /// `interval` as applied for this writer, and serves page requests that were waiting
    /// for it.
    Diffs {
        /// Index of the writer's interval that made the changes.
        interval: u32,
        /// One diff per modified page homed at the receiver.
        diffs: Vec<PageDiff>,
        /// Diffs of other writers to these pages that the writer's copy already held when
        /// it wrote (it received them pushed with a lock grant, not from the home): the
        /// home applies this message only after them, so an older write never lands on a
        /// newer one. Empty unless the writer took pushed diffs.
        after: Vec<Requirement>,
    },
    /// Sent to the manager of each of `locks`, which forwards it to the last requester.
    ///
    /// The manager of a lock is fixed (`lock % nodes`); a node acquiring a lock whose token
    /// it does not hold sends this (a manager handles its own request without a message).
    /// The manager remembers the requester as the lock's new last requester and passes
    /// the request on as a [`LockForward`](Msg::LockForward) (handling it itself when it
    /// was the last requester). Several locks of one manager go in one request when a
    /// node asks for tokens ahead of its acquires (`Dsm::prefetch_locks`).
    LockRequest {
        /// The locks wanted, all managed by the receiver.
        locks: Vec<LockId>,
        /// The acquiring node; must be the sender.
        requester: NodeId,
        /// What the requester has seen (closed intervals only), so the grantor can send
        /// exactly the intervals it lacks.
        known: VectorTime,
    },
    /// A lock request passed on by the manager to the node that holds the token or will
    /// get it next (the previous requester): for each lock, if that node holds the token
    /// and is not inside the critical section it grants at once; otherwise it queues the
    /// requester and grants when it releases the lock.
    LockForward {
        /// The locks wanted.
        locks: Vec<LockId>,
        /// The node that asked for them, and to which the grants go.
        requester: NodeId,
        /// As in [`LockRequest`](Msg::LockRequest): what the requester has seen.
        known: VectorTime,
    },
    /// Lock tokens, each with every interval the grantor knows and the acquirer lacks.
    ///
    /// Sent by the token holder straight to the requester. For each grant, the acquirer
    /// records the intervals, installs the complete pushed pages and invalidates the other
    /// pages their write notices name, merges `known` into its own vector time and enters
    /// the critical section (or, for a token it asked for ahead, keeps the grant until
    /// it takes the lock).
    LockGrant {
        /// One or more grants, of different locks. A page's pushed copy (or a pushed diff)
        /// goes only with the first grant that has it: the later grants whose intervals
        /// name the page take that copy.
        grants: Vec<Grant>,
    },
    /// Arrival at barrier `epoch`, with the sender's own intervals since the last barrier.
    /// `check` is a digest of the sender's allocation table, so diverging collective
    /// allocations are caught. In race mode `bitmaps` carries, unasked, the access bitmaps
    /// of the epoch's pages that other nodes could also have touched, so the master can
    /// usually skip the extra bitmap round.
    ///
    /// Goes to rank 0, the barrier master, except in small jobs without race detection,
    /// where every node sends it to every other node and each completes the barrier itself.
    /// Allocations are barriers too and send it.
    BarrierArrive {
        /// The barrier's number: 1 for the first barrier of the run, one more per barrier
        /// (allocations included). For the protocol only; messages name `at`.
        epoch: u32,
        /// Where the sender's program is, as the program counts its barriers.
        at: SyncPoint,
        /// What the sender has seen, its own closed intervals included.
        known: VectorTime,
        /// The sender's own recorded intervals since the previous barrier.
        #[serde(with = "interval_list")]
        intervals: Vec<IntervalRecord>,
        /// Digest of every allocation the sender has made so far; all arrivals must agree.
        check: u64,
        /// This is the final barrier of the sender's run (from `Dsm::finish`); all arrivals
        /// of a barrier must agree on it.
        finishing: bool,
        /// Race mode: bitmaps shipped unasked (empty otherwise, or when they would be too
        /// large to ship; the master then asks with [`BitmapRequest`](Msg::BitmapRequest)).
        bitmaps: Vec<EncodedBitmap>,
        /// All-to-all barriers: pages homed at the sender that it wrote this epoch and the
        /// receiver is believed to hold, so the receiver need not invalidate them (empty
        /// otherwise; the same arrival to different receivers differs only here).
        pages: Vec<PushedPage>,
    },
    /// The barrier master lets a node leave barrier `epoch`, once every node has arrived
    /// and, in race mode, the epoch has been analyzed.
    ///
    /// The receiver records the intervals, invalidates the pages they name, and then knows
    /// every interval up to the barrier, so it discards its interval log.
    BarrierRelease {
        /// The barrier being left.
        epoch: u32,
        /// The merge of every arrival's `known`: what everybody has seen at the barrier.
        known: VectorTime,
        /// The epoch's intervals the receiver had not seen, from every node.
        #[serde(with = "interval_list")]
        intervals: Vec<IntervalRecord>,
        /// Data races reported at this barrier (0 without race detection).
        races: u64,
    },
    /// Barriers through the master (race detection, large jobs): pages homed at the sender
    /// that it wrote in the epoch `epoch` ends and the receiver is believed to hold, sent
    /// to the receiver beside the sender's arrival, as an all-to-all arrival carries them.
    /// The receiver installs them when the barrier's release comes (if they hold every
    /// change it must see), so it need not invalidate its copies and fault them back in;
    /// one that comes after the release is dropped.
    BarrierPush {
        /// The barrier whose release the pages are for.
        epoch: u32,
        /// The pages.
        pages: Vec<PushedPage>,
    },
    /// The barrier master stops the job (e.g. ranks disagree on allocations).
    ///
    /// Sent to every other rank when the arrivals at a barrier are inconsistent (different
    /// allocation digests, or some ranks finishing while others go on); each receiver stops
    /// with the reason. (With all-to-all barriers every node sees the inconsistency itself.)
    Abort {
        /// What went wrong, for the receiver's error message.
        reason: String,
    },
    /// Race mode: the barrier master asks a node for access bitmaps its analysis needs that
    /// were not shipped with the node's arrival. Answered with a
    /// [`BitmapReply`](Msg::BitmapReply).
    BitmapRequest {
        /// The barrier being analyzed.
        epoch: u32,
        /// The bitmaps wanted, all of the receiver's intervals in this epoch.
        wanted: Vec<BitmapKey>,
    },
    /// A node's answer to a [`BitmapRequest`](Msg::BitmapRequest), sent to rank 0.
    BitmapReply {
        /// The barrier being analyzed, as in the request.
        epoch: u32,
        /// One bitmap per requested key, in request order; a bitmap the node does not have
        /// (nothing accessed) comes back with empty `bits`.
        bitmaps: Vec<EncodedBitmap>,
    },
    /// Race mode, to the race master (rank 0), between barriers: the sender's intervals
    /// closed since its previous batch, every access bitmap they recorded (the sender
    /// keeps none of them), and what the sender had seen. Lets programs that synchronize
    /// only through locks get their races reported while they run (incremental analysis).
    RaceBatch {
        /// What the sender had seen when it sent the batch, its own closed intervals
        /// included: none of its later intervals can precede an interval covered here.
        known: VectorTime,
        /// The sender's own intervals closed since its previous batch (or barrier).
        #[serde(with = "interval_list")]
        intervals: Vec<IntervalRecord>,
        /// Every bitmap those intervals recorded.
        bitmaps: BitmapColumns,
        /// The sender is entering a barrier and closes no more intervals with accesses
        /// in this epoch: its later intervals follow everything, so the master may drop
        /// the other nodes' intervals without waiting for this one to learn of them.
        last: bool,
    },
    /// Race mode, from the race master to a node: the master has analysed the node's
    /// first `batches` race batches. A node keeps only a few batches unanalysed (it waits
    /// before shipping more), so a node that closes intervals faster than the master
    /// analyses them cannot fill the master's memory.
    RaceAbsorbed {
        /// How many of the node's batches the master has analysed so far in the run.
        batches: u64,
    },
    /// A signal (V) on a semaphore, sent by the signaller to the semaphore's manager
    /// (`sem % nodes`); a manager handles its own signals without a message.
    ///
    /// The signal is a release: the signaller closed its interval and keeps what it knew
    /// then under `seq`, so that the wait that consumes this signal learns exactly the
    /// intervals ordered before it. The manager queues the signal as a token, or pairs it
    /// with the first queued waiter at once and sends a [`SemForward`](Msg::SemForward)
    /// back to the signaller.
    SemSignal {
        /// The semaphore signalled.
        sem: SemId,
        /// The signaller's own number for this signal (0, 1, 2, ... per node and
        /// semaphore).
        seq: u32,
    },
    /// A wait (P) or try-wait on a semaphore, sent by the waiter to the manager.
    ///
    /// The manager pairs it with the oldest queued token (FIFO): an initial token is
    /// granted at once with nothing to learn; a signal is forwarded to its signaller
    /// ([`SemForward`](Msg::SemForward)), which grants. Without a token the wait queues at
    /// the manager, and a try-wait is refused with [`SemDenied`](Msg::SemDenied).
    SemWait {
        /// The semaphore waited on.
        sem: SemId,
        /// What the waiter has seen (closed intervals only), passed on to the signaller so
        /// it sends exactly the intervals the waiter lacks.
        known: VectorTime,
        /// A try-wait: refuse instead of queueing when no token is available.
        try_only: bool,
    },
    /// The manager tells a signaller that its signal `seq` satisfies `waiter`'s wait; the
    /// signaller answers the waiter with a [`SemGrant`](Msg::SemGrant).
    SemForward {
        /// The semaphore.
        sem: SemId,
        /// Which of the receiver's signals was consumed.
        seq: u32,
        /// The node whose wait it satisfies.
        waiter: NodeId,
        /// What the waiter has seen, from its [`SemWait`](Msg::SemWait).
        known: VectorTime,
    },
    /// Completes a wait: the token, with the intervals of its signal that the waiter lacks.
    ///
    /// Sent by the signaller (or by the manager for an initial token). The waiter records
    /// the intervals, invalidates the pages they name, merges `known` and continues.
    SemGrant {
        /// The semaphore.
        sem: SemId,
        /// The signal consumed as `(signaller, seq)`, or `None` for one of the
        /// semaphore's initial tokens.
        signal: Option<(NodeId, u32)>,
        /// What the signaller had seen at that signal, its own signal interval included
        /// (all zeros for an initial token): exactly what the wait is ordered after.
        known: VectorTime,
        /// The signaller's logged intervals within `known` that the waiter had not seen.
        #[serde(with = "interval_list")]
        intervals: Vec<IntervalRecord>,
    },
    /// The manager's refusal of a try-wait: no token was available.
    SemDenied {
        /// The semaphore.
        sem: SemId,
    },
    /// "Still here": keeps an idle link alive under the job's liveness deadline
    /// ([`JobConfig::liveness`](crate::JobConfig::liveness)).
    ///
    /// The transport on a node's comm thread sends it to a peer it has sent nothing else to
    /// for a while (see [`heartbeat_period`](crate::liveness::heartbeat_period)), whatever
    /// the app thread is doing, and the receiving transport consumes it: it only tells the
    /// receiver that the sender's comm thread is running, and never reaches the protocol
    /// engine.
    Heartbeat,
}

/// `Msg::PageRequest { pages: vec![page], required: vec![], lane: false }`, serialized
/// exactly as that message is but without building it, so without allocating: what a
/// fault handler sends when it asks a page's home over a socket itself, where nothing may
/// allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainPageRequest(pub PageNo);

/// [`Msg::PageRequest`]'s place among [`Msg`]'s variants, which its serialization carries
/// (checked against the derived encoding by a test).
const PAGE_REQUEST_VARIANT: u32 = 0;

impl Serialize for PlainPageRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStructVariant;
        let mut v =
            serializer.serialize_struct_variant("Msg", PAGE_REQUEST_VARIANT, "PageRequest", 3)?;
        v.serialize_field("pages", &[self.0][..])?;
        v.serialize_field("required", &[] as &[Requirement])?;
        v.serialize_field("lane", &false)?;
        v.end()
    }
}

/// Most `applied` entries a [`PlainPageReply`] holds; a reply whose page has more is not
/// plain (its receiver's comm thread takes it the ordinary way).
pub const PLAIN_REPLY_APPLIED_MAX: usize = 64;

/// [`Msg::PageReply`] with exactly one page, read in place from a frame's payload without
/// allocating: the page's bytes borrowed from the payload, its `applied` entries in a
/// fixed array. What a fault handler reads when it takes its page from a socket itself.
/// Its `Deserialize` accepts only that shape (any other message, or more or fewer pages,
/// or more than [`PLAIN_REPLY_APPLIED_MAX`] entries, is an error); a test holds it to the
/// derived encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainPageReply<'a> {
    /// Which page.
    pub page: PageNo,
    /// The page's bytes, as the home sent them.
    pub data: &'a [u8],
    applied: [(NodeId, u32); PLAIN_REPLY_APPLIED_MAX],
    applied_len: usize,
}

impl PlainPageReply<'_> {
    /// The page's [`PageCopy::applied`] entries.
    pub fn applied(&self) -> &[(NodeId, u32)] {
        &self.applied[..self.applied_len]
    }
}

/// [`Msg::PageReply`]'s place among [`Msg`]'s variants.
const PAGE_REPLY_VARIANT: u32 = 1;

impl<'de> Deserialize<'de> for PlainPageReply<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{self, EnumAccess, SeqAccess, VariantAccess, Visitor};
        use std::fmt;

        /// `PageCopy`'s fields in order, borrowing the page's bytes.
        #[derive(Deserialize)]
        struct OneCopy<'a> {
            page: PageNo,
            #[serde(borrow)]
            data: &'a [u8],
            applied: Applied,
        }

        struct Applied([(NodeId, u32); PLAIN_REPLY_APPLIED_MAX], usize);

        impl<'de> Deserialize<'de> for Applied {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Entries;
                impl<'de> Visitor<'de> for Entries {
                    type Value = Applied;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a page copy's applied entries")
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Applied, A::Error> {
                        let mut out = Applied([(0, 0); PLAIN_REPLY_APPLIED_MAX], 0);
                        while let Some(entry) = seq.next_element::<(NodeId, u32)>()? {
                            let slot = out.0.get_mut(out.1).ok_or_else(|| {
                                de::Error::custom("more applied entries than a plain reply holds")
                            })?;
                            *slot = entry;
                            out.1 += 1;
                        }
                        Ok(out)
                    }
                }
                d.deserialize_seq(Entries)
            }
        }

        /// The `pages` field: a sequence of exactly one copy.
        struct OnlyCopy<'a>(OneCopy<'a>);

        impl<'de> Deserialize<'de> for OnlyCopy<'de> {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct One;
                impl<'de> Visitor<'de> for One {
                    type Value = OnlyCopy<'de>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("one page copy")
                    }
                    fn visit_seq<A: SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Self::Value, A::Error> {
                        if seq.size_hint() != Some(1) {
                            return Err(de::Error::custom("not exactly one page"));
                        }
                        let copy = seq
                            .next_element()?
                            .ok_or_else(|| de::Error::custom("not exactly one page"))?;
                        Ok(OnlyCopy(copy))
                    }
                }
                d.deserialize_seq(One)
            }
        }

        struct Reply;
        impl<'de> Visitor<'de> for Reply {
            type Value = PlainPageReply<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a page reply of one page")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
                let (variant, fields) = data.variant::<u32>()?;
                if variant != PAGE_REPLY_VARIANT {
                    return Err(de::Error::custom("not a page reply"));
                }
                fields.struct_variant(&["pages"], Fields)
            }
        }

        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = PlainPageReply<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a page reply's fields")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let OnlyCopy(copy) = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::custom("a page reply without pages"))?;
                Ok(PlainPageReply {
                    page: copy.page,
                    data: copy.data,
                    applied: copy.applied.0,
                    applied_len: copy.applied.1,
                })
            }
        }

        deserializer.deserialize_enum("Msg", &["PageRequest", "PageReply"], Reply)
    }
}

/// One lock's token as [`Msg::LockGrant`] carries it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Grant {
    /// The lock granted.
    pub lock: LockId,
    /// What the grantor had seen when it last released this lock (all zeros if it never
    /// held it). Only this knowledge is ordered before the acquirer: intervals the
    /// grantor closed after its release are not, and claiming they were would hide
    /// races.
    pub known: VectorTime,
    /// The grantor's logged intervals within `known` that the requester had not seen.
    #[serde(with = "interval_list")]
    pub intervals: Vec<IntervalRecord>,
    /// The acquirer's grant number: how many times the lock was acquired before, by any
    /// node (the count travels with the token; records and replays name grants by it).
    pub grant: u64,
    /// Pages homed at the grantor that `intervals` name and that the acquirer is
    /// believed to hold, brought up to date so the acquirer need not invalidate them
    /// (empty when pushing is off or nothing qualifies).
    pub pages: Vec<PushedPage>,
    /// The grantor's own diffs of pages homed at a third node that `intervals` name
    /// (empty when pushing is off or nothing qualifies).
    pub diffs: Vec<PushedDiff>,
}

impl Msg {
    /// Short name for logs and statistics.
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::PageRequest { .. } => "page-request",
            Msg::PageReply { .. } => "page-reply",
            Msg::LanePageReply { .. } => "lane-page-reply",
            Msg::Diffs { .. } => "diffs",
            Msg::LockRequest { .. } => "lock-request",
            Msg::LockForward { .. } => "lock-forward",
            Msg::LockGrant { .. } => "lock-grant",
            Msg::BarrierArrive { .. } => "barrier-arrive",
            Msg::BarrierRelease { .. } => "barrier-release",
            Msg::BarrierPush { .. } => "barrier-push",
            Msg::Abort { .. } => "abort",
            Msg::BitmapRequest { .. } => "bitmap-request",
            Msg::BitmapReply { .. } => "bitmap-reply",
            Msg::RaceBatch { .. } => "race-batch",
            Msg::RaceAbsorbed { .. } => "race-absorbed",
            Msg::SemSignal { .. } => "sem-signal",
            Msg::SemWait { .. } => "sem-wait",
            Msg::SemForward { .. } => "sem-forward",
            Msg::SemGrant { .. } => "sem-grant",
            Msg::SemDenied { .. } => "sem-denied",
            Msg::Heartbeat => "heartbeat",
        }
    }
}

/// First frame on every connection, from the connecting side. The accepting side checks
/// every field, then answers with a [`HelloReply::Challenge`] (or a refusal). No secret
/// travels: both sides prove they know the job secret with MACs over fresh nonces.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Always [`HELLO_MAGIC`]: tells a dsm peer from a stray connection.
    pub magic: [u8; 4],
    /// The sender's [`PROTOCOL_VERSION`]; must equal the acceptor's.
    pub version: u32,
    /// The sender's rank.
    pub rank: NodeId,
    /// The number of ranks the sender believes the job has; must match the acceptor's.
    pub size: u16,
    /// Where the sender accepts mesh connections from higher ranks.
    pub listen: String,
    /// Fresh random bytes the acceptor's proof must cover, so that no recorded proof can
    /// be replayed to the connector.
    pub nonce: [u8; 32],
}

/// The first four bytes of every [`Hello`] (`DSM!`).
pub const HELLO_MAGIC: [u8; 4] = *b"DSM!";

/// The accepting side's answers during the handshake.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum HelloReply {
    /// The acceptor's proof that it knows the job secret (a MAC over both nonces and both
    /// ranks), and its own fresh nonce, which the connector's [`HelloProof`] must cover.
    Challenge {
        /// Fresh random bytes of the acceptor.
        nonce: [u8; 32],
        /// MAC of the acceptor's role, both nonces, both ranks and the job size.
        proof: [u8; 32],
    },
    /// Accepted. From rank 0 this carries every rank's listen address (indexed by rank);
    /// from other ranks it is empty.
    Welcome {
        /// `IP:PORT` of every rank, indexed by rank (rank 0's is the rendezvous address),
        /// or empty.
        listen: Vec<String>,
    },
    /// Not accepted: wrong magic, version, job size or secret, a rank that is unexpected
    /// or already joined, or (from rank 0) the job start timed out. The connection is then
    /// dropped.
    Refused {
        /// Why, for the refused node's error message.
        reason: String,
    },
}

/// The connector's answer to a [`HelloReply::Challenge`]: its own proof that it knows the
/// job secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HelloProof {
    /// MAC of the connector's role, both nonces, both ranks and the job size.
    pub proof: [u8; 32],
}

/// The start of the shared-memory offer between two ranks, sent by the higher rank of the
/// pair on their fresh TCP connection once the mesh is up (`dsm_net::colocate`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShmHello {
    /// The sender's host identity (the kernel's boot id), or `None` when it only speaks
    /// TCP (`DSM_TRANSPORT=tcp`, or its listener could not be made).
    pub host: Option<String>,
    /// The abstract unix socket where the sender accepts the region: reachable only from
    /// the sender's network namespace, so ranks in other namespaces keep TCP.
    pub listen: String,
    /// Fresh random bytes the region's header must carry, so a region handed over by
    /// anyone but the peer is refused.
    pub nonce: [u8; 32],
}

/// The lower rank's answer to a [`ShmHello`]: whether it handed a region over on the unix
/// socket.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShmOffer {
    /// A region was sent; the higher rank accepts it and answers with a [`ShmVerdict`].
    pub offered: bool,
}

/// The higher rank's verdict on the region offered: from here on the pair's protocol
/// messages all travel through it, or all through TCP.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ShmVerdict {
    /// Why the region was refused, or `None`: accepted.
    pub refused: Option<String>,
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
            let va = VectorTime::from(a);
            let vb = VectorTime::from(b);
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
            vt: VectorTime::from(vt),
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

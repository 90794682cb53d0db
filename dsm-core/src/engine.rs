//! The coherence protocol as a state machine: home-based, multi-writer lazy release
//! consistency. The engine owns the page table, twins, intervals and their vector
//! timestamps, the lock and barrier state and the diff bookkeeping at homes. It is fed
//! events (an app-thread fault, an app-thread command, a peer message) and answers with
//! [`Output`]s (messages to send, a fault to resolve, a reply for the app thread). It
//! touches memory only through the [`Memory`] trait, so the whole protocol runs in tests
//! without sockets, signals or `mmap`.
//!
//! Protocol summary:
//! - Every page has a home. At the home the page is always valid; other nodes hold it
//!   invalid, read-only or read-write (with a twin).
//! - A fault on an invalid page fetches the whole page from its home. The request names the
//!   diffs the requester knows must be in it ("requirements" from write notices); the home
//!   parks the request until it has applied them.
//! - A first write to a read-only non-home page makes a twin. At interval end the page is
//!   write-protected again, diffed against its twin and the diff sent to the home.
//! - The home writes in place. It write-protects a page only when it serves a copy to some
//!   other node; its next write then faults and records a write notice. Pages nobody else
//!   has copied stay writable across intervals, so a node working on its own pages takes no
//!   faults at all. (DESIGN.md asks for one fault per interval at the home; this is the
//!   cheaper equivalent: a notice is needed exactly when a copy may have gone stale.)
//! - Intervals end at acquires, releases and barrier arrivals. A lock grant carries every
//!   interval the grantor knew at its release and the acquirer has not seen; the acquirer
//!   invalidates the pages they name. At a barrier every node's new intervals reach every
//!   other node (all-to-all in small jobs, through rank 0 otherwise and always with race
//!   detection, where rank 0 analyzes the epoch first); afterwards everyone has seen
//!   everything, so interval logs are discarded there.

use crate::diff::{self, DiffError};
use dsm_proto::{
    BitmapKey, EncodedBitmap, IntervalRecord, LockId, Msg, NodeId, PageCopy, PageDiff, PageNo,
    PageRuns, RaceNotices, Requirement, SyncCause, VectorTime, PAGE_SIZE,
};
use std::collections::{BTreeMap, HashMap};

/// Protection of a page in the app view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prot {
    None,
    Read,
    ReadWrite,
}

/// What the engine needs from memory. The real implementation wraps the mapped segment;
/// tests use plain buffers.
pub trait Memory {
    /// Sets the app view's protection of a run of pages.
    fn protect(&mut self, first: PageNo, count: u32, prot: Prot);
    /// Copies a page out of the runtime view.
    fn read_page(&self, page: PageNo, out: &mut [u8]);
    /// Installs a whole page into the runtime view.
    fn write_page(&mut self, page: PageNo, data: &[u8]);
    /// Applies a (validated) diff to a page of the runtime view.
    fn apply_diff(&mut self, page: PageNo, diff: &[u8]);
    /// Diff of the page's current contents against `twin`.
    fn make_diff(&self, page: PageNo, twin: &[u8]) -> Vec<u8>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum PageState {
    /// Not part of any allocation: an access is a genuine segmentation fault.
    Unallocated,
    Invalid,
    ReadOnly,
    ReadWrite,
}

#[derive(Clone, Copy, Debug)]
struct PageEntry {
    state: PageState,
    home: NodeId,
}

/// Commands from the app thread.
#[derive(Debug)]
pub enum Command {
    /// Registers the pages of a new collective allocation (`homes` as runs
    /// `(first, count, home)`), then behaves as a barrier.
    Alloc {
        homes: Vec<(PageNo, u32, NodeId)>,
        digest: u64,
        race: Option<RaceNotices>,
    },
    Acquire {
        lock: LockId,
        race: Option<RaceNotices>,
    },
    Release {
        lock: LockId,
        race: Option<RaceNotices>,
    },
    Barrier {
        finishing: bool,
        race: Option<RaceNotices>,
        /// Race mode: bitmaps shipped with the arrival (see `Msg::BarrierArrive`).
        bitmaps: Vec<EncodedBitmap>,
    },
    /// Makes pages valid (and writable if `write`) ahead of a bulk access, fetching all
    /// missing ones with one request per home instead of one fault per page.
    Prefetch { pages: PageRuns, write: bool },
    /// Race mode, barrier master: ask `node` for these bitmaps.
    RequestBitmaps {
        node: NodeId,
        epoch: u32,
        keys: Vec<BitmapKey>,
    },
    /// Race mode: answer the master's bitmap request.
    SendBitmaps {
        epoch: u32,
        bitmaps: Vec<EncodedBitmap>,
    },
    /// Race mode, barrier master: analysis done, let everyone go.
    ReleaseBarrier { races: u64 },
    /// Snapshot of the protocol counters.
    Stats,
}

/// Answers for the app thread.
#[derive(Debug)]
pub enum Reply {
    Done,
    BarrierDone {
        epoch: u32,
        races: u64,
    },
    /// Race mode, barrier master: every interval of the epoch, for analysis, and the
    /// bitmaps the nodes shipped with their arrivals.
    AnalyzeEpoch {
        epoch: u32,
        intervals: Vec<IntervalRecord>,
        bitmaps: Vec<(NodeId, EncodedBitmap)>,
    },
    /// Race mode: the master wants these bitmaps.
    BitmapsWanted {
        epoch: u32,
        keys: Vec<BitmapKey>,
    },
    /// Race mode, master: bitmaps from `from`.
    BitmapsArrived {
        from: NodeId,
        bitmaps: Vec<EncodedBitmap>,
    },
    Stats(Box<Stats>),
}

#[derive(Debug)]
pub enum Output {
    Send {
        to: NodeId,
        msg: Msg,
    },
    FaultResolved,
    /// The faulting access is outside every allocation: let it crash.
    FaultCrash,
    Reply(Reply),
    /// The job cannot continue (malformed traffic, inconsistent collective call).
    Fatal(String),
    /// The job cannot continue because a peer went away (a consequence of another
    /// node's failure, reported with its own exit status).
    PeerLost(String),
}

/// Protocol counters (the traffic counters are filled in by the comm thread).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub read_faults: u64,
    pub write_faults: u64,
    pub pages_fetched: u64,
    pub fetch_requests: u64,
    pub pages_served: u64,
    pub twins_made: u64,
    pub diffs_sent: u64,
    pub diff_bytes_sent: u64,
    pub diffs_applied: u64,
    pub invalidations: u64,
    pub intervals_closed: u64,
    pub lock_acquires: u64,
    pub lock_acquires_local: u64,
    pub barriers: u64,
    /// Bytes of read/write notices from the access recorder in sent messages (race mode).
    pub race_notice_bytes: u64,
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub messages_received: u64,
    pub bytes_received: u64,
}

#[derive(Debug)]
struct LockState {
    /// At the manager: where the next request is forwarded (initially the manager itself,
    /// which also holds the token of a lock nobody has used).
    last_requester: NodeId,
    token: bool,
    held: bool,
    waiting: bool,
    next: Option<(NodeId, VectorTime)>,
    /// What this node knew when it last released the lock. A later grant passes on exactly
    /// this: intervals closed after the release (by a barrier arrival, another lock) are
    /// not ordered before the acquirer, and claiming they were would hide races.
    released_known: Option<VectorTime>,
}

#[derive(Debug)]
struct FetchInFlight {
    outstanding: usize,
    then: AfterFetch,
    write: bool,
    /// Pages to make writable once they arrive.
    pages: Vec<PageNo>,
}

#[derive(Debug, PartialEq, Eq)]
enum AfterFetch {
    ResolveFault,
    ReplyDone,
}

struct ParkedServe {
    from: NodeId,
    pages: Vec<PageNo>,
    required: Vec<Requirement>,
}

/// Something the app waits for until diffs of home pages have arrived.
struct HomeWait {
    waits: Vec<Requirement>,
    reply: Reply,
}

struct Arrival {
    known: VectorTime,
    intervals: Vec<IntervalRecord>,
    check: u64,
    finishing: bool,
    bitmaps: Vec<EncodedBitmap>,
}

pub struct Engine<M: Memory> {
    me: NodeId,
    n: usize,
    mem: M,
    pages: Vec<PageEntry>,
    /// Current knowledge; `vt[me]` is the index of the open interval.
    vt: VectorTime,
    cur_start: VectorTime,
    cur_cause: SyncCause,
    /// Non-home pages with a twin in this interval.
    dirty: Vec<PageNo>,
    twins: HashMap<PageNo, Box<[u8]>>,
    spare_twins: Vec<Box<[u8]>>,
    /// Home pages written (write-faulted) in this interval.
    home_writes: Vec<PageNo>,
    /// Intervals known since the last barrier, per creating node, in index order.
    log: Vec<Vec<IntervalRecord>>,
    /// Diffs a fetch of this (non-home) page must wait for, per writer.
    required: HashMap<PageNo, Vec<(NodeId, u32)>>,
    /// At the home: per page, the latest interval of each writer whose diff is applied.
    applied: HashMap<PageNo, Vec<(NodeId, u32)>>,
    parked: Vec<ParkedServe>,
    home_wait: Option<HomeWait>,
    fetch: Option<FetchInFlight>,
    locks: HashMap<LockId, LockState>,
    epoch: u32,
    alloc_digest: u64,
    /// Barrier arrivals by epoch (a fast node's arrival at the next barrier can come in
    /// before this node has finished the current one).
    arrivals: BTreeMap<u32, Vec<Option<Arrival>>>,
    master_release: Option<(u32, VectorTime, Vec<IntervalRecord>, Vec<VectorTime>)>,
    race_mode: bool,
    finishing: bool,
    finished: bool,
    stats: Stats,
    out: Vec<Output>,
    mirror: Option<std::sync::Arc<StateMirror>>,
}

/// Page states as the comm thread last set them, readable from the app thread. Reads may
/// be stale by the time they are used; they only decide whether to prefetch, never what is
/// correct.
pub struct StateMirror {
    states: Vec<std::sync::atomic::AtomicU8>,
    /// Pages another node may also access: not homed here, or homed here and served to
    /// someone at least once. Only these can take part in a race.
    shared: Vec<std::sync::atomic::AtomicBool>,
}

impl StateMirror {
    pub fn new(pages: usize) -> Self {
        StateMirror {
            states: (0..pages)
                .map(|_| std::sync::atomic::AtomicU8::new(0))
                .collect(),
            shared: (0..pages)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
        }
    }

    fn mark_shared(&self, page: usize) {
        self.shared[page].store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether another node may have accessed this page too (see the field).
    pub fn shared(&self, page: usize) -> bool {
        self.shared
            .get(page)
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn set(&self, page: usize, state: PageState) {
        self.states[page].store(state as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether any page of `first..=last` would fault for this access.
    pub fn any_missing(&self, first: usize, last: usize, write: bool) -> bool {
        let need = if write {
            PageState::ReadWrite as u8
        } else {
            PageState::ReadOnly as u8
        };
        self.states[first..=last.min(self.states.len() - 1)]
            .iter()
            .any(|s| s.load(std::sync::atomic::Ordering::Relaxed) < need)
    }
}

/// Largest job whose barriers are all-to-all (without race detection); beyond it the
/// N(N-1) messages cost more than the master's extra message delay.
pub const ALL_TO_ALL_MAX_NODES: usize = 4;

/// The lock's manager: a static function of the id so every node agrees without messages.
pub fn lock_manager(lock: LockId, nodes: usize) -> NodeId {
    (lock % nodes as u64) as NodeId
}

impl<M: Memory> Engine<M> {
    pub fn new(me: NodeId, n: usize, pages: usize, mem: M, race_mode: bool) -> Self {
        let mut vt = VectorTime::zero(n);
        vt.set(me, 1);
        Engine {
            me,
            n,
            mem,
            pages: vec![
                PageEntry {
                    state: PageState::Unallocated,
                    home: 0
                };
                pages
            ],
            cur_start: vt.clone(),
            vt,
            cur_cause: SyncCause::Start,
            dirty: Vec::new(),
            twins: HashMap::new(),
            spare_twins: (0..64).map(|_| vec![0u8; PAGE_SIZE].into()).collect(),
            home_writes: Vec::new(),
            log: vec![Vec::new(); n],
            required: HashMap::new(),
            applied: HashMap::new(),
            parked: Vec::new(),
            home_wait: None,
            fetch: None,
            locks: HashMap::new(),
            epoch: 0,
            alloc_digest: 0,
            arrivals: BTreeMap::new(),
            master_release: None,
            race_mode,
            finishing: false,
            finished: false,
            stats: Stats::default(),
            out: Vec::new(),
            mirror: None,
        }
    }

    /// Gives the app thread a read-only view of page states, so bulk accessors can fetch
    /// the missing pages of a range in one request instead of faulting page by page.
    pub fn share_states(&mut self, mirror: std::sync::Arc<StateMirror>) {
        for (p, e) in self.pages.iter().enumerate() {
            mirror.set(p, e.state);
        }
        self.mirror = Some(mirror);
    }

    fn set_state(&mut self, page: PageNo, state: PageState) {
        self.pages[page as usize].state = state;
        if let Some(m) = &self.mirror {
            m.set(page as usize, state);
        }
    }

    pub fn memory(&self) -> &M {
        &self.mem
    }

    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.mem
    }

    pub fn page_state(&self, page: PageNo) -> PageState {
        self.pages[page as usize].state
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn take_out(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.out)
    }

    fn send(&mut self, to: NodeId, msg: Msg) {
        if self.race_mode {
            let intervals = match &msg {
                Msg::LockGrant { intervals, .. }
                | Msg::BarrierArrive { intervals, .. }
                | Msg::BarrierRelease { intervals, .. } => intervals.as_slice(),
                _ => &[],
            };
            for r in intervals.iter().filter_map(|i| i.race.as_ref()) {
                self.stats.race_notice_bytes +=
                    postcard::experimental::serialized_size(r).map_or(0, |s| s as u64);
            }
        }
        self.out.push(Output::Send { to, msg });
    }

    fn reply(&mut self, r: Reply) {
        self.out.push(Output::Reply(r));
    }

    fn fatal(&mut self, why: String) {
        self.out.push(Output::Fatal(why));
    }

    fn is_home(&self, page: PageNo) -> bool {
        self.pages[page as usize].home == self.me
    }

    /// What this node has seen, counting only its closed intervals.
    fn known(&self) -> VectorTime {
        let mut k = self.vt.clone();
        k.set(self.me, self.vt.get(self.me) - 1);
        k
    }

    fn protect_runs(&mut self, pages: &mut [PageNo], prot: Prot) {
        pages.sort_unstable();
        let runs = PageRuns::from_sorted_unique(pages);
        for &(first, count) in runs.runs() {
            self.mem.protect(first, count, prot);
        }
    }

    fn take_twin(&mut self) -> Box<[u8]> {
        self.spare_twins
            .pop()
            .unwrap_or_else(|| vec![0u8; PAGE_SIZE].into())
    }

    // ---------------------------------------------------------------- faults

    /// A fault of the app thread at `page`. `write` is `None` when the architecture does
    /// not say; the access is then treated as a read and a write retries as a write fault.
    pub fn on_fault(&mut self, page: Option<PageNo>, write: Option<bool>) -> Vec<Output> {
        let Some(page) = page.filter(|&p| (p as usize) < self.pages.len()) else {
            self.out.push(Output::FaultCrash);
            return self.take_out();
        };
        let entry = self.pages[page as usize];
        let write = write.unwrap_or(false);
        match entry.state {
            PageState::Unallocated => self.out.push(Output::FaultCrash),
            PageState::Invalid => {
                self.stats.read_faults += u64::from(!write);
                self.stats.write_faults += u64::from(write);
                self.start_fetch(vec![page], write, AfterFetch::ResolveFault);
            }
            PageState::ReadOnly if write => {
                self.stats.write_faults += 1;
                self.make_writable(page);
                self.out.push(Output::FaultResolved);
            }
            // Spurious: the page became accessible in the meantime (e.g. a prefetch).
            PageState::ReadOnly | PageState::ReadWrite => self.out.push(Output::FaultResolved),
        }
        self.take_out()
    }

    /// Read-only -> read-write: a twin for non-home pages, a write notice at the home.
    fn make_writable(&mut self, page: PageNo) {
        if self.is_home(page) {
            self.home_writes.push(page);
        } else {
            let mut twin = self.take_twin();
            self.mem.read_page(page, &mut twin);
            self.twins.insert(page, twin);
            self.dirty.push(page);
            self.stats.twins_made += 1;
        }
        self.mem.protect(page, 1, Prot::ReadWrite);
        self.set_state(page, PageState::ReadWrite);
    }

    fn start_fetch(&mut self, pages: Vec<PageNo>, write: bool, then: AfterFetch) {
        let mut by_home: BTreeMap<NodeId, Vec<PageNo>> = BTreeMap::new();
        for &p in &pages {
            by_home
                .entry(self.pages[p as usize].home)
                .or_default()
                .push(p);
        }
        self.fetch = Some(FetchInFlight {
            outstanding: by_home.len(),
            then,
            write,
            pages,
        });
        for (home, pages) in by_home {
            let required =
                pages
                    .iter()
                    .flat_map(|&p| {
                        self.required.get(&p).into_iter().flatten().map(
                            move |&(writer, interval)| Requirement {
                                page: p,
                                writer,
                                interval,
                            },
                        )
                    })
                    .collect();
            self.stats.fetch_requests += 1;
            self.send(home, Msg::PageRequest { pages, required });
        }
    }

    fn on_page_reply(&mut self, from: NodeId, copies: Vec<PageCopy>) {
        let Some(fetch) = self.fetch.as_mut() else {
            self.fatal(format!("rank {from} sent pages nobody asked for"));
            return;
        };
        fetch.outstanding = fetch.outstanding.saturating_sub(1);
        for copy in &copies {
            let p = copy.page as usize;
            if p >= self.pages.len()
                || copy.data.len() != PAGE_SIZE
                || self.pages[p].state != PageState::Invalid
                || self.pages[p].home != from
            {
                self.fatal(format!(
                    "rank {from} sent a bad copy of page {} ({} bytes)",
                    copy.page,
                    copy.data.len()
                ));
                return;
            }
        }
        let mut readable = Vec::with_capacity(copies.len());
        for copy in copies {
            self.mem.write_page(copy.page, &copy.data);
            self.required.remove(&copy.page);
            self.set_state(copy.page, PageState::ReadOnly);
            self.stats.pages_fetched += 1;
            readable.push(copy.page);
        }
        self.protect_runs(&mut readable, Prot::Read);
        let fetch = self.fetch.as_ref().expect("checked above");
        if fetch.outstanding > 0 {
            return;
        }
        let fetch = self.fetch.take().expect("checked above");
        if fetch.write {
            for p in fetch.pages {
                if self.pages[p as usize].state == PageState::ReadOnly {
                    self.make_writable(p);
                }
            }
        }
        match fetch.then {
            AfterFetch::ResolveFault => self.out.push(Output::FaultResolved),
            AfterFetch::ReplyDone => self.reply(Reply::Done),
        }
    }

    // ---------------------------------------------------------------- serving pages

    fn requirements_met(&self, required: &[Requirement]) -> bool {
        required.iter().all(|r| {
            self.applied
                .get(&r.page)
                .and_then(|v| v.iter().find(|(w, _)| *w == r.writer))
                .is_some_and(|&(_, i)| i >= r.interval)
        })
    }

    fn on_page_request(&mut self, from: NodeId, pages: Vec<PageNo>, required: Vec<Requirement>) {
        for &p in &pages {
            if (p as usize) >= self.pages.len()
                || !self.is_home(p)
                || self.pages[p as usize].state == PageState::Unallocated
            {
                self.fatal(format!(
                    "rank {from} asked for page {p}, which is not homed here"
                ));
                return;
            }
        }
        if self.requirements_met(&required) {
            self.serve(from, pages);
        } else {
            self.parked.push(ParkedServe {
                from,
                pages,
                required,
            });
        }
    }

    fn serve(&mut self, to: NodeId, pages: Vec<PageNo>) {
        // Write-protect first, so that any later write by the home faults and produces the
        // write notice that will invalidate the copy we hand out.
        let mut newly_shared: Vec<PageNo> = pages
            .iter()
            .copied()
            .filter(|&p| self.pages[p as usize].state == PageState::ReadWrite)
            .collect();
        self.protect_runs(&mut newly_shared, Prot::Read);
        for &p in &newly_shared {
            self.set_state(p, PageState::ReadOnly);
        }
        if let Some(m) = &self.mirror {
            for &p in &pages {
                m.mark_shared(p as usize);
            }
        }
        let copies = pages
            .into_iter()
            .map(|page| {
                let mut data = vec![0u8; PAGE_SIZE];
                self.mem.read_page(page, &mut data);
                PageCopy { page, data }
            })
            .collect::<Vec<_>>();
        self.stats.pages_served += copies.len() as u64;
        self.send(to, Msg::PageReply { pages: copies });
    }

    fn on_diffs(&mut self, from: NodeId, interval: u32, diffs: Vec<PageDiff>) {
        for d in &diffs {
            if (d.page as usize) >= self.pages.len() || !self.is_home(d.page) {
                self.fatal(format!(
                    "rank {from} sent a diff for page {}, which is not homed here",
                    d.page
                ));
                return;
            }
            if let Err(e) = diff::validate(&d.runs) {
                self.fatal(format!(
                    "rank {from} sent a malformed diff for page {}: {e}",
                    d.page
                ));
                return;
            }
        }
        for d in diffs {
            self.mem.apply_diff(d.page, &d.runs);
            self.stats.diffs_applied += 1;
            let v = self.applied.entry(d.page).or_default();
            match v.iter_mut().find(|(w, _)| *w == from) {
                Some((_, i)) => *i = (*i).max(interval),
                None => v.push((from, interval)),
            }
        }
        self.recheck_waits();
    }

    fn recheck_waits(&mut self) {
        if !self.parked.is_empty() {
            let parked = std::mem::take(&mut self.parked);
            for p in parked {
                if self.requirements_met(&p.required) {
                    self.serve(p.from, p.pages);
                } else {
                    self.parked.push(p);
                }
            }
        }
        if let Some(hw) = self.home_wait.take() {
            if self.requirements_met(&hw.waits) {
                self.reply(hw.reply);
            } else {
                self.home_wait = Some(hw);
            }
        }
    }

    /// Replies to the app once the diffs of home pages named in newly seen write notices
    /// have arrived (the app reads home pages without faulting).
    fn reply_after_home_diffs(&mut self, waits: Vec<Requirement>, reply: Reply) {
        if self.requirements_met(&waits) {
            self.reply(reply);
        } else {
            self.home_wait = Some(HomeWait { waits, reply });
        }
    }

    // ---------------------------------------------------------------- intervals

    /// Ends the open interval: diffs go to homes, pages are write-protected, and the
    /// interval is logged if it carries any notice.
    fn close_interval(&mut self, race: Option<RaceNotices>) {
        let index = self.vt.get(self.me);
        let mut dirty = std::mem::take(&mut self.dirty);
        self.protect_runs(&mut dirty, Prot::Read);
        let mut by_home: BTreeMap<NodeId, Vec<PageDiff>> = BTreeMap::new();
        let mut written: Vec<PageNo> = std::mem::take(&mut self.home_writes);
        for &p in &dirty {
            let twin = self.twins.remove(&p).expect("dirty page has a twin");
            let runs = self.mem.make_diff(p, &twin);
            self.spare_twins.push(twin);
            self.set_state(p, PageState::ReadOnly);
            if !runs.is_empty() {
                self.stats.diffs_sent += 1;
                self.stats.diff_bytes_sent += runs.len() as u64;
                by_home
                    .entry(self.pages[p as usize].home)
                    .or_default()
                    .push(PageDiff { page: p, runs });
                written.push(p);
            }
        }
        for (home, diffs) in by_home {
            self.send(
                home,
                Msg::Diffs {
                    interval: index,
                    diffs,
                },
            );
        }
        let writes = PageRuns::from_pages(written);
        let race = race.filter(|r| !r.reads.is_empty() || !r.writes.is_empty());
        if !writes.is_empty() || race.is_some() {
            self.log[self.me as usize].push(IntervalRecord {
                node: self.me,
                index,
                vt: self.cur_start.clone(),
                writes,
                race,
                began_with: self.cur_cause,
            });
        }
        self.stats.intervals_closed += 1;
        self.vt.set(self.me, index + 1);
    }

    fn begin_interval(&mut self, cause: SyncCause) {
        self.cur_start = self.vt.clone();
        self.cur_cause = cause;
    }

    /// Intervals in the log that a node with knowledge `known` has not seen.
    fn unseen_by(&self, known: &VectorTime) -> Vec<IntervalRecord> {
        let mut out = Vec::new();
        for (node, list) in self.log.iter().enumerate() {
            let seen = known.0.get(node).copied().unwrap_or(0);
            let start = list.partition_point(|r| r.index <= seen);
            out.extend_from_slice(&list[start..]);
        }
        out
    }

    /// Incorporates intervals learned at an acquire or barrier: logs them, invalidates the
    /// pages their write notices name, and returns the diffs this node must have applied to
    /// its home pages before the app may continue.
    fn apply_intervals(
        &mut self,
        mut records: Vec<IntervalRecord>,
        known: &VectorTime,
    ) -> Vec<Requirement> {
        if known.len() != self.n {
            self.fatal(format!(
                "received a vector timestamp for {} nodes in a {}-node job",
                known.len(),
                self.n
            ));
            return Vec::new();
        }
        records.sort_by_key(|r| (r.node, r.index));
        let mut invalidate: Vec<PageNo> = Vec::new();
        let mut home_waits = Vec::new();
        for rec in records {
            let node = rec.node;
            if node as usize >= self.n || node == self.me {
                continue;
            }
            let last_logged = self.log[node as usize].last().map_or(0, |r| r.index);
            if rec.index <= self.vt.get(node) || rec.index <= last_logged {
                continue;
            }
            for &(first, count) in rec.writes.runs() {
                let end = (first as usize).saturating_add(count as usize);
                if end > self.pages.len() {
                    self.fatal(format!(
                        "rank {node} sent a write notice for pages beyond the segment"
                    ));
                    return Vec::new();
                }
                for p in first..first + count {
                    let entry = self.pages[p as usize];
                    if entry.home == self.me {
                        if node != self.me {
                            home_waits.push(Requirement {
                                page: p,
                                writer: node,
                                interval: rec.index,
                            });
                        }
                        continue;
                    }
                    if entry.home != node {
                        // The writer is not the home, so its changes reach the home as a
                        // diff: a later fetch must wait for it.
                        let req = self.required.entry(p).or_default();
                        match req.iter_mut().find(|(w, _)| *w == node) {
                            Some((_, i)) => *i = (*i).max(rec.index),
                            None => req.push((node, rec.index)),
                        }
                    }
                    if matches!(entry.state, PageState::ReadOnly | PageState::ReadWrite) {
                        invalidate.push(p);
                    }
                }
            }
            self.log[node as usize].push(rec);
        }
        invalidate.sort_unstable();
        invalidate.dedup();
        for &p in &invalidate {
            debug_assert!(
                self.pages[p as usize].state != PageState::ReadWrite,
                "interval closed before invalidation"
            );
            self.set_state(p, PageState::Invalid);
        }
        self.stats.invalidations += invalidate.len() as u64;
        self.protect_runs(&mut invalidate, Prot::None);
        self.vt.merge(known);
        home_waits.retain(|r| !self.requirements_met(std::slice::from_ref(r)));
        home_waits
    }

    // ---------------------------------------------------------------- commands

    pub fn on_command(&mut self, cmd: Command) -> Vec<Output> {
        match cmd {
            Command::Alloc {
                homes,
                digest,
                race,
            } => self.alloc(homes, digest, race),
            Command::Acquire { lock, race } => self.acquire(lock, race),
            Command::Release { lock, race } => self.release(lock, race),
            Command::Barrier {
                finishing,
                race,
                bitmaps,
            } => self.barrier(finishing, race, bitmaps),
            Command::Prefetch { pages, write } => self.prefetch(pages, write),
            Command::RequestBitmaps { node, epoch, keys } => self.send(
                node,
                Msg::BitmapRequest {
                    epoch,
                    wanted: keys,
                },
            ),
            Command::SendBitmaps { epoch, bitmaps } => {
                self.send(0, Msg::BitmapReply { epoch, bitmaps })
            }
            Command::ReleaseBarrier { races } => self.master_release(races),
            Command::Stats => {
                let s = Box::new(self.stats.clone());
                self.reply(Reply::Stats(s));
            }
        }
        self.take_out()
    }

    fn alloc(&mut self, homes: Vec<(PageNo, u32, NodeId)>, digest: u64, race: Option<RaceNotices>) {
        let mut mine = Vec::new();
        for (first, count, home) in homes {
            let end = first as usize + count as usize;
            if end > self.pages.len() || home as usize >= self.n {
                self.fatal(format!(
                    "allocation of pages {first}..{end} does not fit the segment"
                ));
                return;
            }
            for p in first..first + count {
                let e = &mut self.pages[p as usize];
                if e.state != PageState::Unallocated {
                    self.fatal(format!("page {p} allocated twice"));
                    return;
                }
                e.home = home;
                let state = if home == self.me {
                    PageState::ReadWrite
                } else {
                    PageState::Invalid
                };
                self.set_state(p, state);
                if home != self.me {
                    if let Some(m) = &self.mirror {
                        m.mark_shared(p as usize);
                    }
                }
            }
            if home == self.me {
                mine.push((first, count));
            }
        }
        for (first, count) in mine {
            self.mem.protect(first, count, Prot::ReadWrite);
        }
        self.alloc_digest = self.alloc_digest.rotate_left(7) ^ digest;
        self.barrier(false, race, Vec::new());
    }

    fn prefetch(&mut self, pages: PageRuns, write: bool) {
        let mut missing = Vec::new();
        for p in pages.iter() {
            if (p as usize) >= self.pages.len() {
                break;
            }
            match self.pages[p as usize].state {
                PageState::Invalid => missing.push(p),
                PageState::ReadOnly if write => self.make_writable(p),
                _ => {}
            }
        }
        if missing.is_empty() {
            self.reply(Reply::Done);
        } else {
            self.start_fetch(missing, write, AfterFetch::ReplyDone);
        }
    }

    fn lock_entry(&mut self, lock: LockId) -> &mut LockState {
        let manager = lock_manager(lock, self.n);
        let me = self.me;
        self.locks.entry(lock).or_insert_with(|| LockState {
            last_requester: manager,
            token: manager == me,
            held: false,
            waiting: false,
            next: None,
            released_known: None,
        })
    }

    fn acquire(&mut self, lock: LockId, race: Option<RaceNotices>) {
        self.close_interval(race);
        self.stats.lock_acquires += 1;
        let st = self.lock_entry(lock);
        if st.held || st.waiting {
            self.fatal(format!(
                "lock {lock} acquired again by rank {} while already held (locks are not recursive)",
                self.me
            ));
            return;
        }
        if st.token {
            st.held = true;
            self.stats.lock_acquires_local += 1;
            self.begin_interval(SyncCause::Acquire(lock));
            self.reply(Reply::Done);
            return;
        }
        st.waiting = true;
        let known = self.known();
        let manager = lock_manager(lock, self.n);
        if manager == self.me {
            self.on_lock_request(lock, self.me, known);
        } else {
            self.send(
                manager,
                Msg::LockRequest {
                    lock,
                    requester: self.me,
                    known,
                },
            );
        }
    }

    fn on_lock_request(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        if lock_manager(lock, self.n) != self.me {
            self.fatal(format!(
                "lock request for {lock} sent to a node that does not manage it"
            ));
            return;
        }
        let me = self.me;
        let st = self.lock_entry(lock);
        let target = std::mem::replace(&mut st.last_requester, requester);
        if target == me {
            self.on_lock_forward(lock, requester, known);
        } else {
            self.send(
                target,
                Msg::LockForward {
                    lock,
                    requester,
                    known,
                },
            );
        }
    }

    fn on_lock_forward(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        let st = self.lock_entry(lock);
        if st.token && !st.held {
            self.grant(lock, requester, known);
        } else if st.next.is_some() {
            self.fatal(format!("lock {lock}: two successors queued at one node"));
        } else {
            st.next = Some((requester, known));
        }
    }

    fn grant(&mut self, lock: LockId, to: NodeId, their_known: VectorTime) {
        let n = self.n;
        let st = self.lock_entry(lock);
        st.token = false;
        let known = st
            .released_known
            .clone()
            .unwrap_or_else(|| VectorTime::zero(n));
        let intervals = self
            .unseen_by(&their_known)
            .into_iter()
            .filter(|r| r.index <= known.get(r.node))
            .collect();
        self.send(
            to,
            Msg::LockGrant {
                lock,
                known,
                intervals,
            },
        );
    }

    fn on_lock_grant(
        &mut self,
        from: NodeId,
        lock: LockId,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
    ) {
        let st = self.lock_entry(lock);
        if !st.waiting {
            self.fatal(format!(
                "rank {from} granted lock {lock}, which was not requested"
            ));
            return;
        }
        st.waiting = false;
        st.held = true;
        st.token = true;
        let waits = self.apply_intervals(intervals, &known);
        self.begin_interval(SyncCause::Acquire(lock));
        self.reply_after_home_diffs(waits, Reply::Done);
    }

    fn release(&mut self, lock: LockId, race: Option<RaceNotices>) {
        let st = self.lock_entry(lock);
        if !st.held {
            self.fatal(format!(
                "release of lock {lock}, which this node does not hold"
            ));
            return;
        }
        st.held = false;
        let next = st.next.take();
        self.close_interval(race);
        let known = self.known();
        self.lock_entry(lock).released_known = Some(known);
        self.begin_interval(SyncCause::Release(lock));
        if let Some((to, known)) = next {
            self.grant(lock, to, known);
        }
        self.reply(Reply::Done);
    }

    /// Whether barriers are all-to-all (see [`Engine::barrier`]).
    fn all_to_all(&self) -> bool {
        !self.race_mode && self.n <= ALL_TO_ALL_MAX_NODES
    }

    /// Barriers. In small jobs without race detection every node sends its arrival (with
    /// the intervals it created since the last barrier) to every other node and leaves once
    /// it holds all of them: one message delay. Otherwise the arrivals go to rank 0, which
    /// releases everyone (after analyzing the epoch, with race detection): two message
    /// delays, but 2(N-1) messages instead of N(N-1).
    fn barrier(&mut self, finishing: bool, race: Option<RaceNotices>, bitmaps: Vec<EncodedBitmap>) {
        self.close_interval(race);
        self.epoch += 1;
        self.finishing = finishing;
        let msg = Msg::BarrierArrive {
            epoch: self.epoch,
            known: self.known(),
            intervals: self.log[self.me as usize].clone(),
            check: self.alloc_digest,
            finishing,
            bitmaps,
        };
        if !self.all_to_all() {
            if self.me == 0 {
                self.handle(0, msg);
            } else {
                self.send(0, msg);
            }
        } else {
            let me = self.me;
            for to in (0..self.n as NodeId).filter(|&k| k != me) {
                self.send(to, msg.clone());
            }
            self.handle(self.me, msg);
        }
    }

    fn on_arrive(&mut self, from: NodeId, epoch: u32, arrival: Arrival) {
        if !self.all_to_all() && self.me != 0 {
            self.fatal(format!(
                "rank {from} sent a barrier arrival to a non-master"
            ));
            return;
        }
        if epoch != self.epoch && !(epoch == self.epoch + 1 && from != self.me) {
            self.fatal(format!(
                "rank {from} arrived at barrier {epoch} while rank {} is at barrier {}: \
                 ranks called barrier/alloc a different number of times",
                self.me, self.epoch
            ));
            return;
        }
        let n = self.n;
        let slots = self
            .arrivals
            .entry(epoch)
            .or_insert_with(|| (0..n).map(|_| None).collect());
        if slots[from as usize].is_some() {
            self.fatal(format!("rank {from} arrived twice at barrier {epoch}"));
            return;
        }
        slots[from as usize] = Some(arrival);
        self.try_complete_barrier();
    }

    /// Completes the current barrier once every arrival (this node's included) is in.
    fn try_complete_barrier(&mut self) {
        let epoch = self.epoch;
        let complete = self
            .arrivals
            .get(&epoch)
            .is_some_and(|slots| slots.iter().all(Option::is_some));
        if !complete {
            return;
        }
        let arrivals: Vec<Arrival> = self
            .arrivals
            .remove(&epoch)
            .expect("checked")
            .into_iter()
            .map(|a| a.expect("checked"))
            .collect();
        let abort = |engine: &mut Self, reason: String| {
            if !engine.all_to_all() {
                for to in 1..engine.n as NodeId {
                    engine.send(
                        to,
                        Msg::Abort {
                            reason: reason.clone(),
                        },
                    );
                }
            }
            engine.fatal(reason);
        };
        if let Some(k) = (0..self.n).find(|&k| arrivals[k].check != arrivals[0].check) {
            abort(
                self,
                format!(
                    "rank {k} and rank 0 disagree on the shared allocations at barrier {epoch} \
                     (every rank must make the same alloc calls in the same order)"
                ),
            );
            return;
        }
        if arrivals.iter().any(|a| a.finishing) != arrivals.iter().all(|a| a.finishing) {
            let who: Vec<usize> = (0..self.n).filter(|&k| arrivals[k].finishing).collect();
            abort(
                self,
                format!(
                    "ranks {who:?} finished while others are still at barrier {epoch}: \
                     every rank must call barrier the same number of times before finishing"
                ),
            );
            return;
        }
        let mut global = VectorTime::zero(self.n);
        let mut all = Vec::new();
        let mut knowns = Vec::with_capacity(self.n);
        let mut shipped = Vec::new();
        for (node, a) in arrivals.into_iter().enumerate() {
            global.merge(&a.known);
            knowns.push(a.known);
            all.extend(a.intervals);
            shipped.extend(a.bitmaps.into_iter().map(|b| (node as NodeId, b)));
        }
        all.sort_by_key(|r| (r.node, r.index));
        all.dedup_by_key(|r| (r.node, r.index));
        if self.all_to_all() {
            // Every node did this same computation from the same arrivals.
            self.on_release(epoch, global, all, 0);
        } else if !self.race_mode {
            self.master_release = Some((epoch, global, all, knowns));
            self.master_release(0);
        } else {
            self.master_release = Some((epoch, global, all.clone(), knowns));
            self.reply(Reply::AnalyzeEpoch {
                epoch,
                intervals: all,
                bitmaps: shipped,
            });
        }
    }

    fn master_release(&mut self, races: u64) {
        let Some((epoch, global, all, knowns)) = self.master_release.take() else {
            self.fatal("barrier release requested outside a barrier".into());
            return;
        };
        for (k, known) in knowns.iter().enumerate() {
            let intervals: Vec<IntervalRecord> = all
                .iter()
                .filter(|r| r.index > known.get(r.node))
                .cloned()
                .collect();
            let msg = Msg::BarrierRelease {
                epoch,
                known: global.clone(),
                intervals,
                races,
            };
            if k == 0 {
                self.handle(0, msg);
            } else {
                self.send(k as NodeId, msg);
            }
        }
    }

    fn on_release(
        &mut self,
        epoch: u32,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
        races: u64,
    ) {
        if epoch != self.epoch {
            self.fatal(format!(
                "barrier release for {epoch} while at barrier {}",
                self.epoch
            ));
            return;
        }
        let waits = self.apply_intervals(intervals, &known);
        self.stats.barriers += 1;
        // Everyone has now seen every interval up to this barrier: the logs can go.
        for l in self.log.iter_mut() {
            l.clear();
        }
        self.begin_interval(SyncCause::Barrier(epoch));
        if self.finishing {
            self.finished = true;
        }
        self.reply_after_home_diffs(waits, Reply::BarrierDone { epoch, races });
    }

    // ---------------------------------------------------------------- peer messages

    pub fn on_peer_message(&mut self, from: NodeId, msg: Msg) -> Vec<Output> {
        self.handle(from, msg);
        self.take_out()
    }

    fn handle(&mut self, from: NodeId, msg: Msg) {
        match msg {
            Msg::PageRequest { pages, required } => self.on_page_request(from, pages, required),
            Msg::PageReply { pages } => self.on_page_reply(from, pages),
            Msg::Diffs { interval, diffs } => self.on_diffs(from, interval, diffs),
            Msg::LockRequest {
                lock,
                requester,
                known,
            } => {
                if requester != from || known.len() != self.n {
                    self.fatal(format!("rank {from} sent a malformed lock request"));
                } else {
                    self.on_lock_request(lock, requester, known)
                }
            }
            Msg::LockForward {
                lock,
                requester,
                known,
            } => {
                if requester as usize >= self.n || known.len() != self.n {
                    self.fatal(format!("rank {from} sent a malformed lock forward"));
                } else {
                    self.on_lock_forward(lock, requester, known)
                }
            }
            Msg::LockGrant {
                lock,
                known,
                intervals,
            } => self.on_lock_grant(from, lock, known, intervals),
            Msg::BarrierArrive {
                epoch,
                known,
                intervals,
                check,
                finishing,
                bitmaps,
            } => {
                if known.len() != self.n {
                    self.fatal(format!("rank {from} sent a malformed barrier arrival"));
                } else {
                    self.on_arrive(
                        from,
                        epoch,
                        Arrival {
                            known,
                            intervals,
                            check,
                            finishing,
                            bitmaps,
                        },
                    )
                }
            }
            Msg::BarrierRelease {
                epoch,
                known,
                intervals,
                races,
            } => self.on_release(epoch, known, intervals, races),
            Msg::Abort { reason } => self.fatal(format!("job aborted by rank {from}: {reason}")),
            Msg::BitmapRequest { epoch, wanted } => self.reply(Reply::BitmapsWanted {
                epoch,
                keys: wanted,
            }),
            Msg::BitmapReply { bitmaps, .. } => self.reply(Reply::BitmapsArrived { from, bitmaps }),
        }
    }

    /// A peer's connection ended or broke. At the end of the run that is expected from a
    /// peer that has already done its part of the final barrier: TCP delivers a peer's
    /// messages before its close, so its arrival (or, with race detection, the master's
    /// release to it) is known here by then.
    pub fn on_peer_lost(&mut self, peer: NodeId, why: &str) -> Vec<Output> {
        let expected = self.finished
            || self.finishing
                && if !self.all_to_all() {
                    // Non-masters leave after the master's release; only the master's
                    // own departure before releasing is a failure.
                    self.me != 0 && peer != 0
                } else {
                    self.arrivals
                        .get(&self.epoch)
                        .and_then(|slots| slots.get(peer as usize))
                        .is_some_and(Option::is_some)
                };
        if !expected {
            self.out.push(Output::PeerLost(format!(
                "rank {}: lost rank {peer} ({why}); it probably exited or crashed",
                self.me
            )));
        }
        self.take_out()
    }
}

/// Runs of a validated diff applied to a byte buffer (for [`Memory`] implementations).
pub fn apply_diff_to(page: &mut [u8], runs: &[u8]) -> Result<(), DiffError> {
    diff::apply(page, runs)
}

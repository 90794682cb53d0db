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
//!
//! Layout: this module holds the types the runtime sees ([`Engine`], [`Command`],
//! [`Reply`], [`Output`], [`Memory`], [`Stats`]) and routes each event to the concern that
//! handles it: `pages` (page table, faults, fetches, twins, serving, diffs at homes),
//! `intervals` (interval boundaries, write notices, invalidation), `locks` (lock manager,
//! forwarding, grants) and `barriers` (arrivals, releases, log discard, race-mode rounds).
//! Each is an `impl Engine` block over the one state struct, so a protocol step that
//! spans concerns (an acquire closes an interval, which sends diffs) stays a plain call.

mod barriers;
mod intervals;
mod locks;
mod pages;

use crate::diff::{self, DiffError};
use barriers::Arrival;
use dsm_proto::{
    BitmapKey, EncodedBitmap, IntervalRecord, LockId, Msg, NodeId, PageNo, PageRuns, RaceNotices,
    SyncCause, VectorTime, PAGE_SIZE,
};
use locks::LockState;
use pages::{FetchInFlight, HomeWait, PageEntry, ParkedServe};
use std::collections::{BTreeMap, HashMap};

pub use barriers::ALL_TO_ALL_MAX_NODES;
pub use locks::lock_manager;

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
    /// Pages `first..first + count` are now in `state`. The engine never reads these
    /// back; they let the runtime keep a copy of the page table that the app thread can
    /// consult without taking the engine lock.
    PageStates {
        first: PageNo,
        count: u32,
        state: PageState,
    },
    /// Pages `first..first + count` may be accessed by another node as well (they are
    /// homed elsewhere, or a copy was just served). Only such pages can take part in a
    /// race, so race detection ships access bitmaps for these alone.
    PagesShared {
        first: PageNo,
        count: u32,
    },
    /// The job cannot continue because a peer went away (a consequence of another
    /// node's failure, reported with its own exit status).
    PeerLost(String),
}

/// Protocol counters. The engine counts protocol events; the wire-level fields (traffic
/// and `race_notice_bytes`) stay zero here and are filled in by the runtime, which sees the
/// messages it hands to the transport.
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

    /// Size of the page table: the segment's page count.
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    pub(super) fn take_out(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.out)
    }

    pub(super) fn send(&mut self, to: NodeId, msg: Msg) {
        self.out.push(Output::Send { to, msg });
    }

    pub(super) fn reply(&mut self, r: Reply) {
        self.out.push(Output::Reply(r));
    }

    pub(super) fn fatal(&mut self, why: String) {
        self.out.push(Output::Fatal(why));
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

    // ---------------------------------------------------------------- peer messages

    pub fn on_peer_message(&mut self, from: NodeId, msg: Msg) -> Vec<Output> {
        self.handle(from, msg);
        self.take_out()
    }

    pub(super) fn handle(&mut self, from: NodeId, msg: Msg) {
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

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
//!   faults at all. (The design asks for one fault per interval at the home; this is the
//!   cheaper equivalent: a notice is needed exactly when a copy may have gone stale.)
//! - Intervals end at acquires, releases and barrier arrivals. A lock grant carries every
//!   interval the grantor knew at its release and the acquirer has not seen; the acquirer
//!   invalidates the pages they name, except those the grant brought complete copies of
//!   (`push`; also at all-to-all barriers). At a barrier every node's new intervals reach every
//!   other node (all-to-all in small jobs, through rank 0 otherwise and always with race
//!   detection, where rank 0 analyzes the epoch first); afterwards everyone has seen
//!   everything, so interval logs are discarded there.
//!
//! Layout: this module holds the types the runtime sees ([`Engine`], [`Command`],
//! [`Reply`], [`Output`], [`Memory`], [`Stats`]) and routes each event to the concern that
//! handles it: `pages` (page table, faults, fetches, twins, serving, diffs at homes),
//! `intervals` (interval boundaries, write notices, invalidation), `locks` (lock manager,
//! forwarding, grants), `barriers` (arrivals, releases, log discard, race-mode rounds) and
//! `push` (fresh page copies sent with grants and barrier arrivals, and the rule that
//! decides whether the receiver may install one instead of invalidating);
//! [`fast`] holds the lock-free state through which the SIGSEGV handler serves write faults
//! on valid pages without the engine, which takes them in at the start of every event.
//! Each is an `impl Engine` block over the one state struct, so a protocol step that
//! spans concerns (an acquire closes an interval, which sends diffs) stays a plain call.

mod barriers;
pub mod fast;
/// What `fast.rs` is built on (`tests/fast_faults_model.rs` gives it loom's atomics and a
/// pool of a few words instead).
mod fast_deps {
    pub(super) use std::hint::spin_loop;
    pub(super) use std::sync::atomic::{
        AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(super) use std::thread::yield_now;

    /// log2 of the pages per chunk of the page words (64 KiB of words per 256 MiB of
    /// segment).
    pub(super) const PAGE_CHUNK_SHIFT: u32 = 16;
    /// 64-bit words per twin slot.
    pub(super) const SLOT_WORDS: usize = dsm_proto::PAGE_SIZE / 8;
    /// Slots per chunk of the pool (256 KiB per chunk).
    pub(super) const SLOT_CHUNK: usize = 64;
    /// Most pages the handler may install before the engine takes them in; beyond that it
    /// leaves the page to the comm thread.
    pub(super) const FETCHED_MAX: usize = 32;
}
#[cfg(test)]
mod fast_tests;
mod intervals;
mod locks;
mod pages;
mod push;
mod replay;
mod semaphores;
mod vec_memory;

use crate::diff::{self, DiffError};
use barriers::{Arrival, MasterRelease};
use dsm_proto::{
    BitmapColumns, BitmapKey, EncodedBitmap, IntervalRecord, LockId, Msg, NodeId, PageCopy, PageNo,
    PageRuns, RaceNotices, SemId, SyncCause, SyncPoint, VectorTime, PAGE_SIZE,
};
use locks::LockState;
use pages::{FetchInFlight, HomeWait, PageEntry, ParkedServe};
use semaphores::SemState;
use std::collections::{BTreeMap, TryReserveError, VecDeque};
use std::sync::Arc;

/// The engine's hash maps (pages, locks, semaphores): looked up at every fault, lock
/// operation and interval close, with keys that peers of the same job choose, so a fast
/// non-cryptographic hasher instead of SipHash. Randomly seeded, as std's, so that nothing
/// comes to depend on an iteration order.
type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use fast::{pack_applied, FastFaults, FETCHED_APPLIED_MAX};

pub use barriers::ALL_TO_ALL_MAX_NODES;
pub use locks::{lock_manager, KnownClock};
pub use semaphores::{sem_manager, SemDone};
pub use vec_memory::{HostApplied, VecMemory};

/// Protection of a page in the app view, as the engine asks [`Memory::protect`] to set it.
/// Protection is how the engine notices accesses: a page it must hear about on the next
/// read is `None`, on the next write `Read`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prot {
    /// Any access faults: the local copy is missing or stale.
    None,
    /// Reads go through; a write faults, so a twin or a write notice can be made first.
    Read,
    /// No access faults: the page is being written in the open interval (or, at the home,
    /// nobody holds a copy that a write could make stale).
    ReadWrite,
}

/// What the engine needs from memory. The real implementation wraps the mapped segment;
/// tests use plain buffers. "Runtime view" is a second mapping of the same pages that is
/// always writable, so the engine can fill and diff pages the app may not touch.
pub trait Memory {
    /// Sets the app view's protection of pages `first..first + count`.
    fn protect(&mut self, first: PageNo, count: u32, prot: Prot);
    /// Copies a page out of the runtime view into `out` (one page long): to make a twin or
    /// a copy to serve.
    fn read_page(&self, page: PageNo, out: &mut [u8]);
    /// Installs a whole page fetched from its home into the runtime view.
    fn write_page(&mut self, page: PageNo, data: &[u8]);
    /// Applies a diff, already checked with [`diff::validate`], to a page of the runtime
    /// view (at the page's home).
    fn apply_diff(&mut self, page: PageNo, diff: &[u8]);
    /// Encodes (see [`diff`]) how the page's current contents differ from `twin`.
    fn make_diff(&self, page: PageNo, twin: &[u8]) -> Vec<u8>;
    /// With one memory per host: the latest interval of `writer` whose diff of the host
    /// page `page` is in the host's copy, as the page's home last published it (0 when
    /// none is, or when this memory keeps no such table).
    fn host_applied(&self, _page: PageNo, _writer: NodeId) -> u32 {
        0
    }
    /// At a host page's home, once `writer`'s diff of interval `interval` is applied:
    /// publishes it to the other nodes of the host ([`Memory::host_applied`]).
    fn publish_host_applied(&mut self, _page: PageNo, _writer: NodeId, _interval: u32) {}
}

/// A page's state in this node's page table. The order matters: a state at least
/// `ReadOnly` allows reads, `ReadWrite` allows writes, which is how the runtime's mirror
/// answers "would this access fault" with one comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum PageState {
    /// Not part of any allocation: an access is a genuine segmentation fault.
    Unallocated,
    /// Allocated, but the local copy is missing or stale: an access fetches the page from
    /// its home. Never the state of a page at its home.
    Invalid,
    /// A valid copy that is write-protected: the next write makes a twin (or, at the home,
    /// a write notice) first.
    ReadOnly,
    /// Being written in the open interval (or, at the home, not served since its last
    /// write notice).
    ReadWrite,
}

/// Requests from the app thread. Each is answered by exactly one [`Reply`] (possibly
/// later, after messages) except where a variant says otherwise.
#[derive(Debug)]
pub enum Command {
    /// Registers the pages of a new collective allocation, then behaves as a barrier.
    Alloc {
        /// The allocation's pages as runs `(first, count, home)`.
        homes: Vec<(PageNo, u32, NodeId)>,
        /// Hash of the allocation's name and shape; folded into a running digest that the
        /// barrier compares across ranks, so differing alloc calls fail loudly.
        digest: u64,
        /// Race mode: the accesses of the interval this barrier closes.
        race: Option<RaceNotices>,
        /// Where the program is (for messages).
        at: SyncPoint,
    },
    /// Acquires a lock; replies [`Reply::Done`] once the lock is held and the writes
    /// ordered before it are visible.
    Acquire {
        /// The lock to take.
        lock: LockId,
        /// Race mode: the accesses of the interval the acquire closes.
        race: Option<RaceNotices>,
    },
    /// Releases a held lock, handing it to a queued successor if there is one.
    Release {
        /// The lock to give up; this node must hold it.
        lock: LockId,
        /// Race mode: the accesses of the interval the release closes.
        race: Option<RaceNotices>,
    },
    /// Race mode with one common memory: the app thread took `lock` in that memory
    /// (`sys::HostLock`), with no message. The interval before it closes and the next
    /// starts from what the lock's last releaser knew, as a grant would have carried it.
    /// Replies [`Reply::Done`].
    HostAcquire {
        /// The lock taken.
        lock: LockId,
        /// The accesses of the interval the acquire closes.
        race: Option<RaceNotices>,
        /// What the lock's last releaser knew, kept in the lock's memory (all zeros if
        /// nobody released it in race mode yet).
        released: VectorTime,
    },
    /// Race mode with one common memory: the app thread is about to release `lock` in
    /// that memory. Closes the interval; replies [`Reply::HostReleased`] with what the
    /// next holder must learn, which the app stores in the lock's memory.
    HostRelease {
        /// The lock being released.
        lock: LockId,
        /// The accesses of the interval the release closes.
        race: Option<RaceNotices>,
    },
    /// [`Command::HostRelease`] of a lock this node released last, that nobody took
    /// since, with no other synchronization since: takes back the interval that release
    /// closed (see [`Engine::host_release_again_now`]). Replies [`Reply::HostReleased`];
    /// a release the engine cannot take back is a fatal error (the app thread checked).
    HostReleaseAgain {
        /// The lock being released.
        lock: LockId,
        /// The accesses of the interval taken back and of the one since, together.
        race: Option<RaceNotices>,
    },
    /// Registers a semaphore (collectively: every node, before the synchronization that
    /// makes it usable); replies [`Reply::Done`].
    SemCreate {
        /// The semaphore.
        sem: SemId,
        /// Its initial count.
        initial: u32,
    },
    /// Signals (V) a semaphore: a release. Replies [`Reply::Sem`] at once.
    SemSignal {
        /// The semaphore.
        sem: SemId,
        /// Race mode: the accesses of the interval the signal closes.
        race: Option<RaceNotices>,
    },
    /// Waits (P) on a semaphore: an acquire. Replies [`Reply::Sem`] once a token is
    /// granted and the writes ordered before its signal are visible, or, for a try-wait
    /// without a token, at once with `acquired: false`.
    SemWait {
        /// The semaphore.
        sem: SemId,
        /// Refuse instead of waiting when no token is available.
        try_only: bool,
        /// Race mode: the accesses of the interval the wait closes.
        race: Option<RaceNotices>,
    },
    /// Waits until every node has arrived; replies [`Reply::BarrierDone`] (or, at the race
    /// master, first [`Reply::AnalyzeEpoch`]).
    Barrier {
        /// The final barrier of the run: peers leaving afterwards is expected.
        finishing: bool,
        /// Race mode: the accesses of the interval the arrival closes.
        race: Option<RaceNotices>,
        /// Race mode: bitmaps shipped with the arrival (see `Msg::BarrierArrive`).
        bitmaps: Vec<EncodedBitmap>,
        /// Where the program is (for messages).
        at: SyncPoint,
    },
    /// Makes pages valid (and writable if `write`) ahead of a bulk access, fetching all
    /// missing ones with one request per home instead of one fault per page.
    Prefetch {
        /// The pages the access will touch; pages no allocation covers are ignored.
        pages: PageRuns,
        /// Whether the access writes, so the pages end up writable.
        write: bool,
    },
    /// Race mode, barrier master: ask `node` for these bitmaps. No reply of its own; the
    /// bitmaps come back as [`Reply::BitmapsArrived`].
    RequestBitmaps {
        /// The node that recorded the bitmaps.
        node: NodeId,
        /// The barrier epoch being analyzed.
        epoch: u32,
        /// Which bitmaps the analysis needs.
        keys: Vec<BitmapKey>,
    },
    /// Race mode, between barriers: send the race master this node's intervals closed
    /// since its previous batch with `bitmaps`, all the bitmaps they recorded. No reply;
    /// the master's app thread takes the batch from [`Output::RaceBatch`].
    ShipRaceBatch {
        /// Every bitmap of the intervals closed since the previous batch.
        bitmaps: BitmapColumns,
        /// The last batch before a barrier: the open interval closes first with these
        /// notices (the recorder closed it and `bitmaps` hold its bitmaps), and the batch
        /// tells the master this node closes no more intervals with accesses in the epoch
        /// (see [`Msg::RaceBatch`]).
        last: Option<RaceNotices>,
    },
    /// Race mode: replies [`Reply::Done`] once the master has analysed at least `batches`
    /// of this node's race batches ([`Msg::RaceAbsorbed`]); at once if it has.
    AwaitRaceAbsorbed {
        /// How many of this node's batches must have been analysed.
        batches: u64,
    },
    /// Race master: the race batches of `node` analysed so far in the run; tells the node
    /// (itself without a message). No reply.
    RaceAbsorbed {
        /// The node whose batches these are.
        node: NodeId,
        /// How many of its batches have been analysed.
        batches: u64,
    },
    /// Race mode: answer the master's bitmap request. No reply.
    SendBitmaps {
        /// The epoch named in the request.
        epoch: u32,
        /// The bitmaps asked for.
        bitmaps: Vec<EncodedBitmap>,
    },
    /// Race mode, barrier master: analysis done, let everyone go. The master's own
    /// [`Reply::BarrierDone`] follows.
    ReleaseBarrier {
        /// Races reported for the epoch, passed on to every node.
        races: u64,
    },
    /// Snapshot of the protocol counters, answered with [`Reply::Stats`].
    Stats,
    /// The locks the app will take next, in order (`Dsm::prefetch_locks`): their tokens
    /// are asked for a few at a time ahead of the acquires. Replaces the previous hint; no
    /// reply; ignored while replaying (the record orders the token's moves).
    PrefetchLocks {
        /// The locks, in the order the app will take them.
        locks: Vec<LockId>,
    },
    /// Gives a named lock's name to replay messages about it. No reply.
    NameLock {
        /// The lock's id.
        lock: LockId,
        /// Its name.
        name: String,
    },
    /// The synchronization events recorded so far (`--record`), answered with
    /// [`Reply::Record`].
    TakeRecord,
    /// Recording or replaying with race detection: a digest of the epoch's accesses so
    /// far, folded into the next barrier's check. No reply.
    FoldAccessDigest {
        /// The recorder's `epoch_digest`.
        digest: u64,
    },
    /// Recording or replaying, at finish after the last barrier: the digest of the values
    /// in this node's home pages, recorded or checked against the record. No reply.
    NoteValues {
        /// The digest.
        digest: u64,
    },
}

/// Answers for the app thread.
#[derive(Debug)]
pub enum Reply {
    /// An acquire, release or prefetch has completed.
    Done,
    /// A barrier (or allocation) has completed: every node's writes before it are
    /// visible here.
    BarrierDone {
        /// Number of the barrier just passed, counting from 1.
        epoch: u32,
        /// Races the master reported for the epoch (0 without race detection).
        races: u64,
        /// What this node knows after the barrier (see [`KnownClock`]).
        known: VectorTime,
    },
    /// Race mode, barrier master: every interval of the epoch, for analysis, and the
    /// bitmaps the nodes shipped with their arrivals. The app answers with
    /// [`Command::ReleaseBarrier`].
    AnalyzeEpoch {
        /// The epoch that just ended.
        epoch: u32,
        /// Every interval any node closed in the epoch.
        intervals: Vec<IntervalRecord>,
        /// Access bitmaps shipped with the arrivals, by the node that recorded them.
        bitmaps: Vec<(NodeId, EncodedBitmap)>,
    },
    /// Race mode: the master wants these bitmaps; the app answers with
    /// [`Command::SendBitmaps`].
    BitmapsWanted {
        /// The epoch being analyzed.
        epoch: u32,
        /// The bitmaps wanted.
        keys: Vec<BitmapKey>,
    },
    /// Race mode, master: bitmaps from `from`, answering a [`Command::RequestBitmaps`].
    BitmapsArrived {
        /// The node that sent them.
        from: NodeId,
        /// The bitmaps.
        bitmaps: Vec<EncodedBitmap>,
    },
    /// The protocol counters, answering [`Command::Stats`].
    Stats(Box<Stats>),
    /// The recorded synchronization events, answering [`Command::TakeRecord`].
    Record(Vec<dsm_replay::Event>),
    /// A semaphore signal or wait completed (or a try-wait was refused).
    Sem(SemDone),
    /// Answers [`Command::HostRelease`]: what this node knew at the release.
    HostReleased(VectorTime),
}

/// A node's intervals closed between two race batches, with their bitmaps (see
/// [`Msg::RaceBatch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceBatch {
    /// The node that recorded them.
    pub from: NodeId,
    /// What it had seen when it sent them.
    pub known: VectorTime,
    /// Its intervals, in order.
    pub intervals: Vec<IntervalRecord>,
    /// Their bitmaps.
    pub bitmaps: BitmapColumns,
    /// The node's last batch before the barrier (see [`Msg::RaceBatch`]).
    pub last: bool,
}

/// What the engine asks the runtime to carry out, in order.
#[derive(Debug)]
pub enum Output {
    /// Hand a message to the transport.
    Send {
        /// The destination rank (never this node).
        to: NodeId,
        /// The message.
        msg: Msg,
    },
    /// Answer `to`'s fault through the page lane of the shared-memory link: leave `copy`
    /// in the lane and send [`Msg::LanePageReply`]; where the lane cannot take it, send
    /// the copy in a [`Msg::PageReply`] instead (the requester accepts either).
    LaneReply {
        /// The requester (never this node).
        to: NodeId,
        /// The one page it asked for.
        copy: PageCopy,
    },
    /// The faulting access may now proceed: let the app thread retry it.
    FaultResolved,
    /// The faulting access is outside every allocation: let it crash.
    FaultCrash,
    /// Deliver an answer to the app thread.
    Reply(Reply),
    /// Pages `first..first + count` are now in `state`. The engine never reads these
    /// back; they let the runtime keep a copy of the page table that the app thread can
    /// consult without taking the engine lock.
    PageStates {
        /// First page of the run.
        first: PageNo,
        /// Pages in the run (at least 1).
        count: u32,
        /// Their new state.
        state: PageState,
    },
    /// Pages `first..first + count` may be accessed by another node as well (they are
    /// homed elsewhere, or a copy was just served). Only such pages can take part in a
    /// race, so race detection ships access bitmaps for these alone.
    PagesShared {
        /// First page of the run.
        first: PageNo,
        /// Pages in the run.
        count: u32,
    },
    /// Race master: a node's batch of intervals and bitmaps, for the incremental analysis
    /// on the app thread.
    RaceBatch(RaceBatch),
    /// The job cannot continue (malformed traffic, inconsistent collective call).
    Fatal(String),
    /// A replay (`--replay`) deviated from its record: the job stops with
    /// `exit_codes::REPLAY_DIVERGED`.
    Diverged(String),
    /// The job cannot continue because a peer went away (a consequence of another
    /// node's failure, reported with its own exit status).
    PeerLost(String),
}

/// Twin slots the handler's pool starts with; it doubles (up to its maximum) whenever an
/// interval used more than half of them or the handler ran short.
const INITIAL_FAST_SLOTS: usize = 64;

/// The copy of a page taken before its first write in an interval, diffed at its end.
#[derive(Debug)]
enum Twin {
    /// A buffer the engine made (write fault through [`Engine::on_fault`], prefetch).
    Owned(Box<[u8]>),
    /// A slot of the handler's pool (write fault served in the handler).
    Slot(u32),
}

/// Protocol counters. The engine counts protocol events; the wire-level fields (traffic
/// and `race_notice_bytes`) stay zero here and are filled in by the runtime, which sees the
/// messages it hands to the transport. Serialized as the `protocol` object of the stats
/// file, so the field names are a format.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Reads that found the page invalid.
    pub read_faults: u64,
    /// Writes that found the page invalid or read-only.
    pub write_faults: u64,
    /// Page copies received from homes.
    pub pages_fetched: u64,
    /// Page requests sent (a prefetch sends one per home).
    pub fetch_requests: u64,
    /// Page copies served to other nodes, as a home.
    pub pages_served: u64,
    /// Requests of host mates answered, as a home: the diffs they waited for are in the
    /// host's one copy of the pages (see `Engine::set_host_mates`).
    pub host_pages_confirmed: u64,
    /// Another host's write notices of this host's pages whose diffs the home had already
    /// published as applied (no invalidation), or had when the page was next touched (no
    /// request).
    pub host_diffs_found_applied: u64,
    /// Twins taken at the first write to a non-home page in an interval.
    pub twins_made: u64,
    /// Write faults the SIGSEGV handler served itself (twin and write access without the
    /// comm thread); included in `write_faults` and, for non-home pages, `twins_made`.
    pub handler_write_faults: u64,
    /// Pages the faulting thread took from a co-located home's page lane and installed
    /// itself (counted in `pages_fetched` too).
    pub lane_pages: u64,
    /// Pages the faulting thread took out of a remote home's socket itself (the reply to
    /// the request it wrote there) and installed (counted in `pages_fetched` too).
    pub socket_pages: u64,
    /// Read faults whose fetch the SIGSEGV handler asked the co-located home for itself,
    /// through the request slot of the link's lane, without the comm thread (counted in
    /// `read_faults` and `fetch_requests` too).
    pub handler_fetches: u64,
    /// Of those, fetches whose wait the handler handed to the comm thread (no copy within
    /// its polling budget).
    pub handler_fetches_handed_over: u64,
    /// Non-empty page diffs sent to homes.
    pub diffs_sent: u64,
    /// Encoded size of those diffs.
    pub diff_bytes_sent: u64,
    /// Diffs applied to pages homed here.
    pub diffs_applied: u64,
    /// Valid copies dropped because a write notice named them.
    pub invalidations: u64,
    /// Page copies pushed, as a home, with lock grants and barrier arrivals to nodes
    /// believed to hold the page (`DSM_PUSH`).
    pub pages_pushed: u64,
    /// Pushed copies installed instead of invalidating (or fetching) the page: each is a
    /// fault after the acquire or barrier that did not happen.
    pub pushes_applied: u64,
    /// Of `pushes_applied`, pages brought up to date by a granter's diffs (pages homed at
    /// a third node) rather than by a whole copy from the home.
    pub pushes_applied_diffs: u64,
    /// Pushed copies dropped (they missed a diff this node must see, or no new write
    /// notice named the page); the page was invalidated as without pushing.
    pub pushes_rejected: u64,
    /// Intervals ended (at every acquire, release and barrier arrival).
    pub intervals_closed: u64,
    /// Pages left writable at the end of an interval (their diff sent, their twin brought
    /// up to date), each a write fault the next interval does not take if it writes the
    /// page again.
    pub pages_kept_writable: u64,
    /// Lock acquires started.
    pub lock_acquires: u64,
    /// Acquires that needed no message because the lock's token was already here (or
    /// had come ahead of the acquire, see `lock_tokens_asked_ahead`).
    pub lock_acquires_local: u64,
    /// Of those, acquires that left the open interval open, learning nothing
    /// (`Engine::acquire_here_quietly`).
    pub lock_acquires_left_open: u64,
    /// Lock tokens asked for ahead of their acquires (`Dsm::prefetch_locks`).
    pub lock_tokens_asked_ahead: u64,
    /// Of those, tokens that came and went on to a node that asked first, before this
    /// node took the lock (a hint too far ahead, or locks the other nodes still take).
    pub lock_tokens_passed_on: u64,
    /// Barriers (and allocations) completed.
    pub barriers: u64,
    /// Semaphore signals made.
    pub sem_signals: u64,
    /// Semaphore waits and try-waits started.
    pub sem_waits: u64,
    /// One-way message delays this node waited for in its synchronization, summed over
    /// its acquires of locks not held here (2 when the manager grants or passes the request
    /// to the holder, 3 when the manager is a third node), its semaphore waits (0 to 3 by
    /// where the manager and the consumed signal are) and its barriers (1 all-to-all, 2
    /// through the master). With `fetch_requests` (2 each) this is what a round-trip model
    /// charges a network's one-way delay for (`scripts/src/delay.rs`).
    pub lock_acquire_delays: u64,
    /// See `lock_acquire_delays`.
    pub sem_wait_delays: u64,
    /// See `lock_acquire_delays`.
    pub barrier_delays: u64,
    /// Serialized size of the read/write notices from the access recorder in sent
    /// messages (race mode); filled in by the runtime.
    pub race_notice_bytes: u64,
    /// Messages handed to the transport; filled in by the runtime.
    pub messages_sent: u64,
    /// Their framed size on the wire; filled in by the runtime.
    pub bytes_sent: u64,
    /// Messages received from peers; filled in by the runtime.
    pub messages_received: u64,
    /// Their framed size on the wire; filled in by the runtime.
    pub bytes_received: u64,
}

/// One node's protocol state. Feed it with [`Engine::on_fault`], [`Engine::on_command`],
/// [`Engine::on_peer_message`] and [`Engine::on_peer_lost`]; each returns the [`Output`]s
/// to carry out, in order. It never blocks and does no I/O of its own.
pub struct Engine<M: Memory> {
    me: NodeId,
    n: usize,
    mem: M,
    /// The page table, covering the allocated pages only: allocations are contiguous from
    /// page 0 up, so it grows to the allocation high-water mark at each allocation and a
    /// page beyond it is unallocated. Its size follows what the program allocates, never
    /// the segment's size.
    pages: Vec<PageEntry>,
    /// Pages in the segment that allocations may use (see [`Engine::new`]).
    page_limit: usize,
    /// Current knowledge; `vt[me]` is the index of the open interval.
    vt: VectorTime,
    /// `vt` when the open interval began: what its accesses are ordered after.
    cur_start: VectorTime,
    cur_cause: SyncCause,
    /// What began the interval closed last (an interval taken back resumes it: see
    /// [`Engine::host_release_again_now`]).
    closed_cause: SyncCause,
    /// Race mode: this node's last interval sent in a race batch (see
    /// [`Command::ShipRaceBatch`]).
    race_shipped: u32,
    /// Race mode: how many of this node's race batches the master has analysed, and the
    /// count the app thread waits for (see [`Command::AwaitRaceAbsorbed`]).
    race_absorbed: u64,
    race_absorbed_wanted: Option<u64>,
    /// Non-home pages with a twin in this interval.
    dirty: Vec<PageNo>,
    twins: Map<PageNo, Twin>,
    /// Outside race mode: pages of `dirty` left writable at the last close, with how many
    /// closes in a row found them unchanged (see `close_interval`).
    kept: Map<PageNo, u8>,
    /// Whether closes keep written pages writable (see `close_interval`). Race mode keeps
    /// them too: its access notices come from the views' recorder, not from faults.
    keep_writable: bool,
    /// Every node maps the same memory (see [`Engine::set_common_memory`]): this node
    /// treats every page as one it homes and nobody else copies, so none is ever
    /// protected, fetched, diffed or pushed.
    common_memory: bool,
    /// The nodes (bit per rank, this one's included) that map this node's host memory
    /// ([`Engine::set_host_mates`]): pages homed at any of them are one copy on this
    /// host, never fetched or diffed between them.
    host_mates: u64,
    /// Write faults served in the SIGSEGV handler (see [`fast`]); `None`: every fault goes
    /// through [`Engine::on_fault`].
    fast: Option<Arc<FastFaults>>,
    /// Peers (bit per rank) whose pages a read fault fetches through the page lane of the
    /// shared-memory link: its thread takes the page itself ([`Engine::set_lane_peers`]).
    lane_peers: u64,
    /// Peers (bit per rank) to which the SIGSEGV handler writes a page request itself on
    /// their TCP link ([`Engine::set_socket_peers`]).
    socket_peers: u64,
    /// Per home, pages the handler installed from its lane whose
    /// [`Msg::LanePageReply`] has not arrived yet (it may come after later traffic).
    lane_pages_unmarked: BTreeMap<NodeId, u32>,
    /// Pages that became `ReadOnly` during the current event, armed for the handler when
    /// the event ends (after every protection change it makes).
    to_arm: Vec<PageNo>,
    /// Twins in the handler's slots in the open interval.
    slot_twins: usize,
    /// Page buffers of closed intervals' twins, reused so a write fault rarely allocates.
    spare_twins: Vec<Box<[u8]>>,
    /// Home pages written (write-faulted) in this interval.
    home_writes: Vec<PageNo>,
    /// Intervals known since the last barrier, per creating node, in index order, less
    /// those every other node has seen (`trim_log`).
    log: Vec<Vec<IntervalRecord>>,
    /// Per node, the most it is known to have seen: the merge of the `known` vectors it
    /// sent in lock requests, semaphore waits and grants, race batches and barrier
    /// arrivals (see `note_seen_in`). Knowledge only grows, so a record within every
    /// other node's entry is never sent again.
    seen_by: Vec<VectorTime>,
    /// Records logged since the log was last trimmed, and how many between trims.
    logged_since_trim: usize,
    trim_period: usize,
    /// Most pages pushed with one lock grant or barrier arrival; 0: pushing off.
    push_limit: u32,
    /// At the home: per page, the nodes (bit per rank, ranks below 64) it served or pushed
    /// the page to, which are taken to hold a copy.
    copies: Map<PageNo, u64>,
    /// Per non-home page: this node's latest interval whose diff of it went to the home.
    own_diffs: Map<PageNo, u32>,
    /// Diffs this node made of pages homed at others since the last barrier, per page
    /// (interval, runs), kept to push with lock grants (up to `kept_diff_bytes`).
    kept_diffs: Map<PageNo, Vec<(u32, Vec<u8>)>>,
    kept_diff_bytes: usize,
    /// Per node: the latest of this node's intervals it passed to that node with a lock
    /// grant (the node has seen every interval of ours up to it), so a barrier does not
    /// push again what a grant already brought.
    told: Vec<u32>,
    /// All-to-all barrier: pages pushed with the arrivals of the current barrier.
    barrier_pushes: Vec<dsm_proto::PushedPage>,
    /// Barriers through the master: pages pushed for barriers not yet released here, by
    /// epoch (a push may come before this node itself arrives).
    master_pushes: BTreeMap<u32, Vec<dsm_proto::PushedPage>>,
    /// The latest barrier released here.
    released_epoch: u32,
    /// Diffs a fetch of this (non-home) page must wait for, per writer.
    required: Map<PageNo, Vec<(NodeId, u32)>>,
    /// At the home: per page, the latest interval of each writer whose diff is applied.
    applied: Map<PageNo, Vec<(NodeId, u32)>>,
    /// For a copy of a page homed elsewhere: the same, for the diffs the copy holds (what
    /// the home said when it sent the copy, and pushed diffs applied since). A copy made
    /// at allocation holds none.
    copy_holds: Map<PageNo, Vec<(NodeId, u32)>>,
    /// Copies installed (fetched or pushed) so far, and when each page's current copy
    /// was, by that count (see `drop_superseded_copies`).
    copies_installed: u64,
    copy_installed_at: Map<PageNo, u64>,
    /// Page requests waiting at the home for diffs they require.
    parked: Vec<ParkedServe>,
    /// Diffs waiting at the home for the diffs they must follow (`Msg::Diffs::after`):
    /// (writer, interval, diffs, after).
    parked_diffs: Vec<(
        NodeId,
        u32,
        Vec<dsm_proto::PageDiff>,
        Vec<dsm_proto::Requirement>,
    )>,
    /// A reply held back until diffs to home pages arrive (at most one: the app thread
    /// waits for it).
    home_wait: Option<HomeWait>,
    /// The fetch the app thread is waiting for (at most one, for the same reason).
    fetch: Option<FetchInFlight>,
    locks: Map<LockId, LockState>,
    /// The app's hint of its next locks not yet asked for ([`Command::PrefetchLocks`]).
    locks_ahead: VecDeque<LockId>,
    /// Locks of that hint whose tokens were asked for and not yet taken or passed on.
    locks_asked_ahead: Vec<LockId>,
    sems: Map<SemId, SemState>,
    /// Barriers entered so far; the current barrier's number while in one.
    epoch: u32,
    /// Where the program was at its latest barrier-like call: what messages call it.
    at: SyncPoint,
    /// Running hash of the allocations made, compared at every barrier.
    alloc_digest: u64,
    /// Barrier arrivals by epoch (a fast node's arrival at the next barrier can come in
    /// before this node has finished the current one).
    arrivals: BTreeMap<u32, Vec<Option<Arrival>>>,
    /// Race mode, master: the release prepared while the app analyzes the epoch.
    master_release: Option<MasterRelease>,
    race_mode: bool,
    /// In the final barrier: peers may leave once they have arrived.
    finishing: bool,
    /// Past the final barrier: peers leaving is expected.
    finished: bool,
    stats: Stats,
    /// Recording or replaying the synchronization order.
    order: replay::OrderLog,
    /// Outputs of the event being handled, returned when it is done.
    out: Vec<Output>,
}

impl<M: Memory> Engine<M> {
    /// The engine of node `me` in an `n`-node job over a segment of `pages` pages, none of
    /// them allocated yet. `race_mode` must be the same on every node: it changes the
    /// barrier protocol (arrivals always go through rank 0, which analyzes the epoch).
    ///
    /// Allocations may use at most [`PageNo::MAX`] pages, whatever `pages` says, so that
    /// every page-number sum fits a [`PageNo`]. The page table starts empty: its memory
    /// follows the pages allocated, not `pages`.
    pub fn new(me: NodeId, n: usize, pages: usize, mem: M, race_mode: bool) -> Self {
        let mut vt = VectorTime::zero(n);
        vt.set(me, 1);
        Engine {
            me,
            n,
            mem,
            pages: Vec::new(),
            page_limit: pages.min(PageNo::MAX as usize),
            cur_start: vt.clone(),
            vt,
            cur_cause: SyncCause::Start,
            closed_cause: SyncCause::Start,
            race_shipped: 0,
            race_absorbed: 0,
            race_absorbed_wanted: None,
            dirty: Vec::new(),
            kept: Map::default(),
            keep_writable: true,
            common_memory: false,
            host_mates: pages::node_bit(me),
            twins: Map::default(),
            fast: None,
            lane_peers: 0,
            socket_peers: 0,
            lane_pages_unmarked: BTreeMap::new(),
            to_arm: Vec::new(),
            slot_twins: 0,
            spare_twins: (0..64).map(|_| vec![0u8; PAGE_SIZE].into()).collect(),
            home_writes: Vec::new(),
            log: vec![Vec::new(); n],
            seen_by: vec![VectorTime::zero(n); n],
            logged_since_trim: 0,
            trim_period: intervals::TRIM_LOG_EVERY,
            push_limit: dsm_proto::config::DEFAULT_PUSH_PAGES,
            copies: Map::default(),
            own_diffs: Map::default(),
            kept_diffs: Map::default(),
            kept_diff_bytes: 0,
            told: vec![0; n],
            barrier_pushes: Vec::new(),
            master_pushes: BTreeMap::new(),
            released_epoch: 0,
            required: Map::default(),
            applied: Map::default(),
            copy_holds: Map::default(),
            copies_installed: 0,
            copy_installed_at: Map::default(),
            parked: Vec::new(),
            parked_diffs: Vec::new(),
            home_wait: None,
            fetch: None,
            locks: Map::default(),
            locks_ahead: VecDeque::new(),
            locks_asked_ahead: Vec::new(),
            sems: Map::default(),
            epoch: 0,
            at: SyncPoint::Start,
            alloc_digest: 0,
            arrivals: BTreeMap::new(),
            master_release: None,
            race_mode,
            finishing: false,
            finished: false,
            stats: Stats::default(),
            order: replay::OrderLog::default(),
            out: Vec::new(),
        }
    }

    /// Lets the SIGSEGV handler serve write faults on valid pages through `fast` (see
    /// [`fast`]): the engine arms its `ReadOnly` pages there and takes in the writes the
    /// handler let through at the start of every event. Call before the first allocation.
    pub fn with_fast_faults(mut self, fast: Arc<FastFaults>) -> Self {
        fast.reserve_pages(self.pages.len());
        fast.grow_slots(INITIAL_FAST_SLOTS);
        self.fast = Some(fast);
        self
    }

    /// The state shared with the handler, if [`Engine::with_fast_faults`] gave one.
    pub fn fast_faults(&self) -> Option<&Arc<FastFaults>> {
        self.fast.as_ref()
    }

    /// The memory the engine works on (tests inspect page contents through it).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Mutable access to the memory, for a harness that plays the app's writes.
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.mem
    }

    /// The page's current state in this node's page table ([`PageState::Unallocated`] for
    /// any page no allocation covers, including pages beyond the segment).
    pub fn page_state(&self, page: PageNo) -> PageState {
        self.pages
            .get(page as usize)
            .map_or(PageState::Unallocated, |e| e.state)
    }

    /// Pages allocations may use: the segment's page count given to [`Engine::new`], at
    /// most [`PageNo::MAX`].
    pub fn page_limit(&self) -> usize {
        self.page_limit
    }

    /// The allocation high-water mark: pages `0..allocated_pages()` are covered by the page
    /// table (and allocated once the allocation that grew it has been registered), every
    /// page above is unallocated.
    pub fn allocated_pages(&self) -> usize {
        self.pages.len()
    }

    /// Makes room in the page table for pages `..end`, so that registering an allocation
    /// that ends there cannot fail for want of memory. The runtime calls it before a
    /// collective allocation, so that a node short of memory returns an error instead of
    /// aborting; pages stay unallocated until [`Command::Alloc`] registers them.
    pub fn reserve_pages(&mut self, end: usize) -> Result<(), TryReserveError> {
        let more = end.saturating_sub(self.pages.len());
        // Amortized growth for many small allocations; exactly what is needed when the
        // doubled table would not fit but the table itself does.
        self.pages
            .try_reserve(more)
            .or_else(|_| self.pages.try_reserve_exact(more))
    }

    /// One-way message delays between a request this node sent to `manager` and the grant
    /// `granter` sent back: to the manager, on to the granter, back here, each leg only
    /// when it crosses between nodes ([`Stats::lock_acquire_delays`]).
    fn sync_delays(&self, manager: NodeId, granter: NodeId) -> u64 {
        u64::from(manager != self.me)
            + u64::from(granter != manager)
            + u64::from(granter != self.me)
    }

    /// The counters so far (without the runtime's wire-level fields; see [`Stats`]).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Interval records this node keeps to send to others (every node's, since the last
    /// barrier, less those every other node has seen).
    pub fn logged_records(&self) -> usize {
        self.log.iter().map(Vec::len).sum()
    }

    /// Whether the final barrier ([`Command::Barrier`] with `finishing`) has completed.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// What the engine asked for since the last event, for a caller of a method that
    /// runs at once (such as [`Engine::host_acquire_now`]) to carry out.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        self.take_out()
    }

    pub(super) fn take_out(&mut self) -> Vec<Output> {
        self.arm_pending();
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

    /// Takes in what the SIGSEGV handler did since the last event (pages it fetched
    /// itself, writes it let through), for a comm thread the handler woke for that alone.
    pub fn on_handler_work(&mut self) -> Vec<Output> {
        self.take_in_handler_work();
        self.take_out()
    }

    // ---------------------------------------------------------------- commands

    /// Handles a request of the app thread; its [`Reply`] is among the outputs if it could
    /// be answered at once, otherwise it follows from a later event.
    pub fn on_command(&mut self, cmd: Command) -> Vec<Output> {
        self.take_in_handler_work();
        match cmd {
            Command::Alloc {
                homes,
                digest,
                race,
                at,
            } => self.alloc(homes, digest, race, at),
            Command::Acquire { lock, race } => self.acquire(lock, race),
            Command::Release { lock, race } => self.release(lock, race),
            Command::HostAcquire {
                lock,
                race,
                released,
            } => {
                if self.host_acquire(lock, race, &released) {
                    self.reply(Reply::Done);
                }
            }
            Command::HostRelease { lock, race } => {
                let known = self.host_release(lock, race);
                self.reply(Reply::HostReleased(known));
            }
            Command::HostReleaseAgain { lock, race } => {
                if self.host_release_again(lock, race) {
                    let known = self.known();
                    self.reply(Reply::HostReleased(known));
                } else {
                    self.fatal(format!(
                        "lock {lock}: a release could not take back the interval the last one \
                         closed"
                    ));
                }
            }
            Command::Barrier {
                finishing,
                race,
                bitmaps,
                at,
            } => self.barrier(finishing, race, bitmaps, at),
            Command::Prefetch { pages, write } => self.prefetch(pages, write),
            Command::SemCreate { sem, initial } => self.sem_create(sem, initial),
            Command::SemSignal { sem, race } => self.sem_signal(sem, race),
            Command::SemWait {
                sem,
                try_only,
                race,
            } => self.sem_wait(sem, try_only, race),
            Command::RequestBitmaps { node, epoch, keys } => {
                self.request_bitmaps(node, epoch, keys)
            }
            Command::SendBitmaps { epoch, bitmaps } => self.send_bitmaps(epoch, bitmaps),
            Command::ShipRaceBatch { bitmaps, last } => self.ship_race_batch(bitmaps, last),
            Command::ReleaseBarrier { races } => self.master_release(races),
            Command::AwaitRaceAbsorbed { batches } => self.await_race_absorbed(batches),
            Command::RaceAbsorbed { node, batches } => {
                if node == self.me {
                    self.on_race_absorbed(batches);
                } else {
                    self.send(node, Msg::RaceAbsorbed { batches });
                }
            }
            Command::Stats => {
                let s = Box::new(self.stats.clone());
                self.reply(Reply::Stats(s));
            }
            Command::NameLock { lock, name } => self.name_lock(lock, &name),
            Command::PrefetchLocks { locks } => self.prefetch_locks(locks),
            Command::FoldAccessDigest { digest } => self.fold_access_digest(digest),
            Command::NoteValues { digest } => self.note_values(digest),
            Command::TakeRecord => {
                let events = self.take_recording();
                self.reply(Reply::Record(events));
            }
        }
        self.take_out()
    }

    // ---------------------------------------------------------------- peer messages

    /// Handles a message from rank `from`. Malformed or unexpected traffic yields
    /// [`Output::Fatal`] rather than a panic: a peer's bug must not look like this node's.
    pub fn on_peer_message(&mut self, from: NodeId, msg: Msg) -> Vec<Output> {
        self.take_in_handler_work();
        self.handle(from, msg);
        self.take_out()
    }

    /// Routes a message to its concern; also used for messages this node addresses to
    /// itself, which never go through the runtime.
    pub(super) fn handle(&mut self, from: NodeId, msg: Msg) {
        self.note_seen_in(from, &msg);
        match msg {
            Msg::PageRequest {
                pages,
                required,
                lane,
            } => self.on_page_request(from, pages, required, lane),
            Msg::LanePageReply { page } => self.on_lane_page_reply(from, page),
            Msg::PageReply { pages } => self.on_page_reply(from, pages),
            Msg::Diffs {
                interval,
                diffs,
                after,
            } => self.on_diffs(from, interval, diffs, after),
            Msg::LockRequest {
                locks,
                requester,
                known,
            } => {
                if requester != from || known.len() != self.n {
                    self.fatal(format!("rank {from} sent a malformed lock request"));
                } else {
                    let start = self.out.len();
                    for lock in locks {
                        self.on_lock_request(lock, requester, known.clone());
                    }
                    self.merge_lock_sends(start);
                }
            }
            Msg::LockForward {
                locks,
                requester,
                known,
            } => {
                if requester as usize >= self.n || known.len() != self.n {
                    self.fatal(format!("rank {from} sent a malformed lock forward"));
                } else {
                    let start = self.out.len();
                    for lock in locks {
                        self.on_lock_forward(lock, requester, known.clone());
                    }
                    self.merge_lock_sends(start);
                }
            }
            Msg::LockGrant { mut grants } => {
                push::share_grant_pushes(&mut grants);
                let start = self.out.len();
                for g in grants {
                    let pushed = push::Pushed {
                        pages: g.pages,
                        diffs: g.diffs,
                        diffs_from: from,
                        with_grant: true,
                    };
                    self.on_lock_grant(from, g.lock, g.known, g.intervals, g.grant, pushed);
                }
                self.merge_lock_sends(start);
            }
            Msg::BarrierArrive {
                epoch,
                at,
                known,
                intervals,
                check,
                finishing,
                bitmaps,
                pages,
            } => {
                if known.len() != self.n || !self.pushes_well_formed(from, &pages) {
                    self.fatal(format!("rank {from} sent a malformed barrier arrival"));
                } else {
                    self.on_arrive(
                        from,
                        epoch,
                        Arrival {
                            at,
                            known,
                            intervals,
                            check,
                            finishing,
                            bitmaps,
                            pages,
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
            Msg::BarrierPush { epoch, pages } => {
                if self.pushes_well_formed(from, &pages) {
                    self.on_barrier_push(epoch, pages);
                }
            }
            Msg::Abort { reason } => self.fatal(format!("job aborted by rank {from}: {reason}")),
            Msg::BitmapRequest { epoch, wanted } => self.on_bitmap_request(epoch, wanted),
            Msg::BitmapReply { bitmaps, .. } => self.on_bitmap_reply(from, bitmaps),
            Msg::RaceBatch {
                known,
                intervals,
                bitmaps,
                last,
            } => self.on_race_batch(
                from,
                RaceBatch {
                    from,
                    known,
                    intervals,
                    bitmaps,
                    last,
                },
            ),
            Msg::RaceAbsorbed { batches } if from == 0 => self.on_race_absorbed(batches),
            Msg::RaceAbsorbed { .. } => self.fatal(format!(
                "rank {from} sent a race acknowledgement; only rank 0 analyses"
            )),
            Msg::SemSignal { sem, seq } => self.on_sem_signal(from, sem, seq),
            Msg::SemWait {
                sem,
                known,
                try_only,
            } => {
                if known.len() != self.n {
                    self.fatal(format!("rank {from} sent a malformed semaphore wait"));
                } else {
                    self.on_sem_wait(from, sem, known, try_only)
                }
            }
            Msg::SemForward {
                sem,
                seq,
                waiter,
                known,
            } => {
                if waiter as usize >= self.n || known.len() != self.n {
                    self.fatal(format!("rank {from} sent a malformed semaphore forward"));
                } else {
                    self.on_sem_forward(from, sem, seq, waiter, known)
                }
            }
            Msg::SemGrant {
                sem,
                signal,
                known,
                intervals,
            } => self.on_sem_grant(from, sem, signal, known, intervals),
            Msg::SemDenied { sem } => self.on_sem_denied(from, sem),
            // Liveness belongs to the transport, which consumes heartbeats.
            Msg::Heartbeat => {}
        }
    }

    /// A peer's connection ended or broke. At the end of the run that is expected from a
    /// peer that has already done its part of the final barrier: TCP delivers a peer's
    /// messages before its close, so its arrival (or, with race detection, the master's
    /// release to it) is known here by then.
    pub fn on_peer_lost(&mut self, peer: NodeId, why: &str) -> Vec<Output> {
        self.take_in_handler_work();
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
            let loss = dsm_proto::liveness::PeerLoss {
                reporter: self.me as usize,
                lost: peer as usize,
                why: why.to_owned(),
            };
            self.out.push(Output::PeerLost(loss.to_string()));
        }
        self.take_out()
    }
}

/// Runs of a validated diff applied to a byte buffer (for [`Memory`] implementations).
pub fn apply_diff_to(page: &mut [u8], runs: &[u8]) -> Result<(), DiffError> {
    diff::apply(page, runs)
}

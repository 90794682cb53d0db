//! Where the protocol engine runs. The engine sits behind a mutex shared by two threads:
//! the app thread executes its own commands (acquire, release, barrier, ...) directly, so
//! a synchronization that needs no message (a lock whose token is here, a single-node
//! barrier) costs no thread hand-off; the comm thread, a single-threaded tokio runtime,
//! feeds it the faults handed over by the SIGSEGV handler and the messages from peers.
//! Whatever the engine answers is carried out while the mutex is still held (messages
//! queued for the link writers, the faulting thread released, replies queued for the app
//! thread, page-state changes copied into the [`StateMirror`] the app thread reads), so
//! messages leave in the order the engine produced them. A fatal protocol condition (a
//! lost peer, malformed traffic) ends the process with a message naming the cause: the app
//! thread may be parked in the fault handler, and the job cannot continue.
//!
//! A reply from a co-located peer need not wait for the comm thread: while the app thread
//! polls for its reply ([`crate::spin`]) it takes the frames of the shared-memory rings and
//! runs them through the engine itself, under the same lock and in ring order.
//!
//! Liveness is the transport's, on this thread: heartbeats go out on idle links whatever
//! the app thread does (it holds the engine lock only for the span of one command, never
//! while the program computes), and a peer silent for the job's liveness deadline ends
//! this process with the peer-lost status and a [`Silence`] line naming the peer.

use crate::engine::fast::{pack_applied, unpack_applied};
use crate::engine::Prot;
use crate::engine::{Command, Engine, Memory, Output, PageState, RaceBatch, Reply};
use crate::fault::{self, FaultMailbox};
use crate::reply_queue::ReplyQueue;
use crate::sys::{self, Segment};
use dsm_net::ring::LaneState;
use dsm_net::{Mesh, Outbox, PeerEvent, Transport, WireError};
use dsm_proto::exit_codes::PEER_LOST as PEER_LOST_EXIT;
use dsm_proto::liveness::Silence;
use dsm_proto::{Msg, NodeId, PageCopy, PageNo, PAGE_SIZE};
use std::collections::TryReserveError;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Longest the comm thread watches the fault slot after serving a fault. Not more: with
/// the faulting thread and this one both yielding on one core for long, the scheduler
/// (EEVDF) ends up holding the one with work back (see docs/measurements.md).
const FOLLOW_FAULTS_MAX: Duration = Duration::from_micros(50);

/// Longest the comm thread goes on taking ring frames after the last one, when frames
/// come in a run (see [`Shared::follow_messages`]); the same bound as for faults, for the
/// same reason.
const FOLLOW_MESSAGES_MAX: Duration = FOLLOW_FAULTS_MAX;

/// Exit status of a node the runtime stops because the job cannot go on.
pub(crate) const FATAL_EXIT: i32 = 70;

/// [`Memory`] over the mapped segment: what the engine's page operations do in a real
/// process.
pub(crate) struct SegmentMemory {
    seg: &'static Segment,
}

impl SegmentMemory {
    /// Lets the engine work on `seg`: protection changes apply to its app view, page
    /// copies and diffs go through its always-writable runtime view.
    pub(crate) fn new(seg: &'static Segment) -> Self {
        SegmentMemory { seg }
    }
}

impl Memory for SegmentMemory {
    fn protect(&mut self, first: PageNo, count: u32, prot: Prot) {
        let access = match prot {
            Prot::None => sys::PageAccess::None,
            Prot::Read => sys::PageAccess::Read,
            Prot::ReadWrite => sys::PageAccess::ReadWrite,
        };
        if let Err(e) = self.seg.protect(first as usize, count as usize, access) {
            // ENOMEM here almost always means the process hit vm.max_map_count.
            fatal(&format!(
                "cannot change page protection ({e}); if this says 'Cannot allocate memory', \
                 raise vm.max_map_count (sysctl) or use fewer, larger allocations"
            ));
        }
    }

    fn read_page(&self, page: PageNo, out: &mut [u8]) {
        self.seg.read_page(page as usize, out);
    }

    fn write_page(&mut self, page: PageNo, data: &[u8]) {
        self.seg.write_bytes(page as usize, 0, data);
    }

    fn apply_diff(&mut self, page: PageNo, diff: &[u8]) {
        for run in crate::diff::runs(diff) {
            let (offset, bytes) = run.expect("diffs are validated before they are applied");
            self.seg.write_bytes(page as usize, offset, bytes);
        }
    }

    fn make_diff(&self, page: PageNo, twin: &[u8]) -> Vec<u8> {
        self.seg.diff_against(page as usize, twin)
    }

    fn host_applied(&self, page: PageNo, writer: NodeId) -> u32 {
        self.seg.host_applied(page as usize, writer as usize)
    }

    fn publish_host_applied(&mut self, page: PageNo, writer: NodeId, interval: u32) {
        self.seg
            .publish_host_applied(page as usize, writer as usize, interval);
    }
}

/// Prints a fatal error and ends the process at once.
pub(crate) fn fatal(msg: &str) -> ! {
    fatal_with(msg, FATAL_EXIT)
}

fn fatal_with(msg: &str, code: i32) -> ! {
    report_fatal(msg);
    sys::exit_now(code)
}

/// Writes the message in one `write`, so a signal arriving meanwhile cannot cut the line.
/// Not stdout: the app thread may hold its lock while parked in a fault, and stdout is
/// line-buffered, so complete lines are already out.
fn report_fatal(msg: &str) {
    use std::io::Write;
    let line = format!("dsm: fatal: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// log2 of the pages per chunk of the [`StateMirror`]: 64 KiB of mirror for each 256 MiB
/// of segment that allocations reach.
const MIRROR_CHUNK_SHIFT: u32 = 16;
/// Pages per chunk of the [`StateMirror`].
const MIRROR_CHUNK: usize = 1 << MIRROR_CHUNK_SHIFT;
/// The bit of a mirror byte that says the page is shared; the bits below it hold the
/// page's [`PageState`].
const MIRROR_SHARED: u8 = 0x80;

/// One chunk of the mirror: a byte per page.
type MirrorChunk = Box<[AtomicU8; MIRROR_CHUNK]>;

/// The engine's page table as last reported in its outputs, readable from the app thread
/// without the engine lock. Reads may be stale by the time they are used; they only decide
/// whether to prefetch or to ship a bitmap, never what is correct.
///
/// One byte per page: its [`PageState`], and [`MIRROR_SHARED`] for pages another node may
/// also access (not homed here, or homed here and served to someone at least once; only
/// these can take part in a race). The bytes live in chunks of [`MIRROR_CHUNK`] pages
/// made when an allocation first reaches them ([`StateMirror::reserve`]), so the mirror
/// follows the allocation high-water mark, not the segment: the fixed directory costs 16
/// bytes per 256 MiB of segment (1 MiB at the 16 TiB maximum). A chunk is published once
/// through its `OnceLock` and never moves or goes away, so the app thread reads it with
/// no lock while the comm thread writes it.
///
/// Writers (`set`, `mark_shared`) run only in `Shared::dispatch`, with the engine lock
/// held, so there is one writer at a time and a byte's read-modify-write needs no atomic
/// read-modify-write.
pub(crate) struct StateMirror {
    chunks: Box<[OnceLock<MirrorChunk>]>,
}

impl StateMirror {
    /// A mirror for a segment of `pages` pages, all unallocated and unshared, as in a new
    /// engine. Only the chunk directory is allocated here.
    pub(crate) fn new(pages: usize) -> Result<Self, TryReserveError> {
        let dir = pages.div_ceil(MIRROR_CHUNK);
        let mut chunks = Vec::new();
        chunks.try_reserve_exact(dir)?;
        chunks.resize_with(dir, OnceLock::new);
        Ok(StateMirror {
            chunks: chunks.into_boxed_slice(),
        })
    }

    /// Makes the chunks covering pages `..end` (allocations grow from page 0 upwards), so
    /// that the states of a new allocation have somewhere to go.
    pub(crate) fn reserve(&self, end: usize) -> Result<(), TryReserveError> {
        let last = end.div_ceil(MIRROR_CHUNK).min(self.chunks.len());
        for slot in &self.chunks[..last] {
            if slot.get().is_none() {
                let mut bytes = Vec::new();
                bytes.try_reserve_exact(MIRROR_CHUNK)?;
                bytes.resize_with(MIRROR_CHUNK, || AtomicU8::new(PageState::Unallocated as u8));
                let chunk: MirrorChunk = bytes
                    .into_boxed_slice()
                    .try_into()
                    .expect("a chunk has MIRROR_CHUNK bytes");
                // Only the thread holding the engine lock reserves, so the slot is empty.
                let _ = slot.set(chunk);
            }
        }
        Ok(())
    }

    /// The byte of `page`, if an allocation has reached its chunk.
    #[inline]
    fn byte(&self, page: usize) -> Option<&AtomicU8> {
        let chunk = self.chunks.get(page >> MIRROR_CHUNK_SHIFT)?.get()?;
        Some(&chunk[page & (MIRROR_CHUNK - 1)])
    }

    /// Whether another node may have accessed this page too (see [`StateMirror`]).
    #[inline]
    pub(crate) fn shared(&self, page: usize) -> bool {
        self.byte(page)
            .is_some_and(|b| b.load(Ordering::Relaxed) & MIRROR_SHARED != 0)
    }

    /// Whether any page of `first..=last` would fault for this access (pages no
    /// allocation has reached count as missing).
    pub(crate) fn any_missing(&self, first: usize, last: usize, write: bool) -> bool {
        let need = if write {
            PageState::ReadWrite as u8
        } else {
            PageState::ReadOnly as u8
        };
        let mut page = first;
        while page <= last {
            let Some(chunk) = self
                .chunks
                .get(page >> MIRROR_CHUNK_SHIFT)
                .and_then(OnceLock::get)
            else {
                return true;
            };
            let from = page & (MIRROR_CHUNK - 1);
            let to = (last - page + from).min(MIRROR_CHUNK - 1);
            if chunk[from..=to]
                .iter()
                .any(|b| b.load(Ordering::Relaxed) & !MIRROR_SHARED < need)
            {
                return true;
            }
            page += to - from + 1;
        }
        false
    }

    /// Applies `f` to the bytes of pages `first..first + count`. The engine reports only
    /// allocated pages, whose chunks [`StateMirror::reserve`] made before the allocation
    /// was registered; a page without one is skipped (the mirror only advises).
    fn update(&self, first: PageNo, count: u32, f: impl Fn(&AtomicU8)) {
        for page in first as usize..first as usize + count as usize {
            match self.byte(page) {
                Some(b) => f(b),
                None => debug_assert!(false, "page {page} reported before it was reserved"),
            }
        }
    }

    fn set(&self, first: PageNo, count: u32, state: PageState) {
        self.update(first, count, |b| {
            let shared = b.load(Ordering::Relaxed) & MIRROR_SHARED;
            b.store(shared | state as u8, Ordering::Relaxed);
        });
    }

    fn mark_shared(&self, first: PageNo, count: u32) {
        self.update(first, count, |b| {
            b.fetch_or(MIRROR_SHARED, Ordering::Relaxed);
        });
    }
}

/// Serialized size of the access notices (race mode) in the intervals `msg` carries; zero
/// for messages without intervals and for every message when detection is off.
fn race_notice_bytes(msg: &Msg) -> u64 {
    let intervals = match msg {
        Msg::LockGrant { grants } => {
            return grants
                .iter()
                .map(|g| race_notice_bytes_of(&g.intervals))
                .sum()
        }
        Msg::RaceBatch { intervals, .. }
        | Msg::SemGrant { intervals, .. }
        | Msg::BarrierArrive { intervals, .. }
        | Msg::BarrierRelease { intervals, .. } => intervals.as_slice(),
        _ => return 0,
    };
    race_notice_bytes_of(intervals)
}

fn race_notice_bytes_of(intervals: &[dsm_proto::IntervalRecord]) -> u64 {
    intervals
        .iter()
        .filter_map(|i| i.race.as_ref())
        .map(|r| postcard::experimental::serialized_size(r).map_or(0, |s| s as u64))
        .sum()
}

/// What a failed send means for the job.
enum SendFailure {
    /// The link broke: the peer is lost, exactly as if its reader had seen the connection
    /// end. The engine decides (a peer that has done its part of the final barrier may
    /// go), and its outputs are carried out like any others.
    Lost(Vec<Output>),
    /// Not the peer's doing (the message could not be encoded, or there is no link to
    /// `to`): the cause to report.
    Fatal(String),
}

/// Turns a failed send into the same verdict a receive would have given. Whether the
/// writer, the reader or the keep-alive notices a dead peer first is a matter of timing
/// (a send to a peer whose socket is already reset fails with ECONNRESET or EPIPE before
/// the reader sees the end of the stream), so all three report it as the loss of that
/// peer, naming it, with the peer-lost status.
fn send_failure<M: Memory>(
    engine: &mut Engine<M>,
    me: usize,
    to: NodeId,
    kind: &str,
    err: WireError,
) -> SendFailure {
    match err {
        WireError::Io(e) => {
            SendFailure::Lost(engine.on_peer_lost(to, &format!("cannot send {kind}: {e}")))
        }
        other => SendFailure::Fatal(format!(
            "rank {me}: cannot send {kind} to rank {to}: {other}"
        )),
    }
}

/// How the comm thread treats its links: the liveness deadline and chaos mode's seed.
struct LinkOptions {
    liveness: Option<Duration>,
    chaos: Option<u64>,
}

/// What only the comm thread can do for the app thread.
enum Control {
    /// Flush queued messages, then exit with this status (a fatal error was reported).
    Die(i32),
    /// The app is done: flush, close the links and stop.
    Shutdown,
}

/// The engine lock, held by a thread marked as inside the engine (see [`fault::InEngine`]).
struct EngineGuard<'a> {
    guard: MutexGuard<'a, Engine<SegmentMemory>>,
    _inside: fault::InEngine,
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine<SegmentMemory>;
    fn deref(&self) -> &Self::Target {
        &self.guard
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.guard
    }
}

/// State both threads use.
struct Shared {
    engine: Mutex<Engine<SegmentMemory>>,
    /// Follows the engine's page-state outputs, for the app thread.
    states: Arc<StateMirror>,
    /// Set once the transport is up (before the app thread issues its first command).
    outbox: OnceLock<Arc<Outbox>>,
    mailbox: FaultMailbox,
    replies: ReplyQueue<Reply>,
    control: mpsc::UnboundedSender<Control>,
    /// Set once a fatal error is being reported: nothing else is carried out.
    dying: AtomicBool,
    /// Serialized size of the access notices in the messages handed to the transport
    /// ([`Stats::race_notice_bytes`](crate::engine::Stats::race_notice_bytes)).
    race_notice_bytes: AtomicU64,
    /// Race master: batches of intervals that arrived between barriers, waiting for the
    /// incremental analysis.
    race_inbox: Arc<RaceInbox>,
    /// Every peer is reached through a shared-memory ring (set once the transport is up).
    rings_only: AtomicBool,
}

impl Shared {
    /// The engine, with the calling thread marked as inside it for the fault handler (a
    /// fault in the segment while the lock is held aborts with a clear message).
    ///
    /// The other thread holds the lock for one command or one message at most, never while
    /// it waits, so with a polling budget ([`crate::spin`]) a thread finding it taken
    /// yields its core until it is free rather than sleeping on it: the holder then needs
    /// no system call to hand it over, and on a machine where both threads share a core
    /// the yield is what lets the holder finish.
    fn engine(&self) -> EngineGuard<'_> {
        use std::sync::TryLockError;
        let polled =
            crate::spin::poll_for(crate::spin::current(), || match self.engine.try_lock() {
                Ok(g) => Some(g),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            });
        EngineGuard {
            guard: polled.unwrap_or_else(|| self.engine.lock().unwrap_or_else(|p| p.into_inner())),
            _inside: fault::InEngine::enter(),
        }
    }

    /// Runs a message from `peer` through the engine, as the comm thread's reader tasks do.
    fn deliver(&self, peer: usize, msg: Msg) {
        let msg = self.unpack_lane_reply(peer, msg);
        let mut engine = self.engine();
        let outputs = engine.on_peer_message(peer as NodeId, msg);
        self.dispatch(&mut engine, outputs);
    }

    /// A [`Msg::LanePageReply`] from `peer`, before the engine sees it (called while the
    /// frame is delivered, without the engine lock). If the page it announces is still in
    /// the lane (the faulting thread did not take it), takes it out and returns it as the
    /// [`Msg::PageReply`] it stands for. If the handler is copying it out, waits for that
    /// (a page copy and an `mprotect`). If the handler took it, returns the frame as it
    /// is: the engine has taken in, or takes in first, the handler's record. The lane's
    /// page is this frame's only if it was published right before it (its `after` is
    /// where this frame starts); a later page in the lane (this frame having come late)
    /// is not touched. Other messages pass unchanged.
    fn unpack_lane_reply(&self, peer: usize, msg: Msg) -> Msg {
        let Msg::LanePageReply { page } = msg else {
            return msg;
        };
        let Some(end) = self
            .outbox
            .get()
            .and_then(|o| o.lanes().iter().find(|l| l.peer() == peer))
        else {
            return msg;
        };
        let lane = end.incoming();
        let starts_at = end.delivered();
        let mut deferred = false;
        loop {
            match lane.state() {
                LaneState::Empty => return msg,
                LaneState::Taken => std::thread::yield_now(),
                LaneState::Full => {
                    match lane.full() {
                        Some(at) if at.page == u64::from(page) && at.after == starts_at => {}
                        Some(_) => return msg,
                        None => continue,
                    }
                    // The faulting thread asked for this very page and polls for it: it
                    // takes it as soon as it runs (every frame before this one has been
                    // delivered), or hands the wait to this thread first.
                    if fault::handler_asking() && fault::lane_awaited(peer) {
                        std::thread::yield_now();
                        continue;
                    }
                    // The faulting thread, polling for this very page, takes it faster
                    // than this thread can install it and wake it: let it, for a while.
                    if fault::lane_awaited(peer) && !std::mem::replace(&mut deferred, true) {
                        let budget = (crate::spin::current() / 4).min(FOLLOW_FAULTS_MAX);
                        crate::spin::poll_for(budget, || {
                            (lane.state() != LaneState::Full || !fault::lane_awaited(peer))
                                .then_some(())
                        });
                        continue;
                    }
                    if !lane.take() {
                        continue;
                    }
                    let mut applied = [0u64; dsm_net::ring::LANE_APPLIED_MAX];
                    let mut data = vec![0u8; PAGE_SIZE];
                    let (got, n) = lane.copy_out(&mut applied, &mut data);
                    lane.release();
                    if got != u64::from(page) {
                        return Msg::LanePageReply { page };
                    }
                    let applied = applied[..n].iter().map(|&a| unpack_applied(a)).collect();
                    return Msg::PageReply {
                        pages: vec![PageCopy {
                            page,
                            data,
                            applied,
                        }],
                    };
                }
            }
        }
    }

    /// The comm thread, having sent a fault's fetch: when every peer is reached through
    /// shared memory, it polls the rings for the page for the spin budget instead of
    /// going back to sleep and being woken for it (the faulting thread polls its slot
    /// meanwhile, so neither core idles). Over TCP the reply needs the runtime's reader
    /// tasks, so it returns at once.
    fn await_fault_reply(&self) {
        let budget = crate::spin::current();
        let Some(outbox) = self.outbox.get() else {
            return;
        };
        if budget.is_zero() || !self.rings_only.load(Ordering::Relaxed) {
            return;
        }
        let deliver = &mut |peer: usize, msg: Msg| self.deliver(peer, msg);
        crate::spin::poll_for(budget, || {
            outbox.poll_rings(deliver);
            (!self.mailbox.in_service() || self.dying.load(Ordering::Relaxed)).then_some(())
        });
        outbox.end_polling(deliver);
    }

    /// The comm thread, having served a fault: faults come in runs (a sweep over pages
    /// fetched one by one), and a wake-up of this thread lands on whatever core the
    /// scheduler finds idle, on a virtual machine a halted one (19 us from the handler's
    /// kick to the fault's take, median, against a few with this thread already running).
    /// So it watches the fault slot for a quarter of the spin budget, at most
    /// [`FOLLOW_FAULTS_MAX`], before going back to sleep, in jobs whose peers all share the
    /// host (over TCP its runtime must read the sockets meanwhile). Returns the next fault
    /// if one came.
    fn follow_faults(&self) -> Option<fault::Fault> {
        let budget = (crate::spin::current() / 4).min(FOLLOW_FAULTS_MAX);
        if !self.rings_only.load(Ordering::Relaxed) {
            return None;
        }
        self.mailbox.watch(budget)
    }

    /// Serves `fault` as the comm thread does when the handler kicks it: the fault, then,
    /// outside chaos mode, the wait for its page and the faults that follow it.
    fn serve_faults(&self, fault: fault::Fault, seg: &'static Segment, chaos_on: bool) {
        let mut next = Some(fault);
        while let Some(fault) = next {
            let mut engine = self.engine();
            let outputs = engine.on_fault(page_of(seg, fault.addr), fault.write);
            self.dispatch(&mut engine, outputs);
            drop(engine);
            next = None;
            if !chaos_on {
                if self.mailbox.in_service() {
                    self.await_fault_reply();
                }
                next = self.follow_faults();
            }
        }
    }

    /// The comm thread, having taken frames from a ring (its reader task calls this): when
    /// the previous frames came less than a spin budget ago, messages are coming in a run
    /// (a co-located peer taking lock after lock from this node while this node's app
    /// thread computes and cannot answer), so it goes on taking the rings' frames, and
    /// serving faults, until none has come for a quarter of the budget (at most
    /// [`FOLLOW_MESSAGES_MAX`]). Each frame of the run then costs no wake-up of this
    /// thread, which on a busy core is the peer's wait (Water at 2 nodes: 0.20 -> 0.12 s).
    /// A lone frame (the previous ones long ago) is not followed, so a program whose
    /// messages are rare pays no polling. Only in jobs whose peers all share the host, as
    /// for faults.
    fn follow_messages(&self, seg: &'static Segment, last_frames: &std::cell::Cell<Instant>) {
        let budget = crate::spin::current();
        let window = (budget / 4).min(FOLLOW_MESSAGES_MAX);
        let now = Instant::now();
        let in_a_run = now.duration_since(last_frames.get()) < budget;
        last_frames.set(now);
        let Some(outbox) = self.outbox.get() else {
            return;
        };
        if window.is_zero() || !in_a_run {
            return;
        }
        let sockets = !self.rings_only.load(Ordering::Relaxed);
        // With TCP links the runtime has work of its own (writers, heartbeats): a run of
        // ring frames or faults does not keep it waiting beyond one budget.
        let give_back = now + budget;
        let deliver = &mut |peer: usize, msg: Msg| self.deliver(peer, msg);
        let mut quiet_since = now;
        while !self.dying.load(Ordering::Relaxed) && !fault::handler_asking() {
            if sockets && outbox.sockets_need_runtime() {
                // The runtime's reader and writer tasks take it from here, without sleeping.
                crate::spin::SOCKETS_CAUGHT.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let frames = outbox.poll_rings(deliver);
            crate::spin::FRAMES_FOLLOWED.fetch_add(frames as u64, Ordering::Relaxed);
            let mut busy = frames > 0;
            if let Some(fault) = self.mailbox.take() {
                self.serve_faults(fault, seg, false);
                busy = true;
            }
            let now = Instant::now();
            if sockets && now >= give_back {
                break;
            }
            if busy {
                quiet_since = now;
                last_frames.set(now);
            } else if now.duration_since(quiet_since) >= window {
                break;
            }
            std::thread::yield_now();
        }
        outbox.end_polling(deliver);
    }

    /// Hands `msg` to the transport (part of [`Shared::dispatch`]).
    fn send(&self, engine: &mut Engine<SegmentMemory>, to: NodeId, msg: Msg) {
        let notices = race_notice_bytes(&msg);
        if notices > 0 {
            self.race_notice_bytes.fetch_add(notices, Ordering::Relaxed);
        }
        let Some(outbox) = self.outbox.get() else {
            return;
        };
        if let Msg::PageRequest { lane: true, .. } = msg {
            // Before the request leaves: the page may be in the lane at once.
            fault::expect_lane(to as usize);
        }
        // Nobody waits for a diff: it goes to the page's home without waking the home's
        // reader, and the next frame this node sends, or the app thread before it waits
        // (`Comm::recv`), wakes it. Diffs come only from the app thread's commands, at
        // interval closes.
        let sent = if matches!(msg, Msg::Diffs { .. }) {
            outbox.send_quiet(to as usize, &msg)
        } else {
            outbox.send(to as usize, &msg)
        };
        if let Err(e) = sent {
            self.send_failed(engine, to, msg.kind(), e);
        }
    }

    /// A send of a `kind` message to `to` failed with `err`.
    fn send_failed(
        &self,
        engine: &mut Engine<SegmentMemory>,
        to: NodeId,
        kind: &str,
        err: WireError,
    ) {
        // A closed outbox after shutdown is expected.
        if self.dying.load(Ordering::Relaxed) {
            return;
        }
        let Some(outbox) = self.outbox.get() else {
            return;
        };
        match send_failure(engine, outbox.rank(), to, kind, err) {
            SendFailure::Lost(outputs) => self.dispatch(engine, outputs),
            SendFailure::Fatal(why) => fatal_with(&why, PEER_LOST_EXIT),
        }
    }

    /// Carries out the engine's outputs; called with the engine lock held (`engine`) so
    /// messages are queued in the order the engine produced them.
    fn dispatch(&self, engine: &mut Engine<SegmentMemory>, outputs: Vec<Output>) {
        for out in outputs {
            if self.dying.load(Ordering::Relaxed) {
                return;
            }
            match out {
                Output::Send { to, msg } => self.send(engine, to, msg),
                Output::LaneReply { to, copy } => {
                    let Some(outbox) = self.outbox.get() else {
                        continue;
                    };
                    let applied: Vec<u64> = copy.applied.iter().map(pack_applied).collect();
                    let note = Msg::LanePageReply { page: copy.page };
                    let page = u64::from(copy.page);
                    match outbox.send_through_lane(to as usize, &note, page, &applied, &copy.data) {
                        Ok(true) => {}
                        Ok(false) => self.send(engine, to, Msg::PageReply { pages: vec![copy] }),
                        Err(e) => self.send_failed(engine, to, note.kind(), e),
                    }
                }
                Output::PageStates {
                    first,
                    count,
                    state,
                } => self.states.set(first, count, state),
                Output::PagesShared { first, count } => self.states.mark_shared(first, count),
                Output::FaultResolved => self.mailbox.resolve(),
                Output::FaultCrash => self.mailbox.crash(),
                Output::Reply(mut r) => {
                    if let Reply::Stats(s) = &mut r {
                        s.race_notice_bytes = self.race_notice_bytes.load(Ordering::Relaxed);
                        if let Some(outbox) = self.outbox.get() {
                            let t = &outbox.traffic;
                            s.messages_sent = t.messages_sent.load(Ordering::Relaxed);
                            s.bytes_sent = t.bytes_sent.load(Ordering::Relaxed);
                            s.messages_received = t.messages_received.load(Ordering::Relaxed);
                            s.bytes_received = t.bytes_received.load(Ordering::Relaxed);
                        }
                    }
                    self.replies.push(r);
                }
                Output::Fatal(msg) => {
                    // Let queued messages (such as an abort notice to the other nodes) go
                    // out before exiting; only the comm thread can flush them.
                    self.dying.store(true, Ordering::Relaxed);
                    report_fatal(&msg);
                    if self.control.send(Control::Die(FATAL_EXIT)).is_err() {
                        sys::exit_now(FATAL_EXIT);
                    }
                }
                Output::Diverged(msg) => {
                    self.dying.store(true, Ordering::Relaxed);
                    use std::io::Write;
                    let _ = std::io::stderr().write_all(format!("dsm: {msg}\n").as_bytes());
                    let code = i32::from(dsm_proto::exit_codes::REPLAY_DIVERGED);
                    if self.control.send(Control::Die(code)).is_err() {
                        sys::exit_now(code);
                    }
                }
                Output::PeerLost(msg) => fatal_with(&msg, PEER_LOST_EXIT),
                Output::RaceBatch(batch) => self.race_inbox.push(batch),
            }
        }
    }
}

/// Race master: the race batches that arrived between barriers, in arrival order, until
/// the analysis takes them (see `api::analyst`). Taking can be paused: between the end of
/// a barrier's analysis and the app thread's reset for the next epoch, batches of that
/// next epoch may already arrive and must wait.
#[derive(Default)]
pub(crate) struct RaceInbox {
    state: Mutex<InboxState>,
    ready: Condvar,
}

#[derive(Default)]
struct InboxState {
    batches: Vec<RaceBatch>,
    paused: bool,
    closed: bool,
}

impl RaceInbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, batch: RaceBatch) {
        self.lock().batches.push(batch);
        self.ready.notify_all();
    }

    /// The batches waiting, unless taking is paused (then none).
    pub(crate) fn take(&self) -> Vec<RaceBatch> {
        let mut st = self.lock();
        if st.paused {
            return Vec::new();
        }
        std::mem::take(&mut st.batches)
    }

    /// The batches waiting, paused or not (the barrier's own analysis).
    pub(crate) fn take_all(&self) -> Vec<RaceBatch> {
        std::mem::take(&mut self.lock().batches)
    }

    /// Waits until batches may be taken; `false` once the inbox is closed.
    pub(crate) fn wait_ready(&self) -> bool {
        let mut st = self.lock();
        while !st.closed && (st.paused || st.batches.is_empty()) {
            st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        !st.closed
    }

    /// Stops or resumes [`RaceInbox::take`]. The waiting analyst is woken only when it
    /// can take something: a pause never lets it go on, and a resume with nothing waiting
    /// leaves that to the next [`RaceInbox::push`]. Every barrier pauses and resumes, and a
    /// needless wake-up costs a system call and a context switch each time.
    pub(crate) fn set_paused(&self, paused: bool) {
        let mut st = self.lock();
        st.paused = paused;
        let wake = !paused && !st.batches.is_empty();
        drop(st);
        if wake {
            self.ready.notify_all();
        }
    }

    /// Wakes the analysis for good: [`RaceInbox::wait_ready`] returns `false`.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// Runs commands that have no reply on this node's engine, from a thread other than the
/// app thread (whose reply channel any reply would reach).
#[derive(Clone)]
pub(crate) struct CommandSender {
    shared: Arc<Shared>,
}

impl CommandSender {
    /// Runs `cmd`, which must be one that has no reply.
    pub(crate) fn send(&self, cmd: Command) {
        let mut engine = self.shared.engine();
        let outputs = engine.on_command(cmd);
        self.shared.dispatch(&mut engine, outputs);
    }
}

/// The app thread's handle on the engine and the comm thread.
pub(crate) struct Comm {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Whether [`Comm::recv`] may take frames from the shared-memory rings while it polls.
    poll_rings: bool,
}

impl Comm {
    /// Starts the comm thread with the engine and the established mesh; returns once the
    /// transport is up. With a `liveness` deadline, a peer that sends nothing for that
    /// long ends this process (see the module documentation).
    pub(crate) fn start(
        mesh: Mesh,
        engine: Engine<SegmentMemory>,
        mailbox: FaultMailbox,
        seg: &'static Segment,
        liveness: Option<Duration>,
        chaos: Option<u64>,
    ) -> io::Result<Comm> {
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std_mpsc::channel::<io::Result<()>>();
        let mut mailbox = mailbox;
        let kicks = mailbox
            .take_receiver()
            .ok_or_else(|| io::Error::other("fault mailbox receiver already taken"))?;
        // Seeded from the engine so the mirror is right even for an engine that has
        // already changed pages; from here on its outputs keep it current.
        let no_memory = |e: TryReserveError| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate the page-state mirror: {e}"),
            )
        };
        let states = StateMirror::new(engine.page_limit()).map_err(no_memory)?;
        states
            .reserve(engine.allocated_pages())
            .map_err(no_memory)?;
        for p in 0..engine.allocated_pages() as PageNo {
            states.set(p, 1, engine.page_state(p));
        }
        let states = Arc::new(states);
        let shared = Arc::new(Shared {
            engine: Mutex::new(engine),
            states,
            outbox: OnceLock::new(),
            mailbox,
            replies: ReplyQueue::new(),
            control: control_tx,
            dying: AtomicBool::new(false),
            race_notice_bytes: AtomicU64::new(0),
            race_inbox: Arc::default(),
            rings_only: AtomicBool::new(false),
        });
        let rank = mesh.rank;
        let for_thread = shared.clone();
        let replies_of_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("dsm-comm-{rank}"))
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    comm_main(
                        mesh,
                        for_thread,
                        kicks,
                        seg,
                        LinkOptions { liveness, chaos },
                        control_rx,
                        ready_tx,
                    )
                }));
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => fatal(&format!("rank {rank}: comm thread failed: {e}")),
                    Err(_) => fatal(&format!("rank {rank}: comm thread panicked")),
                }
                // The app thread may still wait for a reply only the comm thread could give.
                replies_of_thread.replies.close();
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("the comm thread stopped while starting")),
        }
        Ok(Comm {
            shared,
            thread: Some(thread),
            poll_rings: chaos.is_none(),
        })
    }

    /// Executes a command on this (the app) thread; its reply, if it is ready at once, is
    /// already queued for [`Comm::recv`], otherwise it comes from the comm thread later.
    pub(crate) fn send(&self, cmd: Command) {
        let mut engine = self.shared.engine();
        let outputs = engine.on_command(cmd);
        self.shared.dispatch(&mut engine, outputs);
        drop(engine);
        self.park_if_dying();
    }

    /// Runs `f` on the engine on this (the app) thread and carries out what it asked for:
    /// for the engine's methods that answer at once, with no reply through the channel.
    pub(crate) fn with_engine_now<R>(&self, f: impl FnOnce(&mut Engine<SegmentMemory>) -> R) -> R {
        let mut engine = self.shared.engine();
        let r = f(&mut engine);
        let outputs = engine.take_outputs();
        if !outputs.is_empty() {
            self.shared.dispatch(&mut engine, outputs);
        }
        drop(engine);
        self.park_if_dying();
        r
    }

    /// Runs `f` while this thread holds the engine lock (tests of the handler's check that
    /// no thread faults while it holds the engine).
    pub(crate) fn with_engine_held<R>(&self, f: impl FnOnce() -> R) -> R {
        let _engine = self.shared.engine();
        f()
    }

    /// Makes room for an allocation that ends at page `end` (allocations grow from page 0
    /// upwards) in the engine's page table and the page-state mirror, before the
    /// collective allocation is registered: a node short of memory then gets an error to
    /// return instead of aborting.
    pub(crate) fn reserve_pages(&self, end: usize) -> Result<(), TryReserveError> {
        let mut engine = self.shared.engine();
        engine.reserve_pages(end)?;
        self.shared.states.reserve(end)
    }

    /// The page states the app thread may consult to prefetch only what is missing.
    pub(crate) fn states(&self) -> Arc<StateMirror> {
        self.shared.states.clone()
    }

    /// Waits for the next reply.
    pub(crate) fn recv(&self) -> Reply {
        if let Some(r) = self.shared.replies.try_pop() {
            return r;
        }
        if let Some(outbox) = self.shared.outbox.get() {
            // What this thread waits for may need a diff it sent quietly.
            outbox.ring_owed_bells();
        }
        let polled = self.poll_for_reply();
        crate::spin::count_wait(polled.is_some());
        if let Some(r) = polled {
            return r;
        }
        match self.shared.replies.pop() {
            Some(r) => r,
            None => fatal("the comm thread has stopped"),
        }
    }

    /// Polls for the next reply for the spin budget. Meanwhile this thread also takes the
    /// frames that reach the shared-memory rings and runs them through the engine itself
    /// (the comm thread's work, in the same order under the same lock), so a reply from a
    /// co-located peer needs no wake-up of the comm thread: one hand-off fewer on every
    /// remote lock acquire and barrier. Not in chaos mode, whose delays are the comm
    /// thread's.
    fn poll_for_reply(&self) -> Option<Reply> {
        let outbox = self.shared.outbox.get().filter(|_| self.poll_rings);
        let deliver = &mut |peer: usize, msg: Msg| self.shared.deliver(peer, msg);
        let budget = crate::spin::current();
        let got = crate::spin::poll_for(budget, || {
            if let Some(r) = self.shared.replies.try_pop() {
                return Some(r);
            }
            let outbox = outbox?;
            if outbox.poll_rings(deliver) > 0 {
                self.park_if_dying();
            }
            self.shared.replies.try_pop()
        });
        if let Some(outbox) = outbox.filter(|_| !budget.is_zero()) {
            outbox.end_polling(deliver);
            self.park_if_dying();
        }
        got
    }

    /// Parks this thread for good once a fatal error is being reported: the comm thread
    /// is flushing and will end the process.
    fn park_if_dying(&self) {
        if self.shared.dying.load(Ordering::Relaxed) {
            loop {
                std::thread::park();
            }
        }
    }

    /// Race master: where race batches wait for the incremental analysis.
    pub(crate) fn race_inbox(&self) -> Arc<RaceInbox> {
        self.shared.race_inbox.clone()
    }

    /// A handle that runs commands without a reply from another thread (the race
    /// master's analyst).
    pub(crate) fn commands(&self) -> CommandSender {
        CommandSender {
            shared: self.shared.clone(),
        }
    }

    /// Executes a command and waits for its reply.
    pub(crate) fn call(&self, cmd: Command) -> Reply {
        self.send(cmd);
        self.recv()
    }

    /// Stops the comm thread after it has flushed what it still has to send.
    pub(crate) fn shutdown(mut self) {
        let _ = self.shared.control.send(Control::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn page_of(seg: &Segment, addr: usize) -> Option<PageNo> {
    let base = seg.app_base();
    (addr >= base && addr < base + seg.len()).then(|| ((addr - base) / PAGE_SIZE) as PageNo)
}

fn comm_main(
    mesh: Mesh,
    shared: Arc<Shared>,
    kicks: std::os::unix::net::UnixStream,
    seg: &'static Segment,
    options: LinkOptions,
    mut control: mpsc::UnboundedReceiver<Control>,
    ready: std_mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    let LinkOptions { liveness, chaos } = options;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let kicks = tokio::net::UnixStream::from_std(kicks)?;
        let chaos_on = chaos.is_some();
        let size = mesh.size;
        let on_peer = peer_handler(shared.clone(), mesh.rank, chaos, liveness);
        let transport = match Transport::start(mesh, on_peer, liveness) {
            Ok(t) => t,
            Err(e) => {
                let _ = ready.send(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        install_outbox(&shared, transport.outbox(), size);
        if !chaos_on {
            // Chaos mode's delays are the reader tasks'; it leaves runs to them.
            let s = shared.clone();
            let long_ago = Instant::now().checked_sub(Duration::from_secs(1));
            let last_frames = std::cell::Cell::new(long_ago.unwrap_or_else(Instant::now));
            let follow: Rc<dyn Fn()> = Rc::new(move || s.follow_messages(seg, &last_frames));
            transport.after_ring_frames(follow.clone());
            transport.after_socket_frames(follow);
        }
        let _ = ready.send(Ok(()));

        tokio::task::spawn_local(serve_kicks(kicks, shared.clone(), seg, chaos_on));

        let code = match control.recv().await {
            Some(Control::Die(code)) => Some(code),
            Some(Control::Shutdown) | None => None,
        };
        // Flush what is queued, then let the connections close.
        transport
            .shutdown(Duration::from_millis(match code {
                Some(_) => 500,
                None => 5000,
            }))
            .await;
        if let Some(code) = code {
            sys::exit_now(code);
        }
        Ok::<(), io::Error>(())
    })
}

/// What the transport calls with every peer's messages and link events: the engine's
/// handling of them, and with `chaos` a delay before lock messages.
fn peer_handler(
    shared: Arc<Shared>,
    me: usize,
    chaos: Option<u64>,
    liveness: Option<Duration>,
) -> Rc<dyn Fn(usize, PeerEvent)> {
    let s = shared;
    // Chaos mode: its own stream of draws (the app thread has another).
    let chaos = std::cell::RefCell::new(
        chaos.map(|seed| crate::chaos::Chaos::new(seed ^ 0x5bd1_e995_c0ff_ee00, me)),
    );
    Rc::new(move |peer: usize, ev: PeerEvent| {
        if let (
            Some(c),
            PeerEvent::Message(
                Msg::LockRequest { .. } | Msg::LockForward { .. } | Msg::LockGrant { .. },
            ),
        ) = (chaos.borrow_mut().as_mut(), &ev)
        {
            c.before_lock_message();
        }
        let ev = match ev {
            PeerEvent::Message(msg) => PeerEvent::Message(s.unpack_lane_reply(peer, msg)),
            other => other,
        };
        let mut engine = s.engine();
        let outputs = match ev {
            PeerEvent::Message(msg) => engine.on_peer_message(peer as NodeId, msg),
            PeerEvent::Closed => engine.on_peer_lost(peer as NodeId, "connection closed"),
            PeerEvent::Failed(err) => engine.on_peer_lost(peer as NodeId, &err.to_string()),
            PeerEvent::Silent(after) => {
                // Whatever the engine's state, a peer that is alive but says nothing
                // leaves the job stuck. The line names the peer, for dsmrun too.
                if s.dying.load(Ordering::Relaxed) {
                    return;
                }
                let silence = Silence::new(me, peer, after, liveness.unwrap_or(after));
                fatal_with(&silence.to_string(), PEER_LOST_EXIT)
            }
        };
        s.dispatch(&mut engine, outputs);
    })
}

/// Makes the started transport's links known to the engine and the fault handler, and
/// the outbox to every thread.
fn install_outbox(shared: &Shared, outbox: Arc<Outbox>, size: usize) {
    shared
        .rings_only
        .store(outbox.shm_peers().len() + 1 == size, Ordering::Relaxed);
    // Set even when empty, as the TCP table below: a table from an earlier job in this
    // process must not serve this one.
    fault::set_lanes(outbox.lanes(), size);
    if !outbox.lanes().is_empty() {
        let peers: Vec<NodeId> = outbox.shm_peers().iter().map(|&p| p as NodeId).collect();
        shared.engine().set_lane_peers(&peers);
    }
    let direct = outbox.direct_senders();
    let peers: Vec<NodeId> = direct.iter().map(|d| d.peer() as NodeId).collect();
    fault::set_direct_senders(direct, size);
    shared.engine().set_socket_peers(&peers);
    let _ = shared.outbox.set(outbox);
}

/// Serves the fault handler's kicks for good: the faults it posted, or the pages it
/// fetched itself.
async fn serve_kicks(
    kicks: tokio::net::UnixStream,
    s: Arc<Shared>,
    seg: &'static Segment,
    chaos_on: bool,
) {
    let mut drain = [0u8; 64];
    loop {
        if let Err(err) = kicks.readable().await {
            fatal(&format!("fault mailbox failed: {err}"));
        }
        // Drain the kicks before looking at the slot: a fault posted after this
        // point sends a fresh kick, so none is lost.
        match kicks.try_read(&mut drain) {
            Ok(0) => fatal("fault mailbox closed"),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => fatal(&format!("fault mailbox failed: {e}")),
        }
        if let Some(outbox) = s.outbox.get() {
            // A page request the handler wrote only in part.
            outbox.flush_direct_rests();
        }
        if let Some(fault) = s.mailbox.take() {
            s.serve_faults(fault, seg, chaos_on);
        } else {
            // The handler woke this thread for the pages it fetched itself.
            let mut engine = s.engine();
            let outputs = engine.on_handler_work();
            s.dispatch(&mut engine, outputs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch_from(from: NodeId) -> RaceBatch {
        RaceBatch {
            from,
            known: dsm_proto::VectorTime::zero(2),
            intervals: Vec::new(),
            bitmaps: Default::default(),
            last: false,
        }
    }

    /// The analyst's loop, once: waits for the inbox, then takes what it holds.
    fn analyst_on(inbox: &Arc<RaceInbox>) -> std::thread::JoinHandle<(bool, Vec<RaceBatch>)> {
        let inbox = inbox.clone();
        std::thread::spawn(move || {
            let open = inbox.wait_ready();
            (open, inbox.take())
        })
    }

    /// Waits up to ten seconds for `t` to finish.
    fn finishes<T>(t: &std::thread::JoinHandle<T>) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        t.is_finished()
    }

    /// The barrier's pause and resume wake the analyst only when it can take a batch: one
    /// pushed during the pause must still be taken once the inbox resumes, and the pause
    /// must hold the analyst back meanwhile.
    #[test]
    fn a_batch_pushed_during_a_pause_is_taken_once_the_inbox_resumes() {
        let inbox = Arc::new(RaceInbox::default());
        inbox.set_paused(true);
        let analyst = analyst_on(&inbox);
        inbox.push(batch_from(1));
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !analyst.is_finished(),
            "the analyst went on while the inbox was paused"
        );
        // Resuming with nothing new pushed: the batch already waiting must wake it.
        inbox.set_paused(false);
        assert!(
            finishes(&analyst),
            "the resumed inbox never woke the analyst"
        );
        let (open, taken) = analyst.join().unwrap();
        assert!(open);
        assert_eq!(taken, vec![batch_from(1)]);
    }

    /// A resume with nothing waiting leaves the analyst asleep until a batch comes.
    #[test]
    fn a_resumed_empty_inbox_wakes_the_analyst_at_the_next_batch() {
        let inbox = Arc::new(RaceInbox::default());
        inbox.set_paused(true);
        let analyst = analyst_on(&inbox);
        inbox.set_paused(false);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !analyst.is_finished(),
            "the analyst went on with nothing to take"
        );
        inbox.push(batch_from(1));
        assert!(finishes(&analyst), "a pushed batch never woke the analyst");
        assert_eq!(analyst.join().unwrap(), (true, vec![batch_from(1)]));
    }

    /// The losing order, forced: the peer's process is gone and its socket reset before
    /// this rank's reader could see the end of the stream (the comm thread's runtime never
    /// runs here, so the reader cannot), and the engine then sends to it. The failed send
    /// must report the loss of that peer, named, as the reader would have.
    #[test]
    fn a_send_to_a_reset_peer_reports_that_peer_lost() {
        use dsm_proto::liveness::PeerLoss;
        use dsm_proto::{JobConfig, TransportChoice};
        let coord = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let job = move |rank| JobConfig {
            connect_timeout: Duration::from_secs(10),
            // A TCP link: a shared-memory ring to a gone peer accepts frames until the
            // link's TCP side reports the end, so only TCP fails the send itself.
            transport: TransportChoice::Tcp,
            ..JobConfig::standalone(rank, 2, coord, "t")
        };
        let peer = std::thread::spawn(move || dsm_net::connect_mesh(&job(1)).unwrap());
        let mesh0 = dsm_net::connect_mesh(&job(0)).unwrap();
        // Rank 1 goes away: its end of the connection closes.
        drop(peer.join().unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = tokio::task::LocalSet::new().block_on(&rt, async {
            let transport = Transport::start(mesh0, Rc::new(|_, _| {}), None).unwrap();
            let outbox = transport.outbox();
            let msg = Msg::Abort { reason: "x".into() };
            // The first frame is accepted by the kernel and answered with a reset; a
            // later one fails on the reset socket. No await: the reader never runs.
            for _ in 0..200 {
                if let Err(e) = outbox.send(1, &msg) {
                    return e;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("sends to a closed peer kept succeeding");
        });
        assert!(matches!(err, WireError::Io(_)), "{err:?}");
        let mut engine = Engine::new(0, 2, 16, crate::engine::VecMemory::new(16), false);
        let SendFailure::Lost(outputs) = send_failure(&mut engine, 0, 1, "barrier-arrive", err)
        else {
            panic!("a broken link is a lost peer");
        };
        let lines: Vec<_> = outputs
            .iter()
            .filter_map(|o| match o {
                Output::PeerLost(m) => Some(m.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let loss = PeerLoss::parse(&lines[0]).expect("a line dsmrun reads");
        assert_eq!((loss.reporter, loss.lost), (0, 1), "{lines:?}");
        assert!(
            loss.why.starts_with("cannot send barrier-arrive: "),
            "{lines:?}"
        );
        assert!(lines[0].contains("lost rank 1"), "{lines:?}");
    }

    #[test]
    fn a_send_that_cannot_be_encoded_is_not_blamed_on_the_peer() {
        let mut engine = Engine::new(0, 2, 16, crate::engine::VecMemory::new(16), false);
        let err = WireError::TooLarge { len: 10, max: 1 };
        match send_failure(&mut engine, 0, 1, "page-reply", err) {
            SendFailure::Fatal(why) => {
                assert!(why.contains("cannot send page-reply to rank 1"), "{why}");
                assert!(!why.contains("lost rank"), "{why}");
            }
            SendFailure::Lost(o) => panic!("{o:?}"),
        }
    }

    #[test]
    fn the_mirror_follows_the_allocations_not_the_segment() {
        // A 16 TiB segment: only the chunk directory is allocated up front.
        let m = StateMirror::new(1 << 32).unwrap();
        assert_eq!(m.chunks.len(), (1 << 32) / MIRROR_CHUNK);
        assert!(m.chunks.iter().all(|c| c.get().is_none()));
        m.reserve(MIRROR_CHUNK + 5).unwrap();
        let made = m.chunks.iter().filter(|c| c.get().is_some()).count();
        assert_eq!(made, 2, "chunks up to the high-water mark only");
        // Unreached pages read as unallocated and unshared.
        assert!(!m.shared(3 * MIRROR_CHUNK));
        assert!(m.any_missing(3 * MIRROR_CHUNK, 3 * MIRROR_CHUNK, false));
    }

    #[test]
    fn state_and_shared_bit_live_side_by_side() {
        let m = StateMirror::new(4 * MIRROR_CHUNK).unwrap();
        let end = 2 * MIRROR_CHUNK + 10;
        m.reserve(end).unwrap();
        m.set(0, end as u32, PageState::ReadOnly);
        assert!(!m.any_missing(0, end - 1, false));
        assert!(m.any_missing(0, end - 1, true));
        assert!(m.any_missing(0, end, false), "page `end` is not allocated");
        // Across the chunk boundary.
        let b = MIRROR_CHUNK as PageNo;
        m.set(b - 2, 4, PageState::ReadWrite);
        assert!(!m.any_missing(b as usize - 2, b as usize + 1, true));
        assert!(m.any_missing(b as usize - 3, b as usize + 1, true));
        m.mark_shared(b - 1, 2);
        assert!(m.shared(b as usize - 1) && m.shared(b as usize));
        assert!(!m.shared(b as usize + 1));
        // A state change keeps the shared bit, and the shared bit the state.
        m.set(b - 1, 1, PageState::Invalid);
        assert!(m.shared(b as usize - 1));
        assert!(m.any_missing(b as usize - 1, b as usize - 1, false));
        assert!(!m.any_missing(b as usize, b as usize, true));
    }
}

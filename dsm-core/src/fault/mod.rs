//! The fault path: the SIGSEGV handler and everything it shares with the rest of the
//! node. A fault inside the segment is served here when the handler can do it alone (a
//! write fault on a page the engine armed: twin, write access, dirty mark, see
//! [`crate::engine::fast`]; a read fault on a page armed for a fetch of its own: it asks
//! the home itself and takes the page from the home's page lane or out of its socket);
//! every other fault goes through the fault mailbox (a socket pair and a futex) to the comm
//! thread, which resolves it while the handler polls, then sleeps. Faults outside the
//! segment are chained to the handler installed before dsm.
//!
//! The handler is async-signal-safe: it reads and writes atomics, copies a page into a
//! preallocated twin slot or from a page lane or a reply frame (parsed in place on its
//! stack) into the runtime view, calls `mprotect(2)`, `madvise(2)`, `write(2)`, `send(2)`,
//! `recv(2)`, `poll(2)`, `futex(2)`, `sigaction(2)`, `sched_yield(2)`, `clock_gettime(2)`,
//! `raise(3)` (a SIGSEGV sent by another process, not a fault) and `abort(3)`, and nothing
//! else. It never allocates, logs or waits for a lock (a TCP
//! link's send lock and its incoming bytes it only tries). Its state is process-wide
//! (statics), since a signal handler reaches nothing else; `sys` below it holds the OS
//! primitives it uses.

#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::Cell;
use std::io;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Arc, OnceLock};

use crate::engine::FastFaults;
use crate::sys::{
    errno_location, install_alt_stack, monotonic_ns, os_err, set_global_segment, Segment,
    SegmentFile,
};
use dsm_net::framing::{
    page_request_frame, plain_page_reply, PAGE_REQUEST_FRAME_MAX, PLAIN_REPLY_FRAME_MAX,
};
use dsm_net::transport::LaneEnd;
use dsm_net::{DirectSend, DirectSender, DirectTake};
use dsm_proto::PAGE_SIZE;

mod slot;
use slot::{idle_slot, FaultSlot, SlotState};

/// What the fault slot is built on: the process's atomics and futexes (the model test
/// gives it loom's instead).
mod slot_deps {
    pub(super) use crate::sys::{futex_wait, futex_wake_all};
    pub(super) use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
}

/// Everything the SIGSEGV handler reads, in one place: written by [`start`], the comm
/// thread and the engine's side of the fast paths, read by the handler with atomics
/// only. Process-wide, since a signal handler has no other way to find its state.
struct HandlerState {
    /// The fault in service (see [`slot`]).
    slot: FaultSlot,
    /// The segment's app view, `seg_start..seg_end` (0..0: no DSM running).
    seg_start: AtomicUsize,
    seg_end: AtomicUsize,
    /// Base of the segment's runtime view, where the handler copies twins from.
    runtime_base: AtomicUsize,
    /// Write end of the socket pair that wakes the comm thread (-1: no DSM running).
    kick_fd: AtomicI32,
    /// Set while the comm thread polls the slot for the next fault (`FaultMailbox::watch`):
    /// the handler then skips the kick, a system call on the faulting thread's path that
    /// would also wake the comm thread's runtime later for a fault already taken.
    comm_watching: AtomicBool,
    installed: AtomicBool,
    /// The state shared with the engine for write faults served in the handler; unset
    /// when the fast path is off (`DSM_FAST_FAULTS=0`). Each value comes from
    /// `Arc::into_raw` and is never released, so the handler may use whatever pointer it
    /// loads for the life of the process, even if a later `Dsm::init` in the same process
    /// replaces it.
    fast: AtomicPtr<FastFaults>,
    /// The page lanes from co-located homes, indexed by rank: a value from
    /// `Box::into_raw` never given back (a later job in the same process replaces it and
    /// leaks the old one), so a loaded pointer stays valid for the process's life.
    lanes: AtomicPtr<Vec<Option<LaneEnd>>>,
    /// `home + 1` while the fault in service waits for a page from `home`'s lane; 0
    /// otherwise.
    lane_home: AtomicU32,
    /// The links to peers reached over TCP, indexed by rank, for the handler to ask a
    /// page's home itself (see [`ask_socket_home`]); kept like `lanes`, never freed.
    direct: AtomicPtr<Vec<Option<DirectSender>>>,
}

static HANDLER: HandlerState = HandlerState {
    slot: idle_slot!(),
    seg_start: AtomicUsize::new(0),
    seg_end: AtomicUsize::new(0),
    runtime_base: AtomicUsize::new(0),
    kick_fd: AtomicI32::new(-1),
    comm_watching: AtomicBool::new(false),
    installed: AtomicBool::new(false),
    fast: AtomicPtr::new(std::ptr::null_mut()),
    lanes: AtomicPtr::new(std::ptr::null_mut()),
    lane_home: AtomicU32::new(0),
    direct: AtomicPtr::new(std::ptr::null_mut()),
};

thread_local! {
    /// Set while this thread holds the protocol engine's lock. A fault in the segment
    /// then can never be served (the comm thread needs the lock, and the handler's fast
    /// path relies on the engine not being mid-step on this thread), so the handler stops
    /// the process with a clear message instead of deadlocking. Const-initialized and
    /// without a destructor, so reading it in the handler is a plain TLS load.
    static IN_ENGINE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as holding the engine lock for as long as it lives (see
/// [`IN_ENGINE`]).
pub(crate) struct InEngine(());

impl InEngine {
    pub(crate) fn enter() -> InEngine {
        IN_ENGINE.set(true);
        InEngine(())
    }
}

impl Drop for InEngine {
    fn drop(&mut self) {
        IN_ENGINE.set(false);
    }
}

/// Gives the handler the page lanes from this node's co-located peers.
pub(crate) fn set_lanes(lanes: &[dsm_net::transport::LaneEnd], size: usize) {
    let mut table: Vec<Option<dsm_net::transport::LaneEnd>> = vec![None; size];
    for l in lanes {
        if let Some(slot) = table.get_mut(l.peer()) {
            *slot = Some(l.clone());
        }
    }
    HANDLER
        .lanes
        .store(Box::into_raw(Box::new(table)), Ordering::Release);
}

/// Gives the handler the TCP links of this node, to send page requests on.
pub(crate) fn set_direct_senders(senders: Vec<DirectSender>, size: usize) {
    let mut table: Vec<Option<DirectSender>> = vec![None; size];
    for d in senders {
        let peer = d.peer();
        if let Some(slot) = table.get_mut(peer) {
            *slot = Some(d);
        }
    }
    HANDLER
        .direct
        .store(Box::into_raw(Box::new(table)), Ordering::Release);
}

/// The TCP link to `peer`, if any.
fn direct_sender(peer: usize) -> Option<&'static DirectSender> {
    peer_entry(&HANDLER.direct, peer)
}

/// `peer`'s entry in one of the handler's per-peer tables (`HandlerState::lanes`, `HandlerState::direct`).
fn peer_entry<T>(table: &AtomicPtr<Vec<Option<T>>>, peer: usize) -> Option<&'static T> {
    let table = table.load(Ordering::Acquire);
    if table.is_null() {
        return None;
    }
    // SAFETY: a non-null value of either table comes from Box::into_raw and is never
    // freed (see their docs), so the reference may live for the rest of the process.
    let table: &'static Vec<Option<T>> = unsafe { &*table };
    table.get(peer)?.as_ref()
}

/// How the handler asked a page's home for the page itself.
#[derive(Clone, Copy)]
enum Asked {
    /// Through the request slot of the shared-memory link's lane; the page comes back
    /// in the home's lane, which this thread polls.
    Lane(&'static LaneEnd),
    /// In a frame written to the TCP link; the page comes back in a reply frame, which
    /// this thread takes out of the socket itself if the comm thread's reader holds
    /// nothing of the link's then ([`take_page_from_socket`]); otherwise the comm thread
    /// takes it in, resolving the fault.
    Socket(&'static DirectSender),
}

/// From the handler, holding the fault slot for a read fault at `addr`: if the engine
/// armed the page for a fetch of the handler's own ([`FastFaults::claim_fetch`]), asks
/// its home for it, through the lane of a shared-memory link ([`ask_lane_home`]) or in a
/// frame on a TCP link ([`ask_socket_home`]). Returns how it asked, if it did; if not, the
/// page is unclaimed and the slot still this thread's alone (`Claimed`).
fn ask_home(addr: usize, start: usize) -> Option<Asked> {
    let fast = fast_faults()?;
    let page = (addr - start) / PAGE_SIZE;
    let home = usize::from(fast.claim_fetch(page)?);
    let asked = if let Some(end) = lane_end(home) {
        ask_lane_home(end, page).then_some(Asked::Lane(end))
    } else if let Some(link) = direct_sender(home) {
        ask_socket_home(link, page).then_some(Asked::Socket(link))
    } else {
        None
    };
    if asked.is_none() {
        fast.unclaim_fetch(page);
    }
    asked
}

/// From the handler, `page` claimed for a fetch from the home at the far end of TCP link
/// `link`: writes the home a [`dsm_proto::Msg::PageRequest`] for it, behind every frame
/// this node handed to the link before, unless another thread is sending on the link or
/// frames wait in its queue ([`DirectSender::try_send`]). This thread then looks for the
/// reply in the socket itself ([`take_page_from_socket`]); if the comm thread's reader
/// takes it first, its engine adopts the fetch and resolves the fault. Returns whether it
/// asked. Nothing here allocates, locks or blocks: the frame is encoded on the stack, and
/// the link's lock is only tried.
fn ask_socket_home(link: &DirectSender, page: usize) -> bool {
    let Ok(page_no) = dsm_proto::PageNo::try_from(page) else {
        return false;
    };
    let mut buf = [0u8; PAGE_REQUEST_FRAME_MAX];
    let frame = page_request_frame(page_no, &mut buf);
    // Before the request, since the reply may come at once: the comm thread resolves an
    // asked fault when the copy arrives, and its reader leaves the reply to this thread.
    HANDLER.slot.ask();
    link.await_reply(true);
    match link.try_send(frame) {
        DirectSend::Sent => true,
        DirectSend::Partly => {
            // The rest waits in the link until the comm thread queues it for the writer.
            kick();
            true
        }
        DirectSend::Refused => {
            // Nothing asked, so nothing can answer: the slot is still this thread's alone.
            link.await_reply(false);
            HANDLER.slot.unask();
            false
        }
    }
}

/// Whether the fault in service waits for a page from `home`'s lane (its thread polls it).
pub(crate) fn lane_awaited(home: usize) -> bool {
    HANDLER.lane_home.load(Ordering::Acquire) == home as u32 + 1
        && matches!(HANDLER.slot.state(), SlotState::Taken | SlotState::Asked)
}

/// From the handler, `page` claimed for a fetch from `end`'s peer, a co-located home:
/// asks for it through the request slot of the lane towards the home, behind every frame
/// this node has handed to that link, and rings the home's bell if its reader sleeps.
/// The page then comes back through the home's lane as for a fetch the comm thread asked
/// for, with neither thread of this node in the way. Returns whether it asked. Nothing
/// here allocates, locks or blocks: atomics and at most one `write(2)`.
fn ask_lane_home(end: &'static LaneEnd, page: usize) -> bool {
    let home = end.peer() as u32;
    // All before the request, since the home may answer at once: the flag, the home this
    // thread waits for, and the slot's state, which lets the comm thread resolve the fault
    // if the copy reaches it first.
    end.set_polling(true);
    HANDLER.lane_home.store(home + 1, Ordering::Release);
    HANDLER.slot.ask();
    if !end.request_page(page as u64) {
        // Nothing asked, so nothing can answer: the slot is still this thread's alone.
        HANDLER.slot.unask();
        HANDLER.lane_home.store(0, Ordering::Release);
        end.set_polling(false);
        return false;
    }
    true
}

/// The state shared with the engine for the handler's paths, unless they are off.
fn fast_faults() -> Option<&'static FastFaults> {
    let ptr = HANDLER.fast.load(Ordering::Acquire);
    // SAFETY: a non-null value of `HandlerState::fast` comes from Arc::into_raw and its count is never
    // given back, so the FastFaults it points to lives for the rest of the process.
    (!ptr.is_null()).then(|| unsafe { &*ptr })
}

/// The lane end shared with co-located `peer`, if any.
fn lane_end(peer: usize) -> Option<&'static LaneEnd> {
    peer_entry(&HANDLER.lanes, peer)
}

/// From the handler, which asked `end`'s peer for a page and stops polling its lane (the
/// page taken, the fault resolved, or the wait handed to the comm thread): says so in the
/// lane, and with `wake_reader` rings this node's reader of the peer's ring, which then
/// reads an announcement the peer may have left without ringing while this thread polled.
fn stop_polling_lane(end: &LaneEnd, wake_reader: bool) {
    end.set_polling(false);
    if wake_reader {
        end.wake_own_reader();
    }
}

/// Whether the faulting thread asked the home for its page itself and polls for it
/// (`Asked`), in the home's lane or in the socket from it: the comm thread then
/// keeps off the cores (its polling would only compete with that thread and with the
/// home's) and leaves the page to it.
pub(crate) fn handler_asking() -> bool {
    HANDLER.slot.state() == SlotState::Asked
}

/// The comm thread, about to ask `home` for the faulting page through its lane.
pub(crate) fn expect_lane(home: usize) {
    HANDLER.lane_home.store(home as u32 + 1, Ordering::Release);
}

/// From the handler, while its read fault is in service: if the home left the faulting
/// page in the lane and this node has taken in every frame the home sent before it, takes
/// the page, copies it into the runtime view, makes it readable in the app view and
/// records it for the engine (see [`FastFaults::record_fetched`]); returns whether it
/// did. The engine takes the page in at the start of its next event, before it can
/// change anything about it; until then the comm thread leaves the page alone (the lane
/// is taken, and only its frame or this record completes the fetch). Nothing here
/// allocates, locks or blocks: atomics, two page-sized copies and one `mprotect`.
/// What [`take_page_from_lane`] did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LaneTake {
    /// The page is installed and recorded: the fault is over.
    Taken,
    /// Not there yet (or not this thread's to take).
    NotYet,
    /// There, but the record queue is full until the engine takes records in.
    NoRoom,
}

/// The runtime view of `page`, for the handler to copy a fetched page into.
///
/// # Safety
///
/// The caller holds the page's fetch, its reply not yet taken in: the page is invalid, so
/// the app view has no access to it, and the comm thread installs a fetched page only
/// from its reply, which the caller holds (the lane it took, or the socket bytes it
/// claimed). Nothing else touches the page meanwhile.
unsafe fn runtime_page_of_fetch(page: usize) -> &'static mut [u8] {
    let runtime = HANDLER.runtime_base.load(Ordering::Relaxed) + page * PAGE_SIZE;
    // SAFETY: `runtime` is the page's address in the runtime view, mapped for the life of
    // the process and page-aligned; the caller guarantees nothing else uses it.
    unsafe { std::slice::from_raw_parts_mut(runtime as *mut u8, PAGE_SIZE) }
}

/// Sets the app view's protection of the page at `app` (page-aligned, inside the segment);
/// returns whether `mprotect` succeeded. Async-signal-safe.
fn protect_app_page(app: usize, prot: libc::c_int) -> bool {
    // SAFETY: one page of our app-view mapping; no Rust reference to app-view memory
    // exists.
    unsafe { libc::mprotect(app as *mut libc::c_void, PAGE_SIZE, prot) == 0 }
}

/// From the handler, having recorded a page it installed: when the records waiting reach
/// a mark, kicks the comm thread. No fault of this thread has reached it for a while, so
/// its engine must take the records in before they run out (a watching comm thread looks
/// for faults only, so it is kicked too).
fn kick_if_backlog_high(fast: &FastFaults) {
    if fast.fetched_backlog_high() {
        kick();
    }
}

fn take_page_from_lane(addr: usize, start: usize) -> LaneTake {
    let home = HANDLER.lane_home.load(Ordering::Acquire);
    let (Some(end), Some(fast)) = (
        home.checked_sub(1).and_then(|h| lane_end(h as usize)),
        fast_faults(),
    ) else {
        return LaneTake::NotYet;
    };
    let page = (addr - start) / PAGE_SIZE;
    if !end.holds_current(page as u64) {
        return LaneTake::NotYet;
    }
    let lane = end.incoming();
    if !lane.take() {
        return LaneTake::NotYet;
    }
    let mut applied = [0u64; dsm_net::ring::LANE_APPLIED_MAX];
    // SAFETY: the page is invalid and its fetch outstanding, and its reply is the lane
    // this thread now holds.
    let data = unsafe { runtime_page_of_fetch(page) };
    let (_, n) = lane.copy_out(&mut applied, data);
    let app = start + page * PAGE_SIZE;
    let readable = protect_app_page(app, libc::PROT_READ);
    if !readable || !fast.record_fetched(home - 1, page as dsm_proto::PageNo, &applied[..n]) {
        // Left to the comm thread, as if the handler had never looked: the page stays
        // inaccessible (back to no access, as the engine has it) and the lane full (what
        // was copied is the lane's own data).
        protect_app_page(app, libc::PROT_NONE);
        lane.put_back();
        return if readable {
            LaneTake::NoRoom
        } else {
            LaneTake::NotYet
        };
    }
    lane.release();
    kick_if_backlog_high(fast);
    LaneTake::Taken
}

/// From the handler, which asked the home at the far end of TCP link `link` for the page
/// at `addr` itself and has not handed the wait over: if the socket's next frame is that
/// page's reply, whole, and the comm thread's reader holds nothing of the link's (so every
/// frame the home sent before it has been taken in), takes it out of the socket, copies
/// the page into the runtime view, makes it readable in the app view and records it for
/// the engine, as [`take_page_from_lane`] does for a lane. The engine takes the page in
/// at the start of its next event; the reply never reaches it. Nothing here allocates,
/// locks or blocks: atomics, `recv(2)`, the frame parsed in place on this stack, one
/// page-sized copy and one `mprotect`.
fn take_page_from_socket(link: &DirectSender, addr: usize, start: usize) -> LaneTake {
    let Some(fast) = fast_faults() else {
        return LaneTake::NotYet;
    };
    if !fast.fetched_room() {
        return LaneTake::NoRoom;
    }
    let page = (addr - start) / PAGE_SIZE;
    let app = start + page * PAGE_SIZE;
    let mut frame = [0u8; PLAIN_REPLY_FRAME_MAX];
    // The reply's `applied` entries, packed by `install` for `record`.
    let applied = Cell::new([0u64; crate::engine::FETCHED_APPLIED_MAX]);
    let entries = Cell::new(0);
    let install = &mut |payload: &[u8]| {
        let Some(reply) = plain_page_reply(payload) else {
            return false;
        };
        if reply.page as usize != page || reply.applied().len() > crate::engine::FETCHED_APPLIED_MAX
        {
            return false;
        }
        // SAFETY: the page is invalid and this thread's fetch of it outstanding, and its
        // reply is in the socket bytes the link lets only this thread read now.
        unsafe { runtime_page_of_fetch(page) }.copy_from_slice(reply.data);
        let mut packed = [0u64; crate::engine::FETCHED_APPLIED_MAX];
        for (slot, entry) in packed.iter_mut().zip(reply.applied()) {
            *slot = crate::engine::pack_applied(entry);
        }
        applied.set(packed);
        entries.set(reply.applied().len());
        // If not readable, left in the socket for the comm thread, whose copy overwrites
        // this one.
        protect_app_page(app, libc::PROT_READ)
    };
    // Recorded before the link's reader may read on, so the engine takes the page in
    // before anything the home sent after the reply. Room was there, and only this
    // thread records, so the record goes in.
    let record = &mut |_: &[u8]| {
        let recorded = fast.record_fetched(
            link.peer() as u32,
            page as dsm_proto::PageNo,
            &applied.get()[..entries.get()],
        );
        debug_assert!(recorded, "room for a fetched record was checked first");
    };
    match link.try_take_frame(&mut frame, install, record) {
        DirectTake::NotThere => return LaneTake::NotYet,
        DirectTake::Other => {
            // Something else comes first: the reader takes it in, and the reply with it.
            link.await_reply(false);
            return LaneTake::NotYet;
        }
        // Taken (or read out of a socket that then failed, whole: the page is installed
        // and recorded all the same, and the reader reports the link).
        DirectTake::Taken | DirectTake::Broken => link.await_reply(false),
    }
    kick_if_backlog_high(fast);
    LaneTake::Taken
}

pub(crate) fn set_fast_faults(fast: Option<Arc<FastFaults>>) {
    let ptr = fast.map_or(std::ptr::null_mut(), |f| Arc::into_raw(f).cast_mut());
    HANDLER.fast.store(ptr, Ordering::Release);
}

/// The handler's message when a thread faults on the segment while it holds the engine.
const FAULT_IN_ENGINE: &[u8] = b"dsm: fatal: page fault on shared memory by a thread that holds \
the protocol engine's lock; this is a bug in dsm (the engine must never touch the app view)\n";

/// Stops the process from inside the handler: one `write` of a fixed message, then abort.
fn abort_fault_in_engine() -> ! {
    // SAFETY: write(2) and abort(3) are async-signal-safe; the buffer is a static.
    unsafe {
        libc::write(2, FAULT_IN_ENGINE.as_ptr().cast(), FAULT_IN_ENGINE.len());
        libc::abort()
    }
}

/// Serves a write fault at `addr` (inside the segment that starts at `start`) in the
/// handler if the engine armed its page. Returns false to take the slow path.
fn fast_write_fault(addr: usize, start: usize) -> bool {
    let Some(fast) = fast_faults() else {
        return false;
    };
    let page = (addr - start) / PAGE_SIZE;
    let app = start + page * PAGE_SIZE;
    let runtime = HANDLER.runtime_base.load(Ordering::Relaxed) + page * PAGE_SIZE;
    fast.handler_write_fault(
        page,
        || protect_app_page(app, libc::PROT_READ | libc::PROT_WRITE),
        |slot: &[AtomicU64]| {
            let src = runtime as *const u64;
            for (i, word) in slot.iter().enumerate().take(PAGE_SIZE / 8) {
                // SAFETY: `runtime` is the page's address in the runtime view, mapped for
                // the life of the process, page-aligned, and i < PAGE_SIZE / 8. Nothing
                // writes a valid non-home page there (the comm thread installs fetched
                // pages, which are invalid, and applies diffs to home pages only), and the
                // app thread is here, so the copy is the page as it was before the write.
                word.store(unsafe { std::ptr::read(src.add(i)) }, Ordering::Relaxed);
            }
        },
    )
    .is_ok()
}
static PREVIOUS_ACTION: OnceLock<SavedAction> = OnceLock::new();

struct SavedAction(libc::sigaction);
// SAFETY: a plain C struct of function pointers and flags, only read after being set once.
unsafe impl Send for SavedAction {}
unsafe impl Sync for SavedAction {}

/// What the comm thread learns of a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) addr: usize,
    /// `None` when the architecture does not report the access kind.
    pub(crate) write: Option<bool>,
}

/// From the handler, while a read fault's page is being fetched: commits the page at
/// `offset` in the runtime view (`MADV_POPULATE_WRITE`), so that on a page this rank never
/// held the kernel's first-touch work overlaps the round trip instead of lengthening the
/// comm thread's copy into it (3.5 us of a 22 us remote fault, measured). Contents are
/// unchanged. On a kernel without the advice the copy does the work, as before, so the
/// result is not checked.
fn commit_runtime_page(offset: usize) {
    let page_start = (offset & !(PAGE_SIZE - 1)) + HANDLER.runtime_base.load(Ordering::Relaxed);
    // SAFETY: `offset` lies inside the segment (the handler checked the address), so the
    // page lies inside the runtime mapping, which is always readable and writable;
    // madvise is a system call, async-signal-safe, and populating changes no byte.
    unsafe {
        libc::madvise(
            page_start as *mut libc::c_void,
            PAGE_SIZE,
            libc::MADV_POPULATE_WRITE,
        )
    };
}

#[cfg(target_arch = "x86_64")]
fn fault_is_write(ctx: *mut libc::c_void) -> u32 {
    // SAFETY: for SA_SIGINFO handlers the kernel passes a valid ucontext_t; on x86_64 the
    // page-fault error code is in gregs[REG_ERR], bit 1 set for writes.
    let err =
        unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
    u32::from(err & 2 != 0)
}

#[cfg(not(target_arch = "x86_64"))]
fn fault_is_write(_ctx: *mut libc::c_void) -> u32 {
    2
}

/// Makes SIGSEGV take its default action, so that returning from our handler re-executes
/// the faulting instruction and the process dies of it as it would without dsm.
fn die_by_default_on_return() {
    // SAFETY: an all-zero sigaction with SIG_DFL is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    // SAFETY: sigaction is async-signal-safe; the struct is valid.
    unsafe { libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()) };
}

/// Hands a fault dsm does not own to whatever handled SIGSEGV before us, the way wasmtime
/// chains: a handler function is called in place (Rust's own stack-overflow handler, a
/// profiler's, a JIT's), and our handler stays installed for the faults that follow; only
/// if there was none (`SIG_DFL`, or `SIG_IGN`, which cannot ignore a real fault) does the
/// default action come back, which then ends the process.
fn chain_to_previous(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(SavedAction(prev)) = PREVIOUS_ACTION.get() else {
        die_by_default_on_return();
        return;
    };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        die_by_default_on_return();
        return;
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous disposition declared SA_SIGINFO, so `handler` is the address
        // of a function with the three-argument signature, installed by code of this
        // process; we pass it the kernel's own arguments, as the kernel would have.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO, `handler` is a one-argument signal handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    if code <= 0 {
        // Sent by kill/raise/sigqueue, not a fault: nothing re-faults on return, so die
        // from it the default way.
        die_by_default_on_return();
        // SAFETY: raise is async-signal-safe; SIGSEGV is blocked until we return.
        unsafe { libc::raise(libc::SIGSEGV) };
        return;
    }
    let start = HANDLER.seg_start.load(Ordering::Relaxed);
    let end = HANDLER.seg_end.load(Ordering::Relaxed);
    if addr < start || addr >= end || HANDLER.kick_fd.load(Ordering::Relaxed) < 0 {
        chain_to_previous(sig, info, ctx);
        return;
    }
    if IN_ENGINE.with(Cell::get) {
        abort_fault_in_engine();
    }
    let errno = errno_location();
    // SAFETY: errno slot of this thread; preserved across our syscalls.
    let saved_errno = unsafe { *errno };
    let kind = fault_is_write(ctx);
    if kind == 1 && fast_write_fault(addr, start) {
        // SAFETY: restoring this thread's errno.
        unsafe { *errno = saved_errno };
        return;
    }

    // One fault at a time: other faulting threads wait for the slot.
    HANDLER.slot.claim(addr, kind);
    // A parked fault polls for the process's budget before it sleeps (`crate::spin`).
    let spin_ns = crate::spin::budget_ns();
    // A read fault of a page the engine armed asks the home itself, if this thread will
    // poll for the answer; otherwise, or once the budget is spent, the comm thread takes
    // the fault (and with it the wait for the copy).
    let mut asked = None;
    if spin_ns > 0 && kind == 0 {
        asked = ask_home(addr, start);
    }
    if asked.is_none() {
        hand_to_comm_thread();
    }
    // A read fault is a fetch of an invalid page (or a wild access): once the comm thread
    // has taken it, this thread has nothing to do until the page comes.
    let (outcome, waited) = wait_for_outcome(addr, start, spin_ns, kind == 0, &mut asked);
    if let Some(slept) = waited {
        crate::spin::count_wait(!slept);
    }
    match asked {
        // Resolved by the comm thread, which read the announcement (or the reply) already.
        Some(Asked::Lane(end)) => stop_polling_lane(end, false),
        Some(Asked::Socket(link)) => link.await_reply(false),
        None => {}
    }
    HANDLER.slot.release();
    if outcome == SlotState::Crash {
        // Inside the segment but in no allocation: a wild access; crash like one.
        die_by_default_on_return();
    }
    // SAFETY: restoring this thread's errno.
    unsafe { *errno = saved_errno };
}

/// From the handler, holding the slot with its fault posted or asked for: waits for the
/// outcome, polling for `spin_ns` (meanwhile taking a read fault's page from the home's
/// lane or socket itself when `commit_page`), then handing an asked fault's wait to the
/// comm thread, then sleeping. Returns the outcome (`Resolved` also when this thread took
/// the page itself; `asked` is then emptied and the lane let go) and, if the thread
/// waited, whether it slept.
fn wait_for_outcome(
    addr: usize,
    start: usize,
    spin_ns: u64,
    commit_page: bool,
    asked: &mut Option<Asked>,
) -> (SlotState, Option<bool>) {
    // Set once the wait is the comm thread's (the budget spent): the engine then owns the
    // fetch, and a page this thread took from the lane could race its step for the fault.
    let mut handed_over = false;
    let mut spin_from = if spin_ns > 0 { monotonic_ns() } else { 0 };
    let (mut polled, mut slept) = (false, false);
    let waited = |polled: bool, slept: bool| (polled || slept).then_some(slept);
    let mut committed = false;
    loop {
        let s = HANDLER.slot.state();
        if matches!(s, SlotState::Resolved | SlotState::Crash) {
            return (s, waited(polled, slept));
        }
        if (s == SlotState::Taken && !handed_over || s == SlotState::Asked) && commit_page {
            let took = match *asked {
                Some(Asked::Socket(link)) if s == SlotState::Asked => {
                    take_page_from_socket(link, addr, start)
                }
                _ => take_page_from_lane(addr, start),
            };
            if took == LaneTake::NoRoom && s == SlotState::Asked {
                // The engine must take records in before this thread can install more:
                // hand the wait over now rather than poll for the budget.
                spin_from = spin_from.wrapping_sub(spin_ns);
            }
            if took == LaneTake::Taken {
                if let Some(Asked::Lane(end)) = asked.take() {
                    stop_polling_lane(end, false);
                }
                // The fault is over: the engine takes the page in from the record at the
                // start of its next event (before any next fault), resolving nothing.
                HANDLER.lane_home.store(0, Ordering::Release);
                return (SlotState::Resolved, waited(polled, slept));
            }
            if !committed {
                committed = true;
                commit_runtime_page(addr - start);
                continue;
            }
        }
        if spin_ns > 0 && monotonic_ns().wrapping_sub(spin_from) < spin_ns {
            polled = true;
            // SAFETY: sched_yield has no arguments and is async-signal-safe.
            unsafe { libc::sched_yield() };
            continue;
        }
        if s == SlotState::Asked {
            // No answer within the budget: the comm thread takes over the wait (its engine
            // adopts the fetch this thread asked for), and this thread sleeps.
            match asked.take() {
                Some(Asked::Lane(end)) => stop_polling_lane(end, true),
                Some(Asked::Socket(link)) => link.await_reply(false),
                None => {}
            }
            handed_over = true;
            // The comm thread takes the page when its announcement comes, without
            // deferring to this thread.
            HANDLER.lane_home.store(0, Ordering::Release);
            if HANDLER.slot.hand_over_asked() {
                kick_unless_watched();
            }
            spin_from = monotonic_ns();
            continue;
        }
        slept = true;
        HANDLER.slot.sleep_while(s);
    }
}

/// From the handler: posts the fault in the slot for the comm thread and wakes it, unless
/// it is watching the slot already.
fn hand_to_comm_thread() {
    // SeqCst against the comm thread's `HANDLER.comm_watching` clear and re-look
    // (`FaultMailbox::watch`): either it sees this fault, or this thread sees it is not
    // watching and kicks it.
    HANDLER.slot.post();
    kick_unless_watched();
}

/// From the handler, a fault just posted: kicks the comm thread unless it watches the slot.
fn kick_unless_watched() {
    if !HANDLER.comm_watching.load(Ordering::SeqCst) {
        kick();
    }
}

/// From the handler: wakes the comm thread, which serves the pending fault if there is one
/// and otherwise has its engine take in what the handler did.
fn kick() {
    let kick: u8 = 1;
    // SAFETY: write(2) on a socket is async-signal-safe; the buffer is 1 valid byte.
    unsafe {
        libc::write(
            HANDLER.kick_fd.load(Ordering::Relaxed),
            (&kick as *const u8).cast(),
            1,
        )
    };
}

/// Receiving end of the fault mailbox, owned by the comm thread.
pub(crate) struct FaultMailbox {
    /// Kept open so the handler's writes always have a peer.
    _kick_tx: std::os::unix::net::UnixStream,
    kick_rx: Option<std::os::unix::net::UnixStream>,
}

impl FaultMailbox {
    /// The nonblocking stream that becomes readable when a fault is pending; drain it,
    /// then call [`FaultMailbox::take`].
    pub(crate) fn take_receiver(&mut self) -> Option<std::os::unix::net::UnixStream> {
        self.kick_rx.take()
    }

    /// The pending fault, if any (each fault is delivered once).
    pub(crate) fn take(&self) -> Option<Fault> {
        let (addr, write) = HANDLER.slot.take()?;
        Some(Fault { addr, write })
    }

    /// Whether the comm thread has taken a fault and not yet resolved it (a fetch for it is
    /// under way).
    pub(crate) fn in_service(&self) -> bool {
        HANDLER.slot.state() == SlotState::Taken
    }

    /// Lets the faulting thread retry its access.
    pub(crate) fn resolve(&self) {
        self.finish(SlotState::Resolved);
    }

    /// Tells the faulting thread its access is a genuine segmentation fault.
    pub(crate) fn crash(&self) {
        self.finish(SlotState::Crash);
    }

    /// Posts `outcome` for the fault in service: one posted, taken, or asked for by the
    /// handler. A slot in any other state has no fault the engine could be answering (its
    /// fault ended in the handler, or the next one is being posted), so it is left alone.
    fn finish(&self, outcome: SlotState) {
        if HANDLER.slot.try_finish(outcome) {
            HANDLER.lane_home.store(0, Ordering::Release);
            HANDLER.slot.wake();
        }
    }

    /// Polls the slot for the next fault for up to `budget` ([`crate::spin::poll_for`]),
    /// telling the handler meanwhile that it need not kick: the comm thread is looking.
    /// The last look comes after the flag is cleared, so a fault whose handler saw the
    /// flag set is taken here rather than left without a kick.
    pub(crate) fn watch(&self, budget: std::time::Duration) -> Option<Fault> {
        HANDLER.comm_watching.store(true, Ordering::SeqCst);
        let seen = crate::spin::poll_for(budget, || match self.take() {
            Some(f) => Some(Some(f)),
            None if handler_asking() => Some(None),
            None => None,
        })
        .flatten();
        HANDLER.comm_watching.store(false, Ordering::SeqCst);
        seen.or_else(|| self.take())
    }
}

impl Drop for FaultMailbox {
    fn drop(&mut self) {
        // From now on faults in the segment are treated as crashes.
        HANDLER.kick_fd.store(-1, Ordering::Relaxed);
    }
}

/// Maps the process's segment at `addr` (in `common`, the job's common segment file, if
/// given) for the rest of its life, records it for
/// [`AppSlice::new_in_global_segment`] and installs the fault handler for it: the safe entry
/// point to everything below.
pub(crate) fn start(
    addr: usize,
    len: usize,
    file: SegmentFile,
    nodes: usize,
) -> io::Result<(&'static Segment, FaultMailbox)> {
    let seg: &'static Segment = Box::leak(Box::new(Segment::map(addr, len, file, nodes)?));
    set_global_segment(seg);
    // SAFETY: the segment is leaked, so it stays mapped for the life of the process, longer
    // than any fault the handler can be asked to serve.
    let mailbox = unsafe { install_fault_handler(seg)? };
    Ok((seg, mailbox))
}

/// Installs the SIGSEGV handler for faults inside `seg`, and returns the mailbox the comm
/// thread serves. Faults outside the segment are chained to the previous disposition.
///
/// # Safety
///
/// `seg` must stay mapped for as long as the returned mailbox lives: the handler resolves
/// faults in its address range by changing the protection of its pages.
pub(crate) unsafe fn install_fault_handler(seg: &Segment) -> io::Result<FaultMailbox> {
    use std::os::fd::AsRawFd;
    let (kick_tx, kick_rx) = std::os::unix::net::UnixStream::pair()?;
    kick_rx.set_nonblocking(true)?;
    let efd = kick_tx.as_raw_fd();
    HANDLER
        .runtime_base
        .store(seg.runtime_base(), Ordering::Relaxed);
    HANDLER.seg_start.store(seg.app_base(), Ordering::Relaxed);
    HANDLER
        .seg_end
        .store(seg.app_base() + seg.len(), Ordering::Relaxed);
    HANDLER.kick_fd.store(efd, Ordering::Release);
    if !HANDLER.installed.swap(true, Ordering::AcqRel) {
        // SAFETY: building a sigaction for our handler; zeroed is a valid starting value.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigsegv as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sa_mask is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: zeroed sigaction is a valid out-parameter.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: installing a handler that is async-signal-safe (see on_sigsegv).
        if unsafe { libc::sigaction(libc::SIGSEGV, &sa, &mut old) } != 0 {
            HANDLER.installed.store(false, Ordering::Release);
            return Err(os_err("sigaction(SIGSEGV)"));
        }
        let _ = PREVIOUS_ACTION.set(SavedAction(old));
    }
    install_alt_stack()?;
    Ok(FaultMailbox {
        _kick_tx: kick_tx,
        kick_rx: Some(kick_rx),
    })
}

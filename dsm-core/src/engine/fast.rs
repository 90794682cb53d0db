//! Write faults served inside the SIGSEGV handler, without waking the comm thread: the
//! lock-free state the handler and the engine share, and nothing else (no I/O, no
//! `unsafe`; the handler's page copy and `mprotect` are closures it passes in).
//!
//! A write to a valid, write-protected page (the engine's
//! [`PageState::ReadOnly`](super::PageState::ReadOnly)) needs no peer: a non-home page
//! needs a twin and write access, a home page only write access and a write notice at the
//! end of the interval. The handler does that itself when the engine has *armed* the page:
//!
//! - **Per-page word** ([`FastFaults::page_word`]): `IDLE` (the handler must take the slow
//!   path), `ARMED_HOME` / `ARMED_REMOTE` (the page is `ReadOnly` in the engine and
//!   write-protected in the app view; the handler may take it), `CLAIMED` (the handler is
//!   making it writable), `DONE` (it is writable and the engine has not yet heard of it).
//!   The handler moves `ARMED_* -> CLAIMED` with a compare-and-swap; the engine moves
//!   `ARMED_* -> IDLE` the same way before it changes anything about an armed page
//!   ([`Engine::settle`](super::Engine)), so exactly one of them wins. If the engine loses,
//!   it waits for `DONE` (the handler's work is a page copy and one `mprotect`, and the
//!   handler never waits for the engine) and takes the write in as if it had made it.
//! - **Twin slots**: a pool of page-sized buffers the engine makes (outside the handler)
//!   and hands to the handler through the *free ring*; the handler copies the page into a
//!   slot before it lets the write through. The engine diffs against the slot at the end
//!   of the interval and returns the slot to the free ring.
//! - **Done ring**: `(page, slot)` for every write the handler let through, drained by the
//!   engine at the start of every event it handles.
//!
//! The same word lets the handler fetch an invalid page itself when its home is a
//! co-located rank (see `sys`'s fault handler and dsm-net's page lanes): the engine *arms*
//! an invalid page that needs no diff from a third party (`FETCH_ARMED | home`); the
//! handler claims it (`FETCH_CLAIMED | home`) and posts the request in the home's lane
//! itself. The word stays claimed until the engine takes the copy in, however it came:
//! the handler's record ([`FastFaults::record_fetched`]), or a reply the comm thread
//! received, in which case the engine adopts the fetch as its own
//! ([`FastFaults::fetch_claimed`]).
//!
//! Both rings are single-producer single-consumer: the engine's side runs under the engine
//! lock, and the handler's side under [`FastFaults`]'s busy flag (a second thread faulting
//! meanwhile takes the slow path). Whenever the fast path cannot be taken (page not armed,
//! no free slot, done ring full, busy, the access kind unknown, `mprotect` failed) the
//! handler falls back to handing the fault to the comm thread, which is always correct.

use dsm_proto::PageNo;
use std::sync::OnceLock;
// Atomics, spin hints and the sizes of the pool and its queues come through the parent's
// `fast_deps`, so that the model test (`tests/fast_faults_model.rs`) can run this same
// file on loom's atomics and a pool of a few words; the unit tests are `fast_tests.rs`,
// beside this file, as they run on the real ones.
use super::fast_deps::{
    spin_loop, yield_now, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    FETCHED_MAX, PAGE_CHUNK_SHIFT, SLOT_CHUNK, SLOT_WORDS,
};

/// The handler must hand the fault to the comm thread.
pub const IDLE: u8 = 0;
/// A home page the handler may make writable (no twin needed).
pub const ARMED_HOME: u8 = 1;
/// A non-home page the handler may twin and make writable.
pub const ARMED_REMOTE: u8 = 2;
/// The handler is making the page writable.
pub const CLAIMED: u8 = 3;
/// The handler made the page writable; the engine has not taken it in yet.
pub const DONE: u8 = 4;
/// `FETCH_ARMED | home`: an invalid page the handler may fetch from `home` (< 64) itself.
pub const FETCH_ARMED: u8 = 0x80;
/// `FETCH_CLAIMED | home`: the handler asked `home` for the page; the engine has not taken
/// the copy in yet.
pub const FETCH_CLAIMED: u8 = 0xC0;
/// The bits of a fetch word that say which.
const FETCH_KIND: u8 = 0xC0;
/// Most homes a fetch word can name.
pub const FETCH_HOMES: u16 = 64;

const PAGE_CHUNK: usize = 1 << PAGE_CHUNK_SHIFT;
/// A done-ring entry's slot for a home page (no twin).
pub const NO_SLOT: u32 = u32::MAX;

/// A bounded single-producer single-consumer queue of `u64`s.
pub(super) struct Ring {
    buf: Box<[AtomicU64]>,
    /// Next index the consumer reads (only the consumer stores it).
    head: AtomicUsize,
    /// Next index the producer writes (only the producer stores it).
    tail: AtomicUsize,
}

impl Ring {
    pub(super) fn new(capacity: usize) -> Ring {
        Ring {
            buf: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    /// Producer side: whether a push would succeed now (only the producer makes it fail).
    pub(super) fn has_room(&self) -> bool {
        let t = self.tail.load(Ordering::Relaxed);
        t - self.head.load(Ordering::Acquire) < self.buf.len()
    }

    pub(super) fn push(&self, v: u64) -> bool {
        let t = self.tail.load(Ordering::Relaxed);
        if t - self.head.load(Ordering::Acquire) == self.buf.len() {
            return false;
        }
        self.buf[t % self.buf.len()].store(v, Ordering::Relaxed);
        self.tail.store(t + 1, Ordering::Release);
        true
    }

    /// Consumer side: whether a pop would succeed now (only the consumer makes it fail).
    pub(super) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed) == self.tail.load(Ordering::Acquire)
    }

    pub(super) fn pop(&self) -> Option<u64> {
        let h = self.head.load(Ordering::Relaxed);
        if h == self.tail.load(Ordering::Acquire) {
            return None;
        }
        let v = self.buf[h % self.buf.len()].load(Ordering::Relaxed);
        self.head.store(h + 1, Ordering::Release);
        Some(v)
    }
}

/// What [`FastFaults::take_back`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakenBack {
    /// The handler could not take the page.
    WasIdle,
    /// The page was armed; now the handler cannot take it.
    WasArmed,
    /// The handler made the page writable; drain before deciding anything about it.
    HandlerWrote,
    /// The handler asked the page's home for it: a fetch of the page is under way, which
    /// the engine takes over (see [`FastFaults::fetch_claimed`]).
    HandlerFetching,
}

/// Why the handler did not serve a write fault itself (counted for the stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The page was not armed (not a valid write-protected page, or the engine is busy
    /// with it).
    NotArmed,
    /// No free twin slot, or the done ring is full: the engine grows the pool.
    NoRoom,
    /// Another thread is in the fast path.
    Busy,
    /// `mprotect` failed; the slow path reports it.
    Protect,
}

/// The state the SIGSEGV handler and the engine share for write faults served in the
/// handler (see the module documentation).
pub struct FastFaults {
    pages: Box<[OnceLock<Box<[AtomicU8]>>]>,
    slots: Box<[OnceLock<Box<[AtomicU64]>>]>,
    /// Slot numbers the handler may fill (engine -> handler).
    free: Ring,
    /// `page << 32 | slot` of the writes the handler let through (handler -> engine).
    done: Ring,
    busy: AtomicBool,
    /// Faults the handler could not serve for want of a slot or ring room since the
    /// engine last looked.
    short: AtomicU64,
    /// The pages the handler installed from co-located homes' page lanes, not yet taken in
    /// by the engine (handler -> engine, single-producer single-consumer: the handler
    /// serves one fault at a time). Several may wait: a fault the handler both asked for
    /// and served wakes nobody, so the engine hears of it only at its next event.
    fetched: Box<[FetchedRecord]>,
    /// Next record the engine reads (only the engine stores it).
    fetched_head: AtomicUsize,
    /// Next record the handler writes (only the handler stores it).
    fetched_tail: AtomicUsize,
}

/// One page the handler installed (see [`FastFaults::record_fetched`]).
struct FetchedRecord {
    page: AtomicU32,
    from: AtomicU32,
    /// `applied` entries, `writer << 32 | interval`.
    applied: Box<[AtomicU64]>,
    applied_len: AtomicUsize,
}

/// Records waiting at which the handler wakes the comm thread to have the engine take
/// them in ([`FastFaults::fetched_backlog_high`]), well before the handler runs out.
pub(super) const FETCHED_HIGH: usize = FETCHED_MAX / 2;

/// One `(writer, interval)` entry of a copy's `applied` list as the lanes and the
/// handler's record carry it: `writer << 32 | interval`.
pub fn pack_applied(&(writer, interval): &(u16, u32)) -> u64 {
    (u64::from(writer) << 32) | u64::from(interval)
}

/// The `(writer, interval)` entry [`pack_applied`] made.
pub fn unpack_applied(packed: u64) -> (u16, u32) {
    ((packed >> 32) as u16, packed as u32)
}

/// Most `applied` entries a page installed by the handler carries (as many as a lane).
pub const FETCHED_APPLIED_MAX: usize = 64;

/// A page the handler installed from a lane ([`FastFaults::take_fetched`]).
#[derive(Debug, PartialEq, Eq)]
pub struct FetchedPage {
    /// Its home, which left it in the lane.
    pub home: u16,
    /// The page.
    pub page: PageNo,
    /// The copy's `applied` entries, `(writer, interval)`, as in a
    /// [`PageCopy`](dsm_proto::PageCopy).
    pub applied: Vec<(u16, u32)>,
}

impl FastFaults {
    /// Shared state for a segment of `pages` pages, with room for at most `max_slots`
    /// twins in the handler's pool per interval. Only directories are allocated here; the
    /// page words and slots are made by [`FastFaults::reserve_pages`] and
    /// [`FastFaults::grow_slots`].
    pub fn new(pages: usize, max_slots: usize) -> FastFaults {
        let max_slots = max_slots.clamp(SLOT_CHUNK, 1 << 20);
        FastFaults {
            pages: (0..pages.div_ceil(PAGE_CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
            slots: (0..max_slots.div_ceil(SLOT_CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
            free: Ring::new(max_slots.div_ceil(SLOT_CHUNK) * SLOT_CHUNK),
            done: Ring::new(max_slots.div_ceil(SLOT_CHUNK) * SLOT_CHUNK * 2),
            busy: AtomicBool::new(false),
            short: AtomicU64::new(0),
            fetched: (0..FETCHED_MAX)
                .map(|_| FetchedRecord {
                    page: AtomicU32::new(0),
                    from: AtomicU32::new(0),
                    applied: (0..FETCHED_APPLIED_MAX)
                        .map(|_| AtomicU64::new(0))
                        .collect(),
                    applied_len: AtomicUsize::new(0),
                })
                .collect(),
            fetched_head: AtomicUsize::new(0),
            fetched_tail: AtomicUsize::new(0),
        }
    }

    /// Handler side: records that it installed `page`, homed at `from`, with its
    /// `applied` entries (`writer << 32 | interval`, at most [`FETCHED_APPLIED_MAX`]).
    /// Returns false, recording nothing, if 32 records are still untaken or
    /// `applied` is too long (the handler then leaves the page to the comm thread).
    pub fn record_fetched(&self, from: u32, page: PageNo, applied: &[u64]) -> bool {
        let tail = self.fetched_tail.load(Ordering::Relaxed);
        if applied.len() > FETCHED_APPLIED_MAX
            || tail - self.fetched_head.load(Ordering::Acquire) == FETCHED_MAX
        {
            return false;
        }
        let rec = &self.fetched[tail % FETCHED_MAX];
        rec.page.store(page, Ordering::Relaxed);
        rec.from.store(from, Ordering::Relaxed);
        for (slot, &a) in rec.applied.iter().zip(applied) {
            slot.store(a, Ordering::Relaxed);
        }
        rec.applied_len.store(applied.len(), Ordering::Relaxed);
        self.fetched_tail.store(tail + 1, Ordering::Release);
        true
    }

    /// Handler side: whether a [`FastFaults::record_fetched`] now would find room (only
    /// the thread that holds the fault slot records, so room found stays until it does).
    pub fn fetched_room(&self) -> bool {
        self.fetched_tail.load(Ordering::Relaxed) - self.fetched_head.load(Ordering::Acquire)
            < FETCHED_MAX
    }

    /// Handler side, having just recorded a page: whether the records waiting have just
    /// reached a mark at which the engine should take them in (the handler then wakes the
    /// comm thread, which runs an engine step): half the queue, and every eighth record
    /// after, so a comm thread slow to come is woken again but not at every fault.
    pub fn fetched_backlog_high(&self) -> bool {
        let waiting =
            self.fetched_tail.load(Ordering::Relaxed) - self.fetched_head.load(Ordering::Acquire);
        waiting >= FETCHED_HIGH && waiting.is_multiple_of(8)
    }

    /// Engine side: the oldest page the handler installed and the engine has not taken
    /// in, if any.
    pub fn take_fetched(&self) -> Option<FetchedPage> {
        let head = self.fetched_head.load(Ordering::Relaxed);
        if head == self.fetched_tail.load(Ordering::Acquire) {
            return None;
        }
        let rec = &self.fetched[head % FETCHED_MAX];
        let n = rec.applied_len.load(Ordering::Relaxed);
        let got = FetchedPage {
            home: rec.from.load(Ordering::Relaxed) as u16,
            page: rec.page.load(Ordering::Relaxed),
            applied: rec.applied[..n]
                .iter()
                .map(|a| unpack_applied(a.load(Ordering::Relaxed)))
                .collect(),
        };
        self.fetched_head.store(head + 1, Ordering::Release);
        Some(got)
    }

    /// Makes the page words of pages `..end` (engine side, at allocation).
    pub fn reserve_pages(&self, end: usize) {
        let last = end.div_ceil(PAGE_CHUNK).min(self.pages.len());
        for slot in &self.pages[..last] {
            slot.get_or_init(|| (0..PAGE_CHUNK).map(|_| AtomicU8::new(IDLE)).collect());
        }
    }

    /// The word of `page`, if an allocation has reached it.
    #[inline]
    pub fn page_word(&self, page: usize) -> Option<&AtomicU8> {
        let chunk = self.pages.get(page >> PAGE_CHUNK_SHIFT)?.get()?;
        Some(&chunk[page & (PAGE_CHUNK - 1)])
    }

    fn slot(&self, slot: u32) -> &[AtomicU64] {
        let s = slot as usize;
        let chunk = self.slots[s / SLOT_CHUNK]
            .get()
            .expect("slot numbers come from made chunks");
        let at = (s % SLOT_CHUNK) * SLOT_WORDS;
        &chunk[at..at + SLOT_WORDS]
    }

    /// Slots made so far.
    pub fn slots_made(&self) -> usize {
        self.slots.iter().take_while(|c| c.get().is_some()).count() * SLOT_CHUNK
    }

    /// Most slots the pool may hold.
    pub fn max_slots(&self) -> usize {
        self.slots.len() * SLOT_CHUNK
    }

    /// Engine side: makes slots until at least `want` exist (at most the maximum) and
    /// hands the new ones to the handler. Returns how many were made.
    pub fn grow_slots(&self, want: usize) -> usize {
        let mut made = 0;
        for (c, chunk) in self.slots.iter().enumerate() {
            if c * SLOT_CHUNK >= want {
                break;
            }
            if chunk.get().is_some() {
                continue;
            }
            let _ = chunk.set(
                (0..SLOT_CHUNK * SLOT_WORDS)
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            );
            for s in 0..SLOT_CHUNK {
                let pushed = self.free.push((c * SLOT_CHUNK + s) as u64);
                debug_assert!(pushed, "the free ring holds every slot");
            }
            made += SLOT_CHUNK;
        }
        made
    }

    /// Engine side: gives a slot back to the handler once its twin has been diffed.
    pub fn release_slot(&self, slot: u32) {
        let pushed = self.free.push(u64::from(slot));
        debug_assert!(pushed, "the free ring holds every slot");
    }

    /// Engine side: copies a slot's twin into `out` (one page).
    pub fn read_slot(&self, slot: u32, out: &mut [u8]) {
        for (w, bytes) in self.slot(slot).iter().zip(out.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
    }

    /// Engine side: how many faults the handler left to the slow path for want of room
    /// since the last call.
    pub fn take_short(&self) -> u64 {
        self.short.swap(0, Ordering::Relaxed)
    }

    /// Engine side: lets the handler take `page` (a `ReadOnly` page whose app view is
    /// write-protected). Returns false if the page's word is not idle.
    pub fn arm(&self, page: PageNo, home: bool) -> bool {
        let Some(w) = self.page_word(page as usize) else {
            return false;
        };
        let armed = if home { ARMED_HOME } else { ARMED_REMOTE };
        w.compare_exchange(IDLE, armed, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Engine side: takes `page` back from the handler. Returns true if the handler had
    /// made it writable first (the engine must then [`FastFaults::drain`] before deciding
    /// anything about the page); after either answer the handler leaves the page alone
    /// until it is armed again. Waits while the handler is working on the page.
    pub fn disarm(&self, page: PageNo) -> bool {
        self.take_back(page) == TakenBack::HandlerWrote
    }

    /// [`FastFaults::disarm`], saying also whether the page was armed.
    pub fn take_back(&self, page: PageNo) -> TakenBack {
        let Some(w) = self.page_word(page as usize) else {
            return TakenBack::WasIdle;
        };
        let mut spins = 0u32;
        loop {
            match w.load(Ordering::Acquire) {
                IDLE => return TakenBack::WasIdle,
                DONE => return TakenBack::HandlerWrote,
                // The fetch outlives the engine's step: nothing to wait for.
                w if w & FETCH_KIND == FETCH_CLAIMED => return TakenBack::HandlerFetching,
                CLAIMED => {
                    // The handler copies a page and calls mprotect, then stores DONE; it
                    // never waits for the engine.
                    spins += 1;
                    if spins < 1000 {
                        spin_loop();
                    } else {
                        yield_now();
                    }
                }
                armed => {
                    if w.compare_exchange(armed, IDLE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return TakenBack::WasArmed;
                    }
                }
            }
        }
    }

    /// Engine side: lets the handler fetch `page`, an invalid page homed at `home` that
    /// needs no diff from anyone but the home. Returns false if the page's word is not idle
    /// or `home` cannot be named in it.
    pub fn arm_fetch(&self, page: PageNo, home: u16) -> bool {
        let Some(w) = self.page_word(page as usize) else {
            return false;
        };
        home < FETCH_HOMES
            && w.compare_exchange(
                IDLE,
                FETCH_ARMED | home as u8,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Handler side: claims `page` for a fetch of its own if the engine armed it; returns
    /// its home. The handler then owes the home a request (or [`FastFaults::unclaim_fetch`]).
    pub fn claim_fetch(&self, page: usize) -> Option<u16> {
        let w = self.page_word(page)?;
        let armed = w.load(Ordering::Relaxed);
        if armed & FETCH_KIND != FETCH_ARMED {
            return None;
        }
        let claimed = FETCH_CLAIMED | (armed & !FETCH_KIND);
        w.compare_exchange(armed, claimed, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| u16::from(armed & !FETCH_KIND))
    }

    /// Handler side: gives back a page it claimed but could not ask for.
    pub fn unclaim_fetch(&self, page: usize) {
        if let Some(w) = self.page_word(page) {
            let claimed = w.load(Ordering::Relaxed);
            if claimed & FETCH_KIND == FETCH_CLAIMED {
                // An exchange: the engine may have moved the word on meanwhile.
                let armed = FETCH_ARMED | (claimed & !FETCH_KIND);
                let _ = w.compare_exchange(claimed, armed, Ordering::Release, Ordering::Relaxed);
            }
        }
    }

    /// Engine side: the home the handler asked for `page`, if it did and the copy has not
    /// been taken in yet.
    pub fn fetch_claimed(&self, page: PageNo) -> Option<u16> {
        let w = self.page_word(page as usize)?.load(Ordering::Acquire);
        (w & FETCH_KIND == FETCH_CLAIMED).then_some(u16::from(w & !FETCH_KIND))
    }

    /// Engine side: `page` is no longer invalid (its copy came, whoever asked): its word,
    /// if armed or claimed for a fetch, goes back to idle. A page stops being invalid only
    /// by a fetch the engine knows of (its own, or the handler's it adopted or took in) or
    /// by what the app thread's own synchronization brings (pushes, prefetches); the
    /// handler claims a page only for its thread's fault, so none of these races with a
    /// claim (the runtime has one app thread, as the engine's single fetch in flight
    /// assumes too).
    pub fn end_fetch(&self, page: PageNo) {
        if let Some(w) = self.page_word(page as usize) {
            if w.load(Ordering::Acquire) & FETCH_ARMED != 0 {
                w.store(IDLE, Ordering::Release);
            }
        }
    }

    /// Engine side: whether the handler has let writes through that the engine has not
    /// taken in.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Engine side: the writes the handler let through, as `(page, twin slot)` (`None` for
    /// home pages), each page's word back to idle.
    pub fn drain(&self, mut f: impl FnMut(PageNo, Option<u32>)) {
        while let Some(v) = self.done.pop() {
            let page = (v >> 32) as PageNo;
            let slot = v as u32;
            if let Some(w) = self.page_word(page as usize) {
                // The handler pushes before it stores DONE.
                while w.load(Ordering::Acquire) == CLAIMED {
                    spin_loop();
                }
                w.store(IDLE, Ordering::Release);
            }
            f(page, (slot != NO_SLOT).then_some(slot));
        }
    }

    /// Handler side: serves a write fault on `page` if the engine armed it: claims the
    /// page, makes it writable with `make_writable` (false if that failed), copies the
    /// page's contents into a twin slot with `copy_twin` for a non-home page, and tells
    /// the engine. Never allocates, blocks or takes a lock.
    ///
    /// The caller is the thread whose write faulted, so nothing writes the page between
    /// `make_writable` and `copy_twin`: the twin is the page as it was before the write.
    pub fn handler_write_fault(
        &self,
        page: usize,
        make_writable: impl FnOnce() -> bool,
        copy_twin: impl FnOnce(&[AtomicU64]),
    ) -> Result<(), Miss> {
        let Some(w) = self.page_word(page) else {
            return Err(Miss::NotArmed);
        };
        let armed = w.load(Ordering::Relaxed);
        if armed != ARMED_HOME && armed != ARMED_REMOTE {
            return Err(Miss::NotArmed);
        }
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(Miss::Busy);
        }
        let result = self.serve_claimed(w, armed, page, make_writable, copy_twin);
        self.busy.store(false, Ordering::Release);
        result
    }

    fn serve_claimed(
        &self,
        w: &AtomicU8,
        armed: u8,
        page: usize,
        make_writable: impl FnOnce() -> bool,
        copy_twin: impl FnOnce(&[AtomicU64]),
    ) -> Result<(), Miss> {
        let remote = armed == ARMED_REMOTE;
        if !self.done.has_room() || remote && self.free.is_empty() {
            self.short.fetch_add(1, Ordering::Relaxed);
            return Err(Miss::NoRoom);
        }
        if w.compare_exchange(armed, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(Miss::NotArmed);
        }
        if !make_writable() {
            w.store(armed, Ordering::Release);
            return Err(Miss::Protect);
        }
        let slot = if remote {
            let slot = self.free.pop().expect("checked non-empty; only we pop") as u32;
            copy_twin(self.slot(slot));
            slot
        } else {
            NO_SLOT
        };
        let pushed = self.done.push((page as u64) << 32 | u64::from(slot));
        debug_assert!(pushed, "checked room; only we push");
        w.store(DONE, Ordering::Release);
        Ok(())
    }
}

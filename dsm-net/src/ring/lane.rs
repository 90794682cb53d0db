//! A page lane's protocol: who may write which of its words and its data page, and the
//! orderings that hand them over (see [`PageLane`]). It runs over [`LaneCells`], the
//! region's memory in a process; `tests/lane_model.rs` runs this same file over loom's
//! atomics, which is why it holds nothing but the protocol.

// Atomics come through the parent's `lane_deps` (loom's in the model test).
use super::lane_deps::{AtomicU32, AtomicU64, Ordering};

/// Most `(writer, interval)` entries a lane carries with its page; a copy with more goes
/// through the ring.
pub const LANE_APPLIED_MAX: usize = 64;

/// Bytes of the page a lane carries.
const LANE_PAGE: usize = 4096;

/// The memory of one lane: a 4-byte state word, 64-bit control words by byte offset (under
/// 4096) and one page of data. [`PageLane`] touches the data only while its state gives
/// the page to the caller (an empty lane to the home, a taken one to its taker); an
/// implementation may rely on that.
pub trait LaneCells {
    /// The state word.
    fn state(&self) -> &AtomicU32;
    /// The control word at byte `offset` (a multiple of 8).
    fn word(&self, offset: usize) -> &AtomicU64;
    /// Copies one page into the lane's data.
    fn put_data(&self, data: &[u8]);
    /// Copies the lane's data out (one page).
    fn get_data(&self, data: &mut [u8]);
}

/// What a [`PageLane`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneState {
    /// Nothing: the home may publish.
    Empty,
    /// A page the home published, not yet taken.
    Full,
    /// Taken by one thread of the requester, which copies it out and then empties it.
    Taken,
}

/// Where a page in a lane stands in its ring (see [`PageLane::publish`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LanePosition {
    /// The page.
    pub page: u64,
    /// Ring position where the frame announcing the page starts.
    pub after: u64,
    /// Ring position after the last frame before it that announces no lane page.
    pub needs: u64,
}

/// Offset in a lane's control page of its request slot: `page + 1` (0: none), then the
/// ring position the request comes after. Written by the lane ring's writer, the
/// requester; taken by the ring's reader.
const REQUEST: usize = 2048;
/// Offset in a lane's control page of the taker's flag: nonzero while a thread of the
/// requester polls the lane for a page (see [`PageLane::set_taker_polling`]).
const TAKER_POLLING: usize = 2112;

const LANE_EMPTY: u32 = 0;
const LANE_FULL: u32 = 1;
const LANE_TAKEN: u32 = 2;

/// One direction's page lane: a single slot beside the ring in which a home leaves the
/// page a co-located requester's fault waits for, so the faulting thread can take it
/// without waiting for its comm thread to read the ring (see dsm-core's fault handler).
/// The home publishes only into an empty lane; one thread of the requester takes a full
/// one (compare-and-swap) and empties it after copying. Every access is an atomic or a
/// copy into or out of the data page by the side the state gives it to.
pub struct PageLane<C> {
    cells: C,
}

impl<C: LaneCells> PageLane<C> {
    /// The lane over `cells`.
    pub fn new(cells: C) -> PageLane<C> {
        PageLane { cells }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        self.cells.word(offset)
    }

    fn state_word(&self) -> &AtomicU32 {
        self.cells.state()
    }

    /// What the lane holds now.
    pub fn state(&self) -> LaneState {
        match self.state_word().load(Ordering::Acquire) {
            LANE_EMPTY => LaneState::Empty,
            LANE_FULL => LaneState::Full,
            _ => LaneState::Taken,
        }
    }

    /// Home side: leaves `page`'s `data` and its `applied` entries in an empty lane,
    /// noting `after`, the ring position of everything sent before it (where the frame
    /// announcing the page starts), and `needs`, the position after the last frame before
    /// it that is not itself such an announcement: a faulting thread may take the page
    /// once the frames up to `needs` are delivered, without waiting for announcements of
    /// pages it took before. Returns false (and changes nothing) if the lane is not empty
    /// or `applied` does not fit.
    pub fn publish(&self, at: LanePosition, applied: &[u64], data: &[u8]) -> bool {
        assert_eq!(data.len(), LANE_PAGE, "a lane carries one page");
        if applied.len() > LANE_APPLIED_MAX
            || self.state_word().load(Ordering::Acquire) != LANE_EMPTY
        {
            return false;
        }
        self.word(8).store(at.page, Ordering::Relaxed);
        self.word(16).store(at.after, Ordering::Relaxed);
        self.word(32).store(at.needs, Ordering::Relaxed);
        self.word(24).store(applied.len() as u64, Ordering::Relaxed);
        for (i, &a) in applied.iter().enumerate() {
            self.word(64 + 8 * i).store(a, Ordering::Relaxed);
        }
        // An empty lane's data belongs to the home until it stores `FULL` below.
        self.cells.put_data(data);
        self.state_word().store(LANE_FULL, Ordering::Release);
        true
    }

    /// Requester side: the page a full lane holds and where it stands in the ring.
    pub fn full(&self) -> Option<LanePosition> {
        (self.state_word().load(Ordering::Acquire) == LANE_FULL).then(|| LanePosition {
            page: self.word(8).load(Ordering::Relaxed),
            after: self.word(16).load(Ordering::Relaxed),
            needs: self.word(32).load(Ordering::Relaxed),
        })
    }

    /// Requester side (the writer of this lane's ring, which owns the request slot): asks
    /// the peer for `page` through its lane, to be served once the peer has delivered this
    /// ring's frames up to position `after` (everything sent before the request). Returns
    /// false if an earlier request is still pending (only one may be).
    pub fn post_request(&self, page: u64, after: u64) -> bool {
        let slot = self.word(REQUEST);
        if slot.load(Ordering::Acquire) != 0 {
            return false;
        }
        self.word(REQUEST + 8).store(after, Ordering::Relaxed);
        // SeqCst against the reader's `prepare_wait`: either it sees the request, or the
        // requester sees it waiting and rings its bell.
        slot.store(page + 1, Ordering::SeqCst);
        true
    }

    /// Peer side (this ring's reader): the pending request, as `(page, after)`.
    pub fn pending_request(&self) -> Option<(u64, u64)> {
        match self.word(REQUEST).load(Ordering::SeqCst) {
            0 => None,
            v => Some((v - 1, self.word(REQUEST + 8).load(Ordering::Relaxed))),
        }
    }

    /// Peer side: takes the pending request for `page` off the slot (the requester may
    /// post the next one).
    pub fn take_request(&self, page: u64) -> bool {
        self.word(REQUEST)
            .compare_exchange(page + 1, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Requester side: says whether a thread polls this lane for its page. While one does,
    /// the home's announcement of the page need not wake the requester's reader (the
    /// poller takes the page; the announcement waits in the ring for the next frame that
    /// rings). SeqCst against the home's look after its commit: a poller that stops
    /// polling and then wakes its own reader finds the announcement in the ring, or the
    /// home sees the flag clear and rings.
    pub fn set_taker_polling(&self, polling: bool) {
        self.word(TAKER_POLLING)
            .store(u64::from(polling), Ordering::SeqCst);
    }

    /// Home side: whether a thread of the requester polls this lane.
    pub fn taker_polling(&self) -> bool {
        self.word(TAKER_POLLING).load(Ordering::SeqCst) != 0
    }

    /// Requester side: takes a full lane for this thread; false if it is not full (empty,
    /// or another thread took it).
    pub fn take(&self) -> bool {
        self.state_word()
            .compare_exchange(LANE_FULL, LANE_TAKEN, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Requester side, holding the lane ([`PageLane::take`]): the page number, its
    /// `applied` entries (into `out`, returning how many) and its data (into `data`, one
    /// page).
    pub fn copy_out(&self, out: &mut [u64; LANE_APPLIED_MAX], data: &mut [u8]) -> (u64, usize) {
        assert_eq!(data.len(), LANE_PAGE, "a lane carries one page");
        let n = (self.word(24).load(Ordering::Relaxed) as usize).min(LANE_APPLIED_MAX);
        for (i, slot) in out.iter_mut().enumerate().take(n) {
            *slot = self.word(64 + 8 * i).load(Ordering::Relaxed);
        }
        // A taken lane's data belongs to the taker until it empties the lane.
        self.cells.get_data(data);
        (self.word(8).load(Ordering::Relaxed), n)
    }

    /// Requester side, holding the lane: gives it back full, for another thread to take.
    pub fn put_back(&self) {
        self.state_word().store(LANE_FULL, Ordering::Release);
    }

    /// Requester side, holding the lane: empties it for the home's next page.
    pub fn release(&self) {
        self.state_word().store(LANE_EMPTY, Ordering::Release);
    }
}

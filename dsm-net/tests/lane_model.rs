//! Model test of the page lane (`src/ring/lane.rs`, compiled here on loom's atomics): loom
//! runs every interleaving of a home publishing pages and threads of the requester taking
//! them, within a preemption bound, and checks that a taker copies out the page, position
//! and `applied` entries the home left (never those of an earlier or a later page), that
//! one taker at a time holds the lane, and that a page given back is taken again.
//! The data page is one word here: the protocol hands it over as a whole, so one word
//! shows whether the handover orders it.
//!
//! Run with the lane's orderings weakened (`dsm_testkit::weak_atomics`), the model fails: a
//! taker reads a page older than the one its take found, or the home overwrites the page
//! under a taker.
//!
//! The takers are threads of their own, not the one that made the lane: loom does not let
//! a thread that gives way read again a store it saw before, and the maker saw every
//! word's first value, so stale reads would go unexplored.

// The lane's API is public in dsm-net, not in this test crate.
#[allow(dead_code, unreachable_pub)]
#[path = "../src/ring/lane.rs"]
mod lane;

/// What `lane.rs` is built on, here: loom's atomics behind the weakening switch.
mod lane_deps {
    pub(crate) use dsm_testkit::weak_atomics::{AtomicU32, AtomicU64};
    pub(crate) use loom::sync::atomic::Ordering;
}

use dsm_testkit::weak_atomics::{weaken, Weaken};
use lane::{LaneCells, LanePosition, PageLane, LANE_APPLIED_MAX};
use lane_deps::{AtomicU32, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// A lane's memory on loom's atomics: the state, the control words the protocol uses (by
/// byte offset) and the data page's first word.
struct ModelCells {
    state: AtomicU32,
    words: Vec<AtomicU64>,
    data: AtomicU64,
}

/// Control words up to the taker's flag (byte 2112).
const WORDS: usize = 2120 / 8;

impl ModelCells {
    fn new() -> ModelCells {
        ModelCells {
            state: AtomicU32::new(0),
            words: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
            data: AtomicU64::new(0),
        }
    }
}

impl LaneCells for ModelCells {
    fn state(&self) -> &AtomicU32 {
        &self.state
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        &self.words[offset / 8]
    }

    fn put_data(&self, data: &[u8]) {
        let first = u64::from_le_bytes(data[..8].try_into().unwrap());
        self.data.store(first, Ordering::Relaxed);
    }

    fn get_data(&self, data: &mut [u8]) {
        data[..8].copy_from_slice(&self.data.load(Ordering::Relaxed).to_le_bytes());
    }
}

/// Page `n` as the home publishes it: its number, position, one `applied` entry and data
/// all say `n`.
fn page(n: u64) -> (LanePosition, [u64; 1], Vec<u8>) {
    let mut data = vec![0u8; 4096];
    data[..8].copy_from_slice(&(100 + n).to_le_bytes());
    let at = LanePosition {
        page: n,
        after: 10 * n,
        needs: 10 * n + 1,
    };
    (at, [1000 + n], data)
}

/// A taker's look: takes the lane if it is full, checks that what it copies out is one
/// page whole, and empties the lane (or, if `give_back`, puts the page back). Returns the
/// page it took.
fn try_take(lane: &PageLane<ModelCells>, give_back: bool) -> Option<u64> {
    let at = lane.full()?;
    if !lane.take() {
        return None;
    }
    let mut applied = [0u64; LANE_APPLIED_MAX];
    let mut data = vec![0u8; 4096];
    let (n, len) = lane.copy_out(&mut applied, &mut data);
    let first = u64::from_le_bytes(data[..8].try_into().unwrap());
    let whole = (at, len, applied[0], first) == (page(n).0, 1, 1000 + n, 100 + n);
    assert!(
        whole,
        "a taker read a torn page: page {n}, position {at:?}, {len} applied ({}), data {first}",
        applied[0]
    );
    if give_back {
        lane.put_back();
    } else {
        lane.release();
    }
    Some(n)
}

fn model(mode: Weaken, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    // Threads waiting for the lane give way at every look.
    b.max_branches = 100_000;
    b.check(move || {
        weaken(mode);
        f()
    });
}

/// A taker that looks until it has taken `pages` pages for good, giving the first one
/// back once if `give_back`. Returns the pages it took.
fn taker(lane: &Arc<PageLane<ModelCells>>, pages: usize, give_back: bool) -> Vec<u64> {
    let mut give_back = give_back;
    let mut mine = Vec::new();
    while mine.len() < pages {
        match try_take(lane, give_back) {
            Some(_) if give_back => give_back = false,
            Some(n) => mine.push(n),
            None => thread::yield_now(),
        }
    }
    mine
}

/// The home publishes `pages` pages, each once the lane is empty again.
fn home(lane: &Arc<PageLane<ModelCells>>, pages: u64) {
    for n in 1..=pages {
        let (at, applied, data) = page(n);
        while !lane.publish(at, &applied, &data) {
            thread::yield_now();
        }
    }
}

/// The home publishes pages 1 and 2 (the second once the first is taken) to one taker,
/// which gets each whole, in order.
fn two_pages_in_turn(mode: Weaken) {
    model(mode, || {
        let lane = Arc::new(PageLane::new(ModelCells::new()));
        let taker = {
            let lane = lane.clone();
            thread::spawn(move || taker(&lane, 2, false))
        };
        home(&lane, 2);
        assert_eq!(taker.join().unwrap(), [1, 2]);
    });
}

#[test]
fn a_taker_copies_out_each_page_the_home_left() {
    two_pages_in_turn(Weaken::Nothing);
}

/// Two threads of the requester look for one page; the first to take it gives it back
/// once. The page is taken for good exactly once, and whole.
#[test]
fn one_taker_at_a_time_and_a_page_given_back_is_taken_again() {
    model(Weaken::Nothing, || {
        let lane = Arc::new(PageLane::new(ModelCells::new()));
        home(&lane, 1);
        let took_for_good = Arc::new(loom::sync::atomic::AtomicU32::new(0));
        let look = |give_back: bool| {
            let (lane, took) = (lane.clone(), took_for_good.clone());
            thread::spawn(move || {
                let mut give_back = give_back;
                while took.load(Ordering::SeqCst) == 0 {
                    match try_take(&lane, give_back) {
                        Some(_) if give_back => give_back = false,
                        Some(n) => {
                            assert_eq!(n, 1);
                            took.fetch_add(1, Ordering::SeqCst);
                        }
                        None => thread::yield_now(),
                    }
                }
            })
        };
        let (a, b) = (look(true), look(false));
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(took_for_good.load(Ordering::SeqCst), 1, "taken twice");
    });
}

/// The model is strong enough to matter: with the lane's publishing stores relaxed (the
/// home's `FULL`, the taker's `EMPTY`), a taker reads words of an older page, or the home
/// overwrites the page under a taker.
#[test]
#[should_panic(expected = "a taker read a torn page")]
fn the_model_catches_a_publish_without_release() {
    two_pages_in_turn(Weaken::Publishing);
}

/// And with the takers' and the home's looks at the state relaxed, the same.
#[test]
#[should_panic(expected = "a taker read a torn page")]
fn the_model_catches_a_take_without_acquire() {
    two_pages_in_turn(Weaken::Observing);
}

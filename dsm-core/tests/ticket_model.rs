//! Model test of the host locks' ticket lock (`src/ticket.rs`, compiled here on loom's
//! atomics): loom runs every interleaving of two or three takers, within a preemption
//! bound, and checks that one holds the lock at a time and that each holder sees what the
//! previous one wrote (the critical section reads and raises a count with relaxed accesses,
//! so only the lock's own orderings make a holder see the last raise; loom lets a load
//! return any store that happens-before does not rule out). Run with the lock's orderings
//! weakened (`dsm_testkit::weak_atomics`), the same check fails: without the release's release or the
//! takers' acquire a holder may read a count from before the last raise, and one is lost.
//!
//! Not checked here: the sleep's handshake (announce, then look; advance, then look),
//! which needs sequential consistency, stronger than loom's model of SeqCst. The futex only
//! gives way while the word holds the expected value, so a lost wake-up cannot show.

#[allow(dead_code)]
#[path = "../src/ticket.rs"]
mod ticket;

/// What `ticket.rs` is built on, here: loom's atomics (behind the weakening switch), a
/// futex that gives way and a clock that never moves (the takers poll with no budget).
mod ticket_deps {
    pub(crate) use dsm_testkit::weak_atomics::AtomicU32;
    pub(crate) use loom::sync::atomic::Ordering;
    pub(crate) use loom::thread::yield_now;

    pub(crate) fn futex_wait_bitset(word: &AtomicU32, expected: u32, _bitset: u32) {
        if word.load(Ordering::SeqCst) == expected {
            loom::thread::yield_now();
        }
    }

    pub(crate) fn futex_wake_bitset(_word: &AtomicU32, _bitset: u32) {}

    pub(crate) fn monotonic_ns() -> u64 {
        0
    }
}

use dsm_testkit::weak_atomics::{weaken, Weaken};
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use ticket::TicketLock;

/// The lock and the data it guards: a count each holder reads and raises.
struct Guarded {
    lock: TicketLock,
    count: AtomicU32,
}

/// One taker: takes the lock, raises the count, releases.
fn hold(g: &Guarded) {
    g.lock.lock(0);
    // A read-modify-write would hide a stale read: two plain accesses.
    let seen = g.count.load(Ordering::Relaxed);
    g.count.store(seen + 1, Ordering::Relaxed);
    g.lock.unlock();
}

/// `takers` threads each hold the lock once; the count ends at `takers`. The takers are
/// threads of their own, not the one that made the lock and the count: loom does not let
/// a thread that gives way (as a waiting taker does) read again a store it saw before, and
/// the maker saw their first values, so its stale reads would go unexplored.
/// `preemptions` bounds loom's search.
fn run(mode: Weaken, takers: usize, preemptions: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    // Waiting takers give way at every look, which loom counts as branches.
    b.max_branches = 100_000;
    b.check(move || {
        weaken(mode);
        let g = Arc::new(Guarded {
            lock: TicketLock::free(),
            count: AtomicU32::new(0),
        });
        let all: Vec<_> = (0..takers)
            .map(|_| {
                let g = g.clone();
                thread::spawn(move || hold(&g))
            })
            .collect();
        for t in all {
            t.join().unwrap();
        }
        assert_eq!(
            g.count.load(Ordering::Relaxed),
            takers as u32,
            "a raise was lost"
        );
    });
}

#[test]
fn two_takers_hold_the_lock_one_at_a_time_and_see_each_others_writes() {
    run(Weaken::Nothing, 2, 3);
}

#[test]
fn three_takers_hold_the_lock_in_turn() {
    run(Weaken::Nothing, 3, 1);
}

/// The model is strong enough to matter: with the release's advance (and every other
/// store) relaxed, the next holder may read the count from before the last raise.
#[test]
#[should_panic(expected = "a raise was lost")]
fn the_model_catches_a_release_without_release() {
    run(Weaken::Publishing, 2, 3);
}

/// And with the takers' looks at `serving` relaxed, the same.
#[test]
#[should_panic(expected = "a raise was lost")]
fn the_model_catches_a_take_without_acquire() {
    run(Weaken::Observing, 2, 3);
}

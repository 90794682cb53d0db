//! Unit tests of `fast.rs`, on the real atomics (kept out of that file because the model
//! test compiles it on loom's).

use super::fast::*;
use super::fast_deps::{AtomicBool, AtomicU64, Ordering, FETCHED_MAX};
use dsm_proto::{PageNo, PAGE_SIZE};
use std::sync::Arc;

fn fill(slot: &[AtomicU64], v: u64) {
    for w in slot {
        w.store(v, Ordering::Relaxed);
    }
}

#[test]
fn ring_is_fifo_and_bounded() {
    let r = Ring::new(4);
    assert!(r.is_empty());
    for i in 0..4 {
        assert!(r.has_room());
        assert!(r.push(i));
    }
    assert!(!r.has_room() && !r.push(9));
    assert_eq!(r.pop(), Some(0));
    assert!(r.push(4));
    assert_eq!(
        (1..5).map(|_| r.pop().unwrap()).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(r.pop(), None);
}

#[test]
fn only_armed_pages_are_served_and_the_engine_hears_of_them() {
    let f = FastFaults::new(16, 64);
    f.reserve_pages(16);
    f.grow_slots(64);
    assert_eq!(f.slots_made(), 64);
    let mut writable = [false; 16];
    // Not armed: slow path, nothing happens.
    assert_eq!(
        f.handler_write_fault(3, || true, |_| ()),
        Err(Miss::NotArmed)
    );
    assert!(f.arm(3, false) && f.arm(5, true));
    assert!(!f.arm(3, false), "already armed");
    f.handler_write_fault(
        3,
        || {
            writable[3] = true;
            true
        },
        |s| fill(s, 33),
    )
    .unwrap();
    f.handler_write_fault(
        5,
        || {
            writable[5] = true;
            true
        },
        |_| panic!("no twin"),
    )
    .unwrap();
    assert!(writable[3] && writable[5]);
    // Served once: a second fault on the page goes the slow way.
    assert_eq!(
        f.handler_write_fault(3, || true, |_| ()),
        Err(Miss::NotArmed)
    );
    assert!(f.has_done());
    let mut got = Vec::new();
    f.drain(|p, s| got.push((p, s)));
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], (5, None));
    let (p, slot) = got[0];
    assert_eq!(p, 3);
    let mut twin = vec![0u8; PAGE_SIZE];
    f.read_slot(slot.unwrap(), &mut twin);
    assert!(twin
        .chunks_exact(8)
        .all(|b| u64::from_ne_bytes(b.try_into().unwrap()) == 33));
    f.release_slot(slot.unwrap());
    assert_eq!(f.page_word(3).unwrap().load(Ordering::Relaxed), IDLE);
}

#[test]
fn disarm_wins_or_reports_the_handlers_write() {
    let f = FastFaults::new(16, 64);
    f.reserve_pages(16);
    f.grow_slots(64);
    f.arm(1, false);
    assert!(!f.disarm(1), "disarmed before the handler came");
    assert_eq!(
        f.handler_write_fault(1, || true, |_| ()),
        Err(Miss::NotArmed)
    );
    f.arm(2, false);
    f.handler_write_fault(2, || true, |_| ()).unwrap();
    assert!(f.disarm(2), "the handler won: the engine must drain");
    // A failed mprotect leaves the page armed for the slow path to sort out.
    f.arm(4, true);
    assert_eq!(
        f.handler_write_fault(4, || false, |_| ()),
        Err(Miss::Protect)
    );
    assert!(!f.disarm(4));
}

#[test]
fn without_slots_or_room_the_handler_falls_back() {
    let f = FastFaults::new(4, 64);
    f.reserve_pages(4);
    f.arm(0, false);
    assert_eq!(f.handler_write_fault(0, || true, |_| ()), Err(Miss::NoRoom));
    assert_eq!(f.take_short(), 1);
    assert_eq!(f.take_short(), 0);
    // Home pages need no slot.
    f.arm(1, true);
    f.handler_write_fault(1, || true, |_| ()).unwrap();
    // The pool grows outside the handler; the page is still armed.
    f.grow_slots(1);
    f.handler_write_fault(0, || true, |_| ()).unwrap();
    // An unallocated page has no word.
    let g = FastFaults::new(1 << 20, 64);
    assert_eq!(
        g.handler_write_fault(5, || true, |_| ()),
        Err(Miss::NotArmed)
    );
    assert!(!g.arm(5, true));
}

#[test]
fn a_fetch_word_is_armed_claimed_and_ended_by_its_owners() {
    let f = FastFaults::new(16, 64);
    f.reserve_pages(16);
    assert_eq!(f.claim_fetch(2), None, "not armed");
    assert!(!f.arm_fetch(2, FETCH_HOMES), "a home the word cannot name");
    assert!(f.arm_fetch(2, 5));
    assert!(!f.arm_fetch(2, 5) && !f.arm(2, false), "armed already");
    assert_eq!(
        f.handler_write_fault(2, || true, |_| ()),
        Err(Miss::NotArmed),
        "a fetch word is no write arming"
    );
    assert_eq!(f.fetch_claimed(2), None);
    assert_eq!(f.claim_fetch(2), Some(5));
    assert_eq!(f.claim_fetch(2), None, "claimed once");
    assert_eq!(f.fetch_claimed(2), Some(5));
    assert_eq!(
        f.take_back(2),
        TakenBack::HandlerFetching,
        "the engine does not wait for a fetch"
    );
    f.unclaim_fetch(2);
    assert_eq!(f.fetch_claimed(2), None, "given back");
    assert_eq!(
        f.take_back(2),
        TakenBack::WasArmed,
        "armed again, taken back"
    );
    assert!(f.arm_fetch(2, 63));
    assert_eq!(f.claim_fetch(2), Some(63));
    f.end_fetch(2);
    assert_eq!(f.page_word(2).unwrap().load(Ordering::Relaxed), IDLE);
    assert!(
        f.arm(2, true),
        "idle again: armed for writes once read-only"
    );
}

#[test]
fn fetched_records_queue_in_order_up_to_a_bound() {
    let f = FastFaults::new(16, 64);
    assert_eq!(f.take_fetched(), None);
    assert!(!f.record_fetched(1, 0, &[0; FETCHED_APPLIED_MAX + 1]));
    for p in 0..FETCHED_MAX as PageNo {
        assert!(
            f.record_fetched(3, p, &[pack_applied(&(2, p))]),
            "record {p}"
        );
        let waiting = p as usize + 1;
        assert_eq!(
            f.fetched_backlog_high(),
            [FETCHED_HIGH, FETCHED_HIGH + 8, FETCHED_MAX].contains(&waiting),
            "{waiting} waiting"
        );
    }
    assert!(!f.record_fetched(3, 99, &[]), "full");
    for p in 0..FETCHED_MAX as PageNo {
        let got = f.take_fetched().unwrap();
        assert_eq!((got.home, got.page, got.applied), (3, p, vec![(2, p)]));
        assert!(f.record_fetched(4, 100 + p, &[]), "room again");
    }
    assert_eq!(f.take_fetched().map(|g| g.page), Some(100));
}

/// The handler (one thread) and the engine (another) race on the same pages: every
/// page is taken by exactly one of them, and every write the handler let through
/// reaches the engine exactly once.
#[test]
fn handler_and_engine_never_both_win() {
    const PAGES: usize = 64;
    let f = Arc::new(FastFaults::new(PAGES, 64));
    f.reserve_pages(PAGES);
    f.grow_slots(64);
    let rounds = 2000;
    let made_writable: Arc<Vec<AtomicU64>> =
        Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let handler = {
        let (f, mw, stop) = (f.clone(), made_writable.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut served = 0u64;
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let p = (i * 7) % PAGES;
                i += 1;
                let r = f.handler_write_fault(
                    p,
                    || {
                        mw[p].fetch_add(1, Ordering::Relaxed);
                        true
                    },
                    |s| fill(s, p as u64),
                );
                served += u64::from(r.is_ok());
            }
            served
        })
    };
    let mut engine_won = 0u64;
    let mut drained = vec![0u64; PAGES];
    for round in 0..rounds {
        for p in 0..PAGES {
            f.arm(p as PageNo, p % 3 == 0);
        }
        if round % 2 == 0 {
            std::thread::yield_now();
        }
        let mut handler_won = Vec::new();
        for p in 0..PAGES {
            if f.disarm(p as PageNo) {
                handler_won.push(p);
            } else {
                engine_won += 1;
            }
        }
        let mut seen = Vec::new();
        f.drain(|p, slot| {
            drained[p as usize] += 1;
            seen.push(p as usize);
            match slot {
                Some(s) => {
                    let mut twin = vec![0u8; PAGE_SIZE];
                    f.read_slot(s, &mut twin);
                    assert_eq!(twin[..8], (p as u64).to_ne_bytes());
                    f.release_slot(s);
                }
                None => assert_eq!(p % 3, 0, "home pages have no twin"),
            }
        });
        seen.sort_unstable();
        assert_eq!(seen, handler_won, "round {round}");
        // Every page is idle again: nothing is left armed or claimed.
        for p in 0..PAGES {
            assert_eq!(f.page_word(p).unwrap().load(Ordering::Relaxed), IDLE);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let served = handler.join().unwrap();
    assert_eq!(served, drained.iter().sum::<u64>());
    for p in 0..PAGES {
        assert_eq!(
            made_writable[p].load(Ordering::Relaxed),
            drained[p],
            "page {p}"
        );
    }
    assert_eq!(engine_won + served, (rounds * PAGES) as u64);
}

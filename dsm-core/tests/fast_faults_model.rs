//! Model test of `FastFaults` (`src/engine/fast.rs`, compiled here on loom's atomics and a
//! pool of a few words): loom runs every interleaving of the SIGSEGV handler's side and
//! the engine's, within a preemption bound, and checks the hand-overs between them:
//!
//! - a write fault the handler serves races the engine taking the page back: exactly one
//!   wins, and when the handler does, the engine finds the write on the done ring with the
//!   twin the handler copied (the free and done rings and the page word's `DONE`);
//! - a fetch the handler claims races the same: the engine either disarms the page or
//!   learns that the handler asked its home;
//! - pages the handler installed reach the engine in order with their `applied` entries
//!   (the fetched records' queue).
//!
//! Run with the code's orderings weakened (`dsm_testkit::weak_atomics`), the first and the last fail: the
//! engine sees the page written but an empty done ring, or reads a twin or a record from
//! before the handler wrote it.
//!
//! The engine runs in a thread of its own, not the one that made the state: loom does not
//! let a thread that gives way (as the engine does while it waits) read again a store it
//! saw before, and the maker saw every word's first value, so stale reads would go
//! unexplored.

// The engine's API is public in dsm-core, not in this test crate.
#[allow(dead_code, unreachable_pub)]
#[path = "../src/engine/fast.rs"]
mod fast;

/// What `fast.rs` is built on, here: loom's atomics (behind the weakening switch) and
/// spin hints, and a pool of a few one-word slots (the protocol does not depend on the
/// sizes).
mod fast_deps {
    pub(crate) use dsm_testkit::weak_atomics::{
        AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    };
    pub(crate) use loom::hint::spin_loop;
    pub(crate) use loom::sync::atomic::Ordering;
    pub(crate) use loom::thread::yield_now;

    pub(crate) const PAGE_CHUNK_SHIFT: u32 = 1;
    pub(crate) const SLOT_WORDS: usize = 1;
    pub(crate) const SLOT_CHUNK: usize = 2;
    pub(crate) const FETCHED_MAX: usize = 2;
}

use dsm_testkit::weak_atomics::{weaken, Weaken};
use fast::{pack_applied, FastFaults, FetchedPage, Miss, TakenBack};
use fast_deps::Ordering;
use loom::sync::Arc;
use loom::thread;

/// The word the handler's page copy leaves in a twin.
const TWIN: u64 = 0xAB;

fn model(mode: Weaken, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    // The engine waits for a claimed page by giving way at every look.
    b.max_branches = 100_000;
    b.check(move || {
        weaken(mode);
        f()
    });
}

/// Two pages, two twin slots handed to the handler.
fn fast_faults() -> Arc<FastFaults> {
    let f = FastFaults::new(2, 2);
    f.reserve_pages(2);
    assert_eq!(f.grow_slots(2), 2);
    Arc::new(f)
}

fn write_fault_races_take_back(mode: Weaken) {
    model(mode, || {
        let f = fast_faults();
        assert!(f.arm(0, false));
        let handler = {
            let f = f.clone();
            thread::spawn(move || {
                f.handler_write_fault(0, || true, |slot| slot[0].store(TWIN, Ordering::Relaxed))
            })
        };
        // The engine is a thread of its own (see the module's documentation).
        let engine = {
            let f = f.clone();
            thread::spawn(move || {
                let taken = f.take_back(0);
                let mut written = Vec::new();
                if taken == TakenBack::HandlerWrote {
                    f.drain(|page, slot| written.push((page, slot)));
                }
                let twin = written.iter().map(|&(_, slot)| {
                    let mut twin = [0u8; 8];
                    f.read_slot(slot.expect("a remote page has a twin"), &mut twin);
                    f.release_slot(slot.unwrap());
                    u64::from_ne_bytes(twin)
                });
                let twins: Vec<u64> = twin.collect();
                (taken, written, twins)
            })
        };
        let served = handler.join().unwrap();
        let (taken, written, twins) = engine.join().unwrap();
        match taken {
            TakenBack::HandlerWrote => {
                assert_eq!(served, Ok(()));
                assert!(
                    matches!(written[..], [(0, Some(_))]) && twins == [TWIN],
                    "the engine missed the handler's write: done ring {written:?}, twins \
                     {twins:x?}"
                );
            }
            TakenBack::WasArmed => assert_eq!(served, Err(Miss::NotArmed)),
            other => panic!("took back {other:?} from an armed page"),
        }
        // Either way the page is the engine's again.
        assert_eq!(f.take_back(0), TakenBack::WasIdle);
        assert!(!f.has_done());
    });
}

#[test]
fn a_write_fault_and_the_engine_never_both_win_and_the_twin_arrives() {
    write_fault_races_take_back(Weaken::Nothing);
}

/// The model is strong enough to matter: with the handler's publishing stores relaxed
/// (the done ring's tail, the page word's `DONE`), the engine may see `DONE` and find the
/// done ring empty, or read the twin slot before the handler's copy reached it.
#[test]
#[should_panic(expected = "the engine missed the handler's write")]
fn the_model_catches_a_done_without_release() {
    write_fault_races_take_back(Weaken::Publishing);
}

/// And with the engine's looks relaxed, the same.
#[test]
#[should_panic(expected = "the engine missed the handler's write")]
fn the_model_catches_a_drain_without_acquire() {
    write_fault_races_take_back(Weaken::Observing);
}

#[test]
fn a_claimed_fetch_and_the_engine_never_both_win() {
    model(Weaken::Nothing, || {
        let f = fast_faults();
        assert!(f.arm_fetch(1, 5));
        let handler = {
            let f = f.clone();
            thread::spawn(move || f.claim_fetch(1))
        };
        let taken = f.take_back(1);
        let claimed = handler.join().unwrap();
        match taken {
            TakenBack::HandlerFetching => {
                assert_eq!(claimed, Some(5));
                assert_eq!(f.fetch_claimed(1), Some(5));
                f.end_fetch(1);
            }
            TakenBack::WasArmed => assert_eq!(claimed, None),
            other => panic!("took back {other:?} from a fetch-armed page"),
        }
        assert_eq!(f.take_back(1), TakenBack::WasIdle);
    });
}

fn records_reach_the_engine(mode: Weaken) {
    model(mode, || {
        let f = fast_faults();
        let handler = {
            let f = f.clone();
            thread::spawn(move || {
                assert!(f.record_fetched(3, 0, &[pack_applied(&(2, 7))]));
                assert!(f.record_fetched(4, 1, &[]));
            })
        };
        // The engine is a thread of its own (see the module's documentation).
        let engine = {
            let f = f.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                while got.len() < 2 {
                    match f.take_fetched() {
                        Some(p) => got.push(p),
                        None => thread::yield_now(),
                    }
                }
                assert!(f.take_fetched().is_none());
                got
            })
        };
        handler.join().unwrap();
        let got = engine.join().unwrap();
        let want = [
            FetchedPage {
                home: 3,
                page: 0,
                applied: vec![(2, 7)],
            },
            FetchedPage {
                home: 4,
                page: 1,
                applied: vec![],
            },
        ];
        assert!(got == want, "the engine read a stale record: {got:?}");
    });
}

#[test]
fn pages_the_handler_installed_reach_the_engine_in_order() {
    records_reach_the_engine(Weaken::Nothing);
}

/// With the handler's publishing stores relaxed, the engine may read a record before its
/// fields.
#[test]
#[should_panic(expected = "the engine read a stale record")]
fn the_model_catches_a_record_without_release() {
    records_reach_the_engine(Weaken::Publishing);
}

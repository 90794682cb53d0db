//! Model test of the fault slot (`src/fault/slot.rs`, compiled here on loom's atomics):
//! loom runs every interleaving of the faulting thread (the SIGSEGV handler's side) and
//! the comm thread, within a preemption bound, and checks that a posted fault is taken
//! exactly once with the address the handler stored, that the slot admits one fault at a
//! time, and that an asked fault ends resolved whether the reply or the hand-over comes
//! first. The futex is modelled by giving way while the word holds the expected value
//! (loom has no futex); a lost wake-up would show as a thread that never ends.

#[allow(dead_code)]
#[path = "../src/fault/slot.rs"]
mod slot;

/// What `slot.rs` is built on, here: loom's atomics and a futex that gives way.
mod slot_deps {
    pub(crate) use loom::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

    pub(crate) fn futex_wait(word: &AtomicU32, expected: u32) {
        if word.load(Ordering::SeqCst) == expected {
            loom::thread::yield_now();
        }
    }

    pub(crate) fn futex_wake_all(_word: &AtomicU32) {}
}

use loom::sync::Arc;
use loom::thread;
use slot::{idle_slot, FaultSlot, SlotState};
use slot_deps::{AtomicU32, Ordering};

/// Every interleaving with up to `preemptions` forced switches (loom's bound; spinning
/// threads give way at every look, which loom counts as branches).
fn model_with(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.max_branches = 100_000;
    b.check(f);
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_with(3, f);
}

/// The handler's wait for its outcome (it polls, then sleeps, in `on_sigsegv`).
fn outcome(slot: &FaultSlot) -> SlotState {
    loop {
        let s = slot.state();
        if matches!(s, SlotState::Resolved | SlotState::Crash) {
            return s;
        }
        slot.sleep_while(s);
    }
}

/// The comm thread's side: takes the next posted fault and resolves it.
fn serve_one(slot: &FaultSlot) -> (usize, Option<bool>) {
    let fault = loop {
        if let Some(f) = slot.take() {
            break f;
        }
        thread::yield_now();
    };
    assert!(slot.try_finish(SlotState::Resolved));
    slot.wake();
    fault
}

#[test]
fn a_posted_fault_is_taken_once_with_its_address_and_resolved() {
    model(|| {
        let slot = Arc::new(idle_slot!());
        let comm = {
            let slot = slot.clone();
            thread::spawn(move || {
                assert_eq!(serve_one(&slot), (0x1000, Some(true)));
                assert!(slot.take().is_none(), "a fault was taken twice");
            })
        };
        slot.claim(0x1000, 1);
        slot.post();
        assert_eq!(outcome(&slot), SlotState::Resolved);
        slot.release();
        comm.join().unwrap();
        assert_eq!(slot.state(), SlotState::Idle);
    });
}

/// Two faulting threads: each holds the slot alone until it releases it (the comm
/// thread's part is the first test's; leaving it out keeps the model small).
#[test]
fn two_faulting_threads_hold_the_slot_one_at_a_time() {
    model(|| {
        let slot = Arc::new(idle_slot!());
        let holders = Arc::new(AtomicU32::new(0));
        let fault = |addr: usize| {
            let (slot, holders) = (slot.clone(), holders.clone());
            thread::spawn(move || {
                slot.claim(addr, 0);
                assert_eq!(
                    holders.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two faults in the slot"
                );
                holders.fetch_sub(1, Ordering::SeqCst);
                slot.release();
            })
        };
        let (a, b) = (fault(0x1000), fault(0x2000));
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(slot.state(), SlotState::Idle);
    });
}

#[test]
fn an_asked_fault_ends_resolved_whether_the_reply_or_the_hand_over_comes_first() {
    model(|| {
        let slot = Arc::new(idle_slot!());
        slot.claim(0x3000, 0);
        slot.ask();
        // The reply to the handler's own request reaches the comm thread.
        let comm = {
            let slot = slot.clone();
            thread::spawn(move || {
                assert!(slot.try_finish(SlotState::Resolved), "nothing to resolve");
                slot.wake();
            })
        };
        // Meanwhile the handler's budget runs out and it hands the wait over, unless the
        // fault is resolved already.
        let handed = slot.hand_over_asked();
        assert_eq!(outcome(&slot), SlotState::Resolved);
        comm.join().unwrap();
        // A handed-over fault resolved by the reply is not taken again.
        assert!(slot.take().is_none(), "handed over: {handed}");
        slot.release();
        assert_eq!(slot.state(), SlotState::Idle);
    });
}

#[test]
fn an_outcome_is_never_posted_to_a_slot_without_a_fault() {
    model(|| {
        let slot = Arc::new(idle_slot!());
        assert!(!slot.try_finish(SlotState::Resolved));
        slot.claim(0x4000, 0);
        assert!(
            !slot.try_finish(SlotState::Crash),
            "a claimed fault is the handler's"
        );
        assert_eq!(slot.state(), SlotState::Claimed);
    });
}

/// The model is strong enough to matter: posting the fault with a relaxed store (no
/// release) lets the comm thread take it and read an address the handler's store has not
/// reached yet, and loom finds that interleaving.
#[test]
#[should_panic(expected = "the comm thread read another address")]
fn the_model_catches_a_post_without_release() {
    model(|| {
        let slot = Arc::new(idle_slot!());
        let comm = {
            let slot = slot.clone();
            thread::spawn(move || {
                let (addr, _) = serve_one(&slot);
                assert_eq!(addr, 0x5000, "the comm thread read another address");
            })
        };
        slot.claim(0x5000, 0);
        // The broken post: `FaultSlot::post` stores with SeqCst.
        slot.state
            .store(SlotState::Pending as u32, Ordering::Relaxed);
        assert_eq!(outcome(&slot), SlotState::Resolved);
        slot.release();
        comm.join().unwrap();
    });
}

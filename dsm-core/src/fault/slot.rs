//! The fault slot: the one fault of the process in service, passed between the faulting
//! thread (in the SIGSEGV handler) and the comm thread. Every change of its state is a
//! method here:
//!
//! | from | to | by | method |
//! |---|---|---|---|
//! | `Idle` | `Claimed` | handler (waits while another fault holds the slot) | [`FaultSlot::claim`] |
//! | `Claimed` | `Asked` | handler, before it asks a home for the page itself | [`FaultSlot::ask`] |
//! | `Asked` | `Claimed` | handler, its request could not be posted | [`FaultSlot::unask`] |
//! | `Claimed` | `Pending` | handler, handing the fault to the comm thread | [`FaultSlot::post`] |
//! | `Asked` | `Pending` | handler, its polling budget spent | [`FaultSlot::hand_over_asked`] |
//! | `Pending` | `Taken` | comm thread | [`FaultSlot::take`] |
//! | `Pending`, `Taken`, `Asked` | `Resolved`, `Crash` | comm thread | [`FaultSlot::try_finish`] |
//! | the handler's fault | `Idle` | handler, its fault over | [`FaultSlot::release`] |
//!
//! A state change that a sleeping thread may wait for wakes the slot's futex, but only
//! when a thread sleeps on it: a parked fault normally polls, and the wake-up would cost a
//! system call per fault for nothing. Everything here is async-signal-safe (atomics and
//! `futex(2)`).

// Atomics and futex calls come through the parent's `slot_deps`, so that the model test
// (`tests/fault_slot_model.rs`) can run this same file on loom's atomics.
use super::slot_deps::{futex_wait, futex_wake_all, AtomicU32, AtomicUsize, Ordering};

/// Where the fault in the slot stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(super) enum SlotState {
    /// No fault: the next faulting thread may claim the slot.
    Idle = 0,
    /// A handler holds the slot and has not posted its fault yet.
    Claimed = 1,
    /// Posted for the comm thread, which has not taken it yet.
    Pending = 2,
    /// The comm thread took the fault and is resolving it (a fetch may be under way).
    Taken = 3,
    /// Resolved: the faulting thread retries its access.
    Resolved = 4,
    /// A wild access (inside the segment, outside every allocation): the thread crashes.
    Crash = 5,
    /// The handler asked a co-located or socket home for the page itself and polls for
    /// it; the comm thread leaves the slot alone unless a reply to that request reaches it
    /// first (it then resolves the fault) or the handler hands the wait over (`Pending`).
    Asked = 6,
}

impl SlotState {
    fn from_word(w: u32) -> SlotState {
        match w {
            0 => SlotState::Idle,
            1 => SlotState::Claimed,
            2 => SlotState::Pending,
            3 => SlotState::Taken,
            4 => SlotState::Resolved,
            5 => SlotState::Crash,
            // Only this module writes the word, and only these values.
            _ => SlotState::Asked,
        }
    }
}

/// The slot's shared state: its state word (also the futex sleepers wait on), how many
/// threads sleep on it, and the fault's address and kind. Built only by [`idle_slot!`]
/// (a `static` needs a constant, which loom's atomics cannot give); changed only by the
/// methods below.
pub(super) struct FaultSlot {
    pub(super) state: AtomicU32,
    /// Threads asleep (or about to sleep) on `state`'s futex.
    pub(super) sleepers: AtomicU32,
    pub(super) addr: AtomicUsize,
    /// 0 = read, 1 = write, 2 = unknown (the architecture does not tell).
    pub(super) kind: AtomicU32,
}

/// An idle [`FaultSlot`], where `FaultSlot`, `SlotState` and `slot_deps` are in scope.
macro_rules! idle_slot {
    () => {
        FaultSlot {
            state: slot_deps::AtomicU32::new(SlotState::Idle as u32),
            sleepers: slot_deps::AtomicU32::new(0),
            addr: slot_deps::AtomicUsize::new(0),
            kind: slot_deps::AtomicU32::new(0),
        }
    };
}
pub(super) use idle_slot;

impl FaultSlot {
    /// The state as of now (acquiring what the thread that set it wrote before).
    pub(super) fn state(&self) -> SlotState {
        SlotState::from_word(self.state.load(Ordering::Acquire))
    }

    /// Handler: takes the slot for a fault at `addr` of `kind`, sleeping while another
    /// thread's fault holds it (one fault at a time per process).
    pub(super) fn claim(&self, addr: usize, kind: u32) {
        while self
            .state
            .compare_exchange(
                SlotState::Idle as u32,
                SlotState::Claimed as u32,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            let seen = self.state.load(Ordering::Relaxed);
            if seen != SlotState::Idle as u32 {
                self.sleep_while(SlotState::from_word(seen));
            }
        }
        self.addr.store(addr, Ordering::Relaxed);
        self.kind.store(kind, Ordering::Relaxed);
    }

    /// Handler, `Claimed`: about to ask a home itself; from now on a reply reaching the
    /// comm thread first may resolve the fault.
    pub(super) fn ask(&self) {
        self.set(SlotState::Asked);
    }

    /// Handler, `Asked`: the request could not be posted, so nothing can answer it and the
    /// slot is this thread's alone again.
    pub(super) fn unask(&self) {
        self.state
            .store(SlotState::Claimed as u32, Ordering::SeqCst);
    }

    /// Handler, `Claimed`: posts the fault for the comm thread (which the caller then
    /// wakes, unless it watches the slot). Sequentially consistent against the comm
    /// thread's clearing of its watch flag and second look.
    pub(super) fn post(&self) {
        self.state
            .store(SlotState::Pending as u32, Ordering::SeqCst);
    }

    /// Handler, its budget spent: hands an asked fault's wait to the comm thread; false
    /// if the comm thread resolved it meanwhile.
    pub(super) fn hand_over_asked(&self) -> bool {
        self.state
            .compare_exchange(
                SlotState::Asked as u32,
                SlotState::Pending as u32,
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Comm thread: takes the posted fault, once: its address and whether it was a write
    /// (`None` when the architecture does not say).
    pub(super) fn take(&self) -> Option<(usize, Option<bool>)> {
        self.state
            .compare_exchange(
                SlotState::Pending as u32,
                SlotState::Taken as u32,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .ok()?;
        let write = match self.kind.load(Ordering::Relaxed) {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        };
        Some((self.addr.load(Ordering::Relaxed), write))
    }

    /// Comm thread: posts `outcome` (`Resolved` or `Crash`) for the fault in service: one
    /// posted, taken, or asked for by the handler. A slot in any other state has no fault
    /// the engine could be answering (its fault ended in the handler, or the next one is
    /// being posted), so it is left alone and this returns false. The caller wakes the
    /// sleepers ([`FaultSlot::wake`]) once it has done what must precede the wake-up.
    pub(super) fn try_finish(&self, outcome: SlotState) -> bool {
        let mut seen = self.state.load(Ordering::Acquire);
        while matches!(
            SlotState::from_word(seen),
            SlotState::Pending | SlotState::Taken | SlotState::Asked
        ) {
            match self.state.compare_exchange(
                seen,
                outcome as u32,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => seen = now,
            }
        }
        false
    }

    /// Handler: its fault is over (resolved, crashed, or its page taken from a lane); the
    /// next faulting thread may claim the slot.
    pub(super) fn release(&self) {
        self.set(SlotState::Idle);
    }

    /// Sleeps on the slot while it holds `expected`.
    pub(super) fn sleep_while(&self, expected: SlotState) {
        // SeqCst against `set` and `wake`: either they see this sleeper, or the futex sees
        // the new state and returns at once.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        futex_wait(&self.state, expected as u32);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes the threads asleep on the slot after a change of its state, if any.
    pub(super) fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake_all(&self.state);
        }
    }

    fn set(&self, state: SlotState) {
        self.state.store(state as u32, Ordering::SeqCst);
        self.wake();
    }
}

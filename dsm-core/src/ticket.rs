//! The ticket lock behind host locks (`sys::HostLock`): first come, first served across
//! the processes that map one common segment. A taker draws the `next` ticket and waits
//! until `serving` reaches it, polling for a budget and then sleeping on `serving` with the
//! futex bit of its ticket; a release advances `serving` and wakes the sleepers of the next
//! ticket's bit. The one subtle step is the sleep: a taker announces itself in `sleepers`
//! before its last look at `serving`, both sequentially consistent, as are the release's
//! advance and its look at `sleepers`, so either the release sees the sleeper and wakes it
//! or the sleeper sees the release and does not sleep.
//!
//! `tests/ticket_model.rs` runs this file on loom's atomics: one holder at a time, and each
//! holder sees everything the previous one wrote. It cannot check the sleep's handshake:
//! loom treats sequentially consistent accesses as acquire/release, too weak for it (under
//! a kernel-faithful futex model it reports a lost wake-up), so there the futex only gives
//! way.

// Atomics, futex, clock and yield come through the parent's `ticket_deps`, so that the
// model test can run this same file on loom's.
use super::ticket_deps::{
    futex_wait_bitset, futex_wake_bitset, monotonic_ns, yield_now, AtomicU32, Ordering,
};

/// A ticket lock in memory the ranks share; all zeros is a free lock.
#[repr(C)]
pub(crate) struct TicketLock {
    next: AtomicU32,
    serving: AtomicU32,
    sleepers: AtomicU32,
}

impl TicketLock {
    /// A free lock, for the model test (in a process the lock is the zeros of shared
    /// memory).
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn free() -> TicketLock {
        TicketLock {
            next: AtomicU32::new(0),
            serving: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Takes the lock, polling for `spin_ns` (yielding the core between looks) before
    /// sleeping.
    pub(crate) fn lock(&self, spin_ns: u64) {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        if self.serving.load(Ordering::Acquire) == ticket {
            return;
        }
        if spin_ns > 0 {
            let from = monotonic_ns();
            while monotonic_ns().wrapping_sub(from) < spin_ns {
                yield_now();
                if self.serving.load(Ordering::Acquire) == ticket {
                    return;
                }
            }
        }
        loop {
            // Announce the sleep before the last look (see the module's documentation).
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let seen = self.serving.load(Ordering::SeqCst);
            if seen != ticket {
                futex_wait_bitset(&self.serving, seen, ticket_bit(ticket));
            }
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
            if self.serving.load(Ordering::Acquire) == ticket {
                return;
            }
        }
    }

    /// Releases the lock to the next ticket, waking its taker if it sleeps.
    pub(crate) fn unlock(&self) {
        let next = self.serving.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake_bitset(&self.serving, ticket_bit(next));
        }
    }
}

/// The futex bitset bit of a ticket: a release wakes the sleepers of one bit, among them
/// the one whose turn it is.
fn ticket_bit(ticket: u32) -> u32 {
    1 << (ticket % 32)
}

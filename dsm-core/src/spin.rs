//! How a thread of this node waits for the comm thread: the policy behind `DSM_SPIN`.
//!
//! A wait for a remote reply (a fault parked in the handler, a lock grant, a barrier
//! release) ends when a message wakes the comm thread and the comm thread wakes the
//! waiter. If the waiter sleeps at once, its core goes idle, and on virtual machines an idle
//! virtual CPU halts: the next wake-up aimed at it costs a trip through the hypervisor
//! (docs/measurements.md has the ring round trip between idle and busy cores). So the
//! waiter first keeps its core for a
//! short budget, calling `sched_yield` between checks so that any runnable thread on that
//! core (its own comm thread above all) runs first, and only then sleeps.
//!
//! Polling only pays when every rank on the host has a core of its own; with more ranks
//! than cores the yields would hand cores around among waiters instead of to the thread
//! that has work, so the default budget is zero there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// This process's budget in nanoseconds, set once the job starts ([`set_budget`]): one
/// value for the app thread, the comm thread and the fault handler (which reads it with
/// one atomic load).
static BUDGET_NS: AtomicU64 = AtomicU64::new(0);

/// Sets this process's polling budget.
pub(crate) fn set_budget(budget: Duration) {
    BUDGET_NS.store(budget.as_nanos() as u64, Ordering::Relaxed);
}

/// This process's polling budget.
pub(crate) fn current() -> Duration {
    Duration::from_nanos(budget_ns())
}

/// This process's polling budget in nanoseconds (async-signal-safe: one atomic load).
pub(crate) fn budget_ns() -> u64 {
    BUDGET_NS.load(Ordering::Relaxed)
}

/// Waits (app thread and fault handler) whose reply came while polling.
pub(crate) static WAITS_POLLED: AtomicU64 = AtomicU64::new(0);
/// Waits that spent the budget (or had none) and slept.
pub(crate) static WAITS_SLEPT: AtomicU64 = AtomicU64::new(0);

/// Counts one wait that ended while polling (`true`) or after sleeping.
pub(crate) fn count_wait(polled: bool) {
    let counter = if polled { &WAITS_POLLED } else { &WAITS_SLEPT };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Ring frames the comm thread took while following a run of them (see
/// `Shared::follow_messages`), instead of being woken for each.
pub(crate) static FRAMES_FOLLOWED: AtomicU64 = AtomicU64::new(0);

/// Times the comm thread, following a run of messages, saw a TCP socket become readable
/// and went back to its reader tasks without sleeping (see `Shared::follow_messages`).
pub(crate) static SOCKETS_CAUGHT: AtomicU64 = AtomicU64::new(0);

/// `(polled, slept)` so far in this process.
pub(crate) fn waits() -> (u64, u64) {
    (
        WAITS_POLLED.load(Ordering::Relaxed),
        WAITS_SLEPT.load(Ordering::Relaxed),
    )
}

/// The budget when `DSM_SPIN` is unset or `auto` and the host has a core per rank.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// The polling budget of this node: `DSM_SPIN` when set (`setting`), else by `ranks_here`
/// against the cores this process may run on.
pub(crate) fn budget_for(setting: Option<Duration>, ranks_here: usize) -> Duration {
    setting.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if ranks_here <= cores {
            DEFAULT_SPIN
        } else {
            Duration::ZERO
        }
    })
}

/// Polls `ready` for up to `budget`, yielding the core between tries; returns what it gave
/// or `None` when the budget ran out (then the caller sleeps the ordinary way).
pub(crate) fn poll_for<T>(budget: Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    if budget.is_zero() {
        return None;
    }
    // The first look costs no clock read: the engine lock takes this path on every
    // acquisition, and it is almost always free.
    if let Some(v) = ready() {
        return Some(v);
    }
    let start = Instant::now();
    loop {
        std::thread::yield_now();
        if let Some(v) = ready() {
            return Some(v);
        }
        if start.elapsed() >= budget {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_polls_only_with_a_core_per_rank() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(budget_for(None, cores), DEFAULT_SPIN);
        assert_eq!(budget_for(None, cores + 1), Duration::ZERO);
        let set = Duration::from_micros(7);
        assert_eq!(budget_for(Some(set), cores + 1), set);
    }

    #[test]
    fn polling_returns_what_becomes_ready_and_gives_up_after_the_budget() {
        let mut tries = 0;
        let got = poll_for(Duration::from_secs(5), || {
            tries += 1;
            (tries == 3).then_some(tries)
        });
        assert_eq!(got, Some(3));
        let start = Instant::now();
        assert_eq!(poll_for(Duration::from_millis(2), || None::<()>), None);
        assert!(start.elapsed() >= Duration::from_millis(2));
        let mut called = false;
        assert_eq!(
            poll_for(Duration::ZERO, || {
                called = true;
                Some(())
            }),
            None
        );
        assert!(!called, "a zero budget sleeps at once");
    }
}

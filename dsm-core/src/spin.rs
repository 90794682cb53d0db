//! How a thread of this node waits for the comm thread: the policy behind `DSM_SPIN`.
//!
//! A wait for a remote reply (a fault parked in the handler, a lock grant, a barrier
//! release) ends when a message wakes the comm thread and the comm thread wakes the
//! waiter. If the waiter sleeps at once, its core goes idle, and on virtual machines an idle
//! virtual CPU halts: the next wake-up aimed at it costs a trip through the hypervisor
//! (measured on the 2-core development VM: a ring round trip of 43 us between idle cores
//! against 4 us when both cores stay busy). So the waiter first keeps its core for a
//! short budget, calling `sched_yield` between checks so that any runnable thread on that
//! core (its own comm thread above all) runs first, and only then sleeps.
//!
//! Polling only pays when every rank on the host has a core of its own; with more ranks
//! than cores the yields would hand cores around among waiters instead of to the thread
//! that has work, so the default budget is zero there.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
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

/// Times a polling comm thread found itself sharing its core with another busy thread
/// for a run of yields ([`yield_watching_core`]).
pub(crate) static SHARED_CORE_SEEN: AtomicU64 = AtomicU64::new(0);
/// Times it then moved to another core.
pub(crate) static CORE_MOVES: AtomicU64 = AtomicU64::new(0);
/// Moves it took back at once, the core it went to being busy.
pub(crate) static CORE_MOVES_UNDONE: AtomicU64 = AtomicU64::new(0);

/// A yield that gave the core away for at least this long ran another thread meanwhile:
/// alone on its core, `sched_yield` returns in about a microsecond.
const SHARED_YIELD: Duration = Duration::from_micros(4);
/// Yields in a row that must have given the core away before the thread counts its core
/// as shared: a single long yield is a passing thread, a run of them a busy neighbour.
const SHARED_STREAK: u32 = 8;
/// A yield this long, soon after a move, handed the core to a thread that computes there
/// for a time slice: the core moved to was busy.
const BUSY_YIELD: Duration = Duration::from_micros(200);
/// How long after a move a [`BUSY_YIELD`] undoes it.
const JUST_MOVED: Duration = Duration::from_millis(2);
/// The wait before the first move and after one that stayed; each move undone doubles it,
/// up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Yields the core, as [`std::thread::yield_now`], watching whether it is shared (only
/// the comm thread, following a run of messages, calls it). Two threads that poll each other with
/// `sched_yield` on one core (a faulting thread waiting for its page, and the home's comm
/// thread that serves it) run turn by turn while another core idles, and the kernel does
/// not separate them: each ran within the last half millisecond, which its load balancer
/// counts as cache-hot, so it moves neither. Measured on the 2-core development VM: a remote
/// fault over shared memory took 21-23 us while the pair shared a core and 10-13 us once
/// they did not, and a run could stay in either state throughout. So a comm thread whose
/// yields keep handing its core away moves itself to another core of its affinity mask
/// when the host has at most one runnable thread more than the cores it may use
/// ([`a_core_to_spare`]; narrowing its mask to the other cores and at once restoring it
/// migrates it without pinning anything). If
/// that core turns out busy (its next yield hands it to a thread for a whole time slice)
/// it goes straight back, and waits twice as long before the next try: with every core
/// busy it stays with the thread it serves, which is then the better place.
pub(crate) fn yield_watching_core() {
    let before = Instant::now();
    std::thread::yield_now();
    let took = before.elapsed();
    if took < SHARED_YIELD {
        LONG_YIELDS.store(0, Ordering::Relaxed);
        return;
    }
    if took >= BUSY_YIELD && undo_if_just_moved() {
        LONG_YIELDS.store(0, Ordering::Relaxed);
        return;
    }
    if LONG_YIELDS.fetch_add(1, Ordering::Relaxed) + 1 >= SHARED_STREAK {
        LONG_YIELDS.store(0, Ordering::Relaxed);
        SHARED_CORE_SEEN.fetch_add(1, Ordering::Relaxed);
        try_move();
    }
}

/// Long yields in a row so far. It outlives each run the comm thread follows: over TCP a
/// run ends at every message (the runtime reads it), so a streak spans many runs.
static LONG_YIELDS: AtomicU32 = AtomicU32::new(0);

/// When the comm thread may move, and where it came from (only the comm thread uses it).
#[derive(Debug)]
struct MoveState {
    /// The last move not undone: when, and from which core.
    last: Option<(Instant, usize)>,
    /// No move before this.
    next_try: Option<Instant>,
    backoff: Duration,
}

impl MoveState {
    const fn new() -> Self {
        MoveState {
            last: None,
            next_try: None,
            backoff: BACKOFF_MIN,
        }
    }

    /// Whether a move may be tried at `now`; if so, the next one waits for the backoff.
    fn may_try(&mut self, now: Instant) -> bool {
        if self.next_try.is_some_and(|t| now < t) {
            return false;
        }
        if self
            .last
            .is_some_and(|(at, _)| now.duration_since(at) >= JUST_MOVED)
        {
            // The previous move stayed: it was a good one.
            self.backoff = BACKOFF_MIN;
        }
        self.next_try = Some(now + self.backoff);
        true
    }

    fn moved(&mut self, now: Instant, from: usize) {
        self.last = Some((now, from));
    }

    /// A yield at `now` handed the core to a busy thread: if the thread moved moments
    /// ago, the core to go back to; the next move then waits twice as long.
    fn undo(&mut self, now: Instant) -> Option<usize> {
        let (at, from) = self.last?;
        if now.duration_since(at) >= JUST_MOVED {
            return None;
        }
        self.last = None;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.next_try = Some(now + self.backoff);
        Some(from)
    }
}

static MOVES: Mutex<MoveState> = Mutex::new(MoveState::new());

fn moves() -> std::sync::MutexGuard<'static, MoveState> {
    MOVES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Moves the calling thread off its core, unless it tried too recently or the host has
/// no core to spare.
fn try_move() {
    let mut moves = moves();
    let now = Instant::now();
    if !moves.may_try(now) {
        return;
    }
    let (Ok(here), Some(allowed)) = (nix::sched::sched_getcpu(), affinity()) else {
        return;
    };
    if !runnable_threads().is_some_and(|r| a_core_to_spare(r, cores_in(&allowed))) {
        return;
    }
    let mut elsewhere = allowed;
    if elsewhere.unset(here).is_err() || cores_in(&elsewhere) == 0 {
        return;
    }
    if migrate_within(&elsewhere, &allowed) {
        CORE_MOVES.fetch_add(1, Ordering::Relaxed);
        moves.moved(now, here);
    }
}

/// After a yield that handed the core to a busy thread: if the calling thread moved
/// moments ago, takes it back to the core it came from. Returns whether it did.
fn undo_if_just_moved() -> bool {
    let Some(from) = moves().undo(Instant::now()) else {
        return false;
    };
    let Some(allowed) = affinity() else {
        return false;
    };
    let mut back = nix::sched::CpuSet::new();
    if back.set(from).is_err() || !allowed.is_set(from).unwrap_or(false) {
        return false;
    }
    if migrate_within(&back, &allowed) {
        CORE_MOVES_UNDONE.fetch_add(1, Ordering::Relaxed);
    }
    true
}

fn affinity() -> Option<nix::sched::CpuSet> {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()
}

fn cores_in(set: &nix::sched::CpuSet) -> usize {
    (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .count()
}

/// Migrates the calling thread onto one of the cores of `to` by narrowing its affinity
/// to them, then gives it back `allowed`: the kernel moves a thread whose core leaves its
/// mask at once, and restoring the mask does not move it back.
fn migrate_within(to: &nix::sched::CpuSet, allowed: &nix::sched::CpuSet) -> bool {
    use nix::sched::sched_setaffinity;
    use nix::unistd::Pid;
    if sched_setaffinity(Pid::from_raw(0), to).is_err() {
        return false;
    }
    if let Err(e) = sched_setaffinity(Pid::from_raw(0), allowed) {
        tracing::warn!("could not restore the comm thread's CPU affinity: {e}");
    }
    true
}

/// Whether, with `runnable` threads runnable on the host (the calling thread and the one
/// sharing its core among them) and `cores` cores the thread may use, a core may be idle:
/// at most one runnable thread more than cores, as the one the caller shares with does
/// not hold a core of its own, and one more may be passing. Counting the whole host
/// against this thread's cores errs towards staying.
pub(crate) fn a_core_to_spare(runnable: usize, cores: usize) -> bool {
    cores >= 2 && runnable <= cores + 1
}

/// Threads runnable on the host right now: the numerator of the fourth field of
/// `/proc/loadavg` (`running/total`).
fn runnable_threads() -> Option<usize> {
    parse_runnable(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_runnable(loadavg: &str) -> Option<usize> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

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

    #[test]
    fn the_runnable_count_is_read_from_loadavg() {
        assert_eq!(parse_runnable("0.26 0.12 0.04 2/345 5678\n"), Some(2));
        assert_eq!(parse_runnable("0.26 0.12 0.04 17/1024 1\n"), Some(17));
        assert_eq!(parse_runnable("0.26 0.12"), None);
        assert_eq!(parse_runnable("a b c x/y z"), None);
    }

    #[test]
    fn a_core_is_spared_only_with_at_most_one_thread_more_than_cores() {
        // The mover and the thread sharing its core, on a two-core host: one is idle.
        assert!(a_core_to_spare(2, 2));
        // Plus one passing thread.
        assert!(a_core_to_spare(3, 2));
        // Plus a thread busy on the other core too.
        assert!(!a_core_to_spare(4, 2));
        // Nowhere to go.
        assert!(!a_core_to_spare(1, 1));
        assert!(a_core_to_spare(9, 8));
        assert!(!a_core_to_spare(10, 8));
    }

    #[test]
    fn moves_back_off_when_undone_and_recover_when_one_stays() {
        let t0 = Instant::now();
        let mut m = MoveState::new();
        assert!(m.may_try(t0));
        assert!(!m.may_try(t0 + BACKOFF_MIN / 2), "one try per backoff");
        m.moved(t0, 3);
        // A busy yield right after the move: back to core 3, and the next try waits
        // twice as long.
        let undone = t0 + JUST_MOVED / 2;
        assert_eq!(m.undo(undone), Some(3));
        assert_eq!(m.undo(undone), None, "undone once");
        assert!(!m.may_try(undone + BACKOFF_MIN));
        let retry = undone + 2 * BACKOFF_MIN;
        assert!(m.may_try(retry));
        m.moved(retry, 5);
        // A busy yield long after a move says nothing about it: the move stays, and the
        // next try resets the backoff.
        assert_eq!(m.undo(retry + JUST_MOVED), None);
        let later = retry + 4 * BACKOFF_MIN;
        assert!(m.may_try(later));
        assert!(m.may_try(later + BACKOFF_MIN));
        // Undone again and again, the backoff stops at its maximum.
        let mut now = later + BACKOFF_MIN;
        for _ in 0..20 {
            m.moved(now, 1);
            assert_eq!(m.undo(now), Some(1));
            now += BACKOFF_MAX;
            assert!(m.may_try(now));
        }
        assert_eq!(m.backoff, BACKOFF_MAX);
    }

    #[test]
    fn a_move_lands_on_another_core_and_gives_the_affinity_back() {
        let allowed = affinity().expect("sched_getaffinity");
        if cores_in(&allowed) < 2 {
            eprintln!("SKIPPED a_move_lands_on_another_core: this process may use one core");
            return;
        }
        std::thread::spawn(move || {
            let here = nix::sched::sched_getcpu().expect("sched_getcpu");
            let mut elsewhere = allowed;
            elsewhere.unset(here).unwrap();
            assert!(migrate_within(&elsewhere, &allowed));
            let now = nix::sched::sched_getcpu().expect("sched_getcpu");
            assert!(
                elsewhere.is_set(now).unwrap(),
                "moved from core {here} to core {now}, not off it"
            );
            assert_eq!(
                affinity(),
                Some(allowed),
                "the affinity is given back whole"
            );
        })
        .join()
        .unwrap();
    }
}

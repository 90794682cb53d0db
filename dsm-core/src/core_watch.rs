//! Where the comm thread runs: it notices when its polling keeps handing its core to
//! another thread while a core could be spare, and moves.
//!
//! Two threads that poll each other with `sched_yield` on one core (a faulting thread
//! waiting for its page, and the home's comm thread that serves it) run turn by turn while
//! another core idles, and the kernel does not separate them: each ran within the last half
//! millisecond, which its load balancer counts as cache-hot, so it moves neither. In a
//! 3000-fault trace on the 2-core development VM a remote fault over shared memory took
//! 21-23 us while the pair shared a core and 10-13 us while it did not, and a run could
//! stay in either state throughout.
//!
//! So the comm thread, while it follows a run of messages (`Shared::follow_messages`),
//! times its yields. [`SHARED_STREAK`] yields that each handed the core to another thread
//! for [`SHARED_YIELD`] or more, with no gap over [`STREAK_GAP`] between them, mean a
//! shared core. If `/proc/loadavg` then shows at most one runnable thread more than the
//! cores this thread may use (the pair counts two on one core; see [`a_core_to_spare`]),
//! the thread narrows its affinity to its other cores, and the kernel migrates it. It keeps
//! the narrowed mask while its run of messages goes on, and gets its whole mask back after
//! [`HOLD_QUIET`] without following messages, or after [`HOLD_MAX`] at most (a timer on
//! the comm thread's runtime sees to that while it sleeps). The hold is what keeps the
//! pair apart: restoring the mask at once left the thread free to come back, and the
//! kernel brought it back whenever it slept at the end of a run and the faulting thread's
//! bell woke it, beside the waker (in a `perf sched` trace, about 6 ms after a good move).
//! The kernel picks which of the other cores, not by idleness; a yield of [`BUSY_YIELD`]
//! or more within [`JUST_MOVED`] of the move says the new core was busy (a thread there
//! computed for a time slice), and the thread goes back, with its whole mask. Each move
//! taken back doubles the wait before the next try, from [`BACKOFF_MIN`] up to
//! [`BACKOFF_MAX`]; [`CONFIRM_SHORT`] short yields on the new core confirm a move and reset
//! it. A try that finds no core to spare looks again after [`LOOK_AGAIN`], up to
//! [`LOOKS_MAX`] times in a row, since one passing thread is enough to spoil a reading. A
//! held thread that finds its new core shared moves again, among all the cores of its
//! whole mask. If an affinity cannot be restored, moves stop for the rest of the process.
//!
//! Limits: `/proc/loadavg` counts the whole host (or the whole machine, in a container),
//! so on a host whose other cores are busy with other work it rarely moves; and an
//! affinity change another thread makes to the comm thread while it is held (or between
//! the two `sched_setaffinity` calls of a move taken back) is lost when the whole mask is
//! restored.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Times the comm thread found its core shared for a run of yields.
pub(crate) static SHARED_CORE_SEEN: AtomicU64 = AtomicU64::new(0);
/// Times it then moved to another core.
pub(crate) static CORE_MOVES: AtomicU64 = AtomicU64::new(0);
/// Moves it took back, the core it went to being busy.
pub(crate) static CORE_MOVES_UNDONE: AtomicU64 = AtomicU64::new(0);

/// A yield that gave the core away for at least this long ran another thread meanwhile:
/// alone on its core, `sched_yield` returns in about a microsecond.
const SHARED_YIELD: Duration = Duration::from_micros(4);
/// Long yields in a row that make a shared core: one is a passing thread, a run of them
/// a busy neighbour.
const SHARED_STREAK: u32 = 8;
/// A longer gap between two long yields ends the streak. Over TCP the comm thread follows
/// one message at a time (the runtime reads each), so a streak spans several runs.
const STREAK_GAP: Duration = Duration::from_millis(1);
/// A yield this long handed the core to a thread that ran there for a time slice.
const BUSY_YIELD: Duration = Duration::from_micros(200);
/// How long after a move a [`BUSY_YIELD`] takes it back.
const JUST_MOVED: Duration = Duration::from_millis(2);
/// Short yields after a move that show the new core free.
const CONFIRM_SHORT: u32 = 8;
/// The wait between tries: the first, and after a confirmed move.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// The longest wait between tries, reached by moves taken back again and again.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The wait after a try that found no core to spare. A thread passing through (a shell,
/// a launcher, the other rank's comm thread taking a record in) makes one reading of the
/// runnable count too high, so the next look comes soon, up to [`LOOKS_MAX`] in a row.
const LOOK_AGAIN: Duration = Duration::from_millis(2);
/// Looks in a row that may find no core to spare before the backoff applies.
const LOOKS_MAX: u32 = 8;
/// A moved thread keeps off the core it left until it has neither followed messages nor
/// yielded for this long.
pub(crate) const HOLD_QUIET: Duration = Duration::from_millis(10);
/// The longest a move holds, busy or not: a comm thread kept busy by a whole run (Water's
/// lock traffic) would otherwise stay on one core for all of it, which cost Water with
/// 1000 molecules 8% at N = 2.
const HOLD_MAX: Duration = Duration::from_millis(50);

/// What the comm thread should do after a yield.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Nothing,
    /// Its core is shared: move off it if a core may be spare.
    TryMove,
    /// It moved onto a busy core: go back to this one.
    GoBack(usize),
}

/// What the comm thread has seen of its core.
#[derive(Debug)]
struct CoreWatch {
    long_yields: u32,
    last_long: Option<Instant>,
    /// The last move, not yet confirmed or taken back: when, and from which core.
    moved: Option<(Instant, usize)>,
    short_since_move: u32,
    next_try: Option<Instant>,
    backoff: Duration,
    /// Tries in a row that found no core to spare.
    looks: u32,
    /// An affinity could not be restored: no more moves.
    off: bool,
}

impl CoreWatch {
    const fn new() -> Self {
        CoreWatch {
            long_yields: 0,
            last_long: None,
            moved: None,
            short_since_move: 0,
            next_try: None,
            backoff: BACKOFF_MIN,
            looks: 0,
            off: false,
        }
    }

    /// A yield that ended at `now` after `took`.
    fn after_yield(&mut self, now: Instant, took: Duration) -> Action {
        if took < SHARED_YIELD {
            self.long_yields = 0;
            if self.moved.is_some() {
                self.short_since_move += 1;
                if self.short_since_move >= CONFIRM_SHORT {
                    self.moved = None;
                    self.backoff = BACKOFF_MIN;
                }
            }
            return Action::Nothing;
        }
        if let Some((at, from)) = self.moved {
            if now.duration_since(at) >= JUST_MOVED {
                // Neither confirmed nor refuted: the thread slept, most likely. The
                // backoff stays as it is.
                self.moved = None;
            } else if took >= BUSY_YIELD {
                self.moved = None;
                self.long_yields = 0;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                self.next_try = Some(now + self.backoff);
                return Action::GoBack(from);
            }
        }
        if self
            .last_long
            .is_some_and(|t| now.duration_since(t) > STREAK_GAP)
        {
            self.long_yields = 0;
        }
        self.last_long = Some(now);
        self.long_yields += 1;
        if self.long_yields < SHARED_STREAK {
            return Action::Nothing;
        }
        self.long_yields = 0;
        SHARED_CORE_SEEN.fetch_add(1, Ordering::Relaxed);
        if self.off || self.next_try.is_some_and(|t| now < t) {
            return Action::Nothing;
        }
        self.next_try = Some(now + self.backoff);
        Action::TryMove
    }

    fn moved_from(&mut self, now: Instant, core: usize) {
        self.moved = Some((now, core));
        self.short_since_move = 0;
        self.looks = 0;
    }

    /// The thread's affinity could not be restored: it stays narrowed, so no more moves.
    fn stop_moving(&mut self, e: nix::Error) {
        tracing::warn!(
            "the comm thread could not restore its CPU affinity ({e}); it stays on fewer \
             cores and moves no more"
        );
        self.off = true;
    }

    /// A try at `now` found no core to spare: look again soon, unless it has many times.
    fn no_spare_core(&mut self, now: Instant) {
        self.looks += 1;
        if self.looks < LOOKS_MAX {
            self.next_try = Some(now + LOOK_AGAIN);
        } else {
            self.looks = 0;
        }
    }
}

thread_local! {
    static WATCH: RefCell<CoreWatch> = const { RefCell::new(CoreWatch::new()) };
}

/// Yields the core, as [`std::thread::yield_now`], watching whether it is shared (see
/// the module). `before` is the time just before the call, which the caller's loop reads
/// anyway.
pub(crate) fn yield_watching_core(before: Instant) {
    std::thread::yield_now();
    let now = Instant::now();
    note_active(now);
    let action = WATCH.with_borrow_mut(|w| w.after_yield(now, now.duration_since(before)));
    let outcome = match action {
        Action::Nothing => return,
        Action::TryMove => move_off_this_core(),
        Action::GoBack(core) => go_back_to(core),
    };
    WATCH.with_borrow_mut(|w| match outcome {
        Migration::Landed { from, .. } if action == Action::TryMove => {
            CORE_MOVES.fetch_add(1, Ordering::Relaxed);
            w.moved_from(now, from);
        }
        Migration::Landed { .. } => {
            CORE_MOVES_UNDONE.fetch_add(1, Ordering::Relaxed);
        }
        Migration::NoSpareCore => w.no_spare_core(now),
        Migration::NotMoved => {}
        Migration::Narrowed(e) => w.stop_moving(e),
    });
}

/// A moved thread keeps off the core it left while it goes on following messages: the
/// mask it had before, and when it last followed or yielded.
#[derive(Clone, Copy)]
struct Hold {
    whole: CpuSet,
    since: Instant,
    last_active: Instant,
}

thread_local! {
    static HOLD: std::cell::Cell<Option<Hold>> = const { std::cell::Cell::new(None) };
    static HOLD_TIMER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// At a yield or the start of a followed run: gives the thread its whole mask back if it
/// has done neither for [`HOLD_QUIET`] (its run of messages is over, and whatever runs
/// next may want the core it left), and otherwise notes it active.
pub(crate) fn note_active(now: Instant) {
    if release_if_quiet(now) {
        HOLD.set(HOLD.get().map(|h| Hold {
            last_active: now,
            ..h
        }));
    }
}

/// Gives the thread its whole mask back if it has been quiet for [`HOLD_QUIET`] or held
/// for [`HOLD_MAX`]; returns whether it is still held. For a timer too: a thread that
/// sleeps does not note itself.
pub(crate) fn release_if_quiet(now: Instant) -> bool {
    let Some(hold) = HOLD.get() else {
        return false;
    };
    if now.duration_since(hold.last_active) <= HOLD_QUIET
        && now.duration_since(hold.since) <= HOLD_MAX
    {
        return true;
    }
    HOLD.set(None);
    if let Err(e) = restore(&hold.whole) {
        WATCH.with_borrow_mut(|w| w.stop_moving(e));
    }
    false
}

/// Whether the thread is held and nothing is yet set to release it while it sleeps; the
/// caller then sets a timer that calls [`release_if_quiet`] every [`HOLD_QUIET`] until it
/// returns false, then [`release_timer_ended`].
pub(crate) fn needs_release_timer() -> bool {
    HOLD.get().is_some() && !HOLD_TIMER.replace(true)
}

pub(crate) fn release_timer_ended() {
    HOLD_TIMER.set(false);
}

/// Whether a thread that shares its core with another busy thread, seeing `runnable`
/// threads runnable on the host and allowed `cores` cores, may find one of them idle.
/// The two sharing count two on one core, so `runnable <= cores` leaves a core without a
/// runnable thread; one more is allowed, since the count is a single reading that often
/// includes a thread only passing through (on the development VM it read one more than
/// `/proc/*/task/*/stat` showed running, most of the time). A move onto a core that was
/// busy after all is taken back at the first yield there.
fn a_core_to_spare(runnable: usize, cores: usize) -> bool {
    cores >= 2 && runnable <= cores + 1
}

/// What an attempt to move the calling thread came to.
#[derive(Debug)]
enum Migration {
    Landed {
        from: usize,
        #[cfg_attr(not(test), allow(dead_code))]
        on: usize,
    },
    /// Nothing changed: the host had no core to spare.
    NoSpareCore,
    /// Nothing changed.
    NotMoved,
    /// The affinity stayed narrowed to the cores the thread was moved to.
    Narrowed(nix::Error),
}

/// The core the calling thread is on and the cores it may use.
fn placement() -> Option<(usize, CpuSet)> {
    Some((
        sched_getcpu().ok()?,
        sched_getaffinity(Pid::from_raw(0)).ok()?,
    ))
}

/// The mask to move within: the one held back while the thread keeps off a core.
fn whole_mask(current: CpuSet) -> CpuSet {
    HOLD.get().map_or(current, |h| h.whole)
}

fn move_off_this_core() -> Migration {
    let Some((here, current)) = placement() else {
        return Migration::NotMoved;
    };
    let allowed = whole_mask(current);
    if !runnable_threads().is_some_and(|r| a_core_to_spare(r, cores_in(&allowed))) {
        return Migration::NoSpareCore;
    }
    let mut elsewhere = allowed;
    if elsewhere.unset(here).is_err() || cores_in(&elsewhere) == 0 {
        return Migration::NotMoved;
    }
    hold_off(here, &elsewhere, &allowed)
}

/// Moves the calling thread, now on core `here`, onto one of the cores of `to` and keeps
/// it there until [`release_if_quiet`] gives it back `allowed`.
fn hold_off(here: usize, to: &CpuSet, allowed: &CpuSet) -> Migration {
    if sched_setaffinity(Pid::from_raw(0), to).is_err() {
        return Migration::NotMoved;
    }
    let on = sched_getcpu().unwrap_or(here);
    let now = Instant::now();
    HOLD.set(Some(Hold {
        whole: *allowed,
        since: now,
        last_active: now,
    }));
    Migration::Landed { from: here, on }
}

fn go_back_to(core: usize) -> Migration {
    let Some((here, current)) = placement() else {
        return Migration::NotMoved;
    };
    let allowed = whole_mask(current);
    HOLD.set(None);
    let mut back = CpuSet::new();
    if !allowed.is_set(core).unwrap_or(false) || back.set(core).is_err() {
        return match restore(&allowed) {
            Ok(()) => Migration::NotMoved,
            Err(e) => Migration::Narrowed(e),
        };
    }
    migrate_within(here, &back, &allowed)
}

fn restore(allowed: &CpuSet) -> nix::Result<()> {
    sched_setaffinity(Pid::from_raw(0), allowed)
        .or_else(|_| sched_setaffinity(Pid::from_raw(0), allowed))
}

/// Moves the calling thread, now on core `here`, onto one of the cores of `to`, then
/// gives it back `allowed` (retried once: a failure there would leave it narrowed).
fn migrate_within(here: usize, to: &CpuSet, allowed: &CpuSet) -> Migration {
    if sched_setaffinity(Pid::from_raw(0), to).is_err() {
        return Migration::NotMoved;
    }
    // Read between the two calls: once the mask is whole again the kernel may move the
    // thread anywhere.
    let on = sched_getcpu().unwrap_or(here);
    match restore(allowed) {
        Ok(()) => Migration::Landed { from: here, on },
        Err(e) => Migration::Narrowed(e),
    }
}

fn cores_in(set: &CpuSet) -> usize {
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .count()
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

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_micros(20);
    const SHORT: Duration = Duration::from_micros(1);

    /// Feeds `n` yields of `took`, `every` apart from `*now`; returns the actions.
    fn feed(
        w: &mut CoreWatch,
        now: &mut Instant,
        n: u32,
        took: Duration,
        every: Duration,
    ) -> Vec<Action> {
        (0..n)
            .map(|_| {
                *now += every;
                w.after_yield(*now, took)
            })
            .collect()
    }

    /// Feeds one streak of long yields; returns what its last yield asked for, the others
    /// having asked for nothing.
    fn streak(w: &mut CoreWatch, now: &mut Instant) -> Action {
        let acts = feed(w, now, SHARED_STREAK, LONG, Duration::from_micros(30));
        let (last, before) = acts.split_last().unwrap();
        assert!(before.iter().all(|a| *a == Action::Nothing), "{acts:?}");
        *last
    }

    #[test]
    fn the_runnable_count_is_read_from_loadavg() {
        assert_eq!(parse_runnable("0.26 0.12 0.04 2/345 5678\n"), Some(2));
        assert_eq!(parse_runnable("0.26 0.12 0.04 17/1024 1\n"), Some(17));
        assert_eq!(parse_runnable("0.26 0.12"), None);
        assert_eq!(parse_runnable("a b c x/y z"), None);
    }

    #[test]
    fn a_core_may_be_spare_with_at_most_one_runnable_thread_more_than_cores() {
        // The mover and the thread sharing its core, on a two-core host: one is idle.
        assert!(a_core_to_spare(2, 2));
        // Plus one that may be passing through.
        assert!(a_core_to_spare(3, 2));
        // Plus two: the other core is busy.
        assert!(!a_core_to_spare(4, 2));
        assert!(!a_core_to_spare(1, 1), "nowhere to go");
        assert!(a_core_to_spare(9, 8));
        assert!(!a_core_to_spare(10, 8));
    }

    #[test]
    fn a_streak_of_long_yields_asks_for_a_move_and_a_gap_or_a_short_yield_breaks_it() {
        let mut w = CoreWatch::new();
        let mut now = Instant::now();
        let every = Duration::from_micros(30);
        assert_eq!(streak(&mut w, &mut now), Action::TryMove);
        // Within the backoff another streak asks for nothing.
        assert_eq!(streak(&mut w, &mut now), Action::Nothing);
        let mut w = CoreWatch::new();
        feed(&mut w, &mut now, SHARED_STREAK - 1, LONG, every);
        // A short yield ends the streak ...
        w.after_yield(now, SHORT);
        let acts = feed(&mut w, &mut now, SHARED_STREAK - 1, LONG, every);
        assert!(acts.iter().all(|a| *a == Action::Nothing));
        // ... and so does a gap: seven long yields long ago and one now are no streak.
        now += STREAK_GAP * 2;
        assert_eq!(w.after_yield(now, LONG), Action::Nothing);
        let acts = feed(&mut w, &mut now, SHARED_STREAK - 1, LONG, every);
        assert_eq!(acts.last(), Some(&Action::TryMove));
    }

    #[test]
    fn a_move_onto_a_busy_core_is_taken_back_and_the_next_waits_twice_as_long() {
        let mut w = CoreWatch::new();
        let mut now = Instant::now();
        assert_eq!(streak(&mut w, &mut now), Action::TryMove);
        w.moved_from(now, 3);
        now += Duration::from_micros(100);
        assert_eq!(w.after_yield(now, BUSY_YIELD), Action::GoBack(3));
        assert_eq!(w.backoff, BACKOFF_MIN * 2);
        // Taken back once only; the next try waits for the doubled backoff.
        now += Duration::from_micros(100);
        assert_eq!(w.after_yield(now, BUSY_YIELD), Action::Nothing);
        now += BACKOFF_MIN;
        assert_eq!(streak(&mut w, &mut now), Action::Nothing);
        now += BACKOFF_MIN;
        assert_eq!(streak(&mut w, &mut now), Action::TryMove);
        // Moves taken back again and again stop doubling at the maximum.
        for _ in 0..20 {
            w.moved_from(now, 1);
            assert_eq!(w.after_yield(now, BUSY_YIELD), Action::GoBack(1));
        }
        assert_eq!(w.backoff, BACKOFF_MAX);
    }

    #[test]
    fn a_try_that_finds_no_spare_core_looks_again_soon_a_few_times() {
        let mut w = CoreWatch::new();
        let mut now = Instant::now();
        for look in 0..LOOKS_MAX {
            assert_eq!(streak(&mut w, &mut now), Action::TryMove, "look {look}");
            w.no_spare_core(now);
            now += LOOK_AGAIN;
        }
        // The last of them waits for the backoff.
        assert_eq!(streak(&mut w, &mut now), Action::Nothing);
        now += BACKOFF_MIN;
        assert_eq!(streak(&mut w, &mut now), Action::TryMove);
    }

    #[test]
    fn only_short_yields_on_the_new_core_confirm_a_move() {
        let mut w = CoreWatch::new();
        let mut now = Instant::now();
        w.backoff = BACKOFF_MIN * 8;
        w.moved_from(now, 0);
        // A busy yield after the window says nothing about the move, and resets nothing.
        now += JUST_MOVED;
        assert_eq!(w.after_yield(now, BUSY_YIELD), Action::Nothing);
        assert_eq!(w.backoff, BACKOFF_MIN * 8);
        assert!(w.moved.is_none());
        // Short yields right after a move confirm it.
        w.moved_from(now, 0);
        feed(
            &mut w,
            &mut now,
            CONFIRM_SHORT,
            SHORT,
            Duration::from_micros(2),
        );
        assert_eq!(w.backoff, BACKOFF_MIN);
        assert!(w.moved.is_none());
    }

    #[test]
    fn a_moved_thread_keeps_off_its_old_core_until_it_goes_quiet() {
        let allowed = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
        if cores_in(&allowed) < 2 {
            eprintln!(
                "SKIPPED a_moved_thread_keeps_off_its_old_core: this process may use one core"
            );
            return;
        }
        std::thread::spawn(move || {
            let here = sched_getcpu().expect("sched_getcpu");
            let mut elsewhere = allowed;
            elsewhere.unset(here).unwrap();
            assert!(matches!(
                hold_off(here, &elsewhere, &allowed),
                Migration::Landed { from, .. } if from == here
            ));
            let mask = || sched_getaffinity(Pid::from_raw(0)).unwrap();
            assert_eq!(mask(), elsewhere, "held off the core it left");
            let start = HOLD.get().expect("a hold").last_active;
            // Yields that keep coming keep the hold, each one moving its quiet mark on.
            note_active(start + HOLD_QUIET);
            note_active(start + HOLD_QUIET * 2);
            assert_eq!(mask(), elsewhere);
            // A timer's look within the quiet spell notes nothing.
            assert!(release_if_quiet(start + HOLD_QUIET * 3));
            assert!(needs_release_timer() && !needs_release_timer());
            // A move from a held thread is among all the cores it had before.
            assert_eq!(whole_mask(mask()), allowed);
            // A quiet spell gives the whole mask back.
            assert!(!release_if_quiet(start + HOLD_QUIET * 4));
            assert_eq!(mask(), allowed);
            assert!(HOLD.get().is_none());
            // However busy it keeps, a hold ends after HOLD_MAX.
            assert!(matches!(
                hold_off(here, &elsewhere, &allowed),
                Migration::Landed { .. }
            ));
            let start = HOLD.get().expect("a hold").since;
            let mut now = start;
            while now + HOLD_QUIET <= start + HOLD_MAX {
                now += HOLD_QUIET;
                note_active(now);
                assert_eq!(mask(), elsewhere);
            }
            note_active(start + HOLD_MAX + HOLD_QUIET / 2);
            assert_eq!(mask(), allowed);
            assert!(HOLD.get().is_none());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_move_lands_on_another_core_and_gives_the_affinity_back() {
        let allowed = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
        if cores_in(&allowed) < 2 {
            eprintln!("SKIPPED a_move_lands_on_another_core: this process may use one core");
            return;
        }
        std::thread::spawn(move || {
            let here = sched_getcpu().expect("sched_getcpu");
            let mut elsewhere = allowed;
            elsewhere.unset(here).unwrap();
            match migrate_within(here, &elsewhere, &allowed) {
                Migration::Landed { from, on } => {
                    assert_eq!(from, here);
                    assert!(
                        elsewhere.is_set(on).unwrap(),
                        "moved from core {here} to core {on}, not off it"
                    );
                }
                other => panic!("no move: {other:?}"),
            }
            assert_eq!(
                sched_getaffinity(Pid::from_raw(0)).ok(),
                Some(allowed),
                "the affinity is given back whole"
            );
        })
        .join()
        .unwrap();
    }
}

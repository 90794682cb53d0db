//! Race-detection orchestration on a node: closing the recorder's interval at each
//! synchronization, shipping bitmaps with barrier arrivals and, on the barrier master, the
//! analysis of an epoch (plan, fetch the bitmaps it needs, compare, report) and the
//! detector's counters.

use super::analyst::{self, Analyst, Master, SharedMaster, MAX_UNANALYSED_BATCHES};
use super::{Dsm, Outcome, MAX_SHIPPED_BITMAP_BYTES};
use crate::comm::Comm;
use crate::engine::{Command, KnownClock, Reply};
use crate::error::DsmError;
use crate::sys::HostLock;
use dsm_proto::config::DEFAULT_RACE_BATCH;
use dsm_proto::{EncodedBitmap, LockId, NodeId, RaceNotices, RaceOptions, RacePhases, VectorTime};
use dsm_race::{Checker, Incremental, Recorder, Reporter, VarTable};
use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most depth of the always-happens-before expansion under `--sem-order=safe`; larger
/// epochs get less (`dsm_ahb::epoch::depth_for`), so an epoch's analysis stays bounded.
const SAFE_ORDER_DEPTH: u32 = 2;

/// The most a node's batch grows to fit a program's epochs, in lock operations: what a
/// node holds between barriers stays bounded by this much whatever the program does.
const MAX_EPOCH_BATCH: u32 = 8 * DEFAULT_RACE_BATCH;

/// The batch after an epoch of `epoch_lock_syncs` lock operations in which this node
/// shipped batches (`batch`: the batch so far). Batches exist for programs that go a long
/// time without a barrier; one that has barriers but takes more locks between two of them
/// than the default batch (Water's force phase: about a thousand per rank) would ship
/// batches in every epoch, and the master would plan each against everything pending,
/// where the barrier plans the epoch once. The batch grows to twice the epoch, so the
/// next such epoch ships none, up to [`MAX_EPOCH_BATCH`]. A batch size the user set
/// (`DSM_RACE_BATCH`) is kept as it is.
fn batch_for_epochs(batch: u32, epoch_lock_syncs: u32) -> u32 {
    batch.max(epoch_lock_syncs.saturating_mul(2).min(MAX_EPOCH_BATCH))
}

/// Race-detection state of this node.
pub(super) struct RaceState {
    pub(super) phases: RacePhases,
    pub(super) recorder: Recorder,
    /// Rank 0: the reporter and the incremental analysis, shared with the analyst.
    pub(super) master: Option<SharedMaster>,
    /// Rank 0, when nodes ship race batches: the thread that analyses them.
    analyst: Option<Analyst>,
    pub(super) vars: VarTable,
    pub(super) options: RaceOptions,
    pub(super) close_time: Duration,
    /// The detector's own timers and notice sizes are kept (`--race-stats` or a stats
    /// file): lock-heavy programs close an interval every microsecond or so, and two clock
    /// reads each are not free.
    pub(super) timed: bool,
    pub(super) plan_time: Duration,
    pub(super) bitmap_time: Duration,
    pub(super) barriers: u64,
    pub(super) notice_bytes: u64,
    /// Bitmaps the master had to fetch from other nodes in an extra round (not shipped
    /// with their arrivals); its own it reads from its recorder.
    pub(super) fetched_late: u64,
    pub(super) sum: dsm_race::PlanStats,
    /// Rank 0 with `--check`: the dynamic checks' state across epochs.
    pub(super) checker: Option<Checker>,
    /// [`RaceState::batching`], fixed for the run (asked at every lock operation).
    ships_batches: bool,
    /// Lock operations between two asks whether a race batch is due, less one (a power
    /// of two): 15 (every eighth release or so; a batch a few lock operations late
    /// changes nothing, and the question costs more than the rest of a re-taken lock's
    /// release), 0 (every release) for batches smaller than that.
    due_check_mask: u32,
    /// Lock operations since this node's last race batch or barrier.
    unshipped: u32,
    /// The recorder's open interval at this node's last race batch or barrier: the
    /// intervals closed since are what the next batch takes.
    interval_at_ship: u32,
    /// Protocol acquires since then that left the interval open: each counts towards the
    /// next batch as the interval it would have closed, so that a batch spans as many lock
    /// operations (and rank 0 holds as much) as when every acquire closed one.
    quiet_since_ship: u32,
    /// Lock operations since the last barrier.
    epoch_lock_syncs: u32,
    /// Closed intervals after which this node ships a race batch: the configured batch,
    /// grown for a program with barriers to fit its epochs (see [`batch_for_epochs`]).
    batch_threshold: u32,
    /// When this node last shipped a race batch (or passed a barrier).
    last_ship: Instant,
    /// Whether this node shipped a race batch since the last barrier.
    shipped_in_epoch: bool,
    /// Race batches this node shipped in the run.
    batches_shipped: u64,
    /// Rank 0: the analyst's count of other nodes' batches when rank 0 last shipped.
    foreign_seen: u64,
    /// `--sem-order=safe`, master: each semaphore's tokens when the current epoch began.
    pub(super) sem_tokens: std::collections::BTreeMap<dsm_proto::SemId, u32>,
    /// Pages whose bitmaps the master has asked this node for: an iterative program
    /// shares the same pages epoch after epoch, so their bitmaps go with the next
    /// arrivals unasked, sparing the master a round (the protocol's shared pages are
    /// shipped too; in one common memory nothing marks a page shared).
    pub(super) asked_pages: std::collections::HashSet<dsm_proto::PageNo>,
    /// What the engine knew at this node's last host-lock operation or barrier: an
    /// acquire of a host lock whose last release it covers leaves the interval open
    /// (see [`KnownClock`]).
    pub(super) known: KnownClock,
    /// Whether such acquires may leave the interval open: not when intervals must be
    /// numbered alike in every run (`--pinpoint` counts them), nor where lock edges order
    /// nothing or whole epochs are analysed as such (`--race=schedule`, `--check`).
    pub(super) elide_acquires: bool,
    /// Host-lock acquires that left the interval open.
    pub(super) elided_acquires: u64,
    /// The host lock this node released last and the interval that release closed, while
    /// acquires may leave intervals open: its next release may take that interval back
    /// (see `Dsm::release_host_lock`).
    pub(super) last_release: Option<(dsm_proto::LockId, u32)>,
    /// Host-lock releases taken back: the interval a release froze thawed at the next
    /// acquire of the lock, or the next release reopened the interval it closed.
    pub(super) continued_releases: u64,
    /// The host lock whose release froze the open interval (see
    /// `Dsm::freeze_released_interval`), until an acquire of it thaws the interval or
    /// another synchronization closes it.
    pub(super) frozen_release: Option<dsm_proto::LockId>,
    /// Whether the open interval was frozen and thawed and nothing closed since: the
    /// engine's clock is then still `known`, which the freeze left in the lock, and the
    /// next freeze leaves it again without asking the engine.
    pub(super) thawed: bool,
    /// The stamp under which `known` was last left in a host lock, 0 when `known` changed
    /// since (see [`RaceState::lock_holds_known`]).
    pub(super) known_stamp: u64,
    /// The last stamp this node left in a host lock: the rank in the high bits, a count
    /// below, so that no two releases of the job leave the same one.
    last_stamp: u64,
}

/// A node also ships a race batch after this many times the batch size in lock
/// operations, closing intervals or not. What the master holds is counted in intervals,
/// and a rank that re-takes its own lock closes one only now and then (a thawed release
/// closes none); the lock operations stand for the time that passes, counted without a
/// clock, so that a race in such a program is still reported within a few thousand
/// lock operations.
const LOCK_OPS_PER_BATCH_INTERVAL: u32 = 16;

/// A node ships its closed intervals at least this often between barriers, so races in
/// programs without barriers are reported within about this long.
const BATCH_PERIOD: Duration = Duration::from_secs(1);

/// Where a host lock's release stamp keeps the releasing rank (a count of that rank's
/// releases below it).
const STAMP_RANK_SHIFT: u32 = 40;

impl RaceState {
    /// A protocol acquire left the interval open (see `Dsm::may_leave_interval_open`).
    pub(super) fn note_quiet_acquire(&mut self) {
        self.quiet_since_ship = self.quiet_since_ship.saturating_add(1);
    }

    /// Sets what the engine knows (a release or a barrier answered it).
    pub(super) fn set_known(&mut self, known: &VectorTime) {
        self.known.set(known);
        self.known_stamp = 0;
    }

    /// Leaves `known` in host lock `host` as its release clock, under a new stamp. Call
    /// while holding the lock.
    pub(super) fn leave_known(&mut self, host: HostLock) {
        self.last_stamp += 1;
        host.set_released_clock(self.known.entries(), self.last_stamp);
        self.known_stamp = self.last_stamp;
    }

    /// Whether host lock `host` still holds the clock this node left in it with what it
    /// knows now: nobody released it since, and this node learned nothing since. One
    /// compare: the stamp names the release, and any change of `known` forgets it.
    #[inline]
    pub(super) fn lock_holds_known(&self, host: HostLock) -> bool {
        self.known_stamp != 0 && host.released_stamp() == self.known_stamp
    }

    /// What the engine gets of a closed interval's notices: nothing while only recording
    /// is measured (`RacePhases::Record`).
    fn engine_notices(&self, notices: RaceNotices) -> RaceNotices {
        if self.phases == RacePhases::Record {
            RaceNotices::default()
        } else {
            notices
        }
    }

    /// Detection state for a node; rank 0 (`master`) also owns the reporter.
    pub(super) fn new(options: RaceOptions, rank: usize, nodes: usize) -> io::Result<RaceState> {
        let master = rank == 0;
        let batch = options.batch_intervals;
        let reporter = if master {
            let mut rep = Reporter::new(options.log.as_deref(), options.first_only)?;
            if options.schedule {
                rep.set_schedule(options.schedule_ignore.iter().cloned());
            }
            if options.check {
                rep.set_checking();
            }
            if let Some(sarif) = &options.sarif {
                rep.set_sarif(sarif);
            }
            if !options.suppressions.is_empty() {
                let entries = dsm_race::Suppressions::parse(&options.suppressions.join("\n"))
                    .map_err(|e| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("race suppressions: {e}"),
                        )
                    })?;
                rep.set_suppressions(entries);
            }
            // Source files named relative to the workspace that built the program.
            let mut roots: Vec<std::path::PathBuf> = std::env::current_dir().into_iter().collect();
            if let Some(ws) = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent() {
                roots.push(ws.to_path_buf());
            }
            rep.set_source_roots(roots);
            if let Ok(exe) = std::env::current_exe() {
                dsm_race::set_code_resolver(super::code_sites::resolver(exe.clone()));
                let names = super::functions::FunctionNames::new(exe);
                rep.set_function_namer(Box::new(move |site| names.name(site)));
            }
            Some(rep)
        } else {
            None
        };
        let checker = (master && options.check).then(Checker::new);
        let master = reporter.map(|rep| {
            let mut inc = Incremental::new(nodes, options.schedule);
            if options.verify_incremental {
                inc.keep_oracle();
            }
            Arc::new(Mutex::new(Master::new(rep, inc, nodes)))
        });
        let elide_acquires = !options.schedule && !options.check && options.pinpoint.is_empty();
        let mut state = RaceState {
            phases: options.phases,
            recorder: Recorder::new(),
            master,
            analyst: None,
            vars: VarTable::new(),
            options,
            close_time: Duration::ZERO,
            timed: false,
            plan_time: Duration::ZERO,
            bitmap_time: Duration::ZERO,
            barriers: 0,
            notice_bytes: 0,
            fetched_late: 0,
            sum: Default::default(),
            checker,
            ships_batches: false,
            due_check_mask: if batch < 16 { 0 } else { 15 },
            unshipped: 0,
            interval_at_ship: 1,
            quiet_since_ship: 0,
            epoch_lock_syncs: 0,
            batch_threshold: batch,
            last_ship: Instant::now(),
            shipped_in_epoch: false,
            batches_shipped: 0,
            foreign_seen: 0,
            sem_tokens: Default::default(),
            asked_pages: Default::default(),
            known: KnownClock::default(),
            elide_acquires,
            elided_acquires: 0,
            last_release: None,
            continued_releases: 0,
            frozen_release: None,
            thawed: false,
            known_stamp: 0,
            last_stamp: (rank as u64) << STAMP_RANK_SHIFT,
        };
        state.ships_batches = state.batching();
        Ok(state)
    }

    /// Whether this node ships race batches between barriers. First races, the dynamic
    /// checks and the safe semaphore order need whole epochs: `--race-first`, `--check`
    /// and `--sem-order=safe` analyse at barriers only. So does `--pinpoint`: the lines it
    /// watched come with the barrier arrivals, and a race reported before them would be
    /// named by its recorded sites alone.
    fn batching(&self) -> bool {
        self.phases == RacePhases::Full
            && !self.options.first_only
            && !self.options.check
            && !self.options.sem_order_safe
            && self.options.pinpoint.is_empty()
    }

    /// Rank 0, when nodes ship race batches: starts the thread that analyses them.
    pub(super) fn start_analyst(&mut self, comm: &Comm) -> io::Result<()> {
        if let (Some(master), true) = (self.master.as_ref(), self.batching()) {
            self.analyst = Some(Analyst::start(
                master.clone(),
                comm.race_inbox(),
                comm.commands(),
            )?);
        }
        Ok(())
    }

    /// Rank 0's reporter and incremental analysis.
    pub(super) fn master(&self) -> Option<std::sync::MutexGuard<'_, Master>> {
        self.master.as_ref().map(analyst::lock)
    }

    /// A barrier completed (`after_barriers`: the program's barriers so far): what was
    /// shipped or kept before it is analysed; the analysis starts on the next epoch.
    pub(super) fn epoch_done(&mut self, after_barriers: u32) {
        if self.shipped_in_epoch && self.options.batch_intervals == DEFAULT_RACE_BATCH {
            self.batch_threshold = batch_for_epochs(self.batch_threshold, self.epoch_lock_syncs);
        }
        self.epoch_lock_syncs = 0;
        self.unshipped = 0;
        self.interval_at_ship = self.recorder.current_interval();
        self.quiet_since_ship = 0;
        self.last_ship = Instant::now();
        self.shipped_in_epoch = false;
        self.barriers += 1;
        if let Some(mut m) = self.master() {
            m.incremental.reset();
            m.epoch = self.barriers as u32 + 1;
            m.after_barriers = after_barriers;
        }
        if let Some(a) = self.analyst.as_ref() {
            a.inbox().set_paused(false);
        }
    }

    /// End of the run: rank 0 prints the run's statistics (if asked) and the summary, and
    /// says which exit status the race convention asks for.
    pub(super) fn finish(&mut self) -> io::Result<Outcome> {
        if let Some(a) = self.analyst.as_mut() {
            a.stop();
        }
        let Some(master) = self.master.clone() else {
            return Ok(Outcome::default());
        };
        let mut m = analyst::lock(&master);
        if let Some(e) = m.take_failure() {
            return Err(e);
        }
        let Master {
            reporter: rep,
            incremental: inc,
            time: incremental_time,
            ..
        } = &mut *m;
        rep.finish()?;
        if self.options.stats {
            let s = &self.sum;
            let rs = self.recorder.stats();
            eprintln!(
                "dsm-race-stats: run: barriers {}, intervals {}, interval pairs {} considered / {} concurrent / {} overlapping, intervals in a concurrent overlapping pair {}, bitmaps {} of {} fetched, notice bytes {}, rank 0 recording (interval close) {:.3} ms, interval comparison {:.3} ms, bitmap round {:.3} ms, peak bitmap store on rank 0 {} bytes, rank 0 acquires that left the interval open {}, rank 0 releases that continued the interval before {}",
                self.barriers,
                s.intervals,
                s.pairs_considered,
                s.concurrent_pairs,
                s.overlapping_pairs,
                s.intervals_in_overlap,
                s.bitmaps_wanted,
                s.bitmaps_total,
                self.notice_bytes,
                self.close_time.as_secs_f64() * 1e3,
                self.plan_time.as_secs_f64() * 1e3,
                self.bitmap_time.as_secs_f64() * 1e3,
                rs.peak_store_bytes,
                self.elided_acquires,
                self.continued_releases
            );
            if inc.batches > 0 {
                eprintln!(
                    "dsm-race-stats: incremental: {} race batches absorbed between barriers, at most {} intervals pending, {:.3} ms",
                    inc.batches,
                    inc.peak_pending,
                    incremental_time.as_secs_f64() * 1e3
                );
            }
        }
        if let Some(distinct) = rep.distinct_summary() {
            eprintln!("{distinct}");
        }
        eprintln!("{}", rep.summary());
        io::stderr().flush()?;
        let races_reported = rep.total();
        Ok(Outcome {
            races_reported,
            exit_status: if races_reported + rep.check_total() > 0 {
                self.options.exit_code
            } else {
                0
            },
        })
    }
}

impl Dsm {
    /// Race mode, at a synchronization: closes the recorder's open interval (after the
    /// one a release froze, if any) and returns its notices for the engine.
    pub(super) fn close_race_interval(&mut self) -> Result<Option<RaceNotices>, DsmError> {
        self.settle_frozen_release()?;
        if let Some(r) = self.race.as_mut() {
            r.thawed = false;
        }
        if let Some(p) = &self.pin {
            p.interval_closed();
        }
        let Some(r) = self.race.as_mut() else {
            return Ok(None);
        };
        let t = r.timed.then(Instant::now);
        let n = r.recorder.close_interval();
        if let Some(t) = t {
            r.close_time += t.elapsed();
        }
        Ok(Some(r.engine_notices(n)))
    }

    /// Race mode, releasing host lock `lock` when acquires may leave intervals open:
    /// freezes the recorder's interval instead of closing it (see
    /// [`dsm_race::Recorder::freeze_interval`]) and leaves the clock that names it in the
    /// lock, so that this node's next acquire of the same lock, finding its own clock
    /// still there, thaws it: nobody learned where it ended, so the critical sections
    /// and what ran between them are one interval, at the cost of a pass over a few
    /// page flags instead of a close in the recorder and the engine. Any other
    /// synchronization closes it first (`settle_frozen_release`), as the release would
    /// have. `false`, changing nothing, when the interval does not freeze.
    pub(super) fn freeze_released_interval(&mut self, lock: LockId, host: HostLock) -> bool {
        let Some(r) = self.race.as_mut() else {
            return false;
        };
        if !r.elide_acquires || !r.recorder.freeze_interval() {
            return false;
        }
        if r.thawed {
            // The lock holds what this node knows: the thaw checked it, and nothing was
            // learned since (an acquire that learns something closes the interval).
            debug_assert!(r.lock_holds_known(host) && r.known.is(host.released()));
        } else {
            let clock = self.comm().with_engine_now(|e| e.known_after_close());
            let r = self.race.as_mut().expect("race mode");
            r.set_known(&clock);
            r.leave_known(host);
        }
        let r = self.race.as_mut().expect("race mode");
        host.unlock();
        r.thawed = false;
        r.frozen_release = Some(lock);
        r.last_release = None;
        true
    }

    /// Race mode, holding host lock `lock` again after a release of it froze the interval:
    /// thaws it when the lock still holds the clock that release left (nobody took the
    /// lock since) and the recorder can. `false`, changing nothing, otherwise.
    pub(super) fn thaw_frozen_release(&mut self, host: HostLock) -> bool {
        let Some(r) = self.race.as_mut() else {
            return false;
        };
        if !r.lock_holds_known(host) || !r.recorder.thaw_interval() {
            return false;
        }
        r.frozen_release = None;
        r.thawed = true;
        r.elided_acquires += 1;
        r.continued_releases += 1;
        true
    }

    /// Race mode: closes the interval a host-lock release froze, in the recorder and the
    /// engine, as that release would have closed it (nothing was learned since: every
    /// synchronization settles it first). Its clock is already in the lock.
    #[inline]
    pub(super) fn settle_frozen_release(&mut self) -> Result<(), DsmError> {
        match self.race.as_ref() {
            Some(r) if r.frozen_release.is_some() => self.close_frozen_release(),
            _ => Ok(()),
        }
    }

    /// [`Dsm::settle_frozen_release`] when a release froze the interval.
    #[inline(never)]
    fn close_frozen_release(&mut self) -> Result<(), DsmError> {
        let Some(r) = self.race.as_mut() else {
            return Ok(());
        };
        let Some(lock) = r.frozen_release.take() else {
            return Ok(());
        };
        let t = r.timed.then(Instant::now);
        let notices = r.recorder.close_frozen();
        if let Some(t) = t {
            r.close_time += t.elapsed();
        }
        let race = Some(r.engine_notices(notices));
        if let Some(p) = &self.pin {
            p.interval_closed();
        }
        self.close_release_in_engine(lock, race)?;
        self.remember_release(lock);
        Ok(())
    }

    /// Race mode: the engine closes the interval a release of host lock `lock` ended,
    /// with the recorder's notices `race`; it must close it at the clock the release
    /// left in the lock, which `known` holds.
    pub(super) fn close_release_in_engine(
        &mut self,
        lock: LockId,
        race: Option<RaceNotices>,
    ) -> Result<(), DsmError> {
        let known = self
            .comm()
            .with_engine_now(|e| e.host_release_now(lock, race));
        match self.race.as_ref() {
            Some(r) if !r.known.is(known.0.iter().copied()) => Err(DsmError::Protocol(format!(
                "lock {lock}: the release left {:?} in the lock but the engine closed the \
                 interval at {known:?}",
                r.known
            ))),
            _ => Ok(()),
        }
    }

    /// Race mode: remembers the release of `lock` that closed the last interval, which
    /// the next release of the same lock may take back (`take_back_released_interval`).
    pub(super) fn remember_release(&mut self, lock: LockId) {
        if let Some(r) = self.race.as_mut() {
            let closed = r.recorder.current_interval() - 1;
            r.last_release = r.elide_acquires.then_some((lock, closed));
        }
    }

    /// After a lock operation (it closed an interval): between barriers, ship the closed
    /// intervals' bitmaps to the race master once enough have gathered or a second has
    /// passed. While [`MAX_UNANALYSED_BATCHES`] of this node's batches wait for the
    /// master's analyst, wait first: a node cannot close intervals faster than the master
    /// takes them in for long.
    ///
    /// Only a release ships (`released`); an acquire counts. Shipping and that wait
    /// inside a critical section would hold up every rank queued on the lock (on rank 0
    /// the wait is for its own analyst, which shares the cores), and every acquire is
    /// followed by its release, so the batches are as many and as large.
    #[inline]
    pub(super) fn after_lock_sync(&mut self, released: bool) -> Result<(), DsmError> {
        let Some(r) = self.race.as_mut() else {
            return Ok(());
        };
        if !r.ships_batches {
            return Ok(());
        }
        r.unshipped += 1;
        r.epoch_lock_syncs = r.epoch_lock_syncs.saturating_add(1);
        if !released || r.unshipped & r.due_check_mask > 1 {
            return Ok(());
        }
        self.ship_race_batch_if_due()
    }

    /// [`Dsm::after_lock_sync`] after a release: ships a race batch when one is due.
    #[inline(never)]
    fn ship_race_batch_if_due(&mut self) -> Result<(), DsmError> {
        let Some(r) = self.race.as_mut() else {
            return Ok(());
        };
        // Rank 0 ships its own intervals (to itself, no message) whenever the analyst took
        // in another node's batch: an interval is discarded only once every other node's
        // latest batch has seen it, so a rank 0 that shipped rarely would keep everything
        // the others send.
        let foreign = r
            .analyst
            .as_ref()
            .map_or(0, |a| a.foreign_absorbed.load(Ordering::Relaxed));
        // The clock is read every 64th release (128 lock operations): a host lock that
        // leaves the interval open costs well under a microsecond, and a clock read in a
        // VM can cost a tenth of that.
        let closed = r.recorder.current_interval() - r.interval_at_ship + r.quiet_since_ship;
        let due = closed >= r.batch_threshold
            || r.unshipped
                >= r.batch_threshold
                    .saturating_mul(LOCK_OPS_PER_BATCH_INTERVAL)
            || (r.unshipped % 128 < 2 && r.last_ship.elapsed() >= BATCH_PERIOD)
            || foreign != r.foreign_seen;
        if !due {
            return Ok(());
        }
        r.foreign_seen = foreign;
        r.unshipped = 0;
        r.interval_at_ship = r.recorder.current_interval();
        r.quiet_since_ship = 0;
        r.last_ship = Instant::now();
        self.ship_race_batch(None)
    }

    /// Ships the intervals closed since this node's last batch with all their bitmaps. A
    /// batch between barriers (`last` is `None`) first waits while
    /// [`MAX_UNANALYSED_BATCHES`] of this node's batches wait for the analyst; the last
    /// batch before a barrier does not (the barrier's analysis takes it in).
    fn ship_race_batch(&mut self, last: Option<RaceNotices>) -> Result<(), DsmError> {
        let Some(r) = self.race.as_mut() else {
            return Ok(());
        };
        r.shipped_in_epoch = true;
        r.batches_shipped += 1;
        let bitmaps = r.recorder.drain_all();
        let wanted = r
            .batches_shipped
            .checked_sub(MAX_UNANALYSED_BATCHES)
            .filter(|&w| w > 0 && last.is_none());
        if let Some(batches) = wanted {
            match self.comm().call(Command::AwaitRaceAbsorbed { batches }) {
                Reply::Done => {}
                other => {
                    return Err(DsmError::Protocol(format!(
                        "unexpected reply while waiting for the race analysis: {other:?}"
                    )))
                }
            }
        }
        self.comm().send(Command::ShipRaceBatch { bitmaps, last });
        Ok(())
    }

    /// Before a barrier, in an epoch this node shipped race batches in: its open interval
    /// closes into a last batch, which tells the master that nothing this node does
    /// later in the epoch can race, so the other nodes' intervals need not wait for it
    /// to learn of them (a node that reaches the barrier long before the others would
    /// otherwise keep everything they do meanwhile in the master's memory). Not while
    /// recording or replaying: the extra interval would depend on when batches went.
    pub(super) fn ship_last_race_batch(&mut self) -> Result<(), DsmError> {
        let ordered = self.named_locks.is_some();
        if !self
            .race
            .as_ref()
            .is_some_and(|r| r.batching() && r.shipped_in_epoch && !ordered)
        {
            return Ok(());
        }
        let last = self.close_race_interval()?;
        self.ship_race_batch(last)
    }

    /// Race mode: the epoch's bitmaps of pages another node may have touched, shipped with
    /// the barrier arrival so the master rarely needs an extra round to fetch them.
    pub(super) fn shippable_bitmaps(&mut self) -> Vec<EncodedBitmap> {
        let states = self.states.clone();
        let common_memory = self.common_memory;
        let Some(r) = self.race.as_mut() else {
            return Vec::new();
        };
        // The master reads the bitmaps it wants of its own from its recorder.
        if r.phases < RacePhases::Full || r.master.is_some() {
            return Vec::new();
        }
        let t = Instant::now();
        let mut asked: Vec<dsm_proto::PageNo> = r.asked_pages.iter().copied().collect();
        asked.sort_unstable();
        let shipped = if common_memory {
            // Nothing marks a page shared in one common memory: only the asked ones go.
            r.recorder.shippable_pages(&asked, MAX_SHIPPED_BITMAP_BYTES)
        } else {
            // Every stored page is tested: a search of the few asked pages costs less than
            // hashing each (a grid's band stores thousands).
            r.recorder.shippable(
                |p| states.shared(p as usize) || asked.binary_search(&p).is_ok(),
                MAX_SHIPPED_BITMAP_BYTES,
            )
        }
        .unwrap_or_default();
        r.close_time += t.elapsed();
        shipped
    }

    /// Barrier master, race mode: find, fetch, compare, report. Returns the races
    /// reported, and what to free once the release is out.
    pub(super) fn analyze(
        &mut self,
        epoch: u32,
        intervals: Vec<dsm_proto::IntervalRecord>,
        shipped: Vec<(NodeId, EncodedBitmap)>,
    ) -> Result<(u64, SpentAnalysis), DsmError> {
        let r = self.race.as_mut().ok_or_else(|| {
            DsmError::Protocol("analysis requested without race detection".into())
        })?;
        if r.phases < RacePhases::Compare {
            let spent = SpentAnalysis {
                _records: intervals,
                _plans: None,
            };
            return Ok((0, spent));
        }
        // Sizing every notice costs a serialization pass: only for the counters asked for.
        let notice_bytes = if r.timed { notice_bytes(&intervals) } else { 0 };
        let comm = self.comm.as_ref().expect("comm alive during barrier");
        let master = r
            .master
            .clone()
            .ok_or_else(|| DsmError::Protocol("analysis requested of a non-master".into()))?;
        // Held to the release: the analyst waits meanwhile (see `analyst`).
        let mut m = analyst::lock(&master);
        // Batches sent before the arrivals are all here: those the analyst has not taken
        // are analysed first; the barrier's plan then skips the pairs they covered.
        for b in comm.race_inbox().take_all() {
            let (_, ack) = m.absorb(b);
            comm.send(ack);
        }
        if let Some(e) = m.take_failure() {
            return Err(DsmError::Io(e));
        }
        let mut intervals = intervals;
        if r.options.sem_order_safe {
            r.make_sem_order_safe(epoch, &mut intervals, self.size)?;
        }
        let t0 = Instant::now();
        let mut bitmaps = dsm_race::Bitmaps::new();
        let (mut plan, full_plan) = plan_epoch(
            epoch,
            intervals,
            &mut m.incremental,
            r.options.schedule,
            &mut bitmaps,
        );
        let t1 = Instant::now();
        if r.phases < RacePhases::Full {
            plan.wanted.clear();
        }
        let mut wanted = std::mem::take(&mut plan.wanted);
        if let Some(full) = full_plan.as_ref() {
            add_wanted(&mut wanted, full.wanted.clone());
        }
        if let Some(checker) = r.checker.as_ref() {
            add_wanted(&mut wanted, checker.wanted(plan.intervals(), &r.vars));
        }
        for (node, b) in shipped {
            bitmaps.insert(node, b);
        }
        r.fetch_bitmaps(comm, epoch, &wanted, &mut bitmaps)?;
        let findings = match r.checker.as_mut() {
            Some(checker) => checker.check(epoch, plan.intervals(), &bitmaps, &r.vars),
            None => Vec::new(),
        };
        let mut races = plan.compare(&bitmaps, &r.vars);
        if let (Some(full), Some((_, _, found))) = (full_plan.as_ref(), m.incremental.oracle()) {
            verify_incremental(&full.compare(&bitmaps, &r.vars), found, &races)?;
        }
        if r.options.first_only {
            races = dsm_race::first_races(races, plan.intervals());
        }
        let t2 = Instant::now();
        r.plan_time += t1 - t0;
        r.bitmap_time += t2 - t1;
        r.notice_bytes += notice_bytes;
        add_plan_stats(&mut r.sum, &plan.stats);
        let point = &self.sync_point;
        if let Some(a) = r.analyst.as_ref() {
            // Before the release: the next epoch's batches wait for `epoch_done`.
            a.inbox().set_paused(true);
        }
        let reporter = &mut m.reporter;
        if let Some(p) = &self.pin {
            reporter.set_hits(dsm_race::pinpoint::read_hits(
                &p.dir,
                self.size,
                point.epoch(),
            ));
        }
        let reported = reporter
            .report(point, &races, &mut std::io::stderr())
            .map_err(DsmError::Io)?
            + reporter
                .report_findings(point, &findings, &mut std::io::stderr())
                .map_err(DsmError::Io)?;
        if r.options.stats {
            print_race_stats(point, &plan.stats, notice_bytes, t1 - t0, t2 - t1, reported);
        }
        let spent = SpentAnalysis {
            _records: Vec::new(),
            _plans: Some((plan, full_plan, bitmaps)),
        };
        Ok((reported, spent))
    }
}

/// The epoch's records and bitmaps after its barrier's analysis, to be freed once the
/// release has gone out: at a lock-heavy barrier (Water at N = 8, a thousand records)
/// freeing them took 20-40 us that every rank would wait for.
pub(super) struct SpentAnalysis {
    _records: Vec<dsm_proto::IntervalRecord>,
    _plans: Option<(dsm_race::Plan, Option<dsm_race::Plan>, dsm_race::Bitmaps)>,
}

/// `--race-stats`: one line on what the analysis at `point` did and found.
fn print_race_stats(
    point: &dsm_race::Point,
    s: &dsm_race::PlanStats,
    notice_bytes: u64,
    plan_time: Duration,
    bitmap_time: Duration,
    reported: u64,
) {
    eprintln!(
        "dsm-race-stats: {} (epoch {}): intervals {}, interval pairs {} considered / {} concurrent / {} overlapping, bitmaps {} of {} fetched, notice bytes {}, interval comparison {:.3} ms, bitmap round {:.3} ms, races {}",
        point.sync_label(),
        point.epoch(),
        s.intervals,
        s.pairs_considered,
        s.concurrent_pairs,
        s.overlapping_pairs,
        s.bitmaps_wanted,
        s.bitmaps_total,
        notice_bytes,
        plan_time.as_secs_f64() * 1e3,
        bitmap_time.as_secs_f64() * 1e3,
        reported
    );
}

impl RaceState {
    /// `--sem-order=safe`, master: rewrites the semaphore edges of the epoch's `intervals`
    /// (of `nodes` nodes) to those that hold in every execution, and carries the
    /// semaphores' tokens on to the next epoch.
    fn make_sem_order_safe(
        &mut self,
        epoch: u32,
        intervals: &mut [dsm_proto::IntervalRecord],
        nodes: usize,
    ) -> Result<(), DsmError> {
        match dsm_ahb::epoch::make_safe(intervals, &self.sem_tokens, nodes, SAFE_ORDER_DEPTH) {
            Ok(done) if done.depth < SAFE_ORDER_DEPTH => eprintln!(
                "dsm: --sem-order=safe: epoch {epoch} has {} semaphore operations; \
                 analysed at depth {} instead of {SAFE_ORDER_DEPTH}",
                done.ops, done.depth
            ),
            Ok(_) => {}
            Err(dsm_ahb::epoch::SafeOrderError::LocksInEpoch) => eprintln!(
                "dsm: --sem-order=safe: epoch {epoch} also synchronizes through locks; \
                 its semaphore edges are kept as observed"
            ),
            Err(e) => {
                return Err(DsmError::Protocol(format!(
                    "--sem-order=safe analysis of epoch {epoch}: {e}"
                )))
            }
        }
        self.sem_tokens = dsm_ahb::epoch::tokens_after(intervals, &self.sem_tokens);
        Ok(())
    }

    /// Master: adds to `bitmaps` those of `wanted` it lacks, its own from the recorder and
    /// the other nodes' asked for in one round.
    fn fetch_bitmaps(
        &mut self,
        comm: &Comm,
        epoch: u32,
        wanted: &std::collections::BTreeMap<NodeId, Vec<dsm_proto::BitmapKey>>,
        bitmaps: &mut dsm_race::Bitmaps,
    ) -> Result<(), DsmError> {
        let mut pending = 0;
        for (&node, keys) in wanted {
            let missing: Vec<_> = keys
                .iter()
                .filter(|k| !bitmaps.contains(node, k))
                .copied()
                .collect();
            if missing.is_empty() {
                continue;
            }
            if node == 0 {
                // The master's own: read here, with no round.
                for b in self.recorder.bitmaps(&missing) {
                    bitmaps.insert(0, b);
                }
            } else {
                self.fetched_late += missing.len() as u64;
                comm.send(Command::RequestBitmaps {
                    node,
                    epoch,
                    keys: missing,
                });
                pending += 1;
            }
        }
        while pending > 0 {
            match comm.recv() {
                Reply::BitmapsArrived { from, bitmaps: bs } => {
                    for b in bs {
                        bitmaps.insert(from, b);
                    }
                    pending -= 1;
                }
                other => {
                    return Err(DsmError::Protocol(format!(
                        "unexpected reply while fetching bitmaps: {other:?}"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// The plan of the barrier's analysis of `epoch`, and with the incremental analysis's
/// oracle (tests) the plan of the whole epoch; `bitmaps` gets those the incremental
/// analysis holds.
fn plan_epoch(
    epoch: u32,
    mut intervals: Vec<dsm_proto::IntervalRecord>,
    incremental: &mut Incremental,
    schedule: bool,
    bitmaps: &mut dsm_race::Bitmaps,
) -> (dsm_race::Plan, Option<dsm_race::Plan>) {
    // Shipped intervals come without their notices (the nodes sent those in race
    // batches); the ones still pending here take their place. Pairs of two shipped
    // intervals were checked between barriers.
    if incremental.active() {
        intervals.retain(|i| !incremental.shipped(i.node, i.index));
        let (pending, pending_bitmaps) = incremental.take_pending();
        // Exactly: doubling would hold the epoch's records up to twice over.
        intervals.reserve_exact(pending.len());
        intervals.extend(pending);
        bitmaps.append(pending_bitmaps);
    }
    let inc = Some(&*incremental).filter(|inc| inc.active());
    // The oracle (tests): the whole epoch planned as if nothing had been analysed.
    let full_plan = incremental.oracle().map(|(all, bs, _)| {
        bitmaps.extend(bs);
        let mut every = all.to_vec();
        every.extend(
            intervals
                .iter()
                .filter(|i| inc.is_none_or(|inc| !inc.shipped(i.node, i.index)))
                .cloned(),
        );
        every.sort_by_key(|i| (i.node, i.index));
        every.dedup_by_key(|i| (i.node, i.index));
        dsm_race::plan_with(epoch, every, schedule)
    });
    let plan = dsm_race::plan_fresh(epoch, intervals, schedule, |i| {
        inc.is_none_or(|inc| !inc.shipped(i.node, i.index))
    });
    (plan, full_plan)
}

/// The serialized size of the intervals' notices.
fn notice_bytes(intervals: &[dsm_proto::IntervalRecord]) -> u64 {
    intervals
        .iter()
        .filter_map(|i| i.race.as_ref())
        .map(|n| postcard::experimental::serialized_size(n).map_or(0, |s| s as u64))
        .sum()
}

/// Adds an epoch plan's counts to the run's.
fn add_plan_stats(sum: &mut dsm_race::PlanStats, s: &dsm_race::PlanStats) {
    for (acc, v) in [
        (&mut sum.intervals, s.intervals),
        (&mut sum.pairs_considered, s.pairs_considered),
        (&mut sum.concurrent_pairs, s.concurrent_pairs),
        (&mut sum.overlapping_pairs, s.overlapping_pairs),
        (&mut sum.intervals_in_overlap, s.intervals_in_overlap),
        (&mut sum.bitmaps_wanted, s.bitmaps_wanted),
        (&mut sum.bitmaps_total, s.bitmaps_total),
    ] {
        *acc += v;
    }
}

/// The incremental analysis's oracle check: the races of the barrier-time analysis of the
/// whole epoch must be exactly those reported between barriers plus those of the barrier's
/// remaining pairs.
fn verify_incremental(
    expected: &[dsm_race::Race],
    incremental: &[dsm_race::Race],
    at_barrier: &[dsm_race::Race],
) -> Result<(), DsmError> {
    type Key = (String, usize, u16, u32, u16, u32);
    let key = |r: &dsm_race::Race| -> Key {
        (
            r.variable.clone(),
            r.index,
            r.first.node,
            r.first.interval,
            r.second.node,
            r.second.interval,
        )
    };
    let want: std::collections::BTreeSet<Key> = expected.iter().map(key).collect();
    let got: std::collections::BTreeSet<Key> =
        incremental.iter().chain(at_barrier).map(key).collect();
    if want == got {
        return Ok(());
    }
    let missed: Vec<_> = want.difference(&got).take(5).collect();
    let extra: Vec<_> = got.difference(&want).take(5).collect();
    Err(DsmError::Protocol(format!(
        "incremental race analysis disagrees with barrier-time analysis: {} expected, {} found; missed {missed:?}, extra {extra:?}",
        want.len(),
        got.len()
    )))
}

/// Adds `more` to the bitmaps to fetch, each node's keys kept sorted and without
/// duplicates.
fn add_wanted(
    wanted: &mut std::collections::BTreeMap<NodeId, Vec<dsm_proto::BitmapKey>>,
    more: std::collections::BTreeMap<NodeId, Vec<dsm_proto::BitmapKey>>,
) {
    for (node, keys) in more {
        let w = wanted.entry(node).or_default();
        w.extend(keys);
        w.sort_unstable();
        w.dedup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_grows_to_fit_epochs_up_to_its_bound() {
        let base = DEFAULT_RACE_BATCH;
        assert_eq!(batch_for_epochs(base, 600), 1200, "twice the epoch");
        assert_eq!(batch_for_epochs(base, 100), base, "never below the batch");
        assert_eq!(batch_for_epochs(2000, 600), 2000, "never shrinks");
        assert_eq!(batch_for_epochs(base, u32::MAX), MAX_EPOCH_BATCH, "bounded");
    }
}

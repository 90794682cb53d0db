//! Race-detection orchestration on a node: closing the recorder's interval at each
//! synchronization, shipping bitmaps with barrier arrivals and, on the barrier master, the
//! analysis of an epoch (plan, fetch the bitmaps it needs, compare, report) and the
//! detector's counters.

use super::{Dsm, Outcome, MAX_SHIPPED_BITMAP_BYTES};
use crate::engine::{Command, Reply};
use crate::error::DsmError;
use dsm_proto::{EncodedBitmap, NodeId, RaceNotices, RaceOptions, RacePhases};
use dsm_race::{Recorder, Reporter, VarTable};
use std::io::{self, Write};
use std::time::{Duration, Instant};

/// Depth of the always-happens-before expansion under `--sem-order=safe` (see dsm-ahb:
/// depth 1 is first-order inference with shadowing, well under a millisecond for the tens
/// of operations an epoch usually has; each further level costs several times more).
const SAFE_ORDER_DEPTH: u32 = 1;

/// Race-detection state of this node.
pub(super) struct RaceState {
    pub(super) phases: RacePhases,
    pub(super) recorder: Recorder,
    /// Rank 0 reports.
    pub(super) reporter: Option<Reporter>,
    pub(super) vars: VarTable,
    pub(super) options: RaceOptions,
    pub(super) races_total: u64,
    pub(super) close_time: Duration,
    pub(super) plan_time: Duration,
    pub(super) bitmap_time: Duration,
    pub(super) barriers: u64,
    pub(super) notice_bytes: u64,
    /// Bitmaps the master had to fetch in an extra round (not shipped with arrivals).
    pub(super) fetched_late: u64,
    pub(super) sum: dsm_race::PlanStats,
    /// `--sem-order=safe`, master: each semaphore's tokens when the current epoch began.
    pub(super) sem_tokens: std::collections::BTreeMap<dsm_proto::SemId, u32>,
}

impl RaceState {
    /// Detection state for a node; rank 0 (`master`) also owns the reporter.
    pub(super) fn new(options: RaceOptions, master: bool) -> io::Result<RaceState> {
        let reporter = if master {
            let mut rep = Reporter::new(options.log.as_deref(), options.first_only)?;
            if options.schedule {
                rep.set_schedule(options.schedule_ignore.iter().cloned());
            }
            Some(rep)
        } else {
            None
        };
        Ok(RaceState {
            phases: options.phases,
            recorder: Recorder::new(),
            reporter,
            vars: VarTable::new(),
            options,
            races_total: 0,
            close_time: Duration::ZERO,
            plan_time: Duration::ZERO,
            bitmap_time: Duration::ZERO,
            barriers: 0,
            notice_bytes: 0,
            fetched_late: 0,
            sum: Default::default(),
            sem_tokens: Default::default(),
        })
    }

    /// End of the run: rank 0 prints the run's statistics (if asked) and the summary, and
    /// says which exit status the race convention asks for.
    pub(super) fn finish(&mut self) -> io::Result<Outcome> {
        let Some(rep) = self.reporter.as_mut() else {
            return Ok(Outcome::default());
        };
        rep.finish()?;
        if self.options.stats {
            let s = &self.sum;
            let rs = self.recorder.stats();
            eprintln!(
                "dsm-race-stats: run: barriers {}, intervals {}, interval pairs {} considered / {} concurrent / {} overlapping, intervals in a concurrent overlapping pair {}, bitmaps {} of {} fetched, notice bytes {}, rank 0 recording (interval close) {:.3} ms, interval comparison {:.3} ms, bitmap round {:.3} ms, peak bitmap store on rank 0 {} bytes",
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
                rs.peak_store_bytes
            );
        }
        eprintln!("{}", rep.summary());
        io::stderr().flush()?;
        let races_reported = rep.total();
        Ok(Outcome {
            races_reported,
            exit_status: if races_reported > 0 {
                self.options.exit_code
            } else {
                0
            },
        })
    }
}

impl Dsm {
    pub(super) fn close_race_interval(&mut self) -> Option<RaceNotices> {
        let r = self.race.as_mut()?;
        let t = Instant::now();
        let n = r.recorder.close_interval();
        r.close_time += t.elapsed();
        if r.phases == RacePhases::Record {
            return Some(RaceNotices::default());
        }
        Some(n)
    }

    /// Race mode: the epoch's bitmaps of pages another node may have touched, shipped with
    /// the barrier arrival so the master rarely needs an extra round to fetch them.
    pub(super) fn shippable_bitmaps(&mut self) -> Vec<EncodedBitmap> {
        let states = self.states.clone();
        let Some(r) = self.race.as_mut() else {
            return Vec::new();
        };
        if r.phases < RacePhases::Full {
            return Vec::new();
        }
        let t = Instant::now();
        let shipped = r
            .recorder
            .shippable(|p| states.shared(p as usize), MAX_SHIPPED_BITMAP_BYTES)
            .unwrap_or_default();
        r.close_time += t.elapsed();
        shipped
    }

    /// Barrier master, race mode: find, fetch, compare, report.
    pub(super) fn analyze(
        &mut self,
        epoch: u32,
        intervals: Vec<dsm_proto::IntervalRecord>,
        shipped: Vec<(NodeId, EncodedBitmap)>,
    ) -> Result<u64, DsmError> {
        let comm = self.comm.as_ref().expect("comm alive during barrier");
        let r = self.race.as_mut().ok_or_else(|| {
            DsmError::Protocol("analysis requested without race detection".into())
        })?;
        if r.phases < RacePhases::Compare {
            return Ok(0);
        }
        let notice_bytes: u64 = intervals
            .iter()
            .filter_map(|i| i.race.as_ref())
            .map(|n| postcard::experimental::serialized_size(n).map_or(0, |s| s as u64))
            .sum();
        let mut intervals = intervals;
        if r.options.sem_order_safe {
            let n = self.size;
            match dsm_ahb::epoch::make_safe(&mut intervals, &r.sem_tokens, n, SAFE_ORDER_DEPTH) {
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
            r.sem_tokens = dsm_ahb::epoch::tokens_after(&intervals, &r.sem_tokens);
        }
        let t0 = Instant::now();
        let mut plan = dsm_race::plan_with(epoch, intervals, r.options.schedule);
        let t1 = Instant::now();
        if r.phases < RacePhases::Full {
            plan.wanted.clear();
        }
        let mut bitmaps = dsm_race::Bitmaps::new();
        for (node, b) in shipped {
            bitmaps.insert(node, b);
        }
        let mut pending = 0;
        for (&node, keys) in &plan.wanted {
            let missing: Vec<_> = keys
                .iter()
                .filter(|k| !bitmaps.contains(node, k))
                .copied()
                .collect();
            if missing.is_empty() {
                continue;
            }
            r.fetched_late += missing.len() as u64;
            if node == 0 {
                for b in r.recorder.bitmaps(&missing) {
                    bitmaps.insert(0, b);
                }
            } else {
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
        let mut races = plan.compare(&bitmaps, &r.vars);
        if r.options.first_only {
            races = dsm_race::first_races(races, plan.intervals());
        }
        let t2 = Instant::now();
        r.plan_time += t1 - t0;
        r.bitmap_time += t2 - t1;
        r.notice_bytes += notice_bytes;
        let s = &plan.stats;
        for (acc, v) in [
            (&mut r.sum.intervals, s.intervals),
            (&mut r.sum.pairs_considered, s.pairs_considered),
            (&mut r.sum.concurrent_pairs, s.concurrent_pairs),
            (&mut r.sum.overlapping_pairs, s.overlapping_pairs),
            (&mut r.sum.intervals_in_overlap, s.intervals_in_overlap),
            (&mut r.sum.bitmaps_wanted, s.bitmaps_wanted),
            (&mut r.sum.bitmaps_total, s.bitmaps_total),
        ] {
            *acc += v;
        }
        let point = &self.sync_point;
        let reporter = r.reporter.as_mut().expect("rank 0 has the reporter");
        let reported = reporter
            .report(point, &races, &mut std::io::stderr())
            .map_err(DsmError::Io)?;
        if r.options.stats {
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
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3,
                reported
            );
        }
        Ok(reported)
    }
}

//! Barriers: arrivals (all-to-all or through rank 0), the consistency checks on them, the
//! release that spreads every interval of the epoch and then discards the interval logs,
//! and the race-detection rounds the master runs between arrival and release.

use super::{Engine, Memory, Output, RaceBatch, Reply};
use dsm_proto::{
    BitmapColumns, BitmapKey, EncodedBitmap, IntervalRecord, Msg, NodeId, PushedPage, RaceNotices,
    SyncCause, SyncPoint, VectorTime,
};

/// One node's arrival at a barrier, as received (see `Msg::BarrierArrive`).
pub(super) struct Arrival {
    /// Where the sender's program is (for messages).
    pub(super) at: SyncPoint,
    pub(super) known: VectorTime,
    pub(super) intervals: Vec<IntervalRecord>,
    /// The sender's allocation digest, which must match everyone else's.
    pub(super) check: u64,
    pub(super) finishing: bool,
    pub(super) bitmaps: Vec<EncodedBitmap>,
    /// All-to-all: pages the sender pushed to this node (see `push`).
    pub(super) pages: Vec<PushedPage>,
}

/// What the master needs to release a barrier once every node has arrived; with race
/// detection it waits here while the app analyzes the epoch.
pub(super) struct MasterRelease {
    epoch: u32,
    /// Everything anyone knew at arrival: everyone's knowledge after the release.
    global: VectorTime,
    /// Every interval of the epoch, in (node, index) order.
    all: Vec<IntervalRecord>,
    /// Each node's knowledge at arrival, so each is sent only the intervals it lacks.
    knowns: Vec<VectorTime>,
}

/// Largest job whose barriers are all-to-all (without race detection); beyond it the
/// N(N-1) messages cost more than the master's extra message delay.
pub const ALL_TO_ALL_MAX_NODES: usize = 4;

impl<M: Memory> Engine<M> {
    /// Whether barriers are all-to-all (see [`Engine::barrier`]).
    pub(super) fn all_to_all(&self) -> bool {
        !self.race_mode && self.n <= ALL_TO_ALL_MAX_NODES
    }

    /// Barriers. In small jobs without race detection every node sends its arrival (with
    /// the intervals it created since the last barrier) to every other node and leaves once
    /// it holds all of them: one message delay. Otherwise the arrivals go to rank 0, which
    /// releases everyone (after analyzing the epoch, with race detection): two message
    /// delays, but 2(N-1) messages instead of N(N-1).
    pub(super) fn barrier(
        &mut self,
        finishing: bool,
        race: Option<RaceNotices>,
        bitmaps: Vec<EncodedBitmap>,
        at: SyncPoint,
    ) {
        self.close_interval(race);
        self.epoch += 1;
        self.at = at;
        self.finishing = finishing;
        if !self.note_barrier() {
            return;
        }
        // The records move to the arrival. Coherence keeps those with write notices,
        // without their race notices (the master has them from here on); the others,
        // most of a lock-heavy race run's, it never needs again.
        let own = std::mem::take(&mut self.log[self.me as usize]);
        let kept = own
            .iter()
            .filter(|r| !r.writes.is_empty())
            .map(IntervalRecord::without_race)
            .collect();
        self.log[self.me as usize] = kept;
        let msg = Msg::BarrierArrive {
            epoch: self.epoch,
            at: self.at.clone(),
            known: self.known(),
            intervals: own,
            check: self.alloc_digest,
            finishing,
            bitmaps,
            pages: Vec::new(),
        };
        if self.n > 1 {
            // The last arrival reaches everyone at once all-to-all, and through the master
            // only with its release.
            self.stats.barrier_delays += if self.all_to_all() { 1 } else { 2 };
        }
        if !self.all_to_all() {
            // Pushes first: each link is FIFO, so a receiver mostly has them before the
            // master's release (one that comes later is dropped).
            if !finishing {
                self.send_barrier_pushes();
            }
            if self.me == 0 {
                self.handle(0, msg);
            } else {
                self.send(0, msg);
            }
        } else {
            let me = self.me;
            for to in (0..self.n as NodeId).filter(|&k| k != me) {
                let mut m = msg.clone();
                // Nothing is read after the final barrier.
                if let (Msg::BarrierArrive { pages, .. }, false) = (&mut m, finishing) {
                    *pages = self.barrier_pushes_for(to);
                }
                self.send(to, m);
            }
            self.handle(self.me, msg);
        }
    }

    /// Barriers through the master: sends each other node the pages homed here that it
    /// holds and this epoch's intervals wrote, as an all-to-all arrival carries them.
    fn send_barrier_pushes(&mut self) {
        let (epoch, me) = (self.epoch, self.me);
        for to in (0..self.n as NodeId).filter(|&k| k != me) {
            let pages = self.barrier_pushes_for(to);
            if !pages.is_empty() {
                self.send(to, Msg::BarrierPush { epoch, pages });
            }
        }
    }

    /// Pages pushed for barrier `epoch` through the master: kept for its release, unless
    /// that release has come already (then this node's copies were invalidated, and stay
    /// so).
    pub(super) fn on_barrier_push(&mut self, epoch: u32, pages: Vec<dsm_proto::PushedPage>) {
        if epoch > self.released_epoch {
            self.master_pushes.entry(epoch).or_default().extend(pages);
        } else {
            self.stats.pushes_rejected += pages.len() as u64;
        }
    }

    pub(super) fn on_arrive(&mut self, from: NodeId, epoch: u32, arrival: Arrival) {
        if !self.all_to_all() && self.me != 0 {
            self.fatal(format!(
                "rank {from} sent a barrier arrival to a non-master"
            ));
            return;
        }
        if epoch != self.epoch && !(epoch == self.epoch + 1 && from != self.me) {
            self.fatal(format!(
                "rank {from} arrived at {} while rank {} last arrived at {}: ranks called \
                 barrier/alloc a different number of times",
                arrival.at, self.me, self.at
            ));
            return;
        }
        let n = self.n;
        let slots = self
            .arrivals
            .entry(epoch)
            .or_insert_with(|| (0..n).map(|_| None).collect());
        if slots[from as usize].is_some() {
            self.fatal(format!("rank {from} arrived twice, now at {}", arrival.at));
            return;
        }
        slots[from as usize] = Some(arrival);
        self.try_complete_barrier();
    }

    /// Completes the current barrier once every arrival (this node's included) is in.
    fn try_complete_barrier(&mut self) {
        let epoch = self.epoch;
        let complete = self
            .arrivals
            .get(&epoch)
            .is_some_and(|slots| slots.iter().all(Option::is_some));
        if !complete {
            return;
        }
        let arrivals: Vec<Arrival> = self
            .arrivals
            .remove(&epoch)
            .expect("checked")
            .into_iter()
            .map(|a| a.expect("checked"))
            .collect();
        let abort = |engine: &mut Self, reason: String| {
            if !engine.all_to_all() {
                for to in 1..engine.n as NodeId {
                    engine.send(
                        to,
                        Msg::Abort {
                            reason: reason.clone(),
                        },
                    );
                }
            }
            engine.fatal(reason);
        };
        if let Some(k) = (0..self.n).find(|&k| arrivals[k].check != arrivals[0].check) {
            let (theirs, ours) = (&arrivals[k].at, &arrivals[0].at);
            let at = if theirs == ours {
                format!("at {ours}")
            } else {
                format!("(rank {k} at {theirs}, rank 0 at {ours})")
            };
            abort(
                self,
                format!(
                    "rank {k} and rank 0 disagree on the shared allocations {at}: every rank \
                     must make the same alloc and semaphore calls, with the same arguments, in \
                     the same order"
                ),
            );
            return;
        }
        if arrivals.iter().any(|a| a.finishing) != arrivals.iter().all(|a| a.finishing) {
            let who: Vec<usize> = (0..self.n).filter(|&k| arrivals[k].finishing).collect();
            let waiting = arrivals
                .iter()
                .enumerate()
                .filter(|(_, a)| !a.finishing)
                .map(|(k, a)| format!("rank {k} is at {}", a.at))
                .collect::<Vec<_>>()
                .join(", ");
            abort(
                self,
                format!(
                    "{} reached {} while {waiting}: every rank must call barrier the same \
                     number of times before finishing",
                    match who.as_slice() {
                        [one] => format!("rank {one}"),
                        many => format!("ranks {many:?}"),
                    },
                    arrivals[who[0]].at
                ),
            );
            return;
        }
        let mut global = VectorTime::zero(self.n);
        // Sized once: grown by doubling, the epoch's records (a quarter of rank 0's heap
        // at a lock-heavy barrier) were held up to twice over while they moved.
        let mut all = Vec::with_capacity(arrivals.iter().map(|a| a.intervals.len()).sum());
        let mut knowns = Vec::with_capacity(self.n);
        let mut shipped = Vec::new();
        for (node, a) in arrivals.into_iter().enumerate() {
            if self.all_to_all() {
                self.barrier_pushes.extend(a.pages);
            }
            global.merge(&a.known);
            knowns.push(a.known);
            all.extend(a.intervals);
            shipped.extend(a.bitmaps.into_iter().map(|b| (node as NodeId, b)));
        }
        all.sort_by_key(|r| (r.node, r.index));
        all.dedup_by_key(|r| (r.node, r.index));
        if self.all_to_all() {
            // Every node did this same computation from the same arrivals.
            self.on_release(epoch, global, all, 0);
        } else if !self.race_mode {
            self.master_release = Some(MasterRelease {
                epoch,
                global,
                all,
                knowns,
            });
            self.master_release(0);
        } else {
            // The release carries intervals for coherence only, as lock grants do: those
            // with write notices, without race notices (the analysis has them here).
            let coherence = all
                .iter()
                .filter(|r| !r.writes.is_empty())
                .map(IntervalRecord::without_race)
                .collect();
            self.master_release = Some(MasterRelease {
                epoch,
                global,
                all: coherence,
                knowns,
            });
            self.reply(Reply::AnalyzeEpoch {
                epoch,
                intervals: all,
                bitmaps: shipped,
            });
        }
    }

    /// Sends each node the barrier release with the intervals it has not seen, this node's
    /// own included (through `handle`, as if it had come by message).
    pub(super) fn master_release(&mut self, races: u64) {
        let Some(MasterRelease {
            epoch,
            global,
            all,
            knowns,
        }) = self.master_release.take()
        else {
            self.fatal("barrier release requested outside a barrier".into());
            return;
        };
        for (k, known) in knowns.iter().enumerate() {
            let intervals: Vec<IntervalRecord> = all
                .iter()
                .filter(|r| r.index > known.get(r.node))
                .cloned()
                .collect();
            let msg = Msg::BarrierRelease {
                epoch,
                known: global.clone(),
                intervals,
                races,
            };
            if k == 0 {
                self.handle(0, msg);
            } else {
                self.send(k as NodeId, msg);
            }
        }
    }

    pub(super) fn on_release(
        &mut self,
        epoch: u32,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
        races: u64,
    ) {
        if epoch != self.epoch {
            self.fatal(format!(
                "a barrier release arrived for another barrier than this node's latest, {}",
                self.at
            ));
            return;
        }
        let mut pages = std::mem::take(&mut self.barrier_pushes);
        pages.extend(self.master_pushes.remove(&epoch).unwrap_or_default());
        self.released_epoch = epoch;
        self.master_pushes.retain(|&e, _| e > epoch);
        let pushed = super::push::Pushed {
            pages,
            ..Default::default()
        };
        let waits = self.apply_intervals(intervals, &known, pushed);
        self.refuse_stale_early_pushes();
        self.stats.barriers += 1;
        // Everyone has now seen every interval up to this barrier: the logs can go, and
        // with them the diffs kept to push with grants.
        for l in self.log.iter_mut() {
            l.clear();
        }
        self.kept_diffs.clear();
        self.kept_diff_bytes = 0;
        self.begin_interval(SyncCause::Barrier(epoch));
        if self.finishing {
            self.finished = true;
        }
        let known = self.known();
        self.reply_after_home_diffs(
            waits,
            Reply::BarrierDone {
                epoch,
                races,
                known,
            },
        );
    }

    // ---------------------------------------------------------------- race-mode rounds
    // Between arrival and release the master's app may need bitmaps that were not shipped
    // with the arrivals. The engine only carries them: deciding what to ask for and
    // answering is the app thread's job, since it owns the access recorder.

    pub(super) fn request_bitmaps(&mut self, node: NodeId, epoch: u32, keys: Vec<BitmapKey>) {
        self.send(
            node,
            Msg::BitmapRequest {
                epoch,
                wanted: keys,
            },
        );
    }

    pub(super) fn send_bitmaps(&mut self, epoch: u32, bitmaps: Vec<EncodedBitmap>) {
        self.send(0, Msg::BitmapReply { epoch, bitmaps });
    }

    pub(super) fn on_bitmap_request(&mut self, epoch: u32, wanted: Vec<BitmapKey>) {
        self.reply(Reply::BitmapsWanted {
            epoch,
            keys: wanted,
        });
    }

    pub(super) fn on_bitmap_reply(&mut self, from: NodeId, bitmaps: Vec<EncodedBitmap>) {
        self.reply(Reply::BitmapsArrived { from, bitmaps });
    }

    /// Race mode: this node's intervals closed since its previous batch go to the race
    /// master with `bitmaps` (all they recorded), and what this node has seen. With
    /// `last`, the open interval closes first (see [`Command::ShipRaceBatch`]).
    ///
    /// [`Command::ShipRaceBatch`]: super::Command::ShipRaceBatch
    pub(super) fn ship_race_batch(&mut self, bitmaps: BitmapColumns, last: Option<RaceNotices>) {
        let closing = last.is_some();
        if let Some(notices) = last {
            let cause = self.cur_cause;
            self.close_interval(Some(notices));
            self.begin_interval(cause);
        }
        let shipped_upto = self.race_shipped;
        let own = &mut self.log[self.me as usize];
        let start = own.partition_point(|r| r.index <= shipped_upto);
        let intervals: Vec<IntervalRecord> = own.drain(start..).collect();
        // The master keeps the race notices from here on; coherence needs only the
        // intervals with write notices.
        // Semaphore intervals stay too: the master rebuilds the safe semaphore order from
        // them at the barrier.
        let sem_op = |r: &IntervalRecord| {
            matches!(
                r.began_with,
                SyncCause::SemWait(_) | SyncCause::SemSignal(_)
            )
        };
        own.extend(
            intervals
                .iter()
                .filter(|r| !r.writes.is_empty() || sem_op(r))
                .map(IntervalRecord::without_race),
        );
        let known = self.known();
        self.race_shipped = known.get(self.me);
        if self.me == 0 {
            self.out.push(Output::RaceBatch(RaceBatch {
                from: 0,
                known,
                intervals,
                bitmaps,
                last: closing,
            }));
        } else {
            self.send(
                0,
                Msg::RaceBatch {
                    known,
                    intervals,
                    bitmaps,
                    last: closing,
                },
            );
        }
    }

    pub(super) fn await_race_absorbed(&mut self, batches: u64) {
        if self.race_absorbed >= batches {
            self.reply(Reply::Done);
        } else {
            self.race_absorbed_wanted = Some(batches);
        }
    }

    pub(super) fn on_race_absorbed(&mut self, batches: u64) {
        self.race_absorbed = self.race_absorbed.max(batches);
        if self
            .race_absorbed_wanted
            .is_some_and(|w| self.race_absorbed >= w)
        {
            self.race_absorbed_wanted = None;
            self.reply(Reply::Done);
        }
    }

    /// The race master takes a node's batch (checked for shape) to its app thread.
    pub(super) fn on_race_batch(&mut self, from: NodeId, batch: RaceBatch) {
        if self.me != 0
            || from == 0
            || batch.known.len() != self.n
            || !batch.bitmaps.is_consistent()
            || batch
                .intervals
                .iter()
                .any(|r| r.node != from || r.index > batch.known.get(from))
        {
            self.fatal(format!("rank {from} sent a malformed race batch"));
            return;
        }
        self.out.push(Output::RaceBatch(batch));
    }
}

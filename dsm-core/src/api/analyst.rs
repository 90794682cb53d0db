//! Rank 0's analysis of race batches between barriers, on a thread of its own (the
//! analyst).
//!
//! A program that synchronizes through locks alone ships its closed intervals to rank 0 in
//! race batches. Analysed on rank 0's app thread, they waited while it computed or waited
//! for a lock, and when they came they took its time: a rank that closed intervals faster
//! than the analysis kept rank 0 busy, rank 0 fell behind, and everything the fast rank did
//! waited in memory for rank 0 to learn of it. On the comm thread they would starve the
//! protocol and the heartbeats. The analyst takes each batch as it arrives and tells its
//! node how many of its batches it has analysed (`Command::RaceAbsorbed`); a node ships a
//! batch only while fewer than [`MAX_UNANALYSED_BATCHES`] of its batches wait
//! (`Command::AwaitRaceAbsorbed`), so the master's memory is set by how far the ranks are
//! apart, not by how fast any of them closes intervals.
//!
//! The analyst and the app thread share [`Master`] (the reporter and the incremental
//! analysis) under one mutex. A barrier's analysis holds it from the batches still waiting
//! to the release, and pauses the inbox before the release goes out: batches of the next
//! epoch may arrive before the app thread has reset the analysis for it, and wait until it
//! has. Lock order: `Master`, then the inbox or the engine, never the other way round.

use crate::comm::{CommandSender, RaceInbox};
use crate::engine::{Command, RaceBatch};
use dsm_race::{Incremental, Point, Reporter, VarTable};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Race batches of one node that may wait for the analyst at once. One batch holds up to
/// `DSM_RACE_BATCH` intervals (1024 by default): a few keep the analyst busy while the
/// node works on, and bound what waits.
pub(super) const MAX_UNANALYSED_BATCHES: u64 = 4;

/// Rank 0's reporting and between-barrier analysis, shared with the analyst thread.
pub(super) struct Master {
    pub(super) reporter: Reporter,
    pub(super) incremental: Incremental,
    /// The allocations, as the app thread's table (batches name their pages).
    pub(super) vars: VarTable,
    /// Time spent absorbing race batches.
    pub(super) time: Duration,
    /// The epoch under way, and the barriers the program had called when it began.
    pub(super) epoch: u32,
    pub(super) after_barriers: u32,
    /// Per node, how many of its batches were absorbed in the run.
    absorbed: Vec<u64>,
    /// A race report the analyst could not write, for the app thread to return.
    failure: Option<io::Error>,
}

/// [`Master`] as both threads hold it.
pub(super) type SharedMaster = Arc<Mutex<Master>>;

/// Locks the master's state (a panic elsewhere leaves it usable: every update is whole).
pub(super) fn lock(master: &SharedMaster) -> MutexGuard<'_, Master> {
    master.lock().unwrap_or_else(|p| p.into_inner())
}

impl Master {
    pub(super) fn new(reporter: Reporter, incremental: Incremental, nodes: usize) -> Self {
        Master {
            reporter,
            incremental,
            vars: VarTable::new(),
            time: Duration::ZERO,
            epoch: 1,
            after_barriers: 0,
            absorbed: vec![0; nodes],
            failure: None,
        }
    }

    /// Analyses one batch and reports its races; returns how many, and the command that
    /// tells the batch's node it was analysed.
    pub(super) fn absorb(&mut self, b: RaceBatch) -> (u64, Command) {
        let t = Instant::now();
        let from = b.from;
        let races = self.incremental.absorb(
            self.epoch,
            &self.vars,
            from,
            b.known,
            b.intervals,
            b.bitmaps,
        );
        if b.last {
            self.incremental.entered_barrier(from);
        }
        let at = Point::Running {
            after: self.after_barriers,
        };
        let reported = match self.reporter.report(&at, &races, &mut io::stderr()) {
            Ok(n) => n,
            Err(e) => {
                self.failure.get_or_insert(e);
                0
            }
        };
        self.time += t.elapsed();
        let count = &mut self.absorbed[from as usize];
        *count += 1;
        let ack = Command::RaceAbsorbed {
            node: from,
            batches: *count,
        };
        (reported, ack)
    }

    /// A report the analyst thread failed to write, if any.
    pub(super) fn take_failure(&mut self) -> Option<io::Error> {
        self.failure.take()
    }
}

/// The analyst thread and what stops it.
pub(super) struct Analyst {
    inbox: Arc<RaceInbox>,
    thread: Option<JoinHandle<()>>,
    /// Batches of other nodes absorbed so far (rank 0 then ships its own, so that what it
    /// knows reaches the master and the others' intervals can be dropped).
    pub(super) foreign_absorbed: Arc<AtomicU64>,
}

impl Analyst {
    pub(super) fn start(
        master: SharedMaster,
        inbox: Arc<RaceInbox>,
        commands: CommandSender,
    ) -> io::Result<Analyst> {
        let foreign_absorbed = Arc::new(AtomicU64::new(0));
        let (taken, counter) = (inbox.clone(), foreign_absorbed.clone());
        let thread = std::thread::Builder::new()
            .name("dsm-race-analyst".into())
            .spawn(move || {
                while taken.wait_ready() {
                    let mut m = lock(&master);
                    for b in taken.take() {
                        if b.from != 0 {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                        let (_, ack) = m.absorb(b);
                        commands.send(ack);
                    }
                }
            })?;
        Ok(Analyst {
            inbox,
            thread: Some(thread),
            foreign_absorbed,
        })
    }

    /// The inbox the analyst takes from.
    pub(super) fn inbox(&self) -> &RaceInbox {
        &self.inbox
    }

    /// Stops the thread once it has absorbed what it holds.
    pub(super) fn stop(&mut self) {
        self.inbox.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Analyst {
    fn drop(&mut self) {
        // Not joined: a job that ends in an error must not wait for an analysis.
        self.inbox.close();
    }
}

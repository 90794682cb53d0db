//! Recording and replaying the synchronization order (`dsmrun --record`, `--replay`): the
//! engine's side. Recording appends an event for every lock acquisition (the lock and its
//! grant number, which travels with the token) and every barrier (a count and hash of the
//! intervals closed since the previous one). Replaying checks each of this node's
//! synchronization operations against its script in the record, and makes the lock
//! protocol (`locks`) hand out every grant to the rank that had it in the record; anything
//! the record cannot account for ends the job with [`Output::Diverged`], never a wait that
//! cannot end.
//!
//! Racy reads are not made deterministic: a page fetched from its home holds whatever
//! diffs arrived there so far. What a replay does instead is notice when they made a
//! difference to the program's course: the barrier entries compare the number of intervals
//! and a hash of their structure (what began each, and with race detection the pages each
//! read and wrote and a digest of the elements, `Command::FoldAccessDigest`), and a
//! difference stops the replay naming the barrier.

use super::{Engine, Memory, Output};
use dsm_proto::{LockId, RaceNotices, SyncCause};
use dsm_replay::{Event, Schedule};

/// What the engine does about the synchronization order.
#[derive(Default)]
pub(super) struct OrderLog {
    /// Recording: the events so far.
    pub(super) recording: Option<Vec<Event>>,
    /// Replaying: the schedule.
    pub(super) replay: Option<Schedule>,
    /// Intervals closed since the last barrier (only kept when recording or replaying).
    pub(super) intervals: u32,
    /// Hash of their structure.
    pub(super) hash: u64,
    /// A divergence was reported: nothing more is checked.
    pub(super) diverged: bool,
    /// Names of named locks, for messages.
    pub(super) names: std::collections::HashMap<LockId, String>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn mix(h: u64, v: u64) -> u64 {
    v.to_le_bytes()
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

impl OrderLog {
    pub(super) fn active(&self) -> bool {
        self.recording.is_some() || self.replay.is_some()
    }

    pub(super) fn replaying(&self) -> bool {
        self.replay.is_some() && !self.diverged
    }
}

impl<M: Memory> Engine<M> {
    /// Starts recording this node's synchronization events.
    pub fn start_recording(&mut self) {
        self.order.recording = Some(Vec::new());
        self.order.hash = FNV_OFFSET;
    }

    /// Makes this node follow `schedule` (its rank must be this node's).
    pub fn start_replay(&mut self, schedule: Schedule) {
        self.order.replay = Some(schedule);
        self.order.hash = FNV_OFFSET;
    }

    /// Gives a named lock's name to messages about it.
    pub fn name_lock(&mut self, lock: LockId, name: &str) {
        if self.order.active() {
            self.order.names.entry(lock).or_insert_with(|| name.into());
        }
    }

    /// The events recorded so far (empty when not recording), leaving the log empty.
    pub fn take_recording(&mut self) -> Vec<Event> {
        self.order
            .recording
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// How a lock is called in messages.
    pub(super) fn lock_label(&self, lock: LockId) -> String {
        match self.order.names.get(&lock) {
            Some(name) => format!("lock \"{name}\""),
            None if lock >= 1 << 63 => format!("named lock {lock:#x}"),
            None => format!("lock {lock}"),
        }
    }

    pub(super) fn diverged(&mut self, why: String) {
        if self.order.diverged {
            return;
        }
        self.order.diverged = true;
        self.out.push(Output::Diverged(format!(
            "replay diverged on rank {}: {why}",
            self.me
        )));
    }

    fn describe(&self, e: Option<Event>) -> String {
        match e {
            None => "the end of its script".into(),
            Some(Event::Acquire { lock, grant }) => {
                format!("an acquire of {} (grant {grant})", self.lock_label(lock))
            }
            Some(Event::Barrier { .. }) => "a barrier".into(),
            Some(Event::Values { .. }) => "the end of the run".into(),
        }
    }

    /// Folds a closed interval into the barrier check.
    pub(super) fn hash_interval(&mut self, cause: SyncCause, race: Option<&RaceNotices>) {
        if !self.order.active() {
            return;
        }
        let mut h = self.order.hash;
        h = mix(
            h,
            match cause {
                SyncCause::Start => 1,
                SyncCause::Barrier(_) => 2,
                SyncCause::Acquire(l) => 3 ^ l.rotate_left(8),
                SyncCause::Release(l) => 4 ^ l.rotate_left(8),
                // Semaphore pairings are not forced by a replay; a run whose waits consumed
                // other signals shows up here, at the next barrier, as other intervals.
                SyncCause::SemWait(s) => 7 ^ s.rotate_left(8),
                SyncCause::SemSignal(s) => 8 ^ s.rotate_left(8),
                SyncCause::SemTryFailed(s) => 9 ^ s.rotate_left(8),
            },
        );
        if let Some(r) = race {
            for (tag, runs) in [(5, &r.reads), (6, &r.writes)] {
                h = mix(h, tag);
                for &(first, count) in runs.runs() {
                    h = mix(h, u64::from(first) << 32 | u64::from(count));
                }
            }
        }
        self.order.hash = h;
        self.order.intervals += 1;
    }

    /// Folds the runtime's digest of the epoch's accesses into the next barrier's check.
    pub(super) fn fold_access_digest(&mut self, digest: u64) {
        if self.order.active() {
            self.order.hash = mix(self.order.hash, digest);
        }
    }

    /// Before an acquire of `lock` starts: in a replay, the script must say that this
    /// node acquires that lock next. Returns false when it does not (the job is stopping).
    pub(super) fn replay_allows_acquire(&mut self, lock: LockId) -> bool {
        let Some(s) = self.order.replay.as_ref().filter(|_| !self.order.diverged) else {
            return true;
        };
        match s.next_event() {
            Some(Event::Acquire { lock: l, .. }) if l == lock => true,
            other => {
                let mine = s.grants_to(lock, self.me as u32);
                let done = s.acquired_so_far(lock);
                let why = format!(
                    "rank {} acquires {} (its acquire {} of it, event {} of its script), where \
                     the record has {}; the record gives rank {} {} of the lock's {} grants{}",
                    self.me,
                    self.lock_label(lock),
                    done + 1,
                    s.position() + 1,
                    self.describe(other),
                    self.me,
                    mine.len(),
                    s.grants_of(lock),
                    match mine.get(done) {
                        Some(g) => format!(", its next being grant {g}"),
                        None => match mine.last() {
                            Some(g) => format!(", the last being grant {g}"),
                            None => String::new(),
                        },
                    }
                );
                self.diverged(why);
                false
            }
        }
    }

    /// This node now holds `lock` as grant number `grant`.
    pub(super) fn note_acquired(&mut self, lock: LockId, grant: u64) {
        if let Some(rec) = self.order.recording.as_mut() {
            rec.push(Event::Acquire { lock, grant });
        }
        if !self.order.replaying() {
            return;
        }
        let s = self.order.replay.as_mut().expect("replaying");
        match s.next_event() {
            Some(Event::Acquire { lock: l, grant: g }) if l == lock && g == grant => s.advance(),
            other => {
                let why = format!(
                    "it received {} as grant {grant}, where the record has {}",
                    self.lock_label(lock),
                    self.describe(other)
                );
                self.diverged(why);
            }
        }
    }

    /// This node arrives at a barrier (or an allocation, or one of dsm's own barriers).
    /// Returns false when a replay diverged here.
    pub(super) fn note_barrier(&mut self) -> bool {
        if !self.order.active() {
            return true;
        }
        let (intervals, hash) = (self.order.intervals, self.order.hash);
        self.order.intervals = 0;
        self.order.hash = FNV_OFFSET;
        if let Some(rec) = self.order.recording.as_mut() {
            rec.push(Event::Barrier { intervals, hash });
        }
        if !self.order.replaying() {
            return !self.order.diverged;
        }
        let s = self.order.replay.as_mut().expect("replaying");
        match s.next_event() {
            Some(Event::Barrier {
                intervals: i,
                hash: h,
            }) => {
                if i == intervals && h == hash {
                    s.advance();
                    return true;
                }
                let why = format!(
                    "at {} its {intervals} intervals since the previous barrier differ from \
                     the record's {i}{}: the program took another course, most likely because \
                     a racy read saw another value",
                    self.at,
                    if i == intervals {
                        " (same number, other synchronization or pages)"
                    } else {
                        ""
                    }
                );
                self.diverged(why);
                false
            }
            other => {
                let why = format!(
                    "the program arrives at {} as its event {}, where the record has {}",
                    self.at,
                    s.position() + 1,
                    self.describe(other)
                );
                self.diverged(why);
                false
            }
        }
    }

    /// The run ended (after the last barrier) with `digest` as the values of this node's
    /// home pages: recorded, or in a replay checked against the record.
    pub(super) fn note_values(&mut self, digest: u64) {
        if let Some(rec) = self.order.recording.as_mut() {
            rec.push(Event::Values { digest });
        }
        if !self.order.replaying() {
            return;
        }
        let s = self.order.replay.as_mut().expect("replaying");
        match s.next_event() {
            Some(Event::Values { digest: d }) if d == digest => s.advance(),
            Some(Event::Values { .. }) => self.diverged(format!(
                "the run ends with other values in the shared pages rank {} homes than the \
                 recorded run had (the same synchronization, so an unsynchronized read saw \
                 another value)",
                self.me
            )),
            other => {
                let why = format!(
                    "the program ends as its event {}, where the record has {}",
                    s.position() + 1,
                    self.describe(other)
                );
                self.diverged(why);
            }
        }
    }
}

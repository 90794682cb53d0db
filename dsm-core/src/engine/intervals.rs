//! Intervals and vector time: closing the open interval (diffs out, pages write-protected,
//! the interval logged), opening the next one, and taking in intervals learned from others
//! (logging them and invalidating the pages their write notices name). Locks and barriers
//! decide when; this module decides what an interval boundary does to pages and logs.

use super::push::Pushed;
use super::{Engine, Memory, PageState, Prot, Twin};
use dsm_proto::{
    IntervalRecord, Msg, NodeId, PageDiff, PageNo, PageRuns, RaceNotices, Requirement, SyncCause,
    VectorTime,
};
use std::collections::BTreeMap;

/// Closes in a row that may find a page kept writable unchanged before it is
/// write-protected again: two, so that the close at the acquire between two critical
/// sections writing the page does not end it.
pub(super) const KEEP_QUIET_CLOSES: u8 = 2;

/// Records logged between two passes of [`Engine::trim_log`] unless
/// [`Engine::set_log_trim_period`] says otherwise: a pass looks at every node's entry of every other
/// node's knowledge and at the records it drops, so it runs now and then, not at every
/// close.
pub(super) const TRIM_LOG_EVERY: usize = 256;

impl<M: Memory> Engine<M> {
    /// What this node has seen, counting only its closed intervals.
    pub(super) fn known(&self) -> VectorTime {
        let mut k = self.vt.clone();
        k.set(self.me, self.vt.get(self.me) - 1);
        k
    }

    /// What [`Engine::known`] will be once the open interval closes (with no message
    /// taken in meanwhile): its own entry names the open interval.
    pub fn known_after_close(&self) -> VectorTime {
        self.vt.clone()
    }

    // ---------------------------------------------------------------- intervals

    /// Ends the open interval: diffs go to homes, pages are write-protected, and the
    /// interval is logged if it carries any notice.
    ///
    /// A page whose diff was not empty stays writable, its twin brought
    /// up to the page (`keep_writable`): code that writes the same page interval after
    /// interval (a lock per element of an array, sums added one critical section at a
    /// time) then pays one diff per interval instead of a write fault, a twin and two
    /// `mprotect`s. Its next interval's writes are still found, by that diff. A page that
    /// comes through [`KEEP_QUIET_CLOSES`] closes unchanged is write-protected as before,
    /// and one that a write notice names is write-protected before anything is decided
    /// about it ([`Engine::protect_kept`]).
    pub(super) fn close_interval(&mut self, race: Option<RaceNotices>) {
        let index = self.vt.get(self.me);
        let mut written: Vec<PageNo> = std::mem::take(&mut self.home_writes);
        // In one common memory nothing is ever dirty (no twins, diffs or protection), and
        // a lock-heavy program closes an interval per release.
        if !self.dirty.is_empty() {
            self.send_dirty_diffs(index, &mut written);
        }
        self.grow_handler_slots();
        self.protect_mates_pages(&written);
        let writes = PageRuns::from_pages(written);
        let race = race.filter(|r| !r.reads.is_empty() || !r.writes.is_empty());
        self.hash_interval(self.cur_cause, race.as_ref());
        // With race detection, every interval a semaphore operation opened is logged, so
        // the barrier master sees each node's semaphore operations of the epoch in order
        // (`--sem-order=safe` rebuilds the order from them).
        let sem_op = self.race_mode
            && matches!(
                self.cur_cause,
                SyncCause::SemWait(_) | SyncCause::SemSignal(_)
            );
        if !writes.is_empty() || race.is_some() || sem_op {
            self.log_record(IntervalRecord {
                node: self.me,
                index,
                vt: self.cur_start.clone(),
                writes,
                race,
                began_with: self.cur_cause,
            });
        }
        self.stats.intervals_closed += 1;
        self.closed_cause = self.cur_cause;
        self.vt.set(self.me, index + 1);
    }

    /// [`Engine::close_interval`]'s dirty pages: each one's diff goes to its home (its page
    /// noted in `written`), and the page is write-protected or kept writable.
    fn send_dirty_diffs(&mut self, index: u32, written: &mut Vec<PageNo>) {
        let dirty = std::mem::take(&mut self.dirty);
        let mut by_home: BTreeMap<NodeId, Vec<PageDiff>> = BTreeMap::new();
        let mut protect = Vec::with_capacity(dirty.len());
        for &p in &dirty {
            let mut twin = match self.twins.remove(&p).expect("dirty page has a twin") {
                Twin::Owned(twin) => twin,
                Twin::Slot(slot) => {
                    let fast = self.fast.as_ref().expect("slots come from the handler");
                    let mut twin = self
                        .spare_twins
                        .pop()
                        .unwrap_or_else(|| vec![0u8; dsm_proto::PAGE_SIZE].into_boxed_slice());
                    fast.read_slot(slot, &mut twin);
                    fast.release_slot(slot);
                    twin
                }
            };
            let runs = self.mem.make_diff(p, &twin);
            let quiet = if runs.is_empty() {
                self.kept.get(&p).map_or(KEEP_QUIET_CLOSES, |q| q + 1)
            } else {
                0
            };
            if self.keep_writable && quiet < KEEP_QUIET_CLOSES {
                self.mem.read_page(p, &mut twin);
                self.twins.insert(p, Twin::Owned(twin));
                self.kept.insert(p, quiet);
                self.dirty.push(p);
                self.stats.pages_kept_writable += 1;
            } else {
                self.spare_twins.push(twin);
                self.kept.remove(&p);
                self.set_state(p, PageState::ReadOnly);
                protect.push(p);
            }
            if !runs.is_empty() {
                self.stats.diffs_sent += 1;
                self.stats.diff_bytes_sent += runs.len() as u64;
                self.note_own_diff(p, index, &runs);
                by_home
                    .entry(self.pages[p as usize].home)
                    .or_default()
                    .push(PageDiff { page: p, runs });
                written.push(p);
            }
        }
        self.protect_runs(&mut protect, Prot::Read);
        for (home, diffs) in by_home {
            // Diffs this node's copies held without the home having sent them (pushed
            // with a grant) must reach the home's copy before these do.
            let after = diffs
                .iter()
                .flat_map(|d| {
                    self.required.get(&d.page).into_iter().flatten().map(
                        move |&(writer, interval)| Requirement {
                            page: d.page,
                            writer,
                            interval,
                        },
                    )
                })
                .collect();
            self.send(
                home,
                Msg::Diffs {
                    interval: index,
                    diffs,
                    after,
                },
            );
        }
    }

    /// Write-protects the host pages homed at mates among `written` (this interval's
    /// writes of host pages): the next interval that writes one must fault to make its
    /// write notice (see [`Engine::set_host_mates`]).
    fn protect_mates_pages(&mut self, written: &[PageNo]) {
        if !self.has_host_mates() {
            return;
        }
        let mut protect: Vec<PageNo> = written
            .iter()
            .copied()
            .filter(|&p| !self.is_home(p) && self.is_host_page(p))
            .collect();
        for &p in &protect {
            // Writable, so the handler holds no claim on it.
            self.set_state(p, PageState::ReadOnly);
        }
        self.protect_runs(&mut protect, Prot::Read);
    }

    /// Doubles the handler's twin pool when the interval just closed used more than half
    /// of it, so the next one is served in the handler (a pool that ran short mid-interval
    /// grows at once, in `drain_handler_writes`).
    fn grow_handler_slots(&mut self) {
        let used = std::mem::take(&mut self.slot_twins);
        if let Some(fast) = &self.fast {
            let made = fast.slots_made();
            if used * 2 > made && made < fast.max_slots() {
                fast.grow_slots(made * 2);
            }
        }
    }

    /// Turns keeping written pages writable across interval closes on or off (on by
    /// default; see `close_interval`). Off, every interval's first write to a page takes
    /// a write fault.
    pub fn set_keep_writable(&mut self, on: bool) {
        self.keep_writable = on;
    }

    /// Write-protects `p` if it was kept writable past the last close (see
    /// `close_interval`), dropping its twin: afterwards it is an ordinary read-only copy.
    /// Its changes went out at that close, and the app wrote nothing since: this runs in
    /// a synchronisation operation, which the app thread waits for.
    pub(super) fn protect_kept(&mut self, p: PageNo) {
        if self.kept.remove(&p).is_none() {
            return;
        }
        if let Some(pos) = self.dirty.iter().position(|&d| d == p) {
            self.dirty.swap_remove(pos);
        }
        if let Some(Twin::Owned(twin)) = self.twins.remove(&p) {
            self.spare_twins.push(twin);
        }
        self.mem.protect(p, 1, Prot::Read);
        self.set_state(p, PageState::ReadOnly);
    }

    /// Appends `record` to its node's log, trimming the log every `trim_period` records.
    fn log_record(&mut self, record: IntervalRecord) {
        self.log[record.node as usize].push(record);
        self.logged_since_trim += 1;
        if self.logged_since_trim >= self.trim_period {
            self.logged_since_trim = 0;
            self.trim_log();
        }
    }

    /// Trims the log every `records` records logged (256 by default, `TRIM_LOG_EVERY`):
    /// the protocol simulator trims often, so that every message order meets a trim.
    pub fn set_log_trim_period(&mut self, records: usize) {
        self.trim_period = records.max(1);
    }

    /// Notes what `msg`, from `from`, says a node has seen (see `seen_by`): the `known` of
    /// a lock request or forward and a semaphore wait or forward is the waiting node's,
    /// that of a semaphore grant, race batch or barrier arrival its sender's. Not a lock
    /// grant's: a token asked for ahead is passed on with the grant that brought it
    /// (`LockState::early_grant`), whose knowledge the node passing it never took in.
    pub(super) fn note_seen_in(&mut self, from: NodeId, msg: &Msg) {
        let (node, known) = match msg {
            Msg::LockRequest {
                requester, known, ..
            }
            | Msg::LockForward {
                requester, known, ..
            } => (*requester, known),
            Msg::SemForward { waiter, known, .. } => (*waiter, known),
            Msg::SemWait { known, .. }
            | Msg::SemGrant { known, .. }
            | Msg::RaceBatch { known, .. }
            | Msg::BarrierArrive { known, .. } => (from, known),
            _ => return,
        };
        if let Some(seen) = self.seen_by.get_mut(node as usize) {
            seen.merge(known);
        }
    }

    /// Drops from the log the records every other node has seen: no grant, semaphore
    /// grant or barrier will carry them again, so a program that synchronizes only with
    /// locks and semaphores keeps a log as long as its nodes are apart, not as long as it
    /// runs. Records with race notices stay until they are shipped to the race master,
    /// and in race mode those of semaphore operations until the barrier (the master
    /// rebuilds the safe semaphore order from them).
    pub(super) fn trim_log(&mut self) {
        let me = self.me as usize;
        let race_mode = self.race_mode;
        for (node, list) in self.log.iter_mut().enumerate() {
            let Some(floor) = (0..self.n)
                .filter(|&r| r != me)
                .map(|r| self.seen_by[r].0.get(node).copied().unwrap_or(0))
                .min()
            else {
                continue;
            };
            if list.first().is_none_or(|r| r.index > floor) {
                continue;
            }
            list.retain(|r| {
                r.index > floor
                    || r.race.is_some()
                    || race_mode
                        && matches!(
                            r.began_with,
                            SyncCause::SemWait(_) | SyncCause::SemSignal(_)
                        )
            });
        }
    }

    pub(super) fn begin_interval(&mut self, cause: SyncCause) {
        // In place: lock-heavy programs begin an interval at every acquire and release.
        self.cur_start.0.clone_from(&self.vt.0);
        self.cur_cause = cause;
    }

    /// Intervals in the log that a node with knowledge `known` has not seen and that
    /// `upto` covers (a lock's or semaphore signal's release time: what came later is not
    /// ordered before the receiver), as coherence needs them: with their write notices,
    /// without race notices (the race master gets those from the recording node itself,
    /// at barriers or in race batches), and only those that have write notices.
    ///
    /// Only the records in range are looked at: a grant of a lock released long ago (a
    /// node that went on closing intervals since) costs what it carries, not the whole
    /// log since the release.
    pub(super) fn unseen_by(&self, known: &VectorTime, upto: &VectorTime) -> Vec<IntervalRecord> {
        let mut out = Vec::new();
        for (node, list) in self.log.iter().enumerate() {
            let seen = known.0.get(node).copied().unwrap_or(0);
            let last = upto.0.get(node).copied().unwrap_or(0);
            let start = list.partition_point(|r| r.index <= seen);
            let end = list.partition_point(|r| r.index <= last).max(start);
            out.extend(
                list[start..end]
                    .iter()
                    .filter(|r| !r.writes.is_empty())
                    .map(IntervalRecord::without_race),
            );
        }
        out
    }

    /// Incorporates intervals learned at an acquire or barrier: logs them, brings up to
    /// date (from `pushed`, see `push`) or invalidates the pages their write notices name,
    /// and returns the diffs this node must have applied to its home pages before the app
    /// may continue.
    pub(super) fn apply_intervals(
        &mut self,
        mut records: Vec<IntervalRecord>,
        known: &VectorTime,
        pushed: Pushed,
    ) -> Vec<Requirement> {
        if known.len() != self.n {
            self.fatal(format!(
                "received a vector timestamp for {} nodes in a {}-node job",
                known.len(),
                self.n
            ));
            return Vec::new();
        }
        records.sort_by_key(|r| (r.node, r.index));
        let mut named: Vec<PageNo> = Vec::new();
        // (page, writer, interval) of every new notice of a page homed elsewhere.
        let mut fresh: Vec<(PageNo, NodeId, u32)> = Vec::new();
        let mut home_waits = Vec::new();
        for rec in records {
            let node = rec.node;
            if node as usize >= self.n || node == self.me {
                continue;
            }
            let last_logged = self.log[node as usize].last().map_or(0, |r| r.index);
            if rec.index <= self.vt.get(node) || rec.index <= last_logged {
                continue;
            }
            for &(first, count) in rec.writes.runs() {
                let end = (first as usize).saturating_add(count as usize);
                if end > self.pages.len() {
                    self.fatal(format!(
                        "rank {node} sent a write notice for pages beyond the allocations"
                    ));
                    return Vec::new();
                }
                for p in first..first + count {
                    self.settle(p);
                    let entry = self.pages[p as usize];
                    if entry.home == self.me {
                        if node != self.me {
                            home_waits.push(Requirement {
                                page: p,
                                writer: node,
                                interval: rec.index,
                            });
                        }
                        continue;
                    }
                    if self.is_host_mate(entry.home) {
                        // A host page a mate wrote, or whose diff its home applied: the
                        // writes are in the host's copy.
                        if self.is_host_mate(node) {
                            continue;
                        }
                        if self.mem.host_applied(p, node) >= rec.index {
                            self.stats.host_diffs_found_applied += 1;
                            continue;
                        }
                    }
                    self.protect_kept(p);
                    if entry.home != node {
                        // The writer is not the home, so its changes reach the home as a
                        // diff: a later fetch must wait for it.
                        let req = self.required.entry(p).or_default();
                        match req.iter_mut().find(|(w, _)| *w == node) {
                            Some((_, i)) => *i = (*i).max(rec.index),
                            None => req.push((node, rec.index)),
                        }
                    }
                    named.push(p);
                    fresh.push((p, node, rec.index));
                }
            }
            // Race notices are the recording node's to give the master; a record without
            // write notices means nothing to coherence.
            if !rec.writes.is_empty() {
                self.log_record(IntervalRecord { race: None, ..rec });
            }
        }
        named.sort_unstable();
        named.dedup();
        let mut invalidate = self.take_pushes(named, pushed, &fresh);
        for &p in &invalidate {
            debug_assert!(
                self.pages[p as usize].state != PageState::ReadWrite,
                "interval closed before invalidation"
            );
            self.set_state(p, PageState::Invalid);
        }
        self.stats.invalidations += invalidate.len() as u64;
        self.protect_runs(&mut invalidate, Prot::None);
        self.vt.merge(known);
        home_waits.retain(|r| !self.requirements_met(std::slice::from_ref(r)));
        home_waits
    }
}

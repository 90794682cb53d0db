//! Distributed locks: a static manager per lock forwards each request to the last
//! requester, so the token travels directly from holder to successor; a grant carries the
//! intervals the acquirer must see.
//!
//! A program that knows its next locks says so (`Command::PrefetchLocks`): their tokens
//! are asked for a few at a time ahead of the acquires, by the same request an acquire
//! makes. A grant that comes ahead is kept as it arrived ([`EarlyGrant`]) and applied
//! when the app takes the lock, so the acquire joins exactly what the grantor's release
//! knew, at the acquire; a node that asks for the token first gets it at once, with that
//! grant's knowledge passed on as if the token had never stopped here. A token asked for
//! ahead is thus never held, and a hint never changes what a program computes or whether
//! it can deadlock: only how long an acquire waits.
//!
//! Every acquisition has a grant number (acquisitions of the lock before it, by anyone),
//! which travels with the token. In a replay (`replay`) the grant numbers decide who gets
//! the lock: the manager accepts requests in the order in which the token moved between
//! ranks in the record (an early request waits at the manager), and a token holder keeps
//! the token while the record's next grant is its own. A request the record cannot
//! account for ends the job as diverged.

use super::push::Pushed;
use super::{Engine, Memory, Output, Reply};
use dsm_proto::{
    Grant, IntervalRecord, LockId, Msg, NodeId, PageRuns, RaceNotices, SyncCause, VectorTime,
};
use std::collections::VecDeque;

/// This node's view of one lock: as a possible holder, and at the manager, as the end of
/// the forwarding chain.
#[derive(Debug)]
pub(super) struct LockState {
    /// At the manager: where the next request is forwarded (initially the manager itself,
    /// which also holds the token of a lock nobody has used).
    last_requester: NodeId,
    /// The lock's token is here: it can be taken or granted without asking anyone.
    token: bool,
    /// The app holds the lock (implies `token`).
    held: bool,
    /// An acquire is under way; a grant is expected.
    waiting: bool,
    /// The successor a request was forwarded here for, with its knowledge, granted at the
    /// next release (or at once if the token is idle).
    next: Option<(NodeId, VectorTime)>,
    /// What this node knew when it last released the lock. A later grant passes on exactly
    /// this: intervals closed after the release (by a barrier arrival, another lock) are
    /// not ordered before the acquirer, and claiming they were would hide races.
    released_known: Option<VectorTime>,
    /// With the token: the grant number of the next acquisition.
    grants: u64,
    /// The token was asked for ahead of an acquire and is on its way.
    asked_ahead: bool,
    /// The token came ahead of its acquire (with `token`), not yet applied.
    early_grant: Option<EarlyGrant>,
    /// Replay, at the manager: the order in which the token moves between ranks in the
    /// record (computed at first use), and how many of those transfers were accepted.
    transfers: Option<Vec<NodeId>>,
    accepted: usize,
    /// Replay, at the manager: requests that came before their turn.
    early: Vec<(NodeId, VectorTime)>,
}

/// A grant that came before the app took the lock: what the acquire will apply, or what
/// a node asking first is passed on.
#[derive(Debug)]
pub(super) struct EarlyGrant {
    /// The grantor's knowledge at its release.
    known: VectorTime,
    /// What this node lacked of it when it asked (not in its log).
    intervals: Vec<IntervalRecord>,
    /// Pages and diffs that came with it.
    pushed: Pushed,
    /// The barrier epoch it came in: pushes are only taken in the same one (see
    /// `Pushed::with_grant`).
    epoch: u32,
    /// `Engine::copies_installed` when it came: a copy of a page installed since is newer
    /// than the one pushed with it.
    installs_before: u64,
}

/// Lock tokens asked for ahead at a time: enough for a round trip's worth of short
/// critical sections, few enough that a hint running far ahead of the program does not
/// pull tokens the other nodes are still taking.
const LOCKS_ASKED_AHEAD: usize = 32;

/// What the app thread last heard of its engine's knowledge ([`Reply::HostReleased`],
/// [`Reply::BarrierDone`], the release clocks it joined), so that a host-lock acquire can
/// tell without the engine whether the lock's last release brings anything new.
///
/// It never exceeds what the engine knows (which only grows), so a release it covers is
/// one the engine covers too. Such an acquire need not close the interval: the next one
/// would begin with the same vector time, and no node can be ordered after the first but
/// not the second, because a node learns an interval index of this one only from the
/// release (or barrier) that closed it, and this interval ended at an acquire. Merging the
/// two therefore reports exactly the same races, with one interval fewer to record, ship
/// and compare; a program whose ranks mostly re-take locks they or the barrier already
/// ordered (a rank's own lock, the first acquires after a barrier) closes about half as
/// many intervals.
#[derive(Debug, Default, Clone)]
pub struct KnownClock(Vec<u32>);

impl KnownClock {
    /// Whether every entry of `released` (one per node) is within what is known; `false`
    /// before anything is known.
    pub fn covers(&self, released: impl ExactSizeIterator<Item = u32>) -> bool {
        released.len() == self.0.len() && released.zip(&self.0).all(|(r, &k)| r <= k)
    }

    /// Whether `released` (one entry per node) is exactly what is known: a host lock
    /// still holding the clock this node left at its last release.
    pub fn is(&self, released: impl ExactSizeIterator<Item = u32>) -> bool {
        released.len() == self.0.len() && released.zip(&self.0).all(|(r, &k)| r == k)
    }

    /// One entry per node (empty before anything is known).
    pub fn entries(&self) -> &[u32] {
        &self.0
    }

    /// The engine's knowledge as it just answered it (a release or a barrier).
    pub fn set(&mut self, known: &VectorTime) {
        self.0.clear();
        self.0.extend_from_slice(&known.0);
    }

    /// The engine joined `released` (a host-lock acquire it carried out).
    pub fn join(&mut self, released: &VectorTime) {
        if self.0.len() != released.0.len() {
            // Nothing was known yet: after the join the engine knows at least this.
            self.set(released);
            return;
        }
        for (k, &r) in self.0.iter_mut().zip(&released.0) {
            *k = (*k).max(r);
        }
    }
}

/// The lock's manager: a static function of the id so every node agrees without messages.
pub fn lock_manager(lock: LockId, nodes: usize) -> NodeId {
    (lock % nodes as u64) as NodeId
}

impl<M: Memory> Engine<M> {
    fn lock_entry(&mut self, lock: LockId) -> &mut LockState {
        let manager = lock_manager(lock, self.n);
        let me = self.me;
        self.locks.entry(lock).or_insert_with(|| LockState {
            last_requester: manager,
            token: manager == me,
            held: false,
            waiting: false,
            next: None,
            released_known: None,
            grants: 0,
            asked_ahead: false,
            early_grant: None,
            transfers: None,
            accepted: 0,
            early: Vec::new(),
        })
    }

    /// Replay: the rank that holds grant `grant` of `lock` in the record (`None` also
    /// when not replaying).
    fn recorded_holder(&self, lock: LockId, grant: u64) -> Option<NodeId> {
        let s = self
            .order
            .replay
            .as_ref()
            .filter(|_| self.order.replaying())?;
        s.holder(lock, grant).map(|r| r as NodeId)
    }

    /// Replay: the token is here and free; grant `grant` is not recorded for anyone.
    fn unrecorded_grant(&mut self, lock: LockId, grant: u64, wanted_by: NodeId) {
        let have = self.order.replay.as_ref().map_or(0, |s| s.grants_of(lock));
        let why = format!(
            "rank {wanted_by} wants {} as grant {grant}, but the record has only {have} grants of it",
            self.lock_label(lock)
        );
        self.diverged(why);
    }

    pub(super) fn acquire(&mut self, lock: LockId, race: Option<RaceNotices>) {
        if self.locks_ahead.front() == Some(&lock) {
            self.locks_ahead.pop_front();
        }
        self.forget_asked_ahead(lock);
        self.acquire_now(lock, race);
        if !self.locks_ahead.is_empty() {
            self.ask_ahead();
        }
    }

    fn acquire_now(&mut self, lock: LockId, race: Option<RaceNotices>) {
        self.close_interval(race);
        self.stats.lock_acquires += 1;
        if !self.replay_allows_acquire(lock) {
            return;
        }
        let replaying = self.order.replaying();
        let me = self.me;
        let grant_here = {
            let st = self.lock_entry(lock);
            (st.token && !st.held && !st.waiting).then_some(st.grants)
        };
        // Replay: with the token free here, the record decides whether this node takes it
        // now or asks for it like a node without the token (someone else's grant is next).
        let take_local = match grant_here {
            Some(g) if replaying => match self.recorded_holder(lock, g) {
                Some(h) if h == me => true,
                Some(_) => false,
                None => {
                    self.unrecorded_grant(lock, g, me);
                    return;
                }
            },
            Some(_) => true,
            None => false,
        };
        let st = self.lock_entry(lock);
        if st.held || st.waiting {
            self.fatal(format!(
                "lock {lock} acquired again by rank {} while already held (locks are not recursive)",
                self.me
            ));
            return;
        }
        if take_local {
            self.take_token_here(lock);
            return;
        }
        st.waiting = true;
        // Asked for ahead: the grant on its way is this acquire's.
        if !std::mem::replace(&mut st.asked_ahead, false) {
            self.request_lock(lock);
        }
    }

    /// An acquire of `lock` carried out at once, without closing the open interval, when
    /// it can learn nothing: the token is here and free and no grant that brought it is
    /// waiting to be applied (it stayed here since this node's own release, came with a
    /// grant an acquire applied, or nobody has taken the lock yet). Every release of the
    /// lock is then already in what this node knows, so the interval's vector time is the
    /// one a closing acquire would give the next, and the two are one interval, as a host
    /// lock's acquire that learns nothing leaves it open (the writes before the acquire go
    /// out with the critical section's at the release). `false`, changing nothing,
    /// otherwise, and while recording or replaying the synchronization order, whose
    /// intervals must be numbered alike in every run. The app must not close its
    /// recorder's interval either.
    pub fn acquire_here_quietly(&mut self, lock: LockId) -> bool {
        if self.order.replaying() || self.order.recording.is_some() {
            return false;
        }
        let free_here = self
            .locks
            .get(&lock)
            .is_some_and(|st| st.token && !st.held && !st.waiting && st.early_grant.is_none());
        if !free_here {
            return false;
        }
        self.take_in_handler_work();
        if self.locks_ahead.front() == Some(&lock) {
            self.locks_ahead.pop_front();
        }
        self.forget_asked_ahead(lock);
        let st = self.lock_entry(lock);
        st.held = true;
        st.grants += 1;
        self.stats.lock_acquires += 1;
        self.stats.lock_acquires_local += 1;
        self.stats.lock_acquires_left_open += 1;
        if !self.locks_ahead.is_empty() {
            self.ask_ahead();
        }
        true
    }

    /// The app takes `lock`, whose token is here and free: applies the grant that brought
    /// it ahead, if one did.
    fn take_token_here(&mut self, lock: LockId) {
        let epoch = self.epoch;
        let st = self.lock_entry(lock);
        st.held = true;
        let grant = st.grants;
        st.grants += 1;
        let early = st.early_grant.take();
        self.stats.lock_acquires_local += 1;
        self.note_acquired(lock, grant);
        let waits = match early {
            Some(e) => {
                let pushed = if e.epoch == epoch {
                    self.drop_superseded_copies(e.pushed, e.installs_before)
                } else {
                    self.refuse_pushes(&e.pushed);
                    Pushed::default()
                };
                self.apply_intervals(e.intervals, &e.known, pushed)
            }
            None => Vec::new(),
        };
        self.begin_interval(SyncCause::Acquire(lock));
        self.reply_after_home_diffs(waits, Reply::Done);
    }

    /// At a barrier's release: the pages and diffs pushed with grants that came ahead of
    /// their acquires before this barrier are dropped (counted as refused), since pushes
    /// are taken only in the epoch they came in (see `take_token_here`); a token asked for
    /// ahead and never taken would otherwise hold its copies to the end of the run.
    pub(super) fn refuse_stale_early_pushes(&mut self) {
        let epoch = self.epoch;
        let stale: Vec<Pushed> = self
            .locks
            .values_mut()
            .filter_map(|st| st.early_grant.as_mut())
            .filter(|e| e.epoch != epoch)
            .map(|e| std::mem::take(&mut e.pushed))
            .collect();
        for pushed in &stale {
            self.refuse_pushes(pushed);
        }
    }

    /// Sends this node's request for `lock` to its manager.
    fn request_lock(&mut self, lock: LockId) {
        let known = self.known();
        let manager = lock_manager(lock, self.n);
        if manager == self.me {
            self.on_lock_request(lock, self.me, known);
        } else {
            self.send(
                manager,
                Msg::LockRequest {
                    locks: vec![lock],
                    requester: self.me,
                    known,
                },
            );
        }
    }

    /// Merges the lock messages among `self.out[start..]` that go to the same node into
    /// one per kind: requests (or forwards) of one requester with one knowledge, and
    /// grants. A message joins an earlier one only past messages to that node about
    /// other locks, so what each node receives about each lock keeps its order; a burst
    /// of tokens asked for ahead then costs a message or two per node instead of one per
    /// lock.
    pub(super) fn merge_lock_sends(&mut self, start: usize) {
        if self.out.len() <= start + 1 {
            return;
        }
        let tail = self.out.split_off(start);
        for o in tail {
            let Output::Send { to, msg } = o else {
                self.out.push(o);
                continue;
            };
            let mut into = None;
            for (i, earlier) in self.out.iter().enumerate().skip(start).rev() {
                let Output::Send { to: t, msg: m } = earlier else {
                    continue;
                };
                if *t != to {
                    continue;
                }
                if mergeable(m, &msg) {
                    into = Some(i);
                    break;
                }
                if !about_other_locks(m, &msg) {
                    break;
                }
            }
            match into.map(|i| &mut self.out[i]) {
                Some(Output::Send { msg: m, .. }) => merge_lock_msg(m, msg),
                _ => self.out.push(Output::Send { to, msg }),
            }
        }
    }

    /// `lock` no longer counts towards the tokens asked for ahead (the app takes it, or
    /// its token went on).
    fn forget_asked_ahead(&mut self, lock: LockId) {
        if let Some(i) = self.locks_asked_ahead.iter().position(|&l| l == lock) {
            self.locks_asked_ahead.swap_remove(i);
        }
    }

    /// [`Command::PrefetchLocks`](super::Command::PrefetchLocks).
    pub(super) fn prefetch_locks(&mut self, locks: Vec<LockId>) {
        if self.order.replaying() {
            return;
        }
        self.locks_ahead = VecDeque::from(locks);
        self.ask_ahead();
    }

    /// Asks for the hinted locks' tokens until [`LOCKS_ASKED_AHEAD`] are on their way or
    /// here untaken. Locks whose token is here, or held or awaited, are skipped.
    fn ask_ahead(&mut self) {
        // Half a window at a time, so that the requests go out together (one message per
        // manager) and their grants come back together.
        if self.locks_asked_ahead.len() > LOCKS_ASKED_AHEAD / 2 {
            return;
        }
        let locks = &self.locks;
        self.locks_asked_ahead.retain(|l| {
            locks
                .get(l)
                .is_some_and(|s| s.asked_ahead || s.early_grant.is_some())
        });
        let start = self.out.len();
        while self.locks_asked_ahead.len() < LOCKS_ASKED_AHEAD {
            let Some(lock) = self.locks_ahead.pop_front() else {
                break;
            };
            let st = self.lock_entry(lock);
            if st.token || st.waiting || st.asked_ahead {
                continue;
            }
            st.asked_ahead = true;
            self.locks_asked_ahead.push(lock);
            self.stats.lock_tokens_asked_ahead += 1;
            self.request_lock(lock);
        }
        self.merge_lock_sends(start);
    }

    pub(super) fn on_lock_request(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        if lock_manager(lock, self.n) != self.me {
            self.fatal(format!(
                "lock request for {lock} sent to a node that does not manage it"
            ));
            return;
        }
        if self.order.replaying() {
            self.replay_lock_request(lock, requester, known);
        } else {
            self.accept_lock_request(lock, requester, known);
        }
    }

    /// Replay, at the manager: accepts the request if the token's next move in the record
    /// is to `requester`, else keeps it until its turn (then takes in the early requests
    /// whose turn has come).
    fn replay_lock_request(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        let me = self.me;
        let transfers = {
            let sched = self.order.replay.as_ref().expect("replaying");
            let st = self.locks.get(&lock);
            match st.and_then(|s| s.transfers.as_ref()) {
                Some(_) => None,
                None => Some(
                    sched
                        .transfers(lock, me as u32)
                        .into_iter()
                        .map(|r| r as NodeId)
                        .collect::<Vec<_>>(),
                ),
            }
        };
        let st = self.lock_entry(lock);
        if let Some(t) = transfers {
            st.transfers = Some(t);
        }
        st.early.push((requester, known));
        loop {
            let st = self.lock_entry(lock);
            let order = st.transfers.as_ref().expect("computed above");
            let due = order.get(st.accepted).copied();
            let ready = due.and_then(|d| st.early.iter().position(|(r, _)| *r == d));
            // A waiting request the rest of the record never grants cannot be served.
            let stranded = st
                .early
                .iter()
                .map(|(r, _)| *r)
                .find(|r| !order[st.accepted.min(order.len())..].contains(r));
            let moves = order.len();
            match ready {
                Some(i) => {
                    let (r, k) = st.early.remove(i);
                    st.accepted += 1;
                    self.accept_lock_request(lock, r, k);
                }
                None => {
                    if let Some(r) = stranded {
                        let why = format!(
                            "rank {r} requests {}, which the record never hands to it again \
                             (the record moves it between ranks {moves} times)",
                            self.lock_label(lock)
                        );
                        self.diverged(why);
                    }
                    return;
                }
            }
        }
    }

    fn accept_lock_request(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        let me = self.me;
        let st = self.lock_entry(lock);
        let target = std::mem::replace(&mut st.last_requester, requester);
        if target == me {
            self.on_lock_forward(lock, requester, known);
        } else {
            self.send(
                target,
                Msg::LockForward {
                    locks: vec![lock],
                    requester,
                    known,
                },
            );
        }
    }

    pub(super) fn on_lock_forward(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        let me = self.me;
        let st = self.lock_entry(lock);
        let free_grant = (st.token && !st.held).then_some(st.grants);
        let grant_now = match free_grant {
            // Replay: the token stays while the record's next grant is this node's own.
            Some(g) if self.order.replaying() => match self.recorded_holder(lock, g) {
                Some(h) if h == requester => true,
                Some(h) if h == me => false,
                Some(h) => {
                    let why = format!(
                        "rank {requester} was sent {} as grant {g}, which the record gives to rank {h}",
                        self.lock_label(lock)
                    );
                    self.diverged(why);
                    return;
                }
                None => {
                    self.unrecorded_grant(lock, g, requester);
                    return;
                }
            },
            Some(_) => true,
            None => false,
        };
        let st = self.lock_entry(lock);
        if grant_now {
            self.grant(lock, requester, known);
        } else if st.next.is_some() {
            self.fatal(format!("lock {lock}: two successors queued at one node"));
        } else {
            st.next = Some((requester, known));
        }
    }

    fn grant(&mut self, lock: LockId, to: NodeId, their_known: VectorTime) {
        let n = self.n;
        let st = self.lock_entry(lock);
        st.token = false;
        let grant = st.grants;
        let early = st.early_grant.take();
        // A token that came ahead and was not taken passes on its grant's knowledge: the
        // lock's last release is that grantor's.
        let known = match &early {
            Some(e) => e.known.clone(),
            None => st
                .released_known
                .clone()
                .unwrap_or_else(|| VectorTime::zero(n)),
        };
        let mut intervals = self.unseen_by(&their_known, &known);
        if let Some(e) = early {
            self.forget_asked_ahead(lock);
            self.stats.lock_tokens_passed_on += 1;
            self.refuse_pushes(&e.pushed);
            // What this node lacked when it asked is in the early grant, not in its log.
            let before = intervals.len();
            intervals.extend(
                e.intervals
                    .into_iter()
                    .filter(|r| r.index > their_known.get(r.node)),
            );
            if intervals.len() > before {
                intervals.sort_by_key(|r| (r.node, r.index));
                intervals.dedup_by_key(|r| (r.node, r.index));
            }
        }
        // The acquirer now knows our intervals up to the release.
        let me = self.me;
        let told = &mut self.told[to as usize];
        *told = (*told).max(known.get(me));
        // The data goes with the token: fresh copies of the pages homed here that the
        // notices name and the acquirer holds (`push`).
        let named = self.home_pages_named(&intervals);
        let pages = self.pushes_for(to, named);
        let diffs = self.diffs_for(to, &intervals, pages.len());
        self.send(
            to,
            Msg::LockGrant {
                grants: vec![Grant {
                    lock,
                    known,
                    intervals,
                    grant,
                    pages,
                    diffs,
                }],
            },
        );
    }

    pub(super) fn on_lock_grant(
        &mut self,
        from: NodeId,
        lock: LockId,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
        grant: u64,
        pushed: Pushed,
    ) {
        if !self.pushes_well_formed(from, &pushed.pages)
            || !self.pushed_diffs_well_formed(from, &pushed.diffs)
        {
            return;
        }
        let epoch = self.epoch;
        let installs_before = self.copies_installed;
        let st = self.lock_entry(lock);
        if !st.waiting && st.asked_ahead {
            st.asked_ahead = false;
            st.token = true;
            st.grants = grant;
            st.early_grant = Some(EarlyGrant {
                known,
                intervals,
                pushed,
                epoch,
                installs_before,
            });
            // A node that asked after this one gets it at once: it is not held here.
            if let Some((to, their_known)) = st.next.take() {
                self.grant(lock, to, their_known);
            }
            return;
        }
        if !st.waiting {
            self.fatal(format!(
                "rank {from} granted lock {lock}, which was not requested"
            ));
            return;
        }
        st.waiting = false;
        st.held = true;
        st.token = true;
        st.grants = grant.saturating_add(1);
        self.stats.lock_acquire_delays += self.sync_delays(lock_manager(lock, self.n), from);
        self.note_acquired(lock, grant);
        let waits = self.apply_intervals(intervals, &known, pushed);
        self.begin_interval(SyncCause::Acquire(lock));
        self.reply_after_home_diffs(waits, Reply::Done);
    }

    pub(super) fn release(&mut self, lock: LockId, race: Option<RaceNotices>) {
        let st = self.lock_entry(lock);
        if !st.held {
            self.fatal(format!(
                "release of lock {lock}, which this node does not hold"
            ));
            return;
        }
        st.held = false;
        let next_grant = st.grants;
        let mut next = st.next.take();
        // Replay: a queued successor waits while the record's next grant is this node's.
        if next.is_some() && self.recorded_holder(lock, next_grant) == Some(self.me) {
            self.lock_entry(lock).next = next.take();
        }
        self.close_interval(race);
        let known = self.known();
        self.lock_entry(lock).released_known = Some(known);
        self.begin_interval(SyncCause::Release(lock));
        if let Some((to, known)) = next {
            self.on_lock_forward(lock, to, known);
        }
        self.reply(Reply::Done);
    }

    /// [`Command::HostAcquire`] carried out at once for the app thread holding the engine
    /// (see [`Engine::take_outputs`]): the reply is the return value, `false` if the
    /// engine refused and queued a fatal output. Lock-heavy programs take a host lock
    /// every microsecond or two; a reply through the outputs and a channel is a good part
    /// of that.
    ///
    /// [`Command::HostAcquire`]: super::Command::HostAcquire
    pub fn host_acquire_now(
        &mut self,
        lock: LockId,
        race: Option<RaceNotices>,
        released: &VectorTime,
    ) -> bool {
        self.take_in_handler_work();
        self.host_acquire(lock, race, released)
    }

    /// [`Command::HostRelease`] carried out at once (as [`Engine::host_acquire_now`]):
    /// returns what the next holder must learn.
    ///
    /// [`Command::HostRelease`]: super::Command::HostRelease
    pub fn host_release_now(&mut self, lock: LockId, race: Option<RaceNotices>) -> VectorTime {
        self.take_in_handler_work();
        self.host_release(lock, race)
    }

    /// [`Engine::host_release_now`] for a release of `lock` that takes back the interval
    /// this node's previous release of `lock` closed: nobody took the lock in between,
    /// and this node synchronized with nothing else since (`Dsm::release_host_lock`
    /// checks both), so no node knows the open interval's index and the two are one. The
    /// recorder took the closed interval's accesses back, so `race` holds both: they
    /// replace that interval's notices, and the open interval, which began at the release
    /// being taken back, goes on. What the next holder must learn is what the lock already
    /// holds. `false`, changing nothing, unless the open interval is the one that release
    /// began and the closed one has not gone to the race master.
    pub fn host_release_again_now(&mut self, lock: LockId, race: Option<RaceNotices>) -> bool {
        self.take_in_handler_work();
        self.host_release_again(lock, race)
    }

    /// See [`Engine::host_release_again_now`].
    pub(super) fn host_release_again(&mut self, lock: LockId, race: Option<RaceNotices>) -> bool {
        let me = self.me;
        let Some(last) = self
            .vt
            .get(me)
            .checked_sub(1)
            .filter(|&l| l > self.race_shipped)
        else {
            return false;
        };
        if !self.common_memory || self.cur_cause != SyncCause::Release(lock) {
            return false;
        }
        let race = race.filter(|r| !r.reads.is_empty() || !r.writes.is_empty());
        let own = &mut self.log[me as usize];
        match own.last_mut() {
            Some(record) if record.index == last => record.race = race,
            _ => {
                if race.is_some() {
                    let mut vt = self.cur_start.clone();
                    vt.set(me, last);
                    own.push(IntervalRecord {
                        node: me,
                        index: last,
                        vt,
                        writes: PageRuns::new(),
                        race,
                        began_with: self.closed_cause,
                    });
                }
            }
        }
        true
    }

    /// A lock held in the job's common memory (race mode; see [`Command::HostAcquire`]):
    /// the app thread holds it already. Only intervals and vector time change: with one
    /// common memory there is no page to invalidate and no write notice to pass on.
    ///
    /// [`Command::HostAcquire`]: super::Command::HostAcquire
    pub(super) fn host_acquire(
        &mut self,
        lock: LockId,
        race: Option<RaceNotices>,
        released: &VectorTime,
    ) -> bool {
        if !self.common_memory || released.len() != self.n {
            self.fatal(format!(
                "lock {lock} taken in common memory with a release clock of {} entries \
                 (common memory: {}, {} nodes)",
                released.len(),
                self.common_memory,
                self.n
            ));
            return false;
        }
        self.close_interval(race);
        self.vt.merge(released);
        self.begin_interval(SyncCause::Acquire(lock));
        true
    }

    /// Releases a lock held in the job's common memory (see [`Command::HostRelease`]):
    /// closes the interval and returns what the next holder must learn.
    ///
    /// [`Command::HostRelease`]: super::Command::HostRelease
    pub(super) fn host_release(&mut self, lock: LockId, race: Option<RaceNotices>) -> VectorTime {
        self.close_interval(race);
        let known = self.known();
        self.begin_interval(SyncCause::Release(lock));
        known
    }
}

/// Whether `msg` can join `into`: both lock requests (or forwards) of one requester with
/// one knowledge, or both grants.
fn mergeable(into: &Msg, msg: &Msg) -> bool {
    match (into, msg) {
        (
            Msg::LockRequest {
                requester, known, ..
            },
            Msg::LockRequest {
                requester: r,
                known: k,
                ..
            },
        )
        | (
            Msg::LockForward {
                requester, known, ..
            },
            Msg::LockForward {
                requester: r,
                known: k,
                ..
            },
        ) => requester == r && known == k,
        (Msg::LockGrant { .. }, Msg::LockGrant { .. }) => true,
        _ => false,
    }
}

/// Adds `msg` to `into`, which [`mergeable`] allows.
fn merge_lock_msg(into: &mut Msg, msg: Msg) {
    match (into, msg) {
        (Msg::LockRequest { locks, .. }, Msg::LockRequest { locks: more, .. })
        | (Msg::LockForward { locks, .. }, Msg::LockForward { locks: more, .. }) => {
            locks.extend(more)
        }
        (Msg::LockGrant { grants }, Msg::LockGrant { grants: more }) => {
            for mut g in more {
                super::push::drop_shared_pushes(grants, &mut g);
                grants.push(g);
            }
        }
        _ => debug_assert!(false, "merging messages that are not mergeable"),
    }
}

/// Whether `a` and `b` are both lock messages, about no lock in common (so their order
/// does not matter).
fn about_other_locks(a: &Msg, b: &Msg) -> bool {
    let mentions = |m: &Msg, lock: LockId| match m {
        Msg::LockRequest { locks, .. } | Msg::LockForward { locks, .. } => locks.contains(&lock),
        Msg::LockGrant { grants } => grants.iter().any(|g| g.lock == lock),
        _ => true,
    };
    let is_lock_msg = matches!(
        a,
        Msg::LockRequest { .. } | Msg::LockForward { .. } | Msg::LockGrant { .. }
    );
    is_lock_msg
        && match b {
            Msg::LockRequest { locks, .. } | Msg::LockForward { locks, .. } => {
                !locks.iter().any(|&l| mentions(a, l))
            }
            Msg::LockGrant { grants } => !grants.iter().any(|g| mentions(a, g.lock)),
            _ => false,
        }
}

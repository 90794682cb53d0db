//! Distributed locks: a static manager per lock forwards each request to the last
//! requester, so the token travels directly from holder to successor; a grant carries the
//! intervals the acquirer must see.

use super::{Engine, Memory, Reply};
use dsm_proto::{IntervalRecord, LockId, Msg, NodeId, RaceNotices, SyncCause, VectorTime};

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
        })
    }

    pub(super) fn acquire(&mut self, lock: LockId, race: Option<RaceNotices>) {
        self.close_interval(race);
        self.stats.lock_acquires += 1;
        let st = self.lock_entry(lock);
        if st.held || st.waiting {
            self.fatal(format!(
                "lock {lock} acquired again by rank {} while already held (locks are not recursive)",
                self.me
            ));
            return;
        }
        if st.token {
            st.held = true;
            self.stats.lock_acquires_local += 1;
            self.begin_interval(SyncCause::Acquire(lock));
            self.reply(Reply::Done);
            return;
        }
        st.waiting = true;
        let known = self.known();
        let manager = lock_manager(lock, self.n);
        if manager == self.me {
            self.on_lock_request(lock, self.me, known);
        } else {
            self.send(
                manager,
                Msg::LockRequest {
                    lock,
                    requester: self.me,
                    known,
                },
            );
        }
    }

    pub(super) fn on_lock_request(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        if lock_manager(lock, self.n) != self.me {
            self.fatal(format!(
                "lock request for {lock} sent to a node that does not manage it"
            ));
            return;
        }
        let me = self.me;
        let st = self.lock_entry(lock);
        let target = std::mem::replace(&mut st.last_requester, requester);
        if target == me {
            self.on_lock_forward(lock, requester, known);
        } else {
            self.send(
                target,
                Msg::LockForward {
                    lock,
                    requester,
                    known,
                },
            );
        }
    }

    pub(super) fn on_lock_forward(&mut self, lock: LockId, requester: NodeId, known: VectorTime) {
        let st = self.lock_entry(lock);
        if st.token && !st.held {
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
        let known = st
            .released_known
            .clone()
            .unwrap_or_else(|| VectorTime::zero(n));
        let intervals = self
            .unseen_by(&their_known)
            .into_iter()
            .filter(|r| r.index <= known.get(r.node))
            .collect();
        self.send(
            to,
            Msg::LockGrant {
                lock,
                known,
                intervals,
            },
        );
    }

    pub(super) fn on_lock_grant(
        &mut self,
        from: NodeId,
        lock: LockId,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
    ) {
        let st = self.lock_entry(lock);
        if !st.waiting {
            self.fatal(format!(
                "rank {from} granted lock {lock}, which was not requested"
            ));
            return;
        }
        st.waiting = false;
        st.held = true;
        st.token = true;
        let waits = self.apply_intervals(intervals, &known);
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
        let next = st.next.take();
        self.close_interval(race);
        let known = self.known();
        self.lock_entry(lock).released_known = Some(known);
        self.begin_interval(SyncCause::Release(lock));
        if let Some((to, known)) = next {
            self.grant(lock, to, known);
        }
        self.reply(Reply::Done);
    }
}

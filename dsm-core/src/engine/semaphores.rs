//! Counting semaphores: a static manager per semaphore (`sem % nodes`) keeps the queue of
//! tokens (initial tokens and signals not yet consumed, oldest first) and the queue of
//! waiters, and pairs them first come, first served.
//!
//! A signal is a release: the signaller closes its interval and keeps what it knew at that
//! moment under the signal's number. A wait is an acquire: when the manager pairs it with a
//! signal it forwards the wait to the signaller, which grants with the intervals the waiter
//! lacks up to the signaller's knowledge at *that* signal (the lock forward/grant pattern).
//! So the waiter is ordered after exactly the signal it consumed, never after other
//! signals of the same semaphore, and the race detector, which orders intervals by vector
//! time, sees the same order. An initial token is granted by the manager with nothing to
//! learn.
//!
//! Semaphores are created collectively (`Dsm::semaphore`, followed by a barrier-like
//! synchronization), so every node, the manager included, has registered a semaphore before
//! any node can use it; a message for a semaphore this node never created is a protocol
//! error, reported as such rather than queued forever.

use super::Map;
use super::{Engine, Memory, Reply};
use dsm_proto::{IntervalRecord, Msg, NodeId, RaceNotices, SemId, SyncCause, VectorTime};
use std::collections::VecDeque;

/// A token at the manager: what a wait can consume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// One of the semaphore's initial count: ordered after nothing.
    Initial,
    /// A signal of `node`, its `seq`-th on this semaphore.
    Signal { node: NodeId, seq: u32 },
}

/// This node's view of one semaphore: as a signaller and waiter, and at the manager, the
/// two queues.
#[derive(Debug, Default)]
pub(super) struct SemState {
    /// The app thread waits for a grant (or a refusal of a try-wait).
    waiting: bool,
    /// This node's next signal number.
    next_seq: u32,
    /// This node's signals not yet consumed, with what it knew at each.
    signalled: Map<u32, VectorTime>,
    /// At the manager: initial tokens not yet consumed (they come before every signal's,
    /// and are alike, so a count: a semaphore may start with billions).
    initial: u32,
    /// At the manager: signals' tokens not yet consumed, oldest first.
    tokens: VecDeque<Token>,
    /// At the manager: waits not yet satisfied, oldest first, with the waiter's knowledge.
    waiters: VecDeque<(NodeId, VectorTime)>,
}

/// How a semaphore operation ended, for the app thread (and the semaphore trace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemDone {
    /// A wait or signal completed; `false` only for a refused try-wait.
    pub acquired: bool,
    /// For a wait: the signal consumed as `(signaller, seq)`, `None` for an initial token.
    /// For a signal: `Some((this node, its seq))`.
    pub signal: Option<(NodeId, u32)>,
    /// This node's vector time when the operation completed (after merging what a wait
    /// learned); its own entry is the index of the interval the operation opened.
    pub vt: VectorTime,
}

/// The semaphore's manager: a static function of the id so every node agrees without
/// messages.
pub fn sem_manager(sem: SemId, nodes: usize) -> NodeId {
    (sem % nodes as u64) as NodeId
}

impl<M: Memory> Engine<M> {
    /// Registers a semaphore with `initial` tokens (collective: every node calls it before
    /// the synchronization that makes the semaphore usable). Replies [`Reply::Done`].
    pub(super) fn sem_create(&mut self, sem: SemId, initial: u32) {
        if self.sems.contains_key(&sem) {
            self.fatal(format!(
                "semaphore #{sem:x} created twice (names of semaphores must be unique)"
            ));
            return;
        }
        let mut st = SemState::default();
        if sem_manager(sem, self.n) == self.me {
            st.initial = initial;
        }
        self.sems.insert(sem, st);
        self.reply(Reply::Done);
    }

    /// The semaphore's state, or a fatal error naming the misuse.
    fn sem_entry(&mut self, sem: SemId, what: &str) -> Option<&mut SemState> {
        if !self.sems.contains_key(&sem) {
            self.fatal(format!(
                "{what} semaphore #{sem:x}, which rank {} has not created \
                 (Dsm::semaphore is collective: every rank creates it before any uses it)",
                self.me
            ));
            return None;
        }
        self.sems.get_mut(&sem)
    }

    /// Delivers `msg` to `to`, handling it here when this node is the destination.
    fn sem_send(&mut self, to: NodeId, msg: Msg) {
        if to == self.me {
            self.handle(to, msg);
        } else {
            self.send(to, msg);
        }
    }

    pub(super) fn sem_signal(&mut self, sem: SemId, race: Option<RaceNotices>) {
        if self.sem_entry(sem, "signal of").is_none() {
            return;
        }
        self.close_interval(race);
        self.stats.sem_signals += 1;
        let known = self.known();
        let st = self.sems.get_mut(&sem).expect("checked above");
        let seq = st.next_seq;
        st.next_seq += 1;
        st.signalled.insert(seq, known);
        self.begin_interval(SyncCause::SemSignal(sem));
        let vt = self.vt.clone();
        self.sem_send(sem_manager(sem, self.n), Msg::SemSignal { sem, seq });
        self.reply(Reply::Sem(SemDone {
            acquired: true,
            signal: Some((self.me, seq)),
            vt,
        }));
    }

    pub(super) fn sem_wait(&mut self, sem: SemId, try_only: bool, race: Option<RaceNotices>) {
        let Some(st) = self.sem_entry(sem, "wait on") else {
            return;
        };
        if st.waiting {
            self.fatal(format!("semaphore #{sem:x}: two waits at once on one node"));
            return;
        }
        st.waiting = true;
        self.close_interval(race);
        self.stats.sem_waits += 1;
        let known = self.known();
        self.sem_send(
            sem_manager(sem, self.n),
            Msg::SemWait {
                sem,
                known,
                try_only,
            },
        );
    }

    /// At the manager: a signal became a token; pair it with the oldest waiter if any.
    pub(super) fn on_sem_signal(&mut self, from: NodeId, sem: SemId, seq: u32) {
        if sem_manager(sem, self.n) != self.me {
            self.fatal(format!(
                "rank {from} sent a signal of semaphore #{sem:x} to a node that does not manage it"
            ));
            return;
        }
        let Some(st) = self.sem_entry(sem, &format!("rank {from} signalled")) else {
            return;
        };
        st.tokens.push_back(Token::Signal { node: from, seq });
        self.sem_pair(sem);
    }

    /// At the manager: a wait arrived; pair it, queue it, or refuse a try-wait.
    pub(super) fn on_sem_wait(
        &mut self,
        from: NodeId,
        sem: SemId,
        known: VectorTime,
        try_only: bool,
    ) {
        if sem_manager(sem, self.n) != self.me {
            self.fatal(format!(
                "rank {from} sent a wait on semaphore #{sem:x} to a node that does not manage it"
            ));
            return;
        }
        let Some(st) = self.sem_entry(sem, &format!("rank {from} waited on")) else {
            return;
        };
        if try_only && st.initial == 0 && st.tokens.is_empty() {
            self.sem_send(from, Msg::SemDenied { sem });
            return;
        }
        st.waiters.push_back((from, known));
        self.sem_pair(sem);
    }

    /// At the manager: matches tokens with waiters, oldest first.
    fn sem_pair(&mut self, sem: SemId) {
        loop {
            let st = self.sems.get_mut(&sem).expect("caller checked");
            if (st.initial == 0 && st.tokens.is_empty()) || st.waiters.is_empty() {
                return;
            }
            let token = if st.initial > 0 {
                st.initial -= 1;
                Token::Initial
            } else {
                st.tokens.pop_front().expect("non-empty")
            };
            let (waiter, known) = st.waiters.pop_front().expect("non-empty");
            match token {
                Token::Initial => {
                    let zero = VectorTime::zero(self.n);
                    self.sem_send(
                        waiter,
                        Msg::SemGrant {
                            sem,
                            signal: None,
                            known: zero,
                            intervals: Vec::new(),
                        },
                    );
                }
                Token::Signal { node, seq } => self.sem_send(
                    node,
                    Msg::SemForward {
                        sem,
                        seq,
                        waiter,
                        known,
                    },
                ),
            }
        }
    }

    /// At the signaller: its signal `seq` satisfies `waiter`; grant with the intervals the
    /// waiter lacks, up to what this node knew at that signal.
    pub(super) fn on_sem_forward(
        &mut self,
        from: NodeId,
        sem: SemId,
        seq: u32,
        waiter: NodeId,
        their_known: VectorTime,
    ) {
        let Some(st) = self.sem_entry(sem, &format!("rank {from} forwarded a wait on")) else {
            return;
        };
        let Some(known) = st.signalled.remove(&seq) else {
            self.fatal(format!(
                "rank {from} paired a wait on semaphore #{sem:x} with signal {seq} of rank {}, \
                 which it never made or which was consumed already",
                self.me
            ));
            return;
        };
        let intervals = self.unseen_by(&their_known, &known);
        let signal = Some((self.me, seq));
        self.sem_send(
            waiter,
            Msg::SemGrant {
                sem,
                signal,
                known,
                intervals,
            },
        );
    }

    /// At the waiter: the wait completes.
    pub(super) fn on_sem_grant(
        &mut self,
        from: NodeId,
        sem: SemId,
        signal: Option<(NodeId, u32)>,
        known: VectorTime,
        intervals: Vec<IntervalRecord>,
    ) {
        let Some(st) = self.sem_entry(sem, &format!("rank {from} granted")) else {
            return;
        };
        if !st.waiting {
            self.fatal(format!(
                "rank {from} granted semaphore #{sem:x}, which this node was not waiting on"
            ));
            return;
        }
        if signal.is_some_and(|(node, _)| node != from) {
            self.fatal(format!(
                "rank {from} granted semaphore #{sem:x} with another node's signal"
            ));
            return;
        }
        st.waiting = false;
        self.stats.sem_wait_delays += self.sync_delays(sem_manager(sem, self.n), from);
        let waits = self.apply_intervals(intervals, &known, Default::default());
        self.begin_interval(SyncCause::SemWait(sem));
        let done = SemDone {
            acquired: true,
            signal,
            vt: self.vt.clone(),
        };
        self.reply_after_home_diffs(waits, Reply::Sem(done));
    }

    /// At the waiter: a try-wait found no token. The interval it closed stays closed (a
    /// refused try-wait is not ordered after anything, which is the truth).
    pub(super) fn on_sem_denied(&mut self, from: NodeId, sem: SemId) {
        let Some(st) = self.sem_entry(sem, &format!("rank {from} refused")) else {
            return;
        };
        if !st.waiting {
            self.fatal(format!(
                "rank {from} refused a try-wait on semaphore #{sem:x} that was not made"
            ));
            return;
        }
        st.waiting = false;
        self.stats.sem_wait_delays += self.sync_delays(sem_manager(sem, self.n), from);
        self.begin_interval(SyncCause::SemTryFailed(sem));
        let vt = self.vt.clone();
        self.reply(Reply::Sem(SemDone {
            acquired: false,
            signal: None,
            vt,
        }));
    }
}

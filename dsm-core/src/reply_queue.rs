//! The replies to the app thread's commands, in the order the engine produced them.
//!
//! Most replies are produced on the app thread itself (a command the engine answers at
//! once: a lock whose token is here, a release) and taken right after; the others come
//! from the comm thread. A queue under a mutex, with the consumer's look at a count
//! before the lock, costs no allocation per reply (a channel allocated a block every few
//! dozen) and no system call unless the app thread sleeps on it: a producer wakes it only
//! then.
//!
//! `tests/reply_queue_model.rs` runs this file on loom's mutex, condition variable and
//! atomics: every reply pushed is taken once, in order, and a consumer that sleeps is
//! woken.

// Mutex, condition variable and atomics come through the parent's `reply_queue_deps`, so
// that the model test can run this same file on loom's.
use super::reply_queue_deps::{AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};
use std::collections::VecDeque;

/// A queue of replies with one consumer (the app thread) and any number of producers.
pub(crate) struct ReplyQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    /// Replies in the queue, raised once each is in it: the consumer looks here before
    /// taking the lock, so polling an empty queue costs one load.
    queued: AtomicUsize,
}

struct State<T> {
    items: VecDeque<T>,
    /// The consumer sleeps on `ready` (a producer must wake it).
    sleeping: bool,
    /// No producer will push again (see [`ReplyQueue::close`]).
    closed: bool,
}

impl<T> ReplyQueue<T> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        ReplyQueue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                sleeping: false,
                closed: false,
            }),
            ready: Condvar::new(),
            queued: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item`, waking the consumer if it sleeps.
    pub(crate) fn push(&self, item: T) {
        let mut st = self.lock();
        st.items.push_back(item);
        self.queued.fetch_add(1, Ordering::Release);
        let wake = st.sleeping;
        drop(st);
        if wake {
            self.ready.notify_one();
        }
    }

    /// The next item, if one is queued. The consumer's alone.
    pub(crate) fn try_pop(&self) -> Option<T> {
        if self.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let item = self.lock().items.pop_front();
        if item.is_some() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        item
    }

    /// The next item, sleeping until one comes; `None` once the queue is closed and
    /// empty. The consumer's alone.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut st = self.lock();
        loop {
            if let Some(item) = st.items.pop_front() {
                st.sleeping = false;
                self.queued.fetch_sub(1, Ordering::Relaxed);
                return Some(item);
            }
            if st.closed {
                return None;
            }
            st.sleeping = true;
            st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Says that nothing more will be pushed (the producer that answers the waits has
    /// stopped): a consumer sleeping on an empty queue wakes with `None`.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }
}

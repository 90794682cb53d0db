//! Model test of the app thread's reply queue (`src/reply_queue.rs`, compiled here on
//! loom's mutex, condition variable and atomics): loom runs every interleaving of a
//! consumer polling and sleeping against producers pushing (within a preemption bound)
//! and checks that each reply is taken exactly once, in the order it was pushed, and that
//! a consumer sleeping on the queue is woken (a lost wake-up shows as a deadlock), also
//! when the queue is closed instead.

#[allow(dead_code)]
#[path = "../src/reply_queue.rs"]
mod reply_queue;

/// What `reply_queue.rs` is built on, here: loom's.
mod reply_queue_deps {
    pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
}

use loom::sync::Arc;
use reply_queue::ReplyQueue;

/// Every interleaving with up to three forced switches (loom's bound: a condition
/// variable's wait and wake under a mutex make the unbounded state space too large).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Takes `n` replies as the app thread does: a poll first, then a sleep if none is there.
fn take(q: &ReplyQueue<u32>, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            q.try_pop()
                .or_else(|| q.pop())
                .expect("an open queue yields")
        })
        .collect()
}

#[test]
fn every_reply_is_taken_once_in_order_and_a_sleeping_consumer_wakes() {
    model(|| {
        let q = Arc::new(ReplyQueue::new());
        let producer = {
            let q = q.clone();
            loom::thread::spawn(move || {
                q.push(1);
                q.push(2);
            })
        };
        let got = take(&q, 2);
        producer.join().unwrap();
        assert_eq!(got, vec![1, 2]);
        assert_eq!(q.try_pop(), None);
    });
}

#[test]
fn replies_of_two_producers_keep_each_producers_order() {
    model(|| {
        let q = Arc::new(ReplyQueue::new());
        let producers: Vec<_> = [10, 20]
            .into_iter()
            .map(|base| {
                let q = q.clone();
                loom::thread::spawn(move || {
                    q.push(base);
                    q.push(base + 1);
                })
            })
            .collect();
        let got = take(&q, 4);
        for p in producers {
            p.join().unwrap();
        }
        let of = |base: u32| {
            got.iter()
                .filter(|&&v| v / 10 == base / 10)
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(of(10), vec![10, 11]);
        assert_eq!(of(20), vec![20, 21]);
    });
}

#[test]
fn a_consumer_sleeping_on_an_empty_queue_wakes_when_it_closes() {
    model(|| {
        let q = Arc::new(ReplyQueue::<u32>::new());
        let closer = {
            let q = q.clone();
            loom::thread::spawn(move || q.close())
        };
        assert_eq!(q.pop(), None);
        closer.join().unwrap();
    });
}

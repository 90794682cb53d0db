//! loom's atomics behind a switch that weakens the orderings the code under test asks for,
//! so a model test can run the real code with its release or its acquire side broken and
//! show that the model catches it (a model that passes whatever the orderings proves
//! nothing about them).
//!
//! The switch is thread-local: loom runs a model's threads as coroutines on the test's own
//! thread, and the test harness runs each test on a thread of its own.

use loom::sync::atomic::Ordering;
use std::cell::Cell;

/// Which side of the code's orderings to break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weaken {
    /// The orderings as written.
    Nothing,
    /// Stores, and the store half of read-modify-writes, lose their release.
    Publishing,
    /// Loads, and the load half of read-modify-writes, lose their acquire.
    Observing,
}

thread_local! {
    static MODE: Cell<Weaken> = const { Cell::new(Weaken::Nothing) };
}

/// Sets the mode for the models this thread runs from now on.
pub fn weaken(mode: Weaken) {
    MODE.with(|m| m.set(mode));
}

fn mode() -> Weaken {
    MODE.with(|m| m.get())
}

fn load_order(o: Ordering) -> Ordering {
    match mode() {
        Weaken::Observing => Ordering::Relaxed,
        _ => o,
    }
}

fn store_order(o: Ordering) -> Ordering {
    match mode() {
        Weaken::Publishing => Ordering::Relaxed,
        _ => o,
    }
}

fn rmw_order(o: Ordering) -> Ordering {
    use Ordering::*;
    match (mode(), o) {
        (Weaken::Publishing, Release) => Relaxed,
        (Weaken::Publishing, AcqRel | SeqCst) => Acquire,
        (Weaken::Observing, Acquire) => Relaxed,
        (Weaken::Observing, AcqRel | SeqCst) => Release,
        _ => o,
    }
}

macro_rules! weak_atomic {
    ($name:ident, $t:ty) => {
        /// loom's atomic of the same name, its orderings weakened as [`weaken`] says.
        #[derive(Debug)]
        pub struct $name(loom::sync::atomic::$name);

        impl $name {
            /// A new atomic holding `v`.
            pub fn new(v: $t) -> Self {
                Self(loom::sync::atomic::$name::new(v))
            }
            /// loom's `load`, its ordering weakened.
            pub fn load(&self, o: Ordering) -> $t {
                self.0.load(load_order(o))
            }
            /// loom's `store`, its ordering weakened.
            pub fn store(&self, v: $t, o: Ordering) {
                self.0.store(v, store_order(o))
            }
            /// loom's `swap`, its ordering weakened.
            pub fn swap(&self, v: $t, o: Ordering) -> $t {
                self.0.swap(v, rmw_order(o))
            }
            /// loom's `compare_exchange`, its orderings weakened.
            pub fn compare_exchange(
                &self,
                current: $t,
                new: $t,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$t, $t> {
                self.0
                    .compare_exchange(current, new, rmw_order(success), load_order(failure))
            }
        }
    };
    ($name:ident, $t:ty, arithmetic) => {
        weak_atomic!($name, $t);

        impl $name {
            /// loom's `fetch_add`, its ordering weakened.
            pub fn fetch_add(&self, v: $t, o: Ordering) -> $t {
                self.0.fetch_add(v, rmw_order(o))
            }
            /// loom's `fetch_sub`, its ordering weakened.
            pub fn fetch_sub(&self, v: $t, o: Ordering) -> $t {
                self.0.fetch_sub(v, rmw_order(o))
            }
        }
    };
}

weak_atomic!(AtomicBool, bool);
weak_atomic!(AtomicU8, u8, arithmetic);
weak_atomic!(AtomicU32, u32, arithmetic);
weak_atomic!(AtomicU64, u64, arithmetic);
weak_atomic!(AtomicUsize, usize, arithmetic);

//! dsm-core: a software distributed shared memory with lazy release consistency.
//!
//! A program runs as N processes (nodes) that share one address range. Pages move between
//! nodes on demand through page faults; coherence follows home-based, multi-writer lazy
//! release consistency (intervals, vector timestamps, write notices, twins and diffs) and
//! is established at synchronization: locks and barriers. With race detection on, every
//! access through the typed API is recorded and each barrier reports the data races of the
//! epoch that just ended.
//!
//! ```no_run
//! use dsm_core::Dsm;
//! let mut dsm = Dsm::init()?;                       // rank and size from dsmrun
//! let counter = dsm.alloc::<u64>("counter", 1)?;    // collective, named
//! {
//!     let g = dsm.lock(0)?;                         // RAII lock guard
//!     let v = g.view(&counter);
//!     v.set(0, v.get(0) + 1);
//! }
//! dsm.barrier()?;
//! if dsm.rank() == 0 {
//!     println!("count = {}", dsm.view(&counter).get(0));
//! }
//! let outcome = dsm.finish()?;                    // races reported, exit status
//! # let _ = outcome;
//! # Ok::<(), dsm_core::DsmError>(())
//! ```

#![warn(missing_docs)]

mod api;
mod chaos;
mod comm;
// The protocol engine and the diff encoding are public for the protocol simulator and the
// fuzz tests (tests/), not as part of the API.
#[doc(hidden)]
pub mod diff;
#[doc(hidden)]
pub mod engine;
mod error;
#[allow(unsafe_code)]
mod fault;
mod reply_queue;
mod spin;
#[allow(unsafe_code)]
mod sys;
mod ticket;

/// What `ticket.rs` is built on (`tests/ticket_model.rs` gives it loom's instead).
mod ticket_deps {
    pub(crate) use crate::sys::{futex_wait_bitset, futex_wake_bitset, monotonic_ns};
    pub(crate) use std::sync::atomic::{AtomicU32, Ordering};
    pub(crate) use std::thread::yield_now;
}

/// What `reply_queue.rs` is built on (`tests/reply_queue_model.rs` gives it loom's instead).
mod reply_queue_deps {
    pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
}

pub use api::{
    band, lock_manager, semaphore_id, Array, Block, Distribution, Dsm, LockGuard, Outcome,
    RawArray, RegionRule, Semaphore, Stats, Strided, StridedMut, View, DEFAULT_SEGMENT,
    DEFAULT_SEGMENT_ADDR,
};
/// Shared arrays hold plain-old-data types ([`Pod`]); re-exported so that a program's own
/// element types need no dependency of their own:
///
/// ```
/// #[derive(Clone, Copy, dsm_core::Pod, dsm_core::Zeroable)]
/// #[bytemuck(crate = "dsm_core::bytemuck")]
/// #[repr(C)]
/// struct Particle {
///     position: [f64; 3],
///     charge: f64,
/// }
/// let p: Particle = dsm_core::bytemuck::Zeroable::zeroed();
/// assert_eq!(p.charge, 0.0);
/// ```
pub use bytemuck::{self, Pod, Zeroable};
pub use dsm_proto::{env_vars, JobConfig, LockId, RaceOptions, PAGE_SIZE};
pub use error::DsmError;

/// Reads the `u64` at byte `offset` of the shared segment through the app view, ignoring
/// allocations: what a program with a stray index does. A read outside every allocation
/// crashes the process with SIGSEGV, as it would without dsm; tests use this to prove it.
/// `None` before [`Dsm::init`] or when `offset` lies outside the segment.
pub fn read_segment_word(offset: usize) -> Option<u64> {
    sys::AppSlice::<u64>::new_in_global_segment(offset, 1).map(|s| s.get(0))
}

/// Tests only: reads the `u64` at byte `offset` of the segment, like
/// [`read_segment_word`], while this thread holds the protocol engine's lock, which the
/// runtime never does. A fault there must stop the process with the handler's message
/// rather than deadlock (the fault could never be served).
#[doc(hidden)]
pub fn read_segment_word_holding_the_engine(dsm: &Dsm, offset: usize) -> Option<u64> {
    dsm.with_engine_held(|| read_segment_word(offset))
}

/// The README's code examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

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
//! dsm.finish()?;
//! # Ok::<(), dsm_core::DsmError>(())
//! ```

mod api;
pub mod comm;
pub mod diff;
pub mod engine;
mod error;
#[allow(unsafe_code)]
pub mod sys;

pub use api::{
    band, lock_manager, Array, Block, Distribution, Dsm, LockGuard, Stats, Strided, StridedMut,
    View, DEFAULT_SEGMENT, DEFAULT_SEGMENT_ADDR,
};
pub use dsm_net::{JobEnv, LockId, RaceOptions};
pub use error::DsmError;

/// The README's code examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

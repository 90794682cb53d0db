//! Errors the DSM API returns.

use thiserror::Error;

/// Why a [`Dsm`](crate::Dsm) call failed.
///
/// Errors in the protocol itself (a peer sending malformed traffic, ranks calling
/// collective operations inconsistently, a peer crashing) are not returned: they stop the
/// process with a message, because the other nodes cannot continue without this one
/// either. What is returned are errors of this node's own setup and calls.
#[derive(Debug, Error)]
pub enum DsmError {
    /// [`Dsm::init`](crate::Dsm::init) found `DSM_*` (or launcher) variables missing or
    /// malformed.
    #[error("bad job environment: {0}")]
    Env(dsm_proto::ConfigError),
    /// The connections to the other nodes could not be set up (a rank never showed up,
    /// refused this one, or the rendezvous address was unusable).
    #[error("job start failed: {0}")]
    Bootstrap(dsm_net::BootstrapError),
    /// The shared segment could not be mapped at its address, or the page-fault handler
    /// could not be installed.
    #[error("shared segment: {0}")]
    Segment(std::io::Error),
    /// [`Dsm::init`](crate::Dsm::init) was called a second time in this process, even
    /// after the first node finished: a process is one node for its whole life.
    #[error("dsm is already initialised in this process (one node per process)")]
    AlreadyInitialized,
    /// An argument outside what the API accepts, such as a lock id of 2^63 or above (that
    /// range belongs to named locks).
    #[error("configuration: {0}")]
    Config(String),
    /// An allocation request that cannot be satisfied as asked: no name, zero elements,
    /// a zero-sized type, zero columns, a byte size that overflows, or a home node outside
    /// the job.
    #[error("invalid allocation: {0}")]
    InvalidAlloc(String),
    /// The allocation does not fit in what is left of the shared segment.
    #[error(
        "shared segment full: '{name}' needs {bytes} bytes but only {free} of {segment} are left; \
         start with a larger segment (dsmrun --segment, or DSM_SEGMENT)"
    )]
    SegmentFull {
        /// The allocation's name.
        name: String,
        /// Bytes it needs.
        bytes: usize,
        /// Bytes of the segment still unallocated.
        free: usize,
        /// Size of the whole segment in bytes.
        segment: usize,
    },
    /// This node could not allocate the bookkeeping a collective allocation needs (its
    /// page-table entries and page-state mirror, or with race detection the shadow of the
    /// allocation). Nothing was allocated; the other nodes, already in the collective
    /// allocation, stop once this one exits.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The node's protocol thread answered the app thread with something the current
    /// call did not expect: an internal inconsistency of dsm, not of the program.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An I/O error of this node: starting its communication thread, creating the race
    /// log, writing race reports or the `DSM_STATS_FILE`.
    #[error("i/o: {0}")]
    Io(std::io::Error),
}

// The variants above print their cause in their own message, so they do not also expose it
// as `source()`: error reporters (anyhow's `{:?}`) would print every cause twice.
impl From<dsm_proto::ConfigError> for DsmError {
    fn from(e: dsm_proto::ConfigError) -> Self {
        DsmError::Env(e)
    }
}

impl From<dsm_net::BootstrapError> for DsmError {
    fn from(e: dsm_net::BootstrapError) -> Self {
        DsmError::Bootstrap(e)
    }
}

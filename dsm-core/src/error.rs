//! Errors the DSM API returns.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum DsmError {
    #[error("bad job environment: {0}")]
    Env(#[from] dsm_proto::ConfigError),
    #[error("job start failed: {0}")]
    Bootstrap(#[from] dsm_net::BootstrapError),
    #[error("shared segment: {0}")]
    Segment(std::io::Error),
    #[error("dsm is already initialised in this process (one node per process)")]
    AlreadyInitialized,
    #[error("configuration: {0}")]
    Config(String),
    #[error("invalid allocation: {0}")]
    InvalidAlloc(String),
    #[error(
        "shared segment full: '{name}' needs {bytes} bytes but only {free} of {segment} are left; \
         start with a larger segment (dsmrun --segment, or DSM_SEGMENT)"
    )]
    SegmentFull {
        name: String,
        bytes: usize,
        free: usize,
        segment: usize,
    },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("i/o: {0}")]
    Io(std::io::Error),
}

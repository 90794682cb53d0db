//! [`ConfigError`]: why a job's configuration could not be read. Its own module so that
//! `config` and the launcher-specific readers it calls (`launchers`) share it without
//! depending on each other both ways.

use thiserror::Error;

/// A `DSM_*` (or launcher) variable that is missing or does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The variable is set to something unusable.
    #[error("{var}={value:?} is not valid: {why}")]
    Invalid {
        /// The variable's name.
        var: &'static str,
        /// Its value as found.
        value: String,
        /// What was expected.
        why: String,
    },
    /// The first variable is set, the second (which must accompany it) is not.
    #[error("{0} is set but {1} is not; start the program with dsmrun, or set both")]
    Missing(&'static str, &'static str),
    /// A multi-node job without the rendezvous address or the job secret.
    #[error("a {size}-node job needs {var} (rank 0's rendezvous address and the job secret); dsmrun sets them, under Open MPI's mpirun and Slurm's srun they are derived from the launcher's environment, other launchers need them exported")]
    NeedsRendezvous {
        /// The job size.
        size: usize,
        /// The variable that is missing.
        var: &'static str,
    },
}

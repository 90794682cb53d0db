//! How a node learns who it is: rank, job size, rendezvous address and job secret from the
//! environment set by `dsmrun`, or by Slurm (`srun`) or Open MPI / PMI launchers (with
//! `DSM_COORD` and `DSM_JOB_SECRET` exported by the user), or none at all, which makes the
//! program a single-node job. Also the run options that travel by environment (segment
//! size, connect timeout, race-detection switches).

use crate::launcher::env_vars as vars;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("{var}={value:?} is not valid: {why}")]
    Invalid {
        var: &'static str,
        value: String,
        why: String,
    },
    #[error("{0} is set but {1} is not; start the program with dsmrun, or set both")]
    Missing(&'static str, &'static str),
    #[error("a {size}-node job needs {var} (rank 0's rendezvous address and the job secret); dsmrun sets them, other launchers need them exported")]
    NeedsRendezvous { size: usize, var: &'static str },
}

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Dsmrun,
    Slurm,
    Mpi,
    Standalone,
}

/// Race-detection switches, set by `dsmrun --race ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceOptions {
    pub enabled: bool,
    pub log: Option<PathBuf>,
    /// Exit status when races were reported; 0 disables.
    pub exit_code: i32,
    pub first_only: bool,
    pub stats: bool,
}

impl Default for RaceOptions {
    fn default() -> Self {
        RaceOptions {
            enabled: false,
            log: None,
            exit_code: 66,
            first_only: false,
            stats: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnv {
    pub rank: usize,
    pub size: usize,
    pub launcher: Launcher,
    /// Rank 0's rendezvous address; `None` for a single-node job.
    pub coord: Option<SocketAddr>,
    pub secret: String,
    pub connect_timeout: Duration,
    /// Bytes of shared segment to reserve, if overridden.
    pub segment_bytes: Option<u64>,
    pub race: RaceOptions,
}

pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound on job size: node ids are 16-bit and vector timestamps grow with N.
pub const MAX_NODES: usize = 1024;

impl JobEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<JobEnv, EnvError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<JobEnv, EnvError> {
        let (rank, size, launcher) = if let Some(rank) = get(vars::RANK) {
            let size = get(vars::SIZE).ok_or(EnvError::Missing(vars::RANK, vars::SIZE))?;
            let launcher = if get(vars::LAUNCHER).as_deref() == Some("dsmrun") {
                Launcher::Dsmrun
            } else {
                Launcher::Standalone
            };
            (
                parse_num(vars::RANK, &rank)?,
                parse_num(vars::SIZE, &size)?,
                launcher,
            )
        } else if let (Some(r), Some(s)) = (get("SLURM_PROCID"), get("SLURM_NTASKS")) {
            (
                parse_num("SLURM_PROCID", &r)?,
                parse_num("SLURM_NTASKS", &s)?,
                Launcher::Slurm,
            )
        } else if let (Some(r), Some(s)) =
            (get("OMPI_COMM_WORLD_RANK"), get("OMPI_COMM_WORLD_SIZE"))
        {
            (
                parse_num("OMPI_COMM_WORLD_RANK", &r)?,
                parse_num("OMPI_COMM_WORLD_SIZE", &s)?,
                Launcher::Mpi,
            )
        } else if let (Some(r), Some(s)) = (get("PMI_RANK"), get("PMI_SIZE")) {
            (
                parse_num("PMI_RANK", &r)?,
                parse_num("PMI_SIZE", &s)?,
                Launcher::Mpi,
            )
        } else {
            (0, 1, Launcher::Standalone)
        };
        if size == 0 || size > MAX_NODES {
            return Err(EnvError::Invalid {
                var: vars::SIZE,
                value: size.to_string(),
                why: format!("job size must be 1..={MAX_NODES}"),
            });
        }
        if rank >= size {
            return Err(EnvError::Invalid {
                var: vars::RANK,
                value: rank.to_string(),
                why: format!("rank must be below the job size {size}"),
            });
        }
        let coord = match get(vars::COORD) {
            Some(v) => Some(parse_addr(&v)?),
            None if size > 1 => {
                return Err(EnvError::NeedsRendezvous {
                    size,
                    var: vars::COORD,
                })
            }
            None => None,
        };
        let secret = get(vars::JOB_SECRET).unwrap_or_default();
        if size > 1 && secret.is_empty() {
            return Err(EnvError::NeedsRendezvous {
                size,
                var: vars::JOB_SECRET,
            });
        }
        let connect_timeout = match get(vars::CONNECT_TIMEOUT) {
            Some(v) => {
                let secs: f64 = v.trim().parse().map_err(|_| EnvError::Invalid {
                    var: vars::CONNECT_TIMEOUT,
                    value: v.clone(),
                    why: "expected seconds".into(),
                })?;
                if !(secs > 0.0 && secs < 1e6) {
                    return Err(EnvError::Invalid {
                        var: vars::CONNECT_TIMEOUT,
                        value: v,
                        why: "must be positive".into(),
                    });
                }
                Duration::from_secs_f64(secs)
            }
            None => DEFAULT_CONNECT_TIMEOUT,
        };
        let segment_bytes = match get(vars::SEGMENT) {
            Some(v) => Some(parse_size(&v).map_err(|why| EnvError::Invalid {
                var: vars::SEGMENT,
                value: v.clone(),
                why,
            })?),
            None => None,
        };
        let flag = |k: &str| matches!(get(k).as_deref(), Some(v) if v != "0" && !v.is_empty());
        let race = RaceOptions {
            enabled: flag(vars::RACE),
            log: get(vars::RACE_LOG)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            exit_code: match get(vars::RACE_EXIT_CODE) {
                Some(v) => {
                    let code: i32 = v.trim().parse().map_err(|_| EnvError::Invalid {
                        var: vars::RACE_EXIT_CODE,
                        value: v.clone(),
                        why: "expected an exit status 0..=255".into(),
                    })?;
                    if !(0..=255).contains(&code) {
                        return Err(EnvError::Invalid {
                            var: vars::RACE_EXIT_CODE,
                            value: v,
                            why: "expected an exit status 0..=255".into(),
                        });
                    }
                    code
                }
                None => 66,
            },
            first_only: flag(vars::RACE_FIRST),
            stats: flag(vars::RACE_STATS),
        };
        Ok(JobEnv {
            rank,
            size,
            launcher,
            coord,
            secret,
            connect_timeout,
            segment_bytes,
            race,
        })
    }
}

fn parse_num(var: &'static str, v: &str) -> Result<usize, EnvError> {
    v.trim().parse().map_err(|_| EnvError::Invalid {
        var,
        value: v.to_string(),
        why: "expected a non-negative integer".into(),
    })
}

fn parse_addr(v: &str) -> Result<SocketAddr, EnvError> {
    let invalid = |why: String| EnvError::Invalid {
        var: vars::COORD,
        value: v.to_string(),
        why,
    };
    v.to_socket_addrs()
        .map_err(|e| invalid(format!("expected host:port ({e})")))?
        .next()
        .ok_or_else(|| invalid("resolves to no address".into()))
}

/// Parses a byte size such as `1G`, `512M`, `64k`, `4096` (binary multiples): the same
/// grammar dsmrun accepts for `--segment`.
pub fn parse_size(v: &str) -> Result<u64, String> {
    crate::launcher::parse_size(v).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<JobEnv, EnvError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        JobEnv::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn no_variables_means_single_node() {
        let e = env(&[]).unwrap();
        assert_eq!((e.rank, e.size, e.launcher), (0, 1, Launcher::Standalone));
        assert!(e.coord.is_none());
        assert!(!e.race.enabled);
        assert_eq!(e.race.exit_code, 66);
    }

    #[test]
    fn dsmrun_variables() {
        let e = env(&[
            ("DSM_RANK", "2"),
            ("DSM_SIZE", "4"),
            ("DSM_COORD", "127.0.0.1:4000"),
            ("DSM_JOB_SECRET", "abc"),
            ("DSM_LAUNCHER", "dsmrun"),
            ("DSM_SEGMENT", "64M"),
            ("DSM_RACE", "1"),
            ("DSM_RACE_EXIT_CODE", "0"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.size, e.launcher), (2, 4, Launcher::Dsmrun));
        assert_eq!(e.coord.unwrap().port(), 4000);
        assert_eq!(e.segment_bytes, Some(64 << 20));
        assert!(e.race.enabled);
        assert_eq!(e.race.exit_code, 0);
    }

    #[test]
    fn slurm_and_mpi_variables() {
        let e = env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("DSM_COORD", "127.0.0.1:4000"),
            ("DSM_JOB_SECRET", "abc"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.size, e.launcher), (1, 2, Launcher::Slurm));
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("DSM_COORD", "127.0.0.1:4000"),
            ("DSM_JOB_SECRET", "abc"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.size, e.launcher), (3, 8, Launcher::Mpi));
    }

    #[test]
    fn bad_values_are_clear_errors() {
        assert!(matches!(
            env(&[("DSM_RANK", "x"), ("DSM_SIZE", "2")]),
            Err(EnvError::Invalid {
                var: "DSM_RANK",
                ..
            })
        ));
        assert!(matches!(
            env(&[("DSM_RANK", "2"), ("DSM_SIZE", "2")]),
            Err(EnvError::Invalid {
                var: "DSM_RANK",
                ..
            })
        ));
        assert!(matches!(
            env(&[("DSM_RANK", "0")]),
            Err(EnvError::Missing("DSM_RANK", "DSM_SIZE"))
        ));
        assert!(matches!(
            env(&[
                ("DSM_RANK", "0"),
                ("DSM_SIZE", "2"),
                ("DSM_JOB_SECRET", "s")
            ]),
            Err(EnvError::NeedsRendezvous {
                var: "DSM_COORD",
                ..
            })
        ));
        assert!(matches!(
            env(&[
                ("DSM_RANK", "0"),
                ("DSM_SIZE", "2"),
                ("DSM_COORD", "127.0.0.1:1")
            ]),
            Err(EnvError::NeedsRendezvous {
                var: "DSM_JOB_SECRET",
                ..
            })
        ));
        assert!(matches!(
            env(&[("DSM_SEGMENT", "lots")]),
            Err(EnvError::Invalid {
                var: "DSM_SEGMENT",
                ..
            })
        ));
        let msg = env(&[("DSM_RANK", "0"), ("DSM_SIZE", "0")])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("DSM_SIZE"), "{msg}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
        assert!(parse_size("0").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1Q").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}

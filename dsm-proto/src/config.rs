//! The job configuration: one typed description of a job and of this rank's place in it,
//! written by a launcher (`dsmrun`, or the user under `srun`/`mpirun`) as `DSM_*`
//! environment variables and read back by every rank. A rank learns its rank and size from
//! dsmrun, Slurm (`SLURM_PROCID`/`SLURM_NTASKS`), Open MPI (`OMPI_COMM_WORLD_*`) or PMI
//! (`PMI_RANK`/`PMI_SIZE`), or none at all, which makes the program a single-node job.
//!
//! Which variable carries which setting, in which spelling, and when it is written and
//! read is one table (`config/env_table.rs`); the writer ([`JobConfig::to_env`]) and the
//! reader ([`JobConfig::from_lookup`]) are both generated from it.

use crate::env_vars as vars;
use crate::exit_codes;
use crate::liveness::DEFAULT_LIVENESS;
use crate::MAX_NODES;
use env_format::{HostPort, LauncherName, VarText, COUNT};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod env_format;
mod env_table;

pub use crate::config_error::ConfigError;

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `dsmrun`.
    Dsmrun,
    /// Slurm's `srun`.
    Slurm,
    /// An MPI launcher (`mpirun`, PMI).
    Mpi,
    /// No launcher, or `DSM_RANK`/`DSM_SIZE` set by hand.
    Standalone,
}

/// Which transports a rank may use for its links and its pages (`DSM_TRANSPORT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory with the ranks that can map the same memory (one host, one network
    /// namespace), TCP with the others, chosen at start-up pair by pair; and when every
    /// rank of the job can map the same memory and race detection is off, one common
    /// segment for all of them, so pages never travel.
    #[default]
    Auto,
    /// Shared-memory rings for the messages of ranks on one host, but every rank keeps
    /// its own copy of the pages and the protocol moves them (`DSM_TRANSPORT=rings`): what
    /// `auto` does in a job spread over hosts or with race detection.
    Rings,
    /// TCP with every rank (`DSM_TRANSPORT=tcp`).
    Tcp,
}

impl TransportChoice {
    /// Whether co-located ranks may talk through shared-memory rings.
    pub fn rings_allowed(self) -> bool {
        self != TransportChoice::Tcp
    }
}

/// How much of the race detector runs. Only benchmarks lower it (`DSM_RACE_PHASES`), to
/// measure what each part costs: the paper's Figure 3 breakdown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum RacePhases {
    /// Accesses are recorded and intervals closed, but notices stay home.
    Record,
    /// Notices travel with the intervals; no analysis.
    Notices,
    /// The master also finds concurrent, overlapping interval pairs; no bitmaps fetched.
    Compare,
    /// Everything: bitmaps fetched and compared, races reported.
    #[default]
    Full,
}

impl RacePhases {
    fn parse(v: &str) -> Option<Self> {
        match v {
            "full" => Some(RacePhases::Full),
            "record" => Some(RacePhases::Record),
            "notices" => Some(RacePhases::Notices),
            "compare" => Some(RacePhases::Compare),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            RacePhases::Full => "full",
            RacePhases::Record => "record",
            RacePhases::Notices => "notices",
            RacePhases::Compare => "compare",
        }
    }
}

/// Race-detection switches (`dsmrun --race ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceOptions {
    /// Race detection is on.
    pub enabled: bool,
    /// Where rank 0 writes one JSON object per race; absolute, so that it does not depend
    /// on a rank's working directory.
    pub log: Option<PathBuf>,
    /// Exit status when races were reported; 0 turns the convention off.
    pub exit_code: u8,
    /// Report only first races (the paper's section 6.4).
    pub first_only: bool,
    /// Print per-barrier detector statistics.
    pub stats: bool,
    /// How much of the detector runs (benchmarks only).
    pub phases: RacePhases,
    /// Schedule mode (`--race=schedule`): lock acquire/release edges are left out of the
    /// happens-before order (barriers kept), and conflicts that only lock order separates
    /// are reported as lock-order dependences.
    pub schedule: bool,
    /// Variables whose lock-order dependences are not reported (`--schedule-ignore`).
    pub schedule_ignore: Vec<String>,
    /// DVM-style dynamic checks (`--check`): uninitialised reads and accesses outside
    /// declared regions, found from the same access records as races.
    pub check: bool,
    /// Intervals a node closes between barriers before it ships them (with their bitmaps)
    /// to the race master for incremental analysis (`DSM_RACE_BATCH`); a node also ships
    /// what it has once a second has passed since its last batch. At the default, a node
    /// whose epochs outgrow it grows it to fit them (dsm-core's race state); a value the
    /// user set is kept.
    pub batch_intervals: u32,
    /// Tests: at every barrier, also run the full barrier-time analysis over everything
    /// the incremental analysis saw and stop with an error if the two disagree
    /// (`DSM_RACE_VERIFY_INCREMENTAL=1`).
    pub verify_incremental: bool,
    /// Where rank 0 writes the distinct races as SARIF 2.1.0 at finish (absolute).
    pub sarif: Option<PathBuf>,
    /// `--race-suppressions`: the suppression file's entries, one a line (comments and
    /// blank lines dropped; dsmrun has checked them).
    pub suppressions: Vec<String>,
    /// Where a rank notes that it is set up and runs the program under race detection (a
    /// file every rank creates once its set-up ends; set by dsmrun for jobs on its own
    /// machine).
    pub started_marker: Option<PathBuf>,
    /// Pinpoint: elements to watch, each `VAR[INDEX]@EPOCH` (`--pinpoint`).
    pub pinpoint: Vec<String>,
    /// Pinpoint: where nodes leave their watched accesses for the master.
    pub pinpoint_dir: Option<PathBuf>,
    /// `--sem-order=safe`: order semaphore operations by what holds in every feasible
    /// pairing of signals with waits (the always-happens-before order), not by the pairing
    /// the run took, so races another pairing allows are reported too.
    pub sem_order_safe: bool,
}

/// Default of [`RaceOptions::batch_intervals`]: programs with barriers rarely close this
/// many intervals per node between two of them, so they never ship a batch.
pub const DEFAULT_RACE_BATCH: u32 = 1024;

impl Default for RaceOptions {
    fn default() -> Self {
        RaceOptions {
            enabled: false,
            log: None,
            exit_code: exit_codes::RACES_FOUND,
            first_only: false,
            stats: false,
            phases: RacePhases::Full,
            schedule: false,
            schedule_ignore: Vec::new(),
            check: false,
            batch_intervals: DEFAULT_RACE_BATCH,
            verify_incremental: false,
            sarif: None,
            suppressions: Vec::new(),
            started_marker: None,
            pinpoint: Vec::new(),
            pinpoint_dir: None,
            sem_order_safe: false,
        }
    }
}

impl RaceOptions {
    /// The rank exit status that means "races found" rather than "failed", if any.
    pub fn races_found_exit(&self) -> Option<i32> {
        (self.enabled && self.exit_code != 0).then_some(i32::from(self.exit_code))
    }
}

/// What value tracing does (`dsmrun --trace-values` / `--compare`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TraceMode {
    /// No tracing.
    #[default]
    Off,
    /// Rank 0 writes a trace to this (absolute) path.
    Record(PathBuf),
    /// Rank 0 compares with the reference trace at this (absolute) path.
    Compare(PathBuf),
}

/// Value tracing and comparison switches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceOptions {
    /// Record, compare or nothing.
    pub mode: TraceMode,
    /// Recording: keep the values of every allocation, not only hashes.
    pub full: bool,
    /// Recording: keep the values of these allocations.
    pub vars: Vec<String>,
    /// Comparing: report every differing trace point and exit 68 at the end, instead of
    /// stopping at the first.
    pub continue_all: bool,
    /// Comparing: absolute tolerance for f64/f32 elements, as its bit pattern (0: exact).
    pub abs_tolerance_bits: u64,
    /// Comparing: relative tolerance for f64/f32 elements, as its bit pattern (0: exact).
    pub rel_tolerance_bits: u64,
}

impl TraceOptions {
    /// The absolute tolerance.
    pub fn abs_tolerance(&self) -> f64 {
        f64::from_bits(self.abs_tolerance_bits)
    }
    /// The relative tolerance.
    pub fn rel_tolerance(&self) -> f64 {
        f64::from_bits(self.rel_tolerance_bits)
    }
}

/// Synchronization-order recording, replay and chaos (`dsmrun --record`, `--replay`,
/// `--chaos`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplayOptions {
    /// Record: each rank writes its events to `<prefix>.<rank>` at finish (absolute).
    pub record: Option<PathBuf>,
    /// Replay the record at this (absolute) path.
    pub replay: Option<PathBuf>,
    /// Seed of chaos mode's random delays.
    pub chaos: Option<u64>,
}

/// This rank's place among the ranks of its host, when the launcher knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPlacement {
    /// Index among the ranks on this host.
    pub rank: usize,
    /// Ranks on this host.
    pub size: usize,
}

/// Everything a rank needs to know about its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConfig {
    /// This rank, `0..size`.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
    /// Who started the rank.
    pub launcher: Launcher,
    /// Rank 0's rendezvous address; `None` for a single-node job.
    pub coord: Option<SocketAddr>,
    /// Shared by the job's ranks to recognise each other.
    pub secret: String,
    /// How long ranks keep trying to reach each other at start.
    pub connect_timeout: Duration,
    /// How long a peer may send nothing (not even a heartbeat) before this rank stops the
    /// job naming it (`DSM_LIVENESS`); `None`: never, e.g. while a rank sits in a debugger.
    /// See [`liveness`](crate::liveness).
    pub liveness: Option<Duration>,
    /// Bytes of shared segment to reserve, if overridden.
    pub segment_bytes: Option<u64>,
    /// Address of the segment in every rank, if overridden.
    pub segment_addr: Option<usize>,
    /// Race detection.
    pub race: RaceOptions,
    /// Value tracing and comparison.
    pub trace: TraceOptions,
    /// Recording, replay and chaos of the synchronization order.
    pub replay: ReplayOptions,
    /// Pin each rank to its own core (`DSM_PIN=1`).
    pub pin: bool,
    /// Across hosts, one memory per host for the pages homed there (`DSM_HOST_MEMORY=1`).
    pub host_memory: bool,
    /// Which transports this rank's links may use (`DSM_TRANSPORT`).
    pub transport: TransportChoice,
    /// Where this rank sits among the ranks of its host.
    pub local: Option<LocalPlacement>,
    /// Where to write this rank's counters at finish (`%r` becomes the rank).
    pub stats_file: Option<PathBuf>,
    /// Most pages a home pushes with one lock grant or barrier arrival (`DSM_PUSH`; 0: off).
    pub push_pages: u32,
    /// How long a thread waiting for a remote reply polls before it sleeps (`DSM_SPIN`):
    /// `None` for `auto` (the runtime decides by ranks per core), else the budget.
    pub spin: Option<Duration>,
    /// Semaphore trace (`--sem-trace FILE`): each rank writes its completed semaphore
    /// operations and the barriers it passed to `FILE.rank<R>`, which dsmrun merges into
    /// `FILE`.
    pub sem_trace: Option<PathBuf>,
    /// Rank 0: the inherited rendezvous socket, bound to `coord` and listening
    /// (`DSM_COORD_FD`).
    pub coord_fd: Option<i32>,
    /// The inherited pipe end that ties the rank's life to its launcher's
    /// (`DSM_LAUNCHER_FD`): end-of-file on it means the launcher died.
    pub launcher_fd: Option<i32>,
    /// Switches for measurements and tests (README, "Debugging and measurement switches").
    pub debug: DebugOptions,
}

/// Switches that exist for A/B measurements and tests, not for everyday use; each rank
/// reads them from the environment it inherits, through [`JobConfig`] like every other
/// setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugOptions {
    /// Serve write faults on valid pages, and co-located page fetches, in the SIGSEGV
    /// handler (`DSM_FAST_FAULTS`, default on; `0` sends every fault to the comm thread).
    pub fast_faults: bool,
    /// Print the value trace's size at finish (`DSM_TRACE_STATS`, any value).
    pub trace_stats: bool,
    /// Tests: the rank that maps a page at the default segment base before start-up
    /// (`DSM_TEST_OCCUPY_BASE`), to exercise the segment base agreement.
    pub occupy_base_on_rank: Option<usize>,
}

impl Default for DebugOptions {
    fn default() -> Self {
        DebugOptions {
            fast_faults: true,
            trace_stats: false,
            occupy_base_on_rank: None,
        }
    }
}

/// Pages a home pushes with one lock grant or barrier arrival unless `DSM_PUSH` says
/// otherwise: enough for a few rows of a matrix or a block of molecules, small enough that
/// a grant stays a few hundred microseconds on loopback.
pub const DEFAULT_PUSH_PAGES: u32 = 32;

/// Longest polling budget `DSM_SPIN` accepts: a second.
pub const MAX_SPIN_US: u64 = 1_000_000;

/// How long ranks wait for each other at start unless told otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

impl JobConfig {
    /// Rank `rank` of a `size`-rank job started without a launcher: the ranks meet at
    /// `coord` with `secret`, every other option at its default.
    pub fn standalone(rank: usize, size: usize, coord: SocketAddr, secret: &str) -> JobConfig {
        JobConfig {
            rank,
            size,
            coord: Some(coord),
            secret: secret.into(),
            ..JobConfig::single_node()
        }
    }

    /// A single-node job with every option at its default.
    pub fn single_node() -> JobConfig {
        JobConfig {
            rank: 0,
            size: 1,
            launcher: Launcher::Standalone,
            coord: None,
            secret: String::new(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            liveness: Some(DEFAULT_LIVENESS),
            segment_bytes: None,
            segment_addr: None,
            race: RaceOptions::default(),
            trace: TraceOptions::default(),
            replay: ReplayOptions::default(),
            pin: false,
            host_memory: false,
            transport: TransportChoice::Auto,
            local: None,
            stats_file: None,
            push_pages: DEFAULT_PUSH_PAGES,
            spin: None,
            sem_trace: None,
            coord_fd: None,
            launcher_fd: None,
            debug: DebugOptions::default(),
        }
    }

    /// Reads the process environment (see [`JobConfig::from_lookup`] for what is read and
    /// when it fails).
    pub fn from_env() -> Result<JobConfig, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get` (tests pass a map): every `DSM_*` variable
    /// [`JobConfig::to_env`] writes, in the same spelling, and those the user sets for a
    /// whole job; the settings of race detection only with `DSM_RACE` on, so that a
    /// leftover one does not fail a plain run. An unset variable leaves its setting at the
    /// default of [`JobConfig::single_node`].
    ///
    /// Rank and size come from `DSM_RANK`/`DSM_SIZE`, else Slurm, Open MPI or PMI
    /// variables, else the job is a single node. Fails with [`ConfigError`] when a variable
    /// does not parse, the size is outside `1..=MAX_NODES` or the rank not below it,
    /// `DSM_RANK` comes without `DSM_SIZE`, or a multi-node job lacks `DSM_COORD` or
    /// `DSM_JOB_SECRET`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<JobConfig, ConfigError> {
        Self::from_lookup_keyed(get, || Err("no user key in this context".into()))
    }

    /// [`JobConfig::from_lookup`] that can also key a Slurm job: under `srun`, without
    /// `DSM_JOB_SECRET`, the secret is derived from the user's key, which `user_key` reads
    /// (it is called only then; see [`crate::launchers::slurm`]).
    pub fn from_lookup_keyed(
        get: impl Fn(&str) -> Option<String>,
        user_key: impl FnOnce() -> Result<String, String>,
    ) -> Result<JobConfig, ConfigError> {
        let (rank, size, launcher) = rank_and_size(&get)?;
        // Under mpirun and srun, what the launcher already gives every rank names the
        // rendezvous and keys the job, unless the user set them.
        let derived = match launcher {
            Launcher::Mpi if size > 1 => crate::launchers::open_mpi(&get)?,
            Launcher::Slurm if size > 1 => crate::launchers::slurm::rendezvous(
                &get,
                get(vars::JOB_SECRET).is_none(),
                user_key,
            )?,
            _ => None,
        };
        let coord = match get(vars::COORD) {
            Some(v) => Some(HostPort.read_text(vars::COORD, v)?),
            None if derived.is_some() => derived.as_ref().map(|d| d.coord),
            None if size > 1 => {
                return Err(ConfigError::NeedsRendezvous {
                    size,
                    var: vars::COORD,
                })
            }
            None => None,
        };
        let secret = get(vars::JOB_SECRET)
            .or_else(|| derived.map(|d| d.secret))
            .unwrap_or_default();
        if size > 1 && secret.is_empty() {
            return Err(ConfigError::NeedsRendezvous {
                size,
                var: vars::JOB_SECRET,
            });
        }
        let mut config = JobConfig {
            rank,
            size,
            launcher,
            coord,
            secret,
            ..JobConfig::single_node()
        };
        env_table::read_rows(&get, &mut config)?;
        Ok(config)
    }

    /// The launcher-owned variables ([`vars::LAUNCHER_OWNED`]) that describe this
    /// configuration, for a launcher to hand to the rank; [`JobConfig::from_lookup`] reads
    /// them back to an equal value (both come from one table of the variables, their
    /// fields and spellings). A setting at its default is left unset, except the rank's
    /// identity, and the race exit status whenever detection is on; the settings of race
    /// detection are written only with it on. Options the user sets for the whole job by
    /// environment (transport, pinning, stats file, segment address, detector phases...)
    /// are not included: the rank inherits them.
    pub fn to_env(&self) -> Vec<(&'static str, OsString)> {
        env_table::write_rows(self, false)
    }
}

/// Value of `DSM_LAUNCHER` when dsmrun started the rank.
pub const DSMRUN: &str = "dsmrun";

/// This rank, the job's size and who launched it: from `DSM_RANK`/`DSM_SIZE`, else Slurm,
/// Open MPI or PMI variables, else a single node; the size within `1..=MAX_NODES` and the
/// rank below it.
fn rank_and_size(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<(usize, usize, Launcher), ConfigError> {
    // The variables the rank and size came from, named in errors.
    let from = |rank_var: &'static str, size_var: &'static str, r: String, s: String| {
        Ok::<_, ConfigError>((
            COUNT.read_text(rank_var, r)?,
            COUNT.read_text(size_var, s)?,
            rank_var,
            size_var,
        ))
    };
    let ((rank, size, rank_var, size_var), launcher) = if let Some(rank) = get(vars::RANK) {
        let size = get(vars::SIZE).ok_or(ConfigError::Missing(vars::RANK, vars::SIZE))?;
        let launcher = match get(vars::LAUNCHER) {
            Some(name) => LauncherName.read_text(vars::LAUNCHER, name)?,
            None => Launcher::Standalone,
        };
        (from(vars::RANK, vars::SIZE, rank, size)?, launcher)
    } else if let (Some(r), Some(s)) = (get("SLURM_PROCID"), get("SLURM_NTASKS")) {
        (from("SLURM_PROCID", "SLURM_NTASKS", r, s)?, Launcher::Slurm)
    } else if let (Some(r), Some(s)) = (get("OMPI_COMM_WORLD_RANK"), get("OMPI_COMM_WORLD_SIZE")) {
        (
            from("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", r, s)?,
            Launcher::Mpi,
        )
    } else if let (Some(r), Some(s)) = (get("PMI_RANK"), get("PMI_SIZE")) {
        (from("PMI_RANK", "PMI_SIZE", r, s)?, Launcher::Mpi)
    } else {
        ((0, 1, vars::RANK, vars::SIZE), Launcher::Standalone)
    };
    if size == 0 || size > MAX_NODES {
        return Err(ConfigError::Invalid {
            var: size_var,
            value: size.to_string(),
            why: format!("job size must be 1..={MAX_NODES}"),
        });
    }
    if rank >= size {
        return Err(ConfigError::Invalid {
            var: rank_var,
            value: rank.to_string(),
            why: format!("rank must be below the job size {size}"),
        });
    }
    Ok((rank, size, launcher))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    fn env(pairs: &[(&str, &str)]) -> Result<JobConfig, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        JobConfig::from_lookup(|k| m.get(k).cloned())
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
    fn debug_switches_are_read_through_the_config() {
        assert_eq!(env(&[]).unwrap().debug, DebugOptions::default());
        assert!(env(&[]).unwrap().debug.fast_faults);
        let e = env(&[
            ("DSM_FAST_FAULTS", "0"),
            ("DSM_TRACE_STATS", "1"),
            ("DSM_TEST_OCCUPY_BASE", "1"),
        ])
        .unwrap();
        assert_eq!(
            e.debug,
            DebugOptions {
                fast_faults: false,
                trace_stats: true,
                occupy_base_on_rank: Some(1),
            }
        );
        let err = env(&[("DSM_FAST_FAULTS", "yes")]).unwrap_err().to_string();
        assert!(
            err.contains("DSM_FAST_FAULTS") && err.contains("yes"),
            "{err}"
        );
        let err = env(&[("DSM_TEST_OCCUPY_BASE", "x")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("DSM_TEST_OCCUPY_BASE"), "{err}");
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
        // Errors name the launcher's variables, not dsm's.
        assert!(matches!(
            env(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "2")]),
            Err(ConfigError::Invalid {
                var: "SLURM_PROCID",
                ..
            })
        ));
        assert!(matches!(
            env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "0")]),
            Err(ConfigError::Invalid {
                var: "OMPI_COMM_WORLD_SIZE",
                ..
            })
        ));
    }

    #[test]
    fn bad_values_are_clear_errors() {
        assert!(matches!(
            env(&[("DSM_RANK", "x"), ("DSM_SIZE", "2")]),
            Err(ConfigError::Invalid {
                var: "DSM_RANK",
                ..
            })
        ));
        assert!(matches!(
            env(&[("DSM_RANK", "2"), ("DSM_SIZE", "2")]),
            Err(ConfigError::Invalid {
                var: "DSM_RANK",
                ..
            })
        ));
        assert!(matches!(
            env(&[("DSM_RANK", "0")]),
            Err(ConfigError::Missing("DSM_RANK", "DSM_SIZE"))
        ));
        assert!(matches!(
            env(&[
                ("DSM_RANK", "0"),
                ("DSM_SIZE", "2"),
                ("DSM_JOB_SECRET", "s")
            ]),
            Err(ConfigError::NeedsRendezvous {
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
            Err(ConfigError::NeedsRendezvous {
                var: "DSM_JOB_SECRET",
                ..
            })
        ));
        assert!(matches!(
            env(&[("DSM_SEGMENT", "lots")]),
            Err(ConfigError::Invalid {
                var: "DSM_SEGMENT",
                ..
            })
        ));
        let msg = env(&[("DSM_SEGMENT", "17T")]).unwrap_err().to_string();
        assert!(msg.contains("DSM_SEGMENT") && msg.contains("16T"), "{msg}");
        let msg = env(&[("DSM_RANK", "0"), ("DSM_SIZE", "0")])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("DSM_SIZE"), "{msg}");
    }

    #[test]
    fn written_configuration_reads_back_equal() {
        let mut c = JobConfig::single_node();
        c.rank = 3;
        c.size = 8;
        c.launcher = Launcher::Dsmrun;
        c.coord = Some("127.0.0.1:4000".parse().unwrap());
        c.secret = "s3cret".into();
        c.connect_timeout = Duration::from_millis(1500);
        c.liveness = Some(Duration::from_millis(2500));
        c.segment_bytes = Some(64 << 20);
        c.local = Some(LocalPlacement { rank: 3, size: 8 });
        c.launcher_fd = Some(7);
        c.coord_fd = Some(8);
        c.race = RaceOptions {
            enabled: true,
            log: Some("/tmp/races.jsonl".into()),
            exit_code: 9,
            first_only: true,
            stats: true,
            phases: RacePhases::Full,
            schedule: true,
            schedule_ignore: vec!["sum".into(), "forces".into()],
            check: true,
            batch_intervals: DEFAULT_RACE_BATCH,
            verify_incremental: false,
            sarif: Some("/tmp/races.sarif".into()),
            suppressions: vec!["race:variable=bound".into(), "race:line=a.rs:3".into()],
            started_marker: Some("/tmp/started".into()),
            pinpoint: vec!["bound[0]@3".into(), "grid[17]@1".into()],
            pinpoint_dir: Some("/tmp/pin".into()),
            sem_order_safe: true,
        };
        c.trace = TraceOptions {
            mode: TraceMode::Compare("/tmp/ref.dsmtrace".into()),
            full: true,
            vars: vec!["grid".into(), "forces".into()],
            continue_all: true,
            abs_tolerance_bits: 1e-12f64.to_bits(),
            rel_tolerance_bits: 0.1f64.to_bits(),
        };
        c.replay = ReplayOptions {
            record: None,
            replay: Some("/tmp/run.dsmrec".into()),
            chaos: Some(u64::MAX),
        };
        let env: HashMap<String, String> = c
            .to_env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into_string().unwrap()))
            .collect();
        assert_eq!(
            JobConfig::from_lookup(|k| env.get(k).cloned()),
            Ok(c.clone())
        );
        // Off survives the round trip too, and the default is not written at all.
        for (liveness, written) in [(None, Some("off")), (Some(DEFAULT_LIVENESS), None)] {
            c.liveness = liveness;
            let env: HashMap<String, String> = c
                .to_env()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.into_string().unwrap()))
                .collect();
            assert_eq!(env.get("DSM_LIVENESS").map(String::as_str), written);
            assert_eq!(
                JobConfig::from_lookup(|k| env.get(k).cloned()),
                Ok(c.clone())
            );
        }
    }

    /// A configuration with every setting away from its default: what dsmrun writes
    /// (`to_env`) in `launcher_written`, and the user's job-wide settings too in `all`.
    /// `record_side` picks which of the exclusive pairs (trace or compare, record or
    /// replay) is set.
    fn every_setting_changed(record_side: bool) -> (JobConfig, JobConfig) {
        let mut launcher_written = JobConfig {
            rank: 3,
            size: 8,
            launcher: Launcher::Dsmrun,
            coord: Some("127.0.0.1:4000".parse().unwrap()),
            secret: "s3cret".into(),
            connect_timeout: Duration::from_millis(1500),
            liveness: Some(Duration::from_millis(2500)),
            segment_bytes: Some(64 << 20),
            local: Some(LocalPlacement { rank: 3, size: 8 }),
            sem_trace: Some("/tmp/sem".into()),
            coord_fd: Some(8),
            launcher_fd: Some(7),
            ..JobConfig::single_node()
        };
        launcher_written.race = RaceOptions {
            enabled: true,
            log: Some("/tmp/races.jsonl".into()),
            exit_code: 9,
            first_only: true,
            stats: true,
            schedule: true,
            schedule_ignore: vec!["sum".into(), "forces".into()],
            check: true,
            sarif: Some("/tmp/races.sarif".into()),
            suppressions: vec!["race:variable=bound".into(), "race:line=a.rs:3".into()],
            started_marker: Some("/tmp/started".into()),
            pinpoint: vec!["bound[0]@3".into(), "grid[17]@1".into()],
            pinpoint_dir: Some("/tmp/pin".into()),
            sem_order_safe: true,
            ..RaceOptions::default()
        };
        launcher_written.trace = TraceOptions {
            mode: if record_side {
                TraceMode::Record("/tmp/run.dsmtrace".into())
            } else {
                TraceMode::Compare("/tmp/ref.dsmtrace".into())
            },
            full: true,
            vars: vec!["grid".into(), "forces".into()],
            continue_all: true,
            abs_tolerance_bits: 1e-12f64.to_bits(),
            rel_tolerance_bits: 0.1f64.to_bits(),
        };
        let path = Some(PathBuf::from("/tmp/run.dsmrec"));
        launcher_written.replay = ReplayOptions {
            record: path.clone().filter(|_| record_side),
            replay: path.filter(|_| !record_side),
            chaos: Some(u64::MAX),
        };
        let mut all = launcher_written.clone();
        all.race.phases = RacePhases::Compare;
        all.race.batch_intervals = 7;
        all.race.verify_incremental = true;
        all.segment_addr = Some(0x7f00_0000_0000);
        all.pin = true;
        all.host_memory = true;
        all.transport = TransportChoice::Rings;
        all.stats_file = Some("/tmp/stats.%r.json".into());
        all.push_pages = 5;
        all.spin = Some(Duration::from_micros(50));
        all.debug = DebugOptions {
            fast_faults: false,
            trace_stats: true,
            occupy_base_on_rank: Some(2),
        };
        (launcher_written, all)
    }

    /// Fails to compile when a field is added, so that `every_setting_changed` (and with
    /// it the table) cannot miss it; fails when a field is at its default.
    fn assert_every_field_changed(c: &JobConfig, record_side: bool) {
        let d = JobConfig::single_node();
        let JobConfig {
            rank,
            size,
            launcher,
            coord,
            secret,
            connect_timeout,
            liveness,
            segment_bytes,
            segment_addr,
            race,
            trace,
            replay,
            pin,
            host_memory,
            transport,
            local,
            stats_file,
            push_pages,
            spin,
            sem_trace,
            coord_fd,
            launcher_fd,
            debug,
        } = c;
        assert!(*rank != d.rank && *size != d.size && *launcher != d.launcher);
        assert!(*coord != d.coord && *secret != d.secret);
        assert!(*connect_timeout != d.connect_timeout && *liveness != d.liveness);
        assert!(*segment_bytes != d.segment_bytes && *segment_addr != d.segment_addr);
        assert!(*pin != d.pin && *transport != d.transport && *local != d.local);
        assert!(*host_memory != d.host_memory);
        assert!(*stats_file != d.stats_file && *push_pages != d.push_pages);
        assert!(*spin != d.spin && *sem_trace != d.sem_trace);
        assert!(*coord_fd != d.coord_fd && *launcher_fd != d.launcher_fd);
        let RaceOptions {
            enabled,
            log,
            exit_code,
            first_only,
            stats,
            phases,
            schedule,
            schedule_ignore,
            check,
            batch_intervals,
            verify_incremental,
            sarif,
            suppressions,
            started_marker,
            pinpoint,
            pinpoint_dir,
            sem_order_safe,
        } = race;
        let r = &d.race;
        assert!(*enabled != r.enabled && *log != r.log && *exit_code != r.exit_code);
        assert!(*first_only != r.first_only && *stats != r.stats && *phases != r.phases);
        assert!(*schedule != r.schedule && *schedule_ignore != r.schedule_ignore);
        assert!(*check != r.check && *batch_intervals != r.batch_intervals);
        assert!(*verify_incremental != r.verify_incremental && *sarif != r.sarif);
        assert!(*suppressions != r.suppressions && *started_marker != r.started_marker);
        assert!(*pinpoint != r.pinpoint && *pinpoint_dir != r.pinpoint_dir);
        assert!(*sem_order_safe != r.sem_order_safe);
        let TraceOptions {
            mode,
            full,
            vars,
            continue_all,
            abs_tolerance_bits,
            rel_tolerance_bits,
        } = trace;
        let t = &d.trace;
        assert!(*mode != t.mode && *full != t.full && *vars != t.vars);
        assert!(*continue_all != t.continue_all);
        assert!(*abs_tolerance_bits != t.abs_tolerance_bits);
        assert!(*rel_tolerance_bits != t.rel_tolerance_bits);
        let ReplayOptions {
            record,
            replay,
            chaos,
        } = replay;
        assert_eq!(record.is_some(), record_side);
        assert_eq!(replay.is_some(), !record_side);
        assert!(*chaos != d.replay.chaos);
        let DebugOptions {
            fast_faults,
            trace_stats,
            occupy_base_on_rank,
        } = debug;
        let g = &d.debug;
        assert!(*fast_faults != g.fast_faults && *trace_stats != g.trace_stats);
        assert!(*occupy_base_on_rank != g.occupy_base_on_rank);
    }

    /// The variables `env` sets, as a map from name to text.
    fn env_map(env: Vec<(&'static str, OsString)>) -> HashMap<&'static str, String> {
        env.into_iter()
            .map(|(k, v)| (k, v.into_string().unwrap()))
            .collect()
    }

    fn read_back(env: Vec<(&'static str, OsString)>) -> Result<JobConfig, ConfigError> {
        let env = env_map(env);
        JobConfig::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn every_setting_reads_back_as_written() {
        for record_side in [false, true] {
            let (launcher_written, all) = every_setting_changed(record_side);
            assert_every_field_changed(&all, record_side);
            // What dsmrun hands a rank, and what the rank sees with the user's job-wide
            // settings inherited on top.
            assert_eq!(read_back(all.to_env()), Ok(launcher_written));
            assert_eq!(read_back(env_table::write_rows(&all, true)), Ok(all));
        }
    }

    #[test]
    fn to_env_writes_the_launcher_owned_rows_of_the_table_and_the_reader_asks_for_all() {
        let names = |env: Vec<(&'static str, OsString)>| -> BTreeSet<&'static str> {
            env.into_iter().map(|(k, _)| k).collect()
        };
        let (mut written, mut written_with_inherited) = (BTreeSet::new(), BTreeSet::new());
        for record_side in [false, true] {
            let (_, all) = every_setting_changed(record_side);
            written.extend(names(all.to_env()));
            written_with_inherited.extend(names(env_table::write_rows(&all, true)));
        }
        let rows = env_table::rows();
        let table: BTreeSet<&str> = rows.iter().map(|(var, ..)| *var).collect();
        assert_eq!(table.len(), rows.len(), "a variable in two rows");
        assert_eq!(written_with_inherited, table);
        let launcher_rows: BTreeSet<&str> = rows
            .iter()
            .filter(|(_, written, _)| *written != env_table::Written::Inherited)
            .map(|(var, ..)| *var)
            .collect();
        assert_eq!(written, launcher_rows);
        assert_eq!(written, vars::LAUNCHER_OWNED.into_iter().collect());

        // The rows read elsewhere (rank, size, rendezvous) are read too.
        let asked = std::cell::RefCell::new(BTreeSet::new());
        let (_, all) = every_setting_changed(false);
        let env = env_map(env_table::write_rows(&all, true));
        JobConfig::from_lookup(|k| {
            asked.borrow_mut().insert(k.to_owned());
            env.get(k).cloned()
        })
        .unwrap();
        let asked = asked.into_inner();
        let unread: Vec<&&str> = table.iter().filter(|v| !asked.contains(**v)).collect();
        assert!(unread.is_empty(), "written but never read: {unread:?}");
    }

    #[test]
    fn push_is_on_by_default_and_takes_off_or_a_page_count() {
        assert_eq!(env(&[]).unwrap().push_pages, DEFAULT_PUSH_PAGES);
        assert_eq!(
            env(&[("DSM_PUSH", "on")]).unwrap().push_pages,
            DEFAULT_PUSH_PAGES
        );
        assert_eq!(env(&[("DSM_PUSH", "off")]).unwrap().push_pages, 0);
        assert_eq!(env(&[("DSM_PUSH", "0")]).unwrap().push_pages, 0);
        assert_eq!(env(&[("DSM_PUSH", "5")]).unwrap().push_pages, 5);
        assert!(!env(&[]).unwrap().host_memory);
        assert!(env(&[("DSM_HOST_MEMORY", "1")]).unwrap().host_memory);
        assert!(!env(&[("DSM_HOST_MEMORY", "0")]).unwrap().host_memory);
        let e = env(&[("DSM_HOST_MEMORY", "yes")]).unwrap_err().to_string();
        assert!(
            e.contains("DSM_HOST_MEMORY") && e.contains("one memory per host"),
            "{e}"
        );
        assert_eq!(env(&[]).unwrap().spin, None);
        assert_eq!(env(&[("DSM_SPIN", "auto")]).unwrap().spin, None);
        assert_eq!(
            env(&[("DSM_SPIN", "off")]).unwrap().spin,
            Some(Duration::ZERO)
        );
        assert_eq!(
            env(&[("DSM_SPIN", "50")]).unwrap().spin,
            Some(Duration::from_micros(50))
        );
        for bad in ["fast", "-1", "2000000"] {
            let e = env(&[("DSM_SPIN", bad)]).unwrap_err().to_string();
            assert!(e.contains("DSM_SPIN") && e.contains("microseconds"), "{e}");
        }
        let e = env(&[("DSM_PUSH", "lots")]).unwrap_err().to_string();
        assert!(e.contains("DSM_PUSH") && e.contains("page count"), "{e}");
    }

    #[test]
    fn record_and_replay_exclude_each_other_and_chaos_is_a_seed() {
        let c = env(&[("DSM_RECORD", "/tmp/a"), ("DSM_CHAOS", "17")]).unwrap();
        assert_eq!(
            c.replay.record.as_deref(),
            Some(std::path::Path::new("/tmp/a"))
        );
        assert_eq!(c.replay.chaos, Some(17));
        let e = env(&[("DSM_RECORD", "/tmp/a"), ("DSM_REPLAY", "/tmp/b")]).unwrap_err();
        assert!(e.to_string().contains("exclude each other"), "{e}");
        let e = env(&[("DSM_CHAOS", "-1")]).unwrap_err();
        assert!(e.to_string().contains("DSM_CHAOS"), "{e}");
    }

    #[test]
    fn transport_is_auto_rings_or_tcp() {
        assert_eq!(env(&[]).unwrap().transport, TransportChoice::Auto);
        assert_eq!(
            env(&[("DSM_TRANSPORT", "auto")]).unwrap().transport,
            TransportChoice::Auto
        );
        assert_eq!(
            env(&[("DSM_TRANSPORT", "tcp")]).unwrap().transport,
            TransportChoice::Tcp
        );
        assert_eq!(
            env(&[("DSM_TRANSPORT", "rings")]).unwrap().transport,
            TransportChoice::Rings
        );
        let err = env(&[("DSM_TRANSPORT", "udp")]).unwrap_err().to_string();
        assert!(
            err.contains("DSM_TRANSPORT") && err.contains("tcp"),
            "{err}"
        );
    }

    #[test]
    fn liveness_is_seconds_or_off() {
        assert_eq!(env(&[]).unwrap().liveness, Some(DEFAULT_LIVENESS));
        assert_eq!(
            env(&[("DSM_LIVENESS", "2.5")]).unwrap().liveness,
            Some(Duration::from_millis(2500))
        );
        for off in ["0", "off"] {
            assert_eq!(env(&[("DSM_LIVENESS", off)]).unwrap().liveness, None);
        }
        let err = env(&[("DSM_LIVENESS", "soon")]).unwrap_err().to_string();
        assert!(err.contains("DSM_LIVENESS") && err.contains("off"), "{err}");
    }

    #[test]
    fn race_phases_only_matter_with_detection_on() {
        assert_eq!(
            env(&[("DSM_RACE_PHASES", "bogus")]).unwrap().race.phases,
            RacePhases::Full
        );
        let e = env(&[("DSM_RACE", "1"), ("DSM_RACE_PHASES", "compare")]).unwrap();
        assert_eq!(e.race.phases, RacePhases::Compare);
        assert!(env(&[("DSM_RACE", "1"), ("DSM_RACE_PHASES", "bogus")]).is_err());
    }
}

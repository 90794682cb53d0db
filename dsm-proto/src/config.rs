//! The job configuration: one typed description of a job and of this rank's place in it,
//! written by a launcher (`dsmrun`, or the user under `srun`/`mpirun`) as `DSM_*`
//! environment variables and read back by every rank. A rank learns its rank and size from
//! dsmrun, Slurm (`SLURM_PROCID`/`SLURM_NTASKS`), Open MPI (`OMPI_COMM_WORLD_*`) or PMI
//! (`PMI_RANK`/`PMI_SIZE`), or none at all, which makes the program a single-node job.

use crate::env_vars as vars;
use crate::exit_codes;
use crate::liveness::DEFAULT_LIVENESS;
use crate::units::{
    format_secs, format_secs_or_off, parse_seconds, parse_seconds_or_off, parse_segment_size,
};
use crate::MAX_NODES;
use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

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
    /// what it has once a second has passed since its last batch.
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
    /// Where rank 0 notes that every rank joined (a file it creates; set by dsmrun for
    /// jobs on its own machine).
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

impl DebugOptions {
    /// Reads the switches through `get`.
    fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let fast_faults = match get(vars::FAST_FAULTS).as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: vars::FAST_FAULTS,
                    value: other.to_owned(),
                    why: "expected 0 (faults through the comm thread) or 1 (the default)".into(),
                })
            }
        };
        let occupy_base_on_rank = match get(vars::TEST_OCCUPY_BASE) {
            Some(r) => Some(parse_num(vars::TEST_OCCUPY_BASE, &r)?),
            None => None,
        };
        Ok(DebugOptions {
            fast_faults,
            trace_stats: get(vars::TRACE_STATS).is_some(),
            occupy_base_on_rank,
        })
    }
}

/// Pages a home pushes with one lock grant or barrier arrival unless `DSM_PUSH` says
/// otherwise: enough for a few rows of a matrix or a block of molecules, small enough that
/// a grant stays a few hundred microseconds on loopback.
pub const DEFAULT_PUSH_PAGES: u32 = 32;

/// Reads `DSM_PUSH`: `on`, `off`, or a page count (`0` is `off`).
fn parse_push(v: &str) -> Result<u32, String> {
    match v.trim() {
        "on" => Ok(DEFAULT_PUSH_PAGES),
        "off" => Ok(0),
        n => n
            .parse::<u32>()
            .map_err(|_| "expected on, off or a page count".to_owned()),
    }
}

/// Longest polling budget `DSM_SPIN` accepts: a second.
pub const MAX_SPIN_US: u64 = 1_000_000;

/// Reads `DSM_SPIN`: `auto` (`None`), `off`, or microseconds (`0` is `off`).
fn parse_spin(v: &str) -> Result<Option<Duration>, String> {
    match v.trim() {
        "" | "auto" => Ok(None),
        "off" => Ok(Some(Duration::ZERO)),
        n => n
            .parse::<u64>()
            .ok()
            .filter(|&us| us <= MAX_SPIN_US)
            .map(|us| Some(Duration::from_micros(us)))
            .ok_or_else(|| format!("expected auto, off or microseconds (0 to {MAX_SPIN_US})")),
    }
}

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

    /// Reads variables through `get` (tests pass a map).
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
            Some(v) => Some(parse_addr(&v)?),
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
        let connect_timeout = match get(vars::CONNECT_TIMEOUT) {
            Some(v) => {
                parse_seconds(&v).map_err(|e| invalid(vars::CONNECT_TIMEOUT, &v, e.to_string()))?
            }
            None => DEFAULT_CONNECT_TIMEOUT,
        };
        let liveness = match get(vars::LIVENESS) {
            Some(v) => {
                parse_seconds_or_off(&v).map_err(|e| invalid(vars::LIVENESS, &v, e.to_string()))?
            }
            None => Some(DEFAULT_LIVENESS),
        };
        let transport = match get(vars::TRANSPORT).as_deref().map(str::trim) {
            None | Some("" | "auto") => TransportChoice::Auto,
            Some("rings") => TransportChoice::Rings,
            Some("tcp") => TransportChoice::Tcp,
            Some(other) => {
                return Err(invalid(
                    vars::TRANSPORT,
                    other,
                    "expected `auto` (shared memory between ranks on one host, TCP between \
                     hosts), `rings` (shared-memory messages, but every rank its own copy of \
                     the pages) or `tcp`"
                        .into(),
                ))
            }
        };
        let segment_bytes = match get(vars::SEGMENT) {
            Some(v) => Some(
                parse_segment_size(&v).map_err(|e| invalid(vars::SEGMENT, &v, e.to_string()))?,
            ),
            None => None,
        };
        let segment_addr = match get(vars::SEGMENT_ADDR) {
            Some(v) => Some(
                usize::from_str_radix(v.trim().trim_start_matches("0x"), 16).map_err(|_| {
                    invalid(vars::SEGMENT_ADDR, &v, "expected a hex address".into())
                })?,
            ),
            None => None,
        };
        let race = RaceOptions::from_lookup(&get)?;
        let trace = TraceOptions::from_lookup(&get)?;
        let replay = ReplayOptions::from_lookup(&get)?;
        let local = LocalPlacement::from_lookup(&get)?;
        Ok(JobConfig {
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
            pin: get(vars::PIN).as_deref() == Some("1"),
            transport,
            local,
            stats_file: get(vars::STATS_FILE)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            push_pages: match get(vars::PUSH) {
                Some(v) => parse_push(&v).map_err(|e| invalid(vars::PUSH, &v, e))?,
                None => DEFAULT_PUSH_PAGES,
            },
            spin: match get(vars::SPIN) {
                Some(v) => parse_spin(&v).map_err(|e| invalid(vars::SPIN, &v, e))?,
                None => None,
            },
            sem_trace: get(vars::SEM_TRACE)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            coord_fd: parse_fd(vars::COORD_FD, get(vars::COORD_FD))?,
            launcher_fd: parse_fd(vars::LAUNCHER_FD, get(vars::LAUNCHER_FD))?,
            debug: DebugOptions::from_lookup(&get)?,
        })
    }

    /// The launcher-owned variables ([`vars::LAUNCHER_OWNED`]) that describe this
    /// configuration, for a launcher to hand to the rank; [`JobConfig::from_lookup`] reads
    /// them back to an equal value. Options the user sets for the whole job by environment
    /// (pinning, stats file, segment address, detector phases) are not included: the rank
    /// inherits them.
    pub fn to_env(&self) -> Vec<(&'static str, OsString)> {
        let mut env: Vec<(&'static str, OsString)> = vec![
            (vars::RANK, self.rank.to_string().into()),
            (vars::SIZE, self.size.to_string().into()),
            (vars::JOB_SECRET, self.secret.clone().into()),
        ];
        if self.launcher == Launcher::Dsmrun {
            env.push((vars::LAUNCHER, DSMRUN.into()));
        }
        if let Some(coord) = self.coord {
            env.push((vars::COORD, coord.to_string().into()));
        }
        if let Some(bytes) = self.segment_bytes {
            env.push((vars::SEGMENT, bytes.to_string().into()));
        }
        if self.connect_timeout != DEFAULT_CONNECT_TIMEOUT {
            env.push((
                vars::CONNECT_TIMEOUT,
                format_secs(self.connect_timeout).into(),
            ));
        }
        if let Some(fd) = self.coord_fd {
            env.push((vars::COORD_FD, fd.to_string().into()));
        }
        if self.liveness != Some(DEFAULT_LIVENESS) {
            env.push((vars::LIVENESS, format_secs_or_off(self.liveness).into()));
        }
        if let Some(fd) = self.launcher_fd {
            env.push((vars::LAUNCHER_FD, fd.to_string().into()));
        }
        if let Some(local) = self.local {
            env.push((vars::LOCAL_RANK, local.rank.to_string().into()));
            env.push((vars::LOCAL_SIZE, local.size.to_string().into()));
        }
        if let Some(p) = &self.sem_trace {
            env.push((vars::SEM_TRACE, p.clone().into_os_string()));
        }
        let trace = &self.trace;
        match &trace.mode {
            TraceMode::Off => {}
            TraceMode::Record(p) => env.push((vars::TRACE_VALUES, p.clone().into_os_string())),
            TraceMode::Compare(p) => env.push((vars::COMPARE, p.clone().into_os_string())),
        }
        if trace.full {
            env.push((vars::TRACE_FULL, "1".into()));
        }
        if !trace.vars.is_empty() {
            env.push((vars::TRACE_VARS, trace.vars.join(",").into()));
        }
        if trace.continue_all {
            env.push((vars::COMPARE_CONTINUE, "1".into()));
        }
        if trace.abs_tolerance_bits != 0 {
            env.push((
                vars::TOLERANCE,
                format!("{:?}", trace.abs_tolerance()).into(),
            ));
        }
        if trace.rel_tolerance_bits != 0 {
            env.push((
                vars::REL_TOLERANCE,
                format!("{:?}", trace.rel_tolerance()).into(),
            ));
        }
        if let Some(p) = &self.replay.record {
            env.push((vars::RECORD, p.clone().into_os_string()));
        }
        if let Some(p) = &self.replay.replay {
            env.push((vars::REPLAY, p.clone().into_os_string()));
        }
        if let Some(seed) = self.replay.chaos {
            env.push((vars::CHAOS, seed.to_string().into()));
        }
        let race = &self.race;
        if race.enabled {
            env.push((vars::RACE, "1".into()));
            env.push((vars::RACE_EXIT_CODE, race.exit_code.to_string().into()));
            if let Some(log) = &race.log {
                env.push((vars::RACE_LOG, log.clone().into_os_string()));
            }
            if race.first_only {
                env.push((vars::RACE_FIRST, "1".into()));
            }
            if race.stats {
                env.push((vars::RACE_STATS, "1".into()));
            }
            if race.schedule {
                env.push((vars::RACE_MODE, "schedule".into()));
            }
            if !race.schedule_ignore.is_empty() {
                env.push((vars::SCHEDULE_IGNORE, race.schedule_ignore.join(",").into()));
            }
            if race.check {
                env.push((vars::CHECK, "1".into()));
            }
            if let Some(sarif) = &race.sarif {
                env.push((vars::RACE_SARIF, sarif.clone().into_os_string()));
            }
            if !race.suppressions.is_empty() {
                env.push((vars::RACE_SUPPRESSIONS, race.suppressions.join("\n").into()));
            }
            if let Some(marker) = &race.started_marker {
                env.push((vars::RACE_STARTED, marker.clone().into_os_string()));
            }
            if !race.pinpoint.is_empty() {
                env.push((vars::PINPOINT, race.pinpoint.join(";").into()));
            }
            if let Some(dir) = &race.pinpoint_dir {
                env.push((vars::PINPOINT_DIR, dir.clone().into_os_string()));
            }
            if race.sem_order_safe {
                env.push((vars::SEM_ORDER, "safe".into()));
            }
        }
        env
    }
}

/// Value of `DSM_LAUNCHER` when dsmrun started the rank.
pub const DSMRUN: &str = "dsmrun";

impl RaceOptions {
    /// Reads the detector's settings through `get`; those only detection uses are read only with it on, so a leftover setting does not fail a plain run.
    fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<RaceOptions, ConfigError> {
        let enabled = flag(get, vars::RACE);
        let exit_code = match get(vars::RACE_EXIT_CODE) {
            Some(v) => v.trim().parse::<u8>().map_err(|_| {
                invalid(
                    vars::RACE_EXIT_CODE,
                    &v,
                    "expected an exit status 0..=255".into(),
                )
            })?,
            None => exit_codes::RACES_FOUND,
        };
        // Only read with detection on: a leftover setting must not fail a plain run.
        let phases = match get(vars::RACE_PHASES).filter(|_| enabled) {
            Some(v) => RacePhases::parse(v.trim()).ok_or_else(|| {
                invalid(
                    vars::RACE_PHASES,
                    &v,
                    "expected record, notices, compare or full".into(),
                )
            })?,
            None => RacePhases::Full,
        };
        Ok(RaceOptions {
            enabled,
            log: get(vars::RACE_LOG)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            exit_code,
            first_only: flag(get, vars::RACE_FIRST),
            stats: flag(get, vars::RACE_STATS),
            phases,
            schedule: match get(vars::RACE_MODE).filter(|_| enabled) {
                None => false,
                Some(v) => match v.trim() {
                    "" | "race" => false,
                    "schedule" => true,
                    _ => {
                        return Err(invalid(
                            vars::RACE_MODE,
                            &v,
                            "expected race or schedule".into(),
                        ))
                    }
                },
            },
            schedule_ignore: get(vars::SCHEDULE_IGNORE)
                .filter(|_| enabled)
                .map(|v| name_list(&v))
                .unwrap_or_default(),
            check: enabled && flag(get, vars::CHECK),
            batch_intervals: match get(vars::RACE_BATCH).filter(|_| enabled) {
                None => DEFAULT_RACE_BATCH,
                Some(v) => v
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&b| b > 0)
                    .ok_or_else(|| {
                        invalid(
                            vars::RACE_BATCH,
                            &v,
                            "expected a number of intervals, at least 1".into(),
                        )
                    })?,
            },
            verify_incremental: enabled && flag(get, vars::RACE_VERIFY_INCREMENTAL),
            sarif: get(vars::RACE_SARIF)
                .filter(|s| enabled && !s.is_empty())
                .map(PathBuf::from),
            suppressions: get(vars::RACE_SUPPRESSIONS)
                .filter(|_| enabled)
                .map(|s| s.lines().map(str::to_string).collect())
                .unwrap_or_default(),
            started_marker: get(vars::RACE_STARTED)
                .filter(|s| enabled && !s.is_empty())
                .map(PathBuf::from),
            pinpoint: get(vars::PINPOINT)
                .filter(|_| enabled)
                .map(|v| {
                    v.split(';')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            pinpoint_dir: get(vars::PINPOINT_DIR)
                .filter(|s| enabled && !s.is_empty())
                .map(PathBuf::from),
            sem_order_safe: match get(vars::SEM_ORDER).filter(|_| enabled) {
                None => false,
                Some(v) => match v.trim() {
                    "" | "observed" => false,
                    "safe" => true,
                    _ => {
                        return Err(invalid(
                            vars::SEM_ORDER,
                            &v,
                            "expected observed or safe".into(),
                        ))
                    }
                },
            },
        })
    }
}

impl TraceOptions {
    /// Reads value tracing and comparison through `get`.
    fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<TraceOptions, ConfigError> {
        let tolerance = |var: &'static str| -> Result<u64, ConfigError> {
            match get(var) {
                None => Ok(0),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| *x >= 0.0 && x.is_finite())
                    .map(f64::to_bits)
                    .ok_or_else(|| invalid(var, &v, "expected a non-negative number".into())),
            }
        };
        let mode = match (get(vars::TRACE_VALUES), get(vars::COMPARE)) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    vars::COMPARE,
                    "",
                    format!(
                        "{} and {} exclude each other",
                        vars::TRACE_VALUES,
                        vars::COMPARE
                    ),
                ))
            }
            (Some(p), None) if !p.is_empty() => TraceMode::Record(PathBuf::from(p)),
            (None, Some(p)) if !p.is_empty() => TraceMode::Compare(PathBuf::from(p)),
            _ => TraceMode::Off,
        };
        Ok(TraceOptions {
            mode,
            full: flag(get, vars::TRACE_FULL),
            vars: get(vars::TRACE_VARS)
                .map(|v| name_list(&v))
                .unwrap_or_default(),
            continue_all: flag(get, vars::COMPARE_CONTINUE),
            abs_tolerance_bits: tolerance(vars::TOLERANCE)?,
            rel_tolerance_bits: tolerance(vars::REL_TOLERANCE)?,
        })
    }
}

impl ReplayOptions {
    /// Reads recording, replay and chaos through `get` (recording and replay exclude each other).
    fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<ReplayOptions, ConfigError> {
        let replay =
            ReplayOptions {
                record: get(vars::RECORD)
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from),
                replay: get(vars::REPLAY)
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from),
                chaos: match get(vars::CHAOS).filter(|s| !s.is_empty()) {
                    None => None,
                    Some(v) => Some(v.trim().parse::<u64>().map_err(|_| {
                        invalid(vars::CHAOS, &v, "expected a seed 0..=2^64-1".into())
                    })?),
                },
            };
        if replay.record.is_some() && replay.replay.is_some() {
            return Err(invalid(
                vars::REPLAY,
                "",
                format!("{} and {} exclude each other", vars::RECORD, vars::REPLAY),
            ));
        }
        Ok(replay)
    }
}

impl LocalPlacement {
    /// Reads this rank's place on its host through `get`, if the launcher gave both halves.
    fn from_lookup(
        get: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<LocalPlacement>, ConfigError> {
        Ok(match (get(vars::LOCAL_RANK), get(vars::LOCAL_SIZE)) {
            (Some(r), Some(s)) => {
                let local = LocalPlacement {
                    rank: parse_num(vars::LOCAL_RANK, &r)?,
                    size: parse_num(vars::LOCAL_SIZE, &s)?,
                };
                if local.rank >= local.size {
                    return Err(invalid(
                        vars::LOCAL_RANK,
                        &r,
                        format!("must be below {} {s}", vars::LOCAL_SIZE),
                    ));
                }
                Some(local)
            }
            _ => None,
        })
    }
}

/// This rank, the job's size and who launched it: from `DSM_RANK`/`DSM_SIZE`, else Slurm,
/// Open MPI or PMI variables, else a single node; the size within `1..=MAX_NODES` and the
/// rank below it.
fn rank_and_size(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<(usize, usize, Launcher), ConfigError> {
    let (rank, size, launcher) = if let Some(rank) = get(vars::RANK) {
        let size = get(vars::SIZE).ok_or(ConfigError::Missing(vars::RANK, vars::SIZE))?;
        let launcher = if get(vars::LAUNCHER).as_deref() == Some(DSMRUN) {
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
    } else if let (Some(r), Some(s)) = (get("OMPI_COMM_WORLD_RANK"), get("OMPI_COMM_WORLD_SIZE")) {
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
        return Err(ConfigError::Invalid {
            var: vars::SIZE,
            value: size.to_string(),
            why: format!("job size must be 1..={MAX_NODES}"),
        });
    }
    if rank >= size {
        return Err(ConfigError::Invalid {
            var: vars::RANK,
            value: rank.to_string(),
            why: format!("rank must be below the job size {size}"),
        });
    }
    Ok((rank, size, launcher))
}

/// The error for `var`'s `value`, which does not parse: `why`.
fn invalid(var: &'static str, value: &str, why: String) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        why,
    }
}

/// Whether the switch `k` is on (set, not empty, not 0).
fn flag(get: &impl Fn(&str) -> Option<String>, k: &str) -> bool {
    matches!(get(k).as_deref(), Some(v) if v != "0" && !v.is_empty())
}

/// A comma-separated list of names, blanks dropped (`grid, forces`).
fn name_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// An inherited file descriptor: above the standard streams.
fn parse_fd(var: &'static str, v: Option<String>) -> Result<Option<i32>, ConfigError> {
    let Some(v) = v else {
        return Ok(None);
    };
    match v.trim().parse::<i32>() {
        Ok(fd) if fd > 2 => Ok(Some(fd)),
        _ => Err(ConfigError::Invalid {
            var,
            value: v,
            why: "expected a file descriptor above 2".into(),
        }),
    }
}

fn parse_num(var: &'static str, v: &str) -> Result<usize, ConfigError> {
    v.trim().parse().map_err(|_| ConfigError::Invalid {
        var,
        value: v.to_string(),
        why: "expected a non-negative integer".into(),
    })
}

fn parse_addr(v: &str) -> Result<SocketAddr, ConfigError> {
    let invalid = |why: String| ConfigError::Invalid {
        var: vars::COORD,
        value: v.to_string(),
        why,
    };
    v.to_socket_addrs()
        .map_err(|e| invalid(format!("expected host:port ({e})")))?
        .next()
        .ok_or_else(|| invalid("resolves to no address".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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

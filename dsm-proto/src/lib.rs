//! The vocabulary every part of dsm speaks, with no I/O in it: the messages nodes exchange
//! and the values they carry ([`wire`]: node ids, page numbers and runs, vector time,
//! interval records, read/write notices, bitmaps), the job configuration a launcher writes
//! and every rank reads ([`config`]), the units it is written in ([`units`]), the names of
//! the environment variables ([`env_vars`]), the exit statuses ([`exit_codes`]), the page
//! size, and the liveness rules with the message that names a silent rank ([`liveness`]). The protocol engine, the transport, the race detector and the launcher all build on
//! these single definitions.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod config_error;
pub mod launchers;
pub mod liveness;
pub mod segment_base;
pub mod stats;
pub mod units;
pub mod wire;

pub use config::{
    ConfigError, JobConfig, Launcher, LocalPlacement, RaceOptions, RacePhases, ReplayOptions,
    TraceMode, TraceOptions, TransportChoice,
};
pub use stats::PlanStats;
pub use units::{
    format_secs, format_secs_or_off, parse_seconds, parse_seconds_or_off, parse_segment_size,
    parse_size, ValueError,
};
pub use wire::*;

/// Bytes per page of the shared segment: the unit of coherence, protection and transfer.
pub const PAGE_SIZE: usize = 4096;

/// Names of dsm's own shared allocations (value-trace hashes) start with this; programs
/// may not use it, and traces and dynamic checks leave those allocations out.
pub const INTERNAL_ALLOC_PREFIX: &str = "__dsm_";

/// `log2(PAGE_SIZE)`: `offset >> PAGE_SHIFT` is the page holding byte `offset` of the
/// segment.
pub const PAGE_SHIFT: u32 = 12;
/// Largest shared segment (16 TiB): page numbers ([`PageNo`]) are 32-bit. A node's
/// bookkeeping grows with the pages allocated, not with this size, so reserving the
/// maximum costs address space only.
pub const MAX_SEGMENT_BYTES: u64 = (PageNo::MAX as u64 + 1) * PAGE_SIZE as u64;

/// Upper bound on job size: node ids are 16-bit and vector timestamps grow with N.
pub const MAX_NODES: usize = 1024;

/// Exit statuses with a meaning shared by the ranks and the launcher.
pub mod exit_codes {
    /// An input file is damaged: a record to replay or a reference trace that is truncated,
    /// of another version, or whose checksum does not match (sysexits' `EX_DATAERR`).
    pub const CORRUPT_INPUT: u8 = 65;
    /// Default exit status of rank 0 when data races were reported.
    pub const RACES_FOUND: u8 = 66;
    /// A `--replay` run deviated from its record (another program or arguments, another
    /// node count, an acquire or barrier the record does not have there, or intervals that
    /// differ from the recorded ones). The launcher reports it as "replay diverged".
    pub const REPLAY_DIVERGED: u8 = 67;
    /// Rank 0 of a `--compare` run found values that differ from the reference trace
    /// (`dsm-compare` exits with it too). The launcher reports it as "values differ",
    /// not as a crash.
    pub const VALUES_DIFFER: u8 = 68;
    /// A rank stopped because it lost a peer (the peer crashed or was killed, or sent
    /// nothing for the liveness deadline). Such exits are consequences, not causes: the
    /// launcher reports the rank that really failed.
    pub const PEER_LOST: i32 = 71;
    /// The job's wall-clock limit expired (as `timeout(1)`).
    pub const TIMED_OUT: u8 = 124;
    /// The program exists but cannot be executed (as the shell).
    pub const NOT_EXECUTABLE: u8 = 126;
    /// The program was not found (as the shell).
    pub const NOT_FOUND: u8 = 127;
}

/// Names of the environment variables that carry a [`JobConfig`] to each rank.
pub mod env_vars {
    /// This process's rank, `0..DSM_SIZE`.
    pub const RANK: &str = "DSM_RANK";
    /// Number of ranks in the job.
    pub const SIZE: &str = "DSM_SIZE";
    /// `IP:PORT` where rank 0 listens for the rendezvous.
    pub const COORD: &str = "DSM_COORD";
    /// Rank 0 only: file descriptor of the rendezvous socket, already bound and listening,
    /// inherited from the launcher so that no other process can take the port first.
    pub const COORD_FD: &str = "DSM_COORD_FD";
    /// Random per-job secret that ranks use to recognise each other.
    pub const JOB_SECRET: &str = "DSM_JOB_SECRET";
    /// Name of the launcher that started the rank (`dsmrun`).
    pub const LAUNCHER: &str = "DSM_LAUNCHER";
    /// Shared segment size in bytes.
    pub const SEGMENT: &str = "DSM_SEGMENT";
    /// Address (hex) where the segment is mapped in every rank.
    pub const SEGMENT_ADDR: &str = "DSM_SEGMENT_ADDR";
    /// Seconds to keep trying to connect to the other ranks.
    pub const CONNECT_TIMEOUT: &str = "DSM_CONNECT_TIMEOUT";
    /// Seconds a peer may send nothing before the rank stops the job; `0` or `off` turns
    /// the check off.
    pub const LIVENESS: &str = "DSM_LIVENESS";
    /// `1` when race detection is on.
    pub const RACE: &str = "DSM_RACE";
    /// Absolute path of the JSON-lines race log (rank 0 writes it).
    pub const RACE_LOG: &str = "DSM_RACE_LOG";
    /// Pinpoint: `;`-separated elements to watch, each `VAR[INDEX]@EPOCH`
    /// (`dsmrun --pinpoint`, `--pinpoint-log`).
    pub const PINPOINT: &str = "DSM_PINPOINT";
    /// Pinpoint: the directory where nodes leave the source locations of watched
    /// accesses for the barrier master (made by dsmrun).
    pub const PINPOINT_DIR: &str = "DSM_PINPOINT_DIR";
    /// Absolute path of the SARIF 2.1.0 file rank 0 writes at finish (`--race-sarif`).
    pub const RACE_SARIF: &str = "DSM_RACE_SARIF";
    /// The entries of `--race-suppressions FILE`, one a line (dsmrun reads and checks
    /// the file; the ranks get its entries).
    pub const RACE_SUPPRESSIONS: &str = "DSM_RACE_SUPPRESSIONS";
    /// A path rank 0 creates once every rank has joined, so that dsmrun, after a failed
    /// job, says that race detection was cut short only when it had begun (jobs on this
    /// machine).
    pub const RACE_STARTED: &str = "DSM_RACE_STARTED";
    /// Exit status of rank 0 when races were reported (`0`: exit normally).
    pub const RACE_EXIT_CODE: &str = "DSM_RACE_EXIT_CODE";
    /// `1`: report only first races (the paper's section 6.4).
    pub const RACE_FIRST: &str = "DSM_RACE_FIRST";
    /// `schedule`: schedule mode, lock edges left out of the order (`--race=schedule`).
    pub const RACE_MODE: &str = "DSM_RACE_MODE";
    /// Comma-separated variables whose lock-order dependences are muted
    /// (`--schedule-ignore`).
    pub const SCHEDULE_IGNORE: &str = "DSM_SCHEDULE_IGNORE";
    /// `1`: DVM-style dynamic checks (`--check`); needs `DSM_RACE=1`.
    pub const CHECK: &str = "DSM_CHECK";
    /// Intervals a node closes between barriers before shipping them to the race master
    /// for incremental analysis (default 1024).
    pub const RACE_BATCH: &str = "DSM_RACE_BATCH";
    /// `1` (tests): check the incremental race analysis against barrier-time analysis at
    /// every barrier.
    pub const RACE_VERIFY_INCREMENTAL: &str = "DSM_RACE_VERIFY_INCREMENTAL";
    /// `1`: print race detector statistics.
    pub const RACE_STATS: &str = "DSM_RACE_STATS";
    /// How much of the detector runs (`record`, `notices`, `compare`, `full`); benchmarks only.
    pub const RACE_PHASES: &str = "DSM_RACE_PHASES";
    /// `1`: pin each rank to its own core.
    pub const PIN: &str = "DSM_PIN";
    /// `1`: in a job across hosts, the ranks of each host map one copy of the pages
    /// homed there, and the protocol runs between hosts only.
    pub const HOST_MEMORY: &str = "DSM_HOST_MEMORY";
    /// `0`: every page fault goes through the comm thread, none is served inside the
    /// SIGSEGV handler (for A/B measurements); `1` or unset: write faults on valid pages
    /// are served in the handler.
    pub const FAST_FAULTS: &str = "DSM_FAST_FAULTS";
    /// How long a thread waiting for a remote reply polls (yielding its core) before it
    /// sleeps: `auto` (the default: 200 us when the host has a core per rank, else 0),
    /// `off`/`0`, or microseconds.
    pub const SPIN: &str = "DSM_SPIN";
    /// This rank's index among the ranks on its host (for pinning).
    pub const LOCAL_RANK: &str = "DSM_LOCAL_RANK";
    /// Number of ranks on this rank's host (for pinning).
    pub const LOCAL_SIZE: &str = "DSM_LOCAL_SIZE";
    /// File descriptor of the read end of a pipe whose write end only the launcher holds:
    /// when it reports end-of-file, the launcher is gone and the rank stops.
    pub const LAUNCHER_FD: &str = "DSM_LAUNCHER_FD";
    /// Path where the rank writes its protocol and detector counters as JSON at finish
    /// (`%r` is replaced by the rank).
    pub const STATS_FILE: &str = "DSM_STATS_FILE";
    /// Pages a home pushes with one lock grant or barrier arrival to a node holding a copy,
    /// instead of letting the write notices invalidate it: a count, `on` (the default,
    /// [`DEFAULT_PUSH_PAGES`](crate::config::DEFAULT_PUSH_PAGES)) or `off`/`0` (every
    /// notice invalidates, as before pushing existed; for A/B measurements).
    pub const PUSH: &str = "DSM_PUSH";
    /// Value tracing: path of the trace file rank 0 writes (`dsmrun --trace-values`).
    pub const TRACE_VALUES: &str = "DSM_TRACE_VALUES";
    /// `1`: traces keep every allocation's values (`--trace-values-full`).
    pub const TRACE_FULL: &str = "DSM_TRACE_FULL";
    /// Comma-separated allocations whose values traces keep (`--trace-vars`).
    pub const TRACE_VARS: &str = "DSM_TRACE_VARS";
    /// Path of the reference trace rank 0 compares with at every barrier (`--compare`).
    pub const COMPARE: &str = "DSM_COMPARE";
    /// `1`: report every differing trace point instead of stopping at the first.
    pub const COMPARE_CONTINUE: &str = "DSM_COMPARE_CONTINUE";
    /// Absolute tolerance for f64/f32 elements in comparisons.
    pub const TOLERANCE: &str = "DSM_TOLERANCE";
    /// Relative tolerance for f64/f32 elements in comparisons.
    pub const REL_TOLERANCE: &str = "DSM_REL_TOLERANCE";
    /// Path of the user's key file, from which jobs under Slurm's `srun` derive their
    /// secret (default `~/.config/dsm/job-key`; see [`crate::launchers`]).
    pub const KEY_FILE: &str = "DSM_KEY_FILE";
    /// Tests only: `DSM_TEST_OCCUPY_BASE=R` makes rank R map a page at the default segment
    /// base before start-up, as a library or a launcher's shared memory might on another
    /// host, to exercise the segment base agreement ([`crate::segment_base`]).
    pub const TEST_OCCUPY_BASE: &str = "DSM_TEST_OCCUPY_BASE";
    /// Set (to anything): rank 0 prints the value trace's size at finish (measurements).
    pub const TRACE_STATS: &str = "DSM_TRACE_STATS";
    /// Record the synchronization order: path prefix of the part file each rank writes at
    /// finish (`<prefix>.<rank>`), which the launcher merges into the record
    /// (`dsmrun --record`).
    pub const RECORD: &str = "DSM_RECORD";
    /// Replay the synchronization order of this record file (`dsmrun --replay`).
    pub const REPLAY: &str = "DSM_REPLAY";
    /// Seed of the random delays of chaos mode (`dsmrun --chaos`).
    pub const CHAOS: &str = "DSM_CHAOS";
    /// `safe`: the race detector orders semaphore operations by the always-happens-before
    /// order (`dsmrun --sem-order=safe`); `observed` (the default) by the run's pairing.
    pub const SEM_ORDER: &str = "DSM_SEM_ORDER";
    /// Semaphore trace: each rank writes its part to this path plus `.rank<R>`
    /// (`dsmrun --sem-trace`).
    pub const SEM_TRACE: &str = "DSM_SEM_TRACE";
    /// `tcp`: every link of the job uses TCP; `auto` (the default): ranks that can map the
    /// same memory (one host, one network namespace) exchange messages through shared
    /// memory, the others over TCP. The user's to set; ranks inherit it.
    pub const TRANSPORT: &str = "DSM_TRANSPORT";
    /// Log filter for binaries that install dsm's logging (`tracing` env-filter syntax).
    pub const LOG: &str = "DSM_LOG";

    /// The variables a launcher owns: it clears them all from what ranks inherit and sets
    /// its own, so a nested or leftover setting never leaks into a job. The others
    /// (`DSM_SEGMENT_ADDR`, `DSM_RACE_PHASES`, `DSM_RACE_BATCH`, `DSM_PIN`, `DSM_HOST_MEMORY`,
    /// `DSM_FAST_FAULTS`, `DSM_STATS_FILE`, `DSM_PUSH`, `DSM_SPIN`, `DSM_LOG`) are the user's to set for
    /// a whole job and reach the ranks by inheritance. These are exactly the variables
    /// [`JobConfig::to_env`](crate::JobConfig::to_env) can write (a test checks it).
    pub const LAUNCHER_OWNED: [&str; 37] = [
        PINPOINT,
        PINPOINT_DIR,
        RACE_SARIF,
        RACE_SUPPRESSIONS,
        RACE_STARTED,
        RECORD,
        REPLAY,
        CHAOS,
        SEM_ORDER,
        SEM_TRACE,
        TRACE_VALUES,
        TRACE_FULL,
        TRACE_VARS,
        COMPARE,
        COMPARE_CONTINUE,
        TOLERANCE,
        REL_TOLERANCE,
        RANK,
        SIZE,
        COORD,
        COORD_FD,
        JOB_SECRET,
        LAUNCHER,
        SEGMENT,
        CONNECT_TIMEOUT,
        LIVENESS,
        RACE,
        RACE_LOG,
        RACE_EXIT_CODE,
        RACE_FIRST,
        RACE_STATS,
        RACE_MODE,
        SCHEDULE_IGNORE,
        CHECK,
        LOCAL_RANK,
        LOCAL_SIZE,
        LAUNCHER_FD,
    ];
}

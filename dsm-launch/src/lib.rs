//! The job launcher behind `dsmrun`: it owns turning a [`LaunchConfig`] into N
//! running rank processes, on this machine or on other hosts (through [`agent`], one
//! `dsmrun-agent` per rank started by `ssh` or another launch agent, on hosts laid out
//! by [`hosts`]), and supervising them to the end.
//!
//! That covers finding the program, building each rank's `DSM_*` environment,
//! starting every rank in its own process group, forwarding the ranks' output
//! line by line with a `[rank] ` prefix, and stopping the whole job on the
//! first failure, on timeout or on a signal, so that no rank outlives the job.
//! A rank that stops responding (a peer reports it silent for the liveness
//! deadline, see [`dsm_proto::liveness`]) counts as the first failure: it is
//! named and killed, since a stopped process never exits by itself.
//! The rank-side reading of the environment lives with the bootstrap code, not
//! here: both sides share [`dsm_proto::JobConfig`], which the launcher writes with
//! [`JobConfig::to_env`] and every rank reads back.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod hosts;

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::pipe2;
use nix::unistd::{access, AccessFlags, Pid};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::os::fd::{AsRawFd, OwnedFd};
use tracing::{debug, warn};

use agent::{AgentOrder, BindTo};
use dsm_proto::config::{DEFAULT_CONNECT_TIMEOUT, DSMRUN};
use dsm_proto::liveness::{PeerLoss, Silence, DEFAULT_LIVENESS};
use dsm_proto::{
    env_vars, exit_codes, format_secs, JobConfig, Launcher, LocalPlacement, RaceOptions,
    ReplayOptions, TraceMode, TraceOptions,
};
use hosts::{HostSlots, HostsError, MapBy};

pub mod order;

/// Largest job `dsmrun` starts (vector times grow with the job, and dsmrun keeps three
/// threads per rank).
pub const MAX_RANKS: usize = 256;

/// How long ranks get to exit after SIGTERM (failure or timeout) before SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(2);

/// How long a peer-lost exit waits for the root cause to show up.
const COLLATERAL_WAIT: Duration = Duration::from_secs(1);

/// How long a peer-lost exit waits for the rank it reported losing to exit too, when that
/// rank still runs as far as dsmrun knows: its exit is on its way (its peers saw its
/// connections end), but may reach dsmrun late on a busy machine.
const LOST_PEER_WAIT: Duration = Duration::from_secs(5);

/// How long dsmrun waits, after a rank exited, for the end of its output before judging
/// the exit without it: only processes the rank left behind can hold its pipes open that
/// long. Until then the exit waits, so that what the rank printed before exiting (a silent
/// or lost peer, its agent's start report) is known when the exit is judged.
const OUTPUT_WAIT: Duration = Duration::from_secs(5);

/// The same across hosts: a remote rank's exit reaches dsmrun through its agent and the
/// launch agent's session, later than its peers' reports of losing it may.
const COLLATERAL_WAIT_ACROSS_HOSTS: Duration = Duration::from_secs(3);

/// How long ranks get to exit after a forwarded SIGINT/SIGTERM/SIGHUP before
/// SIGKILL; longer than [`TERM_GRACE`] because an interrupted program may want
/// to print a report.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);

/// After SIGKILL a process can only linger in the kernel (e.g. uninterruptible
/// I/O); we wait this long for it and then stop waiting rather than hang.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// Once every rank has exited, leftover descendants may still hold the output
/// pipes open; we wait this long before killing them, and as long again before
/// abandoning their output.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Forwarding threads only hold a small buffer on the stack; with up to 768 of
/// them the default 2 MiB reservation is pointless.
/// How long the other ranks may take to exit after one exited with the race exit code
/// before dsmrun says it waits for them.
const RACE_EXIT_NOTE_AFTER: Duration = Duration::from_secs(2);

const THREAD_STACK: usize = 128 * 1024;

/// Errors that stop a job from being launched at all. [`LaunchError::exit_code`] maps each
/// to `dsmrun`'s exit status. When one happens after some ranks were started, [`run`] has
/// killed those ranks (and waited a bounded time to reap them) before returning it.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// [`LaunchConfig::ranks`] is 0 or above [`MAX_RANKS`]; carries the number given.
    #[error("the number of ranks must be between 1 and {MAX_RANKS}, got {0}")]
    InvalidRankCount(usize),
    /// A bare program name was found neither next to `dsmrun` nor on `PATH`.
    #[error("cannot find program '{}' ({})", name.to_string_lossy(), looked_in(exe_dir.as_deref()))]
    ProgramNotFound {
        /// The name as given.
        name: OsString,
        /// The directory searched before `PATH` (where `dsmrun` lives), if known.
        exe_dir: Option<PathBuf>,
    },
    /// A program given as a path (it contains `/`) does not exist.
    #[error("cannot find program '{}': no such file", .0.display())]
    ProgramPathNotFound(PathBuf),
    /// The program exists but cannot be run: a directory, not a regular file, or without
    /// execute permission. For a bare name, reported only if no runnable candidate exists.
    #[error("cannot run '{}': {reason}", path.display())]
    NotExecutable {
        /// The file found.
        path: PathBuf,
        /// Why it cannot be run.
        reason: &'static str,
    },
    /// No free port for rank 0's rendezvous where it listens (loopback unless
    /// `--bind-address` or `--interface` says otherwise).
    #[error("cannot pick a free TCP port on {where_} for the rendezvous")]
    NoFreePort {
        /// The address it tried to listen on.
        where_: String,
        /// Why it could not.
        #[source]
        error: io::Error,
    },
    /// The signal handlers that forward Ctrl-C and friends to the ranks could not be set.
    #[error("cannot install the SIGINT/SIGTERM/SIGHUP handlers")]
    Signals(#[source] io::Error),
    /// Starting a rank process failed (e.g. the file is not a valid executable).
    #[error("cannot start rank {rank} ('{}')", program.display())]
    Spawn {
        /// The rank that could not be started.
        rank: usize,
        /// The resolved program.
        program: PathBuf,
        /// The error from starting the process.
        #[source]
        source: io::Error,
    },
    /// The host list cannot be used (bad hostfile, too few slots).
    #[error(transparent)]
    Hosts(#[from] HostsError),
    /// `dsmrun-agent`, which runs ranks on other hosts, is not next to `dsmrun`.
    #[error("cannot find dsmrun-agent next to dsmrun ({}): it starts the ranks on other hosts, and must be installed there at the same path", .0.display())]
    AgentMissing(PathBuf),
    /// `--launch-agent` is empty or does not split into words.
    #[error("--launch-agent {0:?} is not a command")]
    BadLaunchAgent(String),
    /// The rendezvous address cannot be chosen (`--interface` unknown here, a host name
    /// that does not resolve).
    #[error("cannot choose the rendezvous address: {0}")]
    Rendezvous(String),
    /// A job-wide variable of the launcher's environment (one of [`JOB_WIDE_VARS`], which
    /// every rank inherits) does not parse; caught before any rank starts.
    #[error("bad job-wide setting in dsmrun's environment (every rank would inherit it)")]
    JobEnvironment(#[source] dsm_proto::config::ConfigError),
    /// An output file of the job cannot be written (a missing directory, no permission, a
    /// read-only file system, a directory by that name); found before any rank starts.
    #[error("cannot write {flag} '{}': {reason}; no rank was started", path.display())]
    UnwritableOutput {
        /// The option that names the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it cannot be written.
        reason: String,
    },
    /// A thread that waits for a rank or forwards its output could not be started.
    #[error("cannot start a supervision thread for rank {rank}")]
    Thread {
        /// The rank the thread was for.
        rank: usize,
        /// The error from the thread spawn.
        #[source]
        source: io::Error,
    },
}

fn looked_in(exe_dir: Option<&Path>) -> String {
    match exe_dir {
        Some(dir) => format!("looked in {} and on PATH", dir.display()),
        None => "looked on PATH".to_owned(),
    }
}

impl LaunchError {
    /// Exit code `dsmrun` uses for this error, following the shell's
    /// conventions (127: not found, 126: found but cannot be executed).
    pub fn exit_code(&self) -> u8 {
        match self {
            LaunchError::InvalidRankCount(_)
            | LaunchError::Hosts(_)
            | LaunchError::BadLaunchAgent(_)
            | LaunchError::JobEnvironment(_)
            | LaunchError::UnwritableOutput { .. } => 2,
            LaunchError::AgentMissing(_) => 127,
            LaunchError::Rendezvous(_) => 1,
            LaunchError::ProgramNotFound { .. } | LaunchError::ProgramPathNotFound(_) => 127,
            LaunchError::NotExecutable { .. } => 126,
            LaunchError::Spawn { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => 127,
                io::ErrorKind::PermissionDenied => 126,
                _ if source.raw_os_error() == Some(Errno::ENOEXEC as i32) => 126,
                _ => 1,
            },
            LaunchError::NoFreePort { .. }
            | LaunchError::Signals(_)
            | LaunchError::Thread { .. } => 1,
        }
    }
}

/// Everything needed to launch one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Number of rank processes, `1..=MAX_RANKS`.
    pub ranks: usize,
    /// As the user gave it; resolved by [`resolve_program`] at launch.
    pub program: OsString,
    /// Passed to every rank untouched.
    pub args: Vec<OsString>,
    /// Shared segment size in bytes, passed as `DSM_SEGMENT`; `None`: the ranks' default.
    pub segment_bytes: Option<u64>,
    /// How long ranks keep trying to reach each other at startup.
    pub connect_timeout: Option<Duration>,
    /// Wall-clock limit for the whole job.
    pub timeout: Option<Duration>,
    /// How long a rank may send its peers nothing before they stop the job naming it
    /// (`None`: never); [`DEFAULT_LIVENESS`] unless set.
    pub liveness: Option<Duration>,
    /// Race detection (`enabled` off: none).
    pub race: RaceOptions,
    /// Value tracing or comparison with a reference trace.
    pub trace: TraceOptions,
    /// The hosts to run on (`--hostfile`, `-H`); `None`: every rank on this machine.
    pub hosts: Option<HostPlan>,
    /// Variables set in every rank's environment (`-x VAR[=VALUE]`), on every host.
    pub forward_env: Vec<(String, String)>,
    /// Where rank 0 listens for the rendezvous (`--bind-address`, `--interface`); `None`:
    /// 127.0.0.1 for a job on this machine, else the address its host was reached at.
    pub bind: Option<BindTo>,
    /// Recording (the ranks' part-file prefix), replay (the record) and chaos of the
    /// synchronization order; see [`order`].
    pub replay: ReplayOptions,
    /// Semaphore trace (`--sem-trace FILE`): ranks write `FILE.rank<R>`, merged into
    /// `FILE` after the job by [`merge_sem_trace`].
    pub sem_trace: Option<PathBuf>,
}

/// How a job spreads over hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPlan {
    /// The hosts and their slots, in order.
    pub hosts: Vec<HostSlots>,
    /// How ranks are laid onto the slots.
    pub map_by: MapBy,
    /// Allow more ranks than slots.
    pub oversubscribe: bool,
    /// The command that runs a command on a host (`ssh`), split into words; the host name
    /// and the command follow it.
    pub launch_agent: Vec<String>,
}

/// The default `--launch-agent`.
pub const DEFAULT_LAUNCH_AGENT: &str = "ssh";

/// Variables the user sets for a whole job in dsmrun's environment: local ranks inherit
/// them, ranks on other hosts get them from dsmrun.
pub const JOB_WIDE_VARS: [&str; 10] = [
    env_vars::SEGMENT_ADDR,
    env_vars::TRANSPORT,
    env_vars::RACE_PHASES,
    env_vars::PIN,
    env_vars::HOST_MEMORY,
    env_vars::FAST_FAULTS,
    env_vars::STATS_FILE,
    env_vars::PUSH,
    env_vars::SPIN,
    env_vars::LOG,
];

/// Reads the job-wide variables ([`JOB_WIDE_VARS`]) through `get` as a rank will read
/// them, so that a bad value stops the job in the launcher with one message instead of in
/// every rank.
fn check_job_wide_env(get: impl Fn(&str) -> Option<String>) -> Result<(), LaunchError> {
    dsm_proto::JobConfig::from_lookup(|k| JOB_WIDE_VARS.contains(&k).then(|| get(k)).flatten())
        .map(drop)
        .map_err(LaunchError::JobEnvironment)
}

impl LaunchConfig {
    /// One rank of `program` with no arguments and no options.
    pub fn new(program: impl Into<OsString>) -> Self {
        LaunchConfig {
            ranks: 1,
            program: program.into(),
            args: Vec::new(),
            segment_bytes: None,
            connect_timeout: None,
            timeout: None,
            liveness: Some(DEFAULT_LIVENESS),
            race: RaceOptions::default(),
            trace: TraceOptions::default(),
            hosts: None,
            forward_env: Vec::new(),
            bind: None,
            replay: ReplayOptions::default(),
            sem_trace: None,
        }
    }
}

/// Merges the ranks' parts of a semaphore trace (`path.rank<R>`) into `path` and removes
/// the parts; on an error (a part missing or corrupt) the parts are left for inspection.
pub fn merge_sem_trace(path: &std::path::Path, ranks: usize) -> Result<(), String> {
    let mut parts = Vec::new();
    for r in 0..ranks {
        let p = dsm_ahb::format::part_path(path, r);
        let f = std::fs::File::open(&p)
            .map_err(|e| format!("semaphore trace part {}: {e}", p.display()))?;
        parts.push(std::io::BufReader::new(f));
    }
    let out = std::fs::File::create(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    dsm_ahb::format::merge_parts(parts, std::io::BufWriter::new(out))
        .map_err(|e| format!("semaphore trace {}: {e}", path.display()))?;
    for r in 0..ranks {
        let _ = std::fs::remove_file(dsm_ahb::format::part_path(path, r));
    }
    Ok(())
}

/// How a rank process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankStatus {
    /// The rank exited on its own with this status.
    Exited(i32),
    /// A signal killed the rank.
    Signaled {
        /// The signal number (e.g. 11 for SIGSEGV).
        signal: i32,
        /// Whether the kernel wrote a core dump.
        core_dumped: bool,
    },
    /// The wait itself failed; we no longer know anything about the rank.
    Unknown,
}

impl From<ExitStatus> for RankStatus {
    fn from(status: ExitStatus) -> Self {
        if let Some(code) = status.code() {
            RankStatus::Exited(code)
        } else if let Some(signal) = status.signal() {
            RankStatus::Signaled {
                signal,
                core_dumped: status.core_dumped(),
            }
        } else {
            RankStatus::Unknown
        }
    }
}

impl RankStatus {
    fn is_success(self) -> bool {
        self == RankStatus::Exited(0)
    }

    /// `dsmrun`'s exit code when this is the first failure: the rank's own status (as
    /// mpirun passes it on), 128+signal for a signal death (as a shell reports it), and 1
    /// where neither says anything: a rank that left with status 0 while the others still
    /// needed it, an unknown end, or a status that would read as one of dsmrun's own
    /// ([`is_dsmrun_status`]).
    pub fn failure_exit_code(self) -> u8 {
        match self {
            RankStatus::Signaled { signal, .. } => signal_exit_code(signal),
            RankStatus::Exited(code) => match u8::try_from(code) {
                Ok(code) if code != 0 && !is_dsmrun_status(code) => code,
                _ => 1,
            },
            RankStatus::Unknown => 1,
        }
    }
}

impl fmt::Display for RankStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RankStatus::Exited(code) => write!(f, "exited with status {code}"),
            RankStatus::Signaled {
                signal,
                core_dumped,
            } => {
                write!(f, "was killed by signal {signal}")?;
                if let Some(name) = signal_name(signal) {
                    write!(f, " ({name})")?;
                }
                if core_dumped {
                    write!(f, ", core dumped")?;
                }
                Ok(())
            }
            RankStatus::Unknown => write!(f, "ended in an unknown way (waiting for it failed)"),
        }
    }
}

/// `SIGSEGV` for 11, etc.; `None` for numbers that are not signals here.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    Signal::try_from(signal).ok().map(Signal::as_str)
}

/// Statuses with a meaning of dsmrun's own (races found, replay diverged, values differ,
/// peer lost, timeout, not executable, not found, signals): a failing rank's status that
/// equals one of them is not passed on, so that they keep meaning only that.
pub fn is_dsmrun_status(code: u8) -> bool {
    code == exit_codes::CORRUPT_INPUT
        || code == exit_codes::RACES_FOUND
        || code == exit_codes::REPLAY_DIVERGED
        || code == exit_codes::VALUES_DIFFER
        || i32::from(code) == exit_codes::PEER_LOST
        || code == exit_codes::TIMED_OUT
        || code == exit_codes::NOT_EXECUTABLE
        || code == exit_codes::NOT_FOUND
        || code > 128
}

fn signal_exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// How a launched job ended; [`JobOutcome::exit_code`] is what `dsmrun` exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Every rank exited 0.
    Success,
    /// Some ranks exited with the race exit code and no rank failed.
    RaceReported {
        /// The ranks that exited with the race exit code, in exit order.
        ranks: Vec<usize>,
        /// That exit code, which `dsmrun` exits with too.
        exit_code: u8,
    },
    /// The first rank to fail, and how; the others were stopped.
    RankFailed {
        /// The failing rank. A rank that exited only because it lost a peer is reported
        /// only if no other rank's failure shows up shortly after.
        rank: usize,
        /// How it ended.
        status: RankStatus,
    },
    /// A peer reported this rank silent for the liveness deadline (stopped, wedged or
    /// unreachable); it was killed and the others stopped.
    RankSilent(Silence),
    /// `--timeout` expired.
    TimedOut {
        /// The limit that expired.
        after: Duration,
    },
    /// With `--compare`, a rank (rank 0) found values that differ from the reference
    /// trace and exited with [`exit_codes::VALUES_DIFFER`]; the others were stopped.
    ValuesDiffer {
        /// The rank that reported it.
        rank: usize,
    },
    /// A rank on another host never started: its launch agent failed before the rank ran
    /// (e.g. the host is unreachable) or did not report within the connect timeout.
    NotStarted {
        /// The rank.
        rank: usize,
        /// Its host.
        host: String,
    },
    /// With `--replay`, a rank found that the run deviates from the record and exited with
    /// [`exit_codes::REPLAY_DIVERGED`]; the others were stopped.
    ReplayDiverged {
        /// The rank that reported it.
        rank: usize,
    },
    /// `dsmrun` received this signal and stopped the job.
    Interrupted {
        /// The signal number (SIGINT, SIGTERM or SIGHUP).
        signal: i32,
    },
}

impl JobOutcome {
    /// The status `dsmrun` exits with: 0 on success, the race exit code, the failing
    /// rank's [`RankStatus::failure_exit_code`], 1 for a silent rank, 124 on timeout, or
    /// 128 + the signal that interrupted the job.
    pub fn exit_code(&self) -> u8 {
        match self {
            JobOutcome::Success => 0,
            JobOutcome::RaceReported { exit_code, .. } => *exit_code,
            JobOutcome::RankFailed { status, .. } => status.failure_exit_code(),
            JobOutcome::RankSilent(_) | JobOutcome::NotStarted { .. } => 1,
            JobOutcome::TimedOut { .. } => 124,
            JobOutcome::ValuesDiffer { .. } => exit_codes::VALUES_DIFFER,
            JobOutcome::ReplayDiverged { .. } => exit_codes::REPLAY_DIVERGED,
            JobOutcome::Interrupted { signal } => signal_exit_code(*signal),
        }
    }
}

/// Finds the executable to run for `name`.
///
/// A name containing `/` is a path and is used as is. A bare name is looked up
/// first in `exe_dir` (where `dsmrun` itself lives, so the apps installed next
/// to it win) and then on `path_var`, taking the first executable regular file
/// like `execvp` does.
pub fn resolve_program(
    name: &OsStr,
    exe_dir: Option<&Path>,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, LaunchError> {
    if name.as_bytes().contains(&b'/') {
        let path = PathBuf::from(name);
        return match inspect_candidate(&path) {
            Candidate::Runnable => Ok(path),
            Candidate::Missing => Err(LaunchError::ProgramPathNotFound(path)),
            Candidate::Directory => Err(LaunchError::NotExecutable {
                path,
                reason: "it is a directory",
            }),
            Candidate::Unusable(reason) => Err(LaunchError::NotExecutable { path, reason }),
        };
    }
    let not_found = || LaunchError::ProgramNotFound {
        name: name.to_owned(),
        exe_dir: exe_dir.map(Path::to_path_buf),
    };
    if name.is_empty() {
        return Err(not_found());
    }
    let path_dirs = path_var
        .map(|p| std::env::split_paths(p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        // An empty PATH entry means the current directory.
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            }
        });
    let mut unusable = None;
    for dir in exe_dir.map(Path::to_path_buf).into_iter().chain(path_dirs) {
        let candidate = dir.join(name);
        match inspect_candidate(&candidate) {
            Candidate::Runnable => return Ok(candidate),
            // Remembered so "exists but not executable" beats "not found",
            // which is the more useful thing to tell the user.
            Candidate::Unusable(reason) => {
                unusable.get_or_insert((candidate, reason));
            }
            // A directory of that name (target/debug/build, ...) is just not it.
            Candidate::Missing | Candidate::Directory => {}
        }
    }
    match unusable {
        Some((path, reason)) => Err(LaunchError::NotExecutable { path, reason }),
        None => Err(not_found()),
    }
}

enum Candidate {
    Missing,
    Directory,
    Unusable(&'static str),
    Runnable,
}

fn inspect_candidate(path: &Path) -> Candidate {
    let Ok(meta) = path.metadata() else {
        return Candidate::Missing;
    };
    if meta.is_dir() {
        Candidate::Directory
    } else if !meta.is_file() {
        Candidate::Unusable("it is not a regular file")
    } else if access(path, AccessFlags::X_OK).is_err() {
        Candidate::Unusable("it is not executable (no execute permission)")
    } else {
        Candidate::Runnable
    }
}

/// 32 hex characters from the thread-local CSPRNG; new for every job so ranks
/// of different jobs never mistake each other for peers.
pub fn generate_secret() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Rank 0's rendezvous socket: bound to a free port on 127.0.0.1 and listening. Rank 0
/// inherits the socket itself (`DSM_COORD_FD`), so no other process can take the port
/// between the launcher's choice and rank 0's start.
pub fn bind_rendezvous() -> io::Result<TcpListener> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
}

/// The job configuration of one rank, as the launcher hands it over.
pub fn rank_config(
    config: &LaunchConfig,
    rank: usize,
    coord: SocketAddr,
    secret: &str,
) -> JobConfig {
    JobConfig {
        rank,
        size: config.ranks,
        launcher: Launcher::Dsmrun,
        coord: Some(coord),
        secret: secret.to_owned(),
        connect_timeout: config.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        liveness: config.liveness,
        segment_bytes: config.segment_bytes,
        // Inherited from dsmrun's environment by the ranks, not written by it.
        segment_addr: None,
        race: config.race.clone(),
        trace: config.trace.clone(),
        replay: config.replay.clone(),
        pin: false,
        host_memory: false,
        // Inherited from dsmrun's environment (a job-wide variable), not written by it.
        transport: Default::default(),
        // Every rank of a dsmrun job runs on this machine.
        local: Some(LocalPlacement {
            rank,
            size: config.ranks,
        }),
        stats_file: None,
        // Inherited like the stats file.
        push_pages: dsm_proto::config::DEFAULT_PUSH_PAGES,
        spin: None,
        sem_trace: config.sem_trace.clone(),
        // Set by spawn_rank, which makes the pipe.
        launcher_fd: None,
        coord_fd: None,
        // Inherited from dsmrun's environment, not written by it.
        debug: Default::default(),
    }
}

/// Checks that every file the job will write can be written, before any rank starts (a
/// typo in a directory must not cost a whole run). A launcher calls it before [`run`], and
/// before it points `--record` at the ranks' part files, so messages name the user's path. The record and the semaphore trace
/// are merged by dsmrun here; the race log, the SARIF file and a value trace are written
/// by rank 0, so they are checked here only when rank 0 runs on this host (no host list).
pub fn check_outputs(config: &LaunchConfig) -> Result<(), LaunchError> {
    let trace = match &config.trace.mode {
        TraceMode::Record(p) => Some(p.as_path()),
        _ => None,
    };
    let local = config.hosts.is_none();
    // The record is written whole and renamed into place, which would put a file in
    // place of a device or FIFO by that name: it must be a file, or not exist yet.
    let outputs = [
        ("--record", config.replay.record.as_deref(), true, true),
        ("--sem-trace", config.sem_trace.as_deref(), true, false),
        ("--race-log", config.race.log.as_deref(), local, false),
        ("--race-sarif", config.race.sarif.as_deref(), local, false),
        ("--trace-values", trace, local, false),
    ];
    for (flag, path, check, renamed) in outputs {
        if let (Some(path), true) = (path, check) {
            writable(path, renamed).map_err(|reason| LaunchError::UnwritableOutput {
                flag,
                path: path.to_path_buf(),
                reason,
            })?;
        }
    }
    Ok(())
}

/// Whether `path` can be written: an existing file is opened for appending (and left as
/// it was), otherwise a probe file is made and removed in its directory. A file written
/// elsewhere and `renamed` into place must be a regular file (through symlinks) if it
/// exists.
fn writable(path: &Path, renamed: bool) -> Result<(), String> {
    if path.is_dir() {
        return Err("it is a directory".into());
    }
    if renamed && path.exists() && !path.is_file() {
        return Err(
            "it is not a regular file (a device, FIFO or socket), and the file is written whole \
             and renamed into place"
                .into(),
        );
    }
    if path.exists() {
        return std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map(drop)
            .map_err(|e| e.to_string());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!("no directory '{}'", dir.display()));
    }
    let probe = dir.join(format!(".dsmrun-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| format!("cannot create files in '{}': {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Launches the job described by `config`, forwards its output to this
/// process's stdout/stderr, and returns once every rank has been reaped.
///
/// Installs handlers for SIGINT, SIGTERM and SIGHUP for the duration (they are
/// forwarded to the ranks), so call it from the process's main flow.
pub fn run(config: &LaunchConfig) -> Result<JobOutcome, LaunchError> {
    if !(1..=MAX_RANKS).contains(&config.ranks) {
        return Err(LaunchError::InvalidRankCount(config.ranks));
    }
    check_job_wide_env(|k| std::env::var(k).ok())?;
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let program = resolve_program(
        &config.program,
        exe_dir.as_deref(),
        std::env::var_os("PATH").as_deref(),
    )?;
    if let Some(plan) = &config.hosts {
        let host_of = hosts::map_ranks(&plan.hosts, config.ranks, plan.map_by, plan.oversubscribe)?;
        let this_host = this_host_name();
        let all_here = host_of
            .iter()
            .all(|&h| hosts::is_local_host(&plan.hosts[h].name, this_host.as_deref()));
        if !all_here {
            return run_across_hosts(config, plan, &host_of, &program, exe_dir.as_deref());
        }
    }
    let (rendezvous, where_) = match &config.bind {
        None => (bind_rendezvous(), "127.0.0.1".to_owned()),
        Some(bind) => {
            let addr = local_bind_addr(bind)?;
            (TcpListener::bind(addr), addr.ip().to_string())
        }
    };
    let no_port = |error| LaunchError::NoFreePort {
        where_: where_.clone(),
        error,
    };
    let rendezvous = rendezvous.map_err(no_port)?;
    let coord = rendezvous.local_addr().map_err(no_port)?;
    let mut rendezvous = Some(rendezvous);
    let secret = generate_secret();
    debug!(program = %program.display(), ranks = config.ranks, %coord, "launching job");

    let (tx, rx) = mpsc::channel();
    // Installed before the first spawn: a Ctrl-C that killed dsmrun with the
    // default action would orphan ranks sitting in their own process groups.
    let _signals = SignalWatch::install(tx.clone()).map_err(LaunchError::Signals)?;
    let mut job = Job::new(config, rx);
    for rank in 0..config.ranks {
        // Only rank 0 gets the socket; dsmrun's own copy closes once rank 0 has it.
        let listener = if rank == 0 { rendezvous.take() } else { None };
        let started = spawn_rank(config, &program, rank, coord, listener, &secret)
            .map_err(|source| LaunchError::Spawn {
                rank,
                program: program.clone(),
                source,
            })
            .and_then(|(child, lifeline)| {
                job.lifelines.push(lifeline);
                job.adopt(rank, child, &tx)
            });
        if let Err(err) = started {
            job.abort();
            return Err(err);
        }
    }
    Ok(job.supervise(config.timeout))
}

/// A pipe whose read end the rank inherits and whose write end only dsmrun holds (it is
/// close-on-exec, so no rank inherits another's). However dsmrun ends, even by SIGKILL,
/// the kernel closes the write end, the rank reads end-of-file and stops: no rank outlives
/// its launcher, even behind a wrapper script that keeps the fd.
fn lifeline() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
    fcntl(read.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
    Ok((read, write))
}

fn spawn_rank(
    config: &LaunchConfig,
    program: &Path,
    rank: usize,
    coord: SocketAddr,
    rendezvous: Option<TcpListener>,
    secret: &str,
) -> io::Result<(Child, OwnedFd)> {
    let mut command = Command::new(program);
    command.args(&config.args);
    for var in env_vars::LAUNCHER_OWNED {
        command.env_remove(var);
    }
    let (lifeline_read, lifeline_write) = lifeline()?;
    let mut job = rank_config(config, rank, coord, secret);
    job.launcher_fd = Some(lifeline_read.as_raw_fd());
    command.envs(config.forward_env.iter().map(|(k, v)| (k, v)));
    if let Some(listener) = &rendezvous {
        // Inherited by this child only: no other spawn happens while the flag is clear.
        fcntl(listener.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
        job.coord_fd = Some(listener.as_raw_fd());
    }
    command
        .envs(job.to_env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own group: one killpg then reaches the rank and everything it forked,
        // and a terminal's Ctrl-C reaches only dsmrun, which stops the job in
        // order instead of every process dying at once.
        .process_group(0);
    let child = command.spawn()?;
    // Only the rank may hold the read end, or the next rank would inherit it too.
    drop(lifeline_read);
    drop(rendezvous);
    Ok((child, lifeline_write))
}

/// This machine's host name, to recognise it in a host list.
fn this_host_name() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
}

/// The address `bind` means on this machine.
fn local_bind_addr(bind: &BindTo) -> Result<SocketAddr, LaunchError> {
    match bind {
        BindTo::Addr(a) => Ok(*a),
        BindTo::Interface(name) => agent::interface_addr(name)
            .map(|ip| SocketAddr::new(ip, 0))
            .map_err(LaunchError::Rendezvous),
        BindTo::Auto(host) => route_to(host),
    }
}

/// The local address this machine uses to reach `host`: connecting a UDP socket asks the
/// routing table without sending anything.
fn route_to(host: &str) -> Result<SocketAddr, LaunchError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let target = std::net::ToSocketAddrs::to_socket_addrs(&(bare, 9))
        .map_err(|e| LaunchError::Rendezvous(format!("cannot resolve host {host}: {e}")))?
        .next()
        .ok_or_else(|| LaunchError::Rendezvous(format!("host {host} resolves to no address")))?;
    let any: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let probe = std::net::UdpSocket::bind(any)
        .and_then(|p| p.connect(target).map(|()| p))
        .and_then(|p| p.local_addr())
        .map_err(|e| LaunchError::Rendezvous(format!("no route to host {host}: {e}")))?;
    Ok(SocketAddr::new(probe.ip(), 0))
}

/// The ranks' environment that dsmrun hands an agent, as text: the rank's configuration,
/// the user's job-wide variables from dsmrun's environment, and the `-x` variables.
fn agent_env(config: &LaunchConfig, job: &JobConfig) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = job
        .to_env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_string_lossy().into_owned()))
        .collect();
    for var in JOB_WIDE_VARS {
        if let Some(v) = std::env::var_os(var) {
            env.push((var.to_owned(), v.to_string_lossy().into_owned()));
        }
    }
    env.extend(config.forward_env.iter().cloned());
    env
}

/// Runs a job whose ranks are (partly) on other hosts: one `dsmrun-agent` per rank, started
/// through the launch agent (`ssh HOST`) or, for ranks on this machine, directly. See
/// [`agent`] for what dsmrun and the agents say to each other.
fn run_across_hosts(
    config: &LaunchConfig,
    plan: &HostPlan,
    host_of: &[usize],
    program: &Path,
    exe_dir: Option<&Path>,
) -> Result<JobOutcome, LaunchError> {
    let agent_exe = exe_dir
        .map(|d| d.join("dsmrun-agent"))
        .unwrap_or_else(|| PathBuf::from("dsmrun-agent"));
    if !agent_exe.is_file() {
        return Err(LaunchError::AgentMissing(agent_exe));
    }
    if plan.launch_agent.is_empty() {
        return Err(LaunchError::BadLaunchAgent(String::new()));
    }
    let this_host = this_host_name();
    let is_here = |h: usize| hosts::is_local_host(&plan.hosts[h].name, this_host.as_deref());
    let bind0 = rank0_bind(config, plan, host_of, is_here)?;
    let placements = local_placements(host_of, plan.hosts.len());
    let secret = generate_secret();
    let remote_command = remote_agent_command(&agent_exe, program, &config.args);
    debug!(program = %program.display(), ranks = config.ranks, hosts = ?plan.hosts, "launching job across hosts");

    let (tx, rx) = mpsc::channel();
    let _signals = SignalWatch::install(tx.clone()).map_err(LaunchError::Signals)?;
    let mut job = Job::new(config, rx);
    job.start_deadline =
        Some(job.started + config.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT));
    job.launch_agent = plan.launch_agent.join(" ");
    for (rank, &h) in host_of.iter().enumerate() {
        let host = &plan.hosts[h];
        let order = agent_order(config, rank, &secret, placements[rank], &bind0);
        let (mut command, spawned) = if is_here(h) {
            (
                local_agent_command(&agent_exe, program, &config.args),
                agent_exe.as_os_str(),
            )
        } else {
            let mut c = Command::new(&plan.launch_agent[0]);
            c.args(&plan.launch_agent[1..])
                .arg(&host.name)
                .arg(&remote_command);
            (c, OsStr::new(&plan.launch_agent[0]))
        };
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let started = command
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                rank,
                program: PathBuf::from(spawned),
                source,
            })
            .and_then(|child| job.adopt_agent(rank, child, &tx, &host.name, order));
        if let Err(err) = started {
            job.abort();
            return Err(err);
        }
    }
    // Rank 0 first: its agent binds the rendezvous, and its ready line tells the others
    // where it is.
    job.send_order(0, None);
    Ok(job.supervise(config.timeout))
}

/// Where rank 0's agent binds the rendezvous.
fn rank0_bind(
    config: &LaunchConfig,
    plan: &HostPlan,
    host_of: &[usize],
    is_here: impl Fn(usize) -> bool,
) -> Result<BindTo, LaunchError> {
    let first_remote = host_of
        .iter()
        .copied()
        .find(|&h| !is_here(h))
        .expect("a job across hosts has a remote host");
    Ok(match &config.bind {
        Some(b) if is_here(host_of[0]) => BindTo::Addr(local_bind_addr(b)?),
        Some(b) => b.clone(),
        // Rank 0 here, others elsewhere: the address this machine reaches them from.
        None if is_here(host_of[0]) => BindTo::Addr(route_to(&plan.hosts[first_remote].name)?),
        None => BindTo::Auto(plan.hosts[host_of[0]].name.clone()),
    })
}

/// Each rank's place among the ranks of its host, in rank order.
fn local_placements(host_of: &[usize], hosts: usize) -> Vec<LocalPlacement> {
    let mut per_host = vec![0; hosts];
    for &h in host_of {
        per_host[h] += 1;
    }
    let mut seen = vec![0; hosts];
    host_of
        .iter()
        .map(|&h| {
            let placement = LocalPlacement {
                rank: seen[h],
                size: per_host[h],
            };
            seen[h] += 1;
            placement
        })
        .collect()
}

/// The command the launch agent runs on a remote host: the agent, then the program.
fn remote_agent_command(agent_exe: &Path, program: &Path, args: &[OsString]) -> String {
    let mut remote_words = vec![
        agent_exe.to_string_lossy().into_owned(),
        "--".to_owned(),
        program.to_string_lossy().into_owned(),
    ];
    remote_words.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
    shell_words::join(&remote_words)
}

/// The agent of a rank on this machine, started directly.
fn local_agent_command(agent_exe: &Path, program: &Path, args: &[OsString]) -> Command {
    let mut c = Command::new(agent_exe);
    c.arg("--").arg(program).args(args);
    for var in env_vars::LAUNCHER_OWNED {
        c.env_remove(var);
    }
    c
}

/// What dsmrun tells `rank`'s agent.
fn agent_order(
    config: &LaunchConfig,
    rank: usize,
    secret: &str,
    placement: LocalPlacement,
    bind0: &BindTo,
) -> AgentOrder {
    let mut rank_job = JobConfig {
        coord: None,
        ..rank_config(
            config,
            rank,
            "0.0.0.0:0".parse().expect("an address"),
            secret,
        )
    };
    rank_job.local = Some(placement);
    AgentOrder {
        env: agent_env(config, &rank_job),
        bind: (rank == 0).then(|| bind0.clone()),
        cwd: std::env::current_dir()
            .ok()
            .and_then(|d| d.to_str().map(String::from)),
    }
}

/// dsmrun's end of a rank's agent.
struct AgentLink {
    /// The agent's stdin: the order, then signals; dropping it tells the agent to stop.
    stdin: Option<ChildStdin>,
    /// The order not sent yet (ranks above 0 wait for rank 0's rendezvous address).
    order: Option<AgentOrder>,
    /// The agent reported the rank started.
    ready: bool,
}

/// Largest status a rank under an agent exits with that means "killed by a signal": the
/// agent reports a signal death as 128 + the signal, as a shell does.
const AGENT_SIGNAL_EXITS: std::ops::RangeInclusive<i32> = 129..=(128 + 64);

/// What the waiter, forwarder and signal threads tell the supervisor.
enum Event {
    /// A rank was reaped.
    Exited { rank: usize, status: RankStatus },
    /// One of a rank's output streams reached end-of-file.
    StreamClosed { rank: usize },
    /// dsmrun received this signal.
    Signal(i32),
    /// A rank printed that a peer has been silent for the liveness deadline.
    Silent(Silence),
    /// A rank printed that it lost a peer (its connection ended or broke).
    Lost(PeerLoss),
    /// A rank's exit, ready to be judged: it was reaped and its output read to the end
    /// (or [`OUTPUT_WAIT`] passed). Made by the supervisor from [`Event::Exited`].
    ExitReady { rank: usize, status: RankStatus },
    /// A rank's agent started it; rank 0's tells where the rendezvous is.
    AgentReady {
        rank: usize,
        coord: Option<SocketAddr>,
    },
}

#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

impl Sink {
    fn write_line(self, line: &[u8]) -> io::Result<()> {
        // Holding the lock for the whole line is what keeps ranks from
        // interleaving mid-line; flushing per line shows progress promptly.
        match self {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(line)?;
                out.flush()
            }
            Sink::Stderr => {
                let mut err = io::stderr().lock();
                err.write_all(line)?;
                err.flush()
            }
        }
    }
}

/// Prints one `dsmrun: ...` line on stderr, under the same lock as the ranks'
/// forwarded stderr lines.
fn note(args: fmt::Arguments<'_>) {
    let line = format!("{DSMRUN}: {args}\n");
    // Nothing sensible to do if stderr is gone.
    let _ = Sink::Stderr.write_line(line.as_bytes());
}

/// Copies `source` to `sink` line by line with a `[rank] ` prefix. Works on
/// bytes so non-UTF-8 output passes through unchanged. With `silences`, a line
/// in which the rank reports a silent peer ([`Silence`]) is also sent there.
/// Longest piece of a line dsmrun holds: a rank printing more without a newline has its
/// output forwarded in pieces of this size, each on a prefixed line of its own, so that
/// dsmrun's memory stays bounded whatever the rank prints.
pub const MAX_FORWARDED_LINE: usize = 64 * 1024;

fn forward_lines(
    rank: usize,
    source: impl Read,
    sink: Sink,
    silences: Option<Sender<Event>>,
    mut agent_ready: Option<Sender<Event>>,
) {
    let prefix = format!("[{rank}] ");
    let mut reader = BufReader::with_capacity(MAX_FORWARDED_LINE, source);
    let mut line = Vec::with_capacity(prefix.len() + MAX_FORWARDED_LINE + 1);
    line.extend_from_slice(prefix.as_bytes());
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                debug!(rank, %err, "reading rank output failed");
                return;
            }
        };
        let eof = chunk.is_empty();
        let room = prefix.len() + MAX_FORWARDED_LINE - line.len();
        let take = match chunk.iter().position(|&b| b == b'\n') {
            Some(nl) if nl < room => nl + 1,
            _ => chunk.len().min(room),
        };
        line.extend_from_slice(&chunk[..take]);
        reader.consume(take);
        let complete = line.last() == Some(&b'\n');
        let full = line.len() >= prefix.len() + MAX_FORWARDED_LINE;
        let pending = line.len() > prefix.len();
        if complete || full || (eof && pending) {
            if !complete {
                line.push(b'\n');
            }
            // An agent's first line says it started the rank; it is not the rank's.
            if let Some(tx) = agent_ready.take() {
                let coord = std::str::from_utf8(&line[prefix.len()..])
                    .ok()
                    .and_then(|l| agent::parse_ready(l.trim_end_matches('\n')));
                if let Some(coord) = coord {
                    let _ = tx.send(Event::AgentReady { rank, coord });
                    line.truncate(prefix.len());
                    if eof {
                        return;
                    }
                    continue;
                }
            }
            if let Some(tx) = &silences {
                let silence = std::str::from_utf8(&line[prefix.len()..])
                    .ok()
                    .and_then(Silence::parse)
                    .filter(|s| s.reporter == rank);
                if let Some(silence) = silence {
                    let _ = tx.send(Event::Silent(silence));
                } else if let Some(loss) = std::str::from_utf8(&line[prefix.len()..])
                    .ok()
                    .and_then(PeerLoss::parse)
                    .filter(|l| l.reporter == rank)
                {
                    let _ = tx.send(Event::Lost(loss));
                }
            }
            if let Err(err) = sink.write_line(&line) {
                // Our own output is gone (e.g. piped into `head`). Returning drops
                // the pipe, so the rank sees EPIPE/SIGPIPE just as it would have
                // writing there directly, instead of us draining it forever.
                debug!(rank, %err, "forwarding rank output failed");
                return;
            }
            line.truncate(prefix.len());
        }
        if eof {
            return;
        }
    }
}

fn spawn_thread(
    rank: usize,
    name: String,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, LaunchError> {
    thread::Builder::new()
        .name(name)
        .stack_size(THREAD_STACK)
        .spawn(body)
        .map_err(|source| LaunchError::Thread { rank, source })
}

/// Turns SIGINT/SIGTERM/SIGHUP into [`Event::Signal`]s until dropped.
struct SignalWatch {
    handle: signal_hook::iterator::Handle,
    thread: Option<JoinHandle<()>>,
}

impl SignalWatch {
    fn install(tx: Sender<Event>) -> io::Result<Self> {
        let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
        let handle = signals.handle();
        let thread = thread::Builder::new()
            .name("dsmrun-signals".to_owned())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                for signal in signals.forever() {
                    if tx.send(Event::Signal(signal)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(SignalWatch {
            handle,
            thread: Some(thread),
        })
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct RankProc {
    /// Also the process group id, thanks to `process_group(0)`. For a rank under an agent,
    /// the agent's (or the launch agent's, e.g. ssh's) process.
    pid: Pid,
    status: Option<RankStatus>,
    open_streams: u8,
    /// The host, in a job across hosts.
    host: Option<String>,
    /// The rank's agent, in a job across hosts.
    agent: Option<AgentLink>,
    /// The peer this rank reported it lost or found silent, if it did.
    lost: Option<usize>,
    /// The rank was reaped but its output is still open: its exit is judged when the
    /// output ends, or at this instant.
    unjudged: Option<(RankStatus, Instant)>,
}

struct Job {
    ranks: Vec<RankProc>,
    /// Write ends of the ranks' lifelines, held until dsmrun exits.
    lifelines: Vec<OwnedFd>,
    rx: Receiver<Event>,
    race_exit_code: Option<i32>,
    /// `--check` is on: the race exit code also means check findings.
    checking: bool,
    /// `--compare` is on: the values-differ exit status is an outcome, not a crash.
    compare: bool,
    /// `--replay` is on: the replay-diverged exit status is an outcome, not a crash.
    replaying: bool,
    started: Instant,
    /// Ranks run under agents (a job across hosts).
    agents: bool,
    /// Every agent must have started its rank by then.
    start_deadline: Option<Instant>,
    /// The launch agent command, for messages.
    launch_agent: String,
}

/// A rank exited with the peer-lost status and no cause has been found yet.
struct Collateral {
    /// The first such rank, and its status.
    rank: usize,
    status: RankStatus,
    /// When its exit was judged.
    since: Instant,
    /// When to stop waiting for the rank that actually failed.
    until: Instant,
}

/// Why the job is being stopped early; the first cause wins.
enum StopCause {
    RankFailed { rank: usize, status: RankStatus },
    ValuesDiffer { rank: usize },
    ReplayDiverged { rank: usize },
    RankSilent(Silence),
    NotStarted { rank: usize, host: String },
    TimedOut(Duration),
    Signal(i32),
}

struct Stopping {
    cause: StopCause,
    /// When to escalate to SIGKILL; `None` once SIGKILL has been sent.
    kill_at: Option<Instant>,
    /// After SIGKILL, when to stop waiting for ranks that still have not exited.
    give_up_at: Option<Instant>,
    /// What was sent first, for the escalation message.
    first_signal: Signal,
    grace: Duration,
}

/// What `supervise` carries from one pass of its loop to the next.
struct Supervision {
    timeout: Option<Duration>,
    /// When the job times out.
    deadline: Option<Instant>,
    stopping: Option<Stopping>,
    /// The ranks that exited with the race exit code.
    race_ranks: Vec<usize>,
    /// The first rank that exited because it lost a peer, and until when to wait for
    /// the rank that actually failed.
    collateral: Option<Collateral>,
    /// A rank that exited with the race exit code while others still ran, and when to
    /// say that dsmrun waits for them: only if they are still running by then (they
    /// normally finish at once, and a note as the last line made the job look stuck).
    race_exit: Option<(Instant, usize, i32)>,
    /// Exits reaped and with their output read, in the order they became ready.
    ready: VecDeque<(usize, RankStatus)>,
}

impl Supervision {
    fn new(deadline: Option<Instant>, timeout: Option<Duration>) -> Self {
        Supervision {
            timeout,
            deadline,
            stopping: None,
            race_ranks: Vec::new(),
            collateral: None,
            race_exit: None,
            ready: VecDeque::new(),
        }
    }

    fn outcome(self, race_exit_code: Option<i32>) -> JobOutcome {
        match self.stopping.map(|stop| stop.cause) {
            Some(StopCause::RankFailed { rank, status }) => JobOutcome::RankFailed { rank, status },
            Some(StopCause::RankSilent(silence)) => JobOutcome::RankSilent(silence),
            Some(StopCause::NotStarted { rank, host }) => JobOutcome::NotStarted { rank, host },
            Some(StopCause::ValuesDiffer { rank }) => JobOutcome::ValuesDiffer { rank },
            Some(StopCause::ReplayDiverged { rank }) => JobOutcome::ReplayDiverged { rank },
            Some(StopCause::TimedOut(after)) => JobOutcome::TimedOut { after },
            Some(StopCause::Signal(signal)) => JobOutcome::Interrupted { signal },
            None if !self.race_ranks.is_empty() => JobOutcome::RaceReported {
                ranks: self.race_ranks,
                exit_code: race_exit_code
                    .and_then(|c| u8::try_from(c).ok())
                    .unwrap_or(exit_codes::RACES_FOUND),
            },
            None => JobOutcome::Success,
        }
    }
}

/// What a step of `supervise`'s loop decided about the current pass.
enum Pass {
    /// Go on with this pass.
    Proceed,
    /// Start the next pass at once (its checks must see what just changed).
    Again,
    /// Stop supervising.
    End,
}

impl Job {
    fn new(config: &LaunchConfig, rx: Receiver<Event>) -> Job {
        Job {
            ranks: Vec::with_capacity(config.ranks),
            lifelines: Vec::with_capacity(config.ranks),
            rx,
            race_exit_code: config.race.races_found_exit(),
            checking: config.race.check,
            compare: matches!(config.trace.mode, TraceMode::Compare(_)),
            replaying: config.replay.replay.is_some(),
            started: Instant::now(),
            agents: config.hosts.is_some(),
            start_deadline: None,
            launch_agent: String::new(),
        }
    }

    /// `rank 3`, or `rank 3 (host node2)` in a job across hosts.
    fn who(&self, rank: usize) -> String {
        match self.ranks.get(rank).and_then(|r| r.host.as_deref()) {
            Some(host) => format!("rank {rank} (host {host})"),
            None => format!("rank {rank}"),
        }
    }

    /// Sends `rank`'s agent its order, with the rendezvous address for ranks above 0.
    fn send_order(&mut self, rank: usize, coord: Option<SocketAddr>) {
        let Some(link) = self.ranks[rank].agent.as_mut() else {
            return;
        };
        let Some(mut order) = link.order.take() else {
            return;
        };
        if let Some(coord) = coord {
            order
                .env
                .push((env_vars::COORD.to_owned(), coord.to_string()));
        }
        let written = match link.stdin.as_mut() {
            Some(stdin) => stdin
                .write_all(order.to_text().as_bytes())
                .and_then(|()| stdin.flush()),
            None => Err(io::ErrorKind::BrokenPipe.into()),
        };
        if let Err(err) = written {
            // The agent is gone; its exit, reported by its waiter, tells the story.
            debug!(rank, %err, "writing the order to the agent failed");
        }
    }

    /// Sends `signal` to `rank`: to its process group here, or through its agent, which
    /// signals the rank's group on its host. An agent that has not started its rank yet
    /// (or cannot be written to) is itself signalled: the launch agent's end closes the
    /// connection, and the remote agent stops whatever it started.
    fn signal_rank(&self, rank: usize, signal: Signal) {
        let proc = &self.ranks[rank];
        if let Some(link) = &proc.agent {
            if link.ready {
                if let Some(mut stdin) = link.stdin.as_ref() {
                    if stdin
                        .write_all(format!("signal {}\n", signal as i32).as_bytes())
                        .and_then(|()| stdin.flush())
                        .is_ok()
                    {
                        return;
                    }
                }
            }
        }
        signal_group(proc.pid, signal);
    }

    /// Starts the waiter and output forwarders for a freshly spawned rank.
    fn adopt(
        &mut self,
        rank: usize,
        mut child: Child,
        tx: &Sender<Event>,
    ) -> Result<(), LaunchError> {
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"));
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        self.ranks.push(RankProc {
            pid,
            status: None,
            open_streams: 0,
            host: None,
            agent: None,
            lost: None,
            unjudged: None,
        });
        let via_agent = self.agents;
        // The waiter comes first so a started rank is always reaped, even if
        // starting a forwarder fails below.
        let waiter_tx = tx.clone();
        let waiter = spawn_thread(rank, format!("dsmrun-wait-{rank}"), move || {
            let status = child.wait().map(RankStatus::from).unwrap_or_else(|err| {
                warn!(rank, %err, "waiting for rank failed");
                RankStatus::Unknown
            });
            let status = match status {
                RankStatus::Exited(code) if via_agent && AGENT_SIGNAL_EXITS.contains(&code) => {
                    RankStatus::Signaled {
                        signal: code - 128,
                        core_dumped: false,
                    }
                }
                other => other,
            };
            let _ = waiter_tx.send(Event::Exited { rank, status });
        });
        if let Err(err) = waiter {
            // Without a waiter nobody would report this rank's exit, so count
            // it as gone and make sure it is.
            signal_group(pid, Signal::SIGKILL);
            self.ranks[rank].status = Some(RankStatus::Unknown);
            return Err(err);
        }
        let streams = [
            stdout.map(|s| Box::new(s) as Box<dyn Read + Send>),
            stderr.map(|s| Box::new(s) as Box<dyn Read + Send>),
        ];
        for (source, (sink, kind)) in streams
            .into_iter()
            .zip([(Sink::Stdout, "out"), (Sink::Stderr, "err")])
        {
            let Some(source) = source else { continue };
            let tx = tx.clone();
            // Ranks print fatal errors, silences among them, on stderr.
            let silences = matches!(sink, Sink::Stderr).then(|| tx.clone());
            let agent_ready = (via_agent && matches!(sink, Sink::Stdout)).then(|| tx.clone());
            spawn_thread(rank, format!("dsmrun-{kind}-{rank}"), move || {
                forward_lines(rank, source, sink, silences, agent_ready);
                let _ = tx.send(Event::StreamClosed { rank });
            })?;
            self.ranks[rank].open_streams += 1;
        }
        Ok(())
    }

    /// Adopts a rank's freshly spawned agent, keeping its stdin for the order.
    fn adopt_agent(
        &mut self,
        rank: usize,
        mut child: Child,
        tx: &Sender<Event>,
        host: &str,
        order: AgentOrder,
    ) -> Result<(), LaunchError> {
        let stdin = child.stdin.take();
        self.adopt(rank, child, tx)?;
        self.ranks[rank].host = Some(host.to_owned());
        self.ranks[rank].agent = Some(AgentLink {
            stdin,
            order: Some(order),
            ready: false,
        });
        Ok(())
    }

    /// The first rank whose agent has not reported it started.
    fn not_started(&self) -> Option<usize> {
        self.ranks
            .iter()
            .position(|r| r.status.is_none() && r.agent.as_ref().is_some_and(|a| !a.ready))
    }

    fn running(&self) -> usize {
        self.ranks.iter().filter(|r| r.status.is_none()).count()
    }

    /// Signals every rank's process group, including those whose leader has
    /// exited, because descendants they left behind are still in it.
    fn signal_all(&self, signal: Signal) {
        for rank in 0..self.ranks.len() {
            self.signal_rank(rank, signal);
        }
    }

    /// When the earliest exit still waiting for the end of its rank's output is judged
    /// anyway.
    fn unjudged(&self) -> Option<Instant> {
        self.ranks
            .iter()
            .filter_map(|r| r.unjudged.map(|u| u.1))
            .min()
    }

    /// The end of the chain of peer losses that starts at `rank`: each rank that exited
    /// with the peer-lost status after reporting the peer it lost (or found silent) hands
    /// the blame on to that peer, until a rank that did not exit that way, or `rank`
    /// itself if it named no peer (or the chain loops).
    fn lost_root(&self, rank: usize) -> usize {
        let mut at = rank;
        let mut seen = vec![false; self.ranks.len()];
        loop {
            seen[at] = true;
            let Some(next) = self.ranks[at].lost.filter(|&p| p < self.ranks.len()) else {
                return at;
            };
            if seen[next] {
                return at;
            }
            if self.ranks[next].status != Some(RankStatus::Exited(exit_codes::PEER_LOST)) {
                return next;
            }
            at = next;
        }
    }

    fn handle_exit(&mut self, rank: usize, status: RankStatus) {
        self.ranks[rank].status = Some(status);
        debug!(rank, %status, elapsed = ?self.started.elapsed(), "rank ended");
    }

    /// Spawning failed part-way: kill what was started and reap it.
    fn abort(&mut self) {
        self.signal_all(Signal::SIGKILL);
        let give_up = Instant::now() + KILL_GRACE;
        while self.running() > 0 {
            let left = give_up.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Event::Exited { rank, status }) => self.handle_exit(rank, status),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }

    fn begin_stop(&self, cause: StopCause, signal: Signal, grace: Duration) -> Stopping {
        self.signal_all(signal);
        Stopping {
            cause,
            kill_at: Some(Instant::now() + grace),
            give_up_at: None,
            first_signal: signal,
            grace,
        }
    }

    /// The last step of stopping: SIGKILL, then a bounded wait for the reaping.
    fn kill_now(&self, stop: &mut Stopping, now: Instant) {
        self.signal_all(Signal::SIGKILL);
        stop.kill_at = None;
        stop.give_up_at = Some(now + KILL_GRACE);
    }

    fn supervise(&mut self, timeout: Option<Duration>) -> JobOutcome {
        let mut sv = Supervision::new(timeout.map(|t| self.started + t), timeout);
        while self.running() > 0
            || sv.stopping.is_none()
                && (sv.collateral.is_some() || !sv.ready.is_empty() || self.unjudged().is_some())
        {
            let now = Instant::now();
            self.note_race_exit_wait(&mut sv, now);
            self.judge_overdue_exits(&mut sv.ready, now);
            if sv.stopping.is_none() && sv.ready.is_empty() && self.judge_collateral(&mut sv, now) {
                continue;
            }
            // Deadlines are checked on every pass, not only on recv timeouts,
            // so a steady stream of events can never postpone them.
            match self.check_deadlines(&mut sv, now) {
                Pass::Proceed => {}
                Pass::Again => continue,
                Pass::End => break,
            }
            let event = match self.next_event(&mut sv, now) {
                Ok(event) => event,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            self.handle_event(&mut sv, event, now);
        }
        self.drain_output();
        sv.outcome(self.race_exit_code)
    }

    /// Says that dsmrun waits for the other ranks after a race exit, once the note is due.
    fn note_race_exit_wait(&self, sv: &mut Supervision, now: Instant) {
        if let Some((_, rank, code)) = sv.race_exit.take_if(|(at, ..)| now >= *at) {
            let others = self.running();
            if others > 0 && sv.stopping.is_none() {
                note(format_args!(
                    "rank {rank} exited with the race exit code {code} ({}); still waiting for the other {}",
                    if self.checking { "data races or --check findings reported" } else { "data race found" },
                    plural(others, "rank", &format!("{others} ranks"))
                ));
            }
        }
    }

    /// An exit whose output is held open past OUTPUT_WAIT is judged without it.
    fn judge_overdue_exits(&mut self, ready: &mut VecDeque<(usize, RankStatus)>, now: Instant) {
        for (rank, r) in self.ranks.iter_mut().enumerate() {
            if let Some((status, _)) = r.unjudged.filter(|&(_, at)| now >= at) {
                r.unjudged = None;
                ready.push_back((rank, status));
            }
        }
    }

    /// Judges a pending peer-lost exit once the rank that actually failed has had its
    /// chance to exit; true if that stopped the job.
    fn judge_collateral(&self, sv: &mut Supervision, now: Instant) -> bool {
        let Some(c) = &mut sv.collateral else {
            return false;
        };
        let (rank, status) = (c.rank, c.status);
        // Follow the chain of peer-lost exits from the first one to the rank
        // that actually failed, whatever order their exits arrived in.
        let root = self.lost_root(rank);
        let root_pending = root != rank && self.ranks[root].unjudged.is_some();
        let root_status = self.ranks[root].status;
        let root_running = root != rank && root_status.is_none();
        let extended = c.since + LOST_PEER_WAIT;
        if root_running && now >= c.until && now < extended {
            // The lost rank's exit is on its way: wait for it a little longer.
            c.until = extended;
        }
        let all_in = self.running() == 0 && self.unjudged().is_none();
        if root_pending || !(now >= c.until || all_in) {
            return false;
        }
        sv.collateral = None;
        let cause = self.collateral_cause(rank, status, root, root_status, root_running);
        sv.stopping = Some(self.begin_stop(cause, Signal::SIGTERM, TERM_GRACE));
        true
    }

    /// Why the job stops after `rank` exited because it lost a peer, `root` being the end
    /// of its chain of peer losses; says so.
    fn collateral_cause(
        &self,
        rank: usize,
        status: RankStatus,
        root: usize,
        root_status: Option<RankStatus>,
        root_running: bool,
    ) -> StopCause {
        let others = self.running();
        // A rank that exited 0 while its peers still needed it left the job
        // early (e.g. returned from main before finish()): that is the
        // cause, not the rank that noticed.
        let left_early = if root_status == Some(RankStatus::Exited(0)) {
            Some(root)
        } else {
            self.ranks
                .iter()
                .position(|r| r.status == Some(RankStatus::Exited(0)))
        };
        match left_early {
            Some(early) => {
                note(format_args!(
                    "rank {early} exited with status 0 while the other ranks still needed it (did it end before finish()?); rank {rank} then lost it and {status}{}",
                    stopping_the_others(others)
                ));
                StopCause::RankFailed {
                    rank: early,
                    status: RankStatus::Exited(0),
                }
            }
            None if root_running => {
                // Still running although its peers lost it: the rank at
                // fault, whatever it is doing.
                let who = self.who(root);
                note(format_args!(
                    "rank {rank} {status} after losing {who}, which is still running{}",
                    stopping_the_others(others)
                ));
                StopCause::RankFailed { rank, status }
            }
            None => {
                note(format_args!(
                    "rank {rank} {status} after losing a peer, and no other failure was seen{}",
                    stopping_the_others(others)
                ));
                StopCause::RankFailed { rank, status }
            }
        }
    }

    /// Starts stopping the job when a deadline has passed, and escalates a stop under way.
    fn check_deadlines(&self, sv: &mut Supervision, now: Instant) -> Pass {
        match &mut sv.stopping {
            None => match self.missed_deadline(sv.deadline, sv.timeout, now) {
                Some(stop) => {
                    sv.stopping = Some(stop);
                    Pass::Again
                }
                None => Pass::Proceed,
            },
            Some(stop) => self.escalate_stop(stop, now),
        }
    }

    /// Begins the stop when a rank's host missed the start deadline or the job its timeout.
    fn missed_deadline(
        &self,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
        now: Instant,
    ) -> Option<Stopping> {
        if let Some(rank) = self
            .start_deadline
            .filter(|d| now >= *d)
            .and_then(|_| self.not_started())
        {
            let host = self.ranks[rank].host.clone().unwrap_or_default();
            note(format_args!(
                "rank {rank}: host {host} did not start it within the connect timeout ({} s) through '{}': is the host reachable, and dsmrun-agent installed there at the same path? Stopping the job",
                format_secs(self.start_deadline.map_or(Duration::ZERO, |d| d - self.started)),
                self.launch_agent,
            ));
            return Some(self.begin_stop(
                StopCause::NotStarted { rank, host },
                Signal::SIGTERM,
                TERM_GRACE,
            ));
        }
        if let (Some(deadline), Some(timeout)) = (deadline, timeout) {
            if now >= deadline {
                note(format_args!(
                    "job timed out after {} s; stopping all ranks",
                    format_secs(timeout)
                ));
                return Some(self.begin_stop(
                    StopCause::TimedOut(timeout),
                    Signal::SIGTERM,
                    TERM_GRACE,
                ));
            }
        }
        None
    }

    /// SIGKILL once the grace is over, and give up on ranks that outlive even that.
    fn escalate_stop(&self, stop: &mut Stopping, now: Instant) -> Pass {
        if stop.kill_at.is_some_and(|at| now >= at) {
            let left = self.running();
            note(format_args!(
                "{left} {} still running {} s after {}; sending SIGKILL",
                plural(left, "rank", "ranks"),
                format_secs(stop.grace),
                stop.first_signal.as_str(),
            ));
            self.kill_now(stop, now);
            return Pass::Again;
        }
        if stop.give_up_at.is_some_and(|at| now >= at) {
            let stuck: Vec<String> = self
                .ranks
                .iter()
                .enumerate()
                .filter(|(_, r)| r.status.is_none())
                .map(|(rank, _)| rank.to_string())
                .collect();
            note(format_args!(
                "rank(s) {} did not exit even after SIGKILL; giving up on them",
                stuck.join(", ")
            ));
            return Pass::End;
        }
        Pass::Proceed
    }

    /// The next exit ready to be judged, or else the next event, waiting at most until the
    /// earliest instant something is due.
    fn next_event(&self, sv: &mut Supervision, now: Instant) -> Result<Event, RecvTimeoutError> {
        let start_wake = self.start_deadline.filter(|_| self.not_started().is_some());
        let wake = match &sv.stopping {
            None => [
                sv.deadline,
                sv.collateral.as_ref().map(|c| c.until),
                sv.race_exit.as_ref().map(|r| r.0),
                start_wake,
                self.unjudged(),
            ]
            .into_iter()
            .flatten()
            .min(),
            Some(stop) => stop.kill_at.or(stop.give_up_at),
        };
        match (sv.ready.pop_front(), wake) {
            (Some((rank, status)), _) => Ok(Event::ExitReady { rank, status }),
            (None, Some(at)) => self.rx.recv_timeout(at.saturating_duration_since(now)),
            (None, None) => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        }
    }

    fn handle_event(&mut self, sv: &mut Supervision, event: Event, now: Instant) {
        match event {
            Event::AgentReady { rank, coord } => {
                if let Some(link) = self.ranks[rank].agent.as_mut() {
                    link.ready = true;
                }
                if rank == 0 {
                    debug!(?coord, elapsed = ?self.started.elapsed(), "rank 0's agent is listening");
                    for other in 1..self.ranks.len() {
                        self.send_order(other, coord);
                    }
                }
            }
            Event::Exited { rank, status } => {
                self.handle_exit(rank, status);
                // Judged once everything the rank printed has been read.
                if self.ranks[rank].open_streams == 0 {
                    sv.ready.push_back((rank, status));
                } else {
                    self.ranks[rank].unjudged = Some((status, now + OUTPUT_WAIT));
                }
            }
            Event::ExitReady { rank, status } => self.judge_exit(sv, rank, status, now),
            Event::StreamClosed { rank } => {
                let r = &mut self.ranks[rank];
                r.open_streams -= 1;
                if r.open_streams == 0 {
                    if let Some((status, _)) = r.unjudged.take() {
                        sv.ready.push_back((rank, status));
                    }
                }
            }
            Event::Lost(loss) => {
                if let Some(r) = self.ranks.get_mut(loss.reporter) {
                    r.lost.get_or_insert(loss.lost);
                }
            }
            Event::Silent(silence) => self.handle_silence(sv, silence),
            Event::Signal(raw) => self.handle_signal(sv, raw, now),
        }
    }

    /// Judges a rank's exit once its output has been read (or waited for long enough).
    fn judge_exit(&self, sv: &mut Supervision, rank: usize, status: RankStatus, now: Instant) {
        let never_started = self.ranks[rank].agent.as_ref().is_some_and(|a| !a.ready);
        if never_started && sv.stopping.is_none() {
            let host = self.ranks[rank].host.clone().unwrap_or_default();
            note(format_args!(
                "rank {rank}: cannot start it on host {host}: '{}' {status} before the rank started (its message, if any, is above){}",
                self.launch_agent,
                stopping_the_others(self.running())
            ));
            sv.stopping = Some(self.begin_stop(
                StopCause::NotStarted { rank, host },
                Signal::SIGTERM,
                TERM_GRACE,
            ));
            return;
        }
        if sv.stopping.is_some() || status.is_success() {
            // Exits after we started stopping the job are
            // consequences of that, not new failures.
            return;
        }
        if status == RankStatus::Exited(exit_codes::PEER_LOST) {
            if sv.collateral.is_none() {
                let wait = if self.agents {
                    COLLATERAL_WAIT_ACROSS_HOSTS
                } else {
                    COLLATERAL_WAIT
                };
                sv.collateral = Some(Collateral {
                    rank,
                    status,
                    since: now,
                    until: now + wait,
                });
            }
            return;
        }
        sv.collateral = None;
        let others = self.running();
        if let RankStatus::Exited(code) = status {
            // Rank 0 reports races: the same status from another rank is its failure.
            if Some(code) == self.race_exit_code && rank == 0 {
                sv.race_ranks.push(rank);
                if others > 0 && sv.race_exit.is_none() {
                    sv.race_exit = Some((now + RACE_EXIT_NOTE_AFTER, rank, code));
                }
                return;
            }
            if let Some(stop) = self.stop_for_outcome_code(rank, code, others) {
                sv.stopping = Some(stop);
                return;
            }
        }
        let who = self.who(rank);
        if others > 0 {
            note(format_args!(
                "{who} {status}; stopping the other {}",
                plural(others, "rank", &format!("{others} ranks"))
            ));
        } else {
            note(format_args!("{who} {status}"));
        }
        sv.stopping = Some(self.begin_stop(
            StopCause::RankFailed { rank, status },
            Signal::SIGTERM,
            TERM_GRACE,
        ));
    }

    /// Begins the stop for an exit status that is an outcome of the job's mode (a replay
    /// that diverged, values that differ from the reference) rather than a crash.
    fn stop_for_outcome_code(&self, rank: usize, code: i32, others: usize) -> Option<Stopping> {
        if self.replaying && code == i32::from(exit_codes::REPLAY_DIVERGED) {
            note(format_args!(
                "replay diverged from the record (rank {rank} exited with status {code}){}",
                stopping_the_others(others)
            ));
            return Some(self.begin_stop(
                StopCause::ReplayDiverged { rank },
                Signal::SIGTERM,
                TERM_GRACE,
            ));
        }
        if self.compare && code == i32::from(exit_codes::VALUES_DIFFER) {
            note(format_args!(
                "values differ from the reference trace (rank 0 printed where; every rank exits with status {code}){}",
                stopping_the_others(others)
            ));
            return Some(self.begin_stop(
                StopCause::ValuesDiffer { rank },
                Signal::SIGTERM,
                TERM_GRACE,
            ));
        }
        None
    }

    /// A rank reported a peer silent past the liveness deadline.
    fn handle_silence(&mut self, sv: &mut Supervision, silence: Silence) {
        if let Some(r) = self.ranks.get_mut(silence.reporter) {
            r.lost.get_or_insert(silence.silent);
        }
        let rank = silence.silent;
        // A rank that has exited is not silent: its own exit tells the story.
        if sv.stopping.is_some() || self.ranks.get(rank).is_none_or(|r| r.status.is_some()) {
            return;
        }
        // This is the root cause the peer-lost exits were waiting for.
        sv.collateral = None;
        note(format_args!(
            "{} has sent nothing to rank {} for {} s (liveness deadline {} s): it is stopped, wedged or unreachable; killing it and stopping the job",
            self.who(rank),
            silence.reporter,
            format_secs(silence.after),
            format_secs(silence.deadline),
        ));
        // SIGKILL, because a stopped process acts on nothing else.
        self.signal_rank(rank, Signal::SIGKILL);
        sv.stopping =
            Some(self.begin_stop(StopCause::RankSilent(silence), Signal::SIGTERM, TERM_GRACE));
    }

    fn handle_signal(&self, sv: &mut Supervision, raw: i32, now: Instant) {
        let signal = Signal::try_from(raw).unwrap_or(Signal::SIGTERM);
        match &mut sv.stopping {
            None => {
                let left = self.running();
                note(format_args!(
                    "received {}; stopping all {left} running {}",
                    signal.as_str(),
                    plural(left, "rank", "ranks")
                ));
                sv.stopping =
                    Some(self.begin_stop(StopCause::Signal(raw), signal, INTERRUPT_GRACE));
            }
            // A second Ctrl-C means the user does not want to wait
            // out the grace period.
            Some(stop) if stop.kill_at.is_some() => {
                note(format_args!(
                    "received {} again; killing the remaining ranks now",
                    signal.as_str()
                ));
                self.kill_now(stop, now);
            }
            Some(_) => {}
        }
    }

    /// Waits, bounded, for the forwarders to hit end-of-file so the ranks'
    /// last lines are printed before `dsmrun` exits.
    fn drain_output(&mut self) {
        let mut killed_leftovers = false;
        let mut give_up = Instant::now() + DRAIN_GRACE;
        while self.ranks.iter().any(|r| r.open_streams > 0) {
            let now = Instant::now();
            if now >= give_up {
                if killed_leftovers {
                    warn!("rank output pipes still open after killing leftovers; not waiting for them");
                    return;
                }
                // The ranks are gone, so whatever still holds their pipes is a
                // leftover descendant; the job is over, and so is it.
                note(format_args!(
                    "processes left behind by the ranks still hold their output open; killing them"
                ));
                for rank in self.ranks.iter().filter(|r| r.open_streams > 0) {
                    signal_group(rank.pid, Signal::SIGKILL);
                }
                killed_leftovers = true;
                give_up = now + DRAIN_GRACE;
                continue;
            }
            match self.rx.recv_timeout(give_up - now) {
                Ok(Event::StreamClosed { rank }) => self.ranks[rank].open_streams -= 1,
                Ok(Event::Exited { rank, status }) => self.handle_exit(rank, status),
                Ok(
                    Event::Signal(_)
                    | Event::Silent(_)
                    | Event::Lost(_)
                    | Event::ExitReady { .. }
                    | Event::AgentReady { .. },
                )
                | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// `; stopping the other N ranks`, or nothing when none is left.
fn stopping_the_others(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => "; stopping the other rank".into(),
        n => format!("; stopping the other {n} ranks"),
    }
}

fn plural<'a>(count: usize, one: &'a str, many: &'a str) -> &'a str {
    if count == 1 {
        one
    } else {
        many
    }
}

fn signal_group(pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        // The group is already empty: nothing left to stop.
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => warn!(%pgid, %signal, %err, "signalling a rank's process group failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_job_wide_variable_stops_the_launch_and_others_are_not_judged() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(check_job_wide_env(env(&[])).is_ok());
        assert!(check_job_wide_env(env(&[("DSM_SPIN", "50"), ("DSM_PUSH", "off")])).is_ok());
        for (var, bad) in [
            ("DSM_SPIN", "fast"),
            ("DSM_PUSH", "lots"),
            ("DSM_TRANSPORT", "carrier-pigeon"),
            ("DSM_SEGMENT_ADDR", "here"),
        ] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(vec![(var, bad)].into_boxed_slice());
            let err = check_job_wide_env(env(pairs)).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            let text = format!("{:#}", anyhow::Error::new(err));
            assert!(text.contains(var) && text.contains(bad), "{text}");
        }
        // Variables a launcher owns are its own to set; a stray one is not judged here.
        assert!(check_job_wide_env(env(&[("DSM_RANK", "x")])).is_ok());
    }
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn signals_are_named() {
        assert_eq!(signal_name(9), Some("SIGKILL"));
        assert_eq!(signal_name(11), Some("SIGSEGV"));
        assert_eq!(signal_name(0), None);
        assert_eq!(signal_name(1000), None);
    }

    #[test]
    fn statuses_describe_themselves_and_map_to_exit_codes() {
        assert_eq!(RankStatus::Exited(3).to_string(), "exited with status 3");
        let segv = RankStatus::Signaled {
            signal: 11,
            core_dumped: true,
        };
        assert_eq!(
            segv.to_string(),
            "was killed by signal 11 (SIGSEGV), core dumped"
        );
        assert_eq!(segv.failure_exit_code(), 139);
        // A rank's own status is passed on, except where it would read as dsmrun's own.
        assert_eq!(RankStatus::Exited(2).failure_exit_code(), 2);
        assert_eq!(RankStatus::Exited(3).failure_exit_code(), 3);
        assert_eq!(RankStatus::Exited(0).failure_exit_code(), 1);
        for own in [65, 66, 67, 68, 71, 124, 126, 127, 130, 139] {
            assert_eq!(RankStatus::Exited(own).failure_exit_code(), 1, "{own}");
        }
        assert_eq!(JobOutcome::Interrupted { signal: 2 }.exit_code(), 130);
        assert_eq!(
            JobOutcome::TimedOut {
                after: Duration::from_secs(1)
            }
            .exit_code(),
            124
        );
        assert_eq!(
            JobOutcome::RaceReported {
                ranks: vec![1],
                exit_code: 66
            }
            .exit_code(),
            66
        );
        assert_eq!(JobOutcome::Success.exit_code(), 0);
        assert_eq!(JobOutcome::ValuesDiffer { rank: 0 }.exit_code(), 68);
        let silence = Silence::new(0, 1, Duration::from_secs(10), Duration::from_secs(10));
        assert_eq!(JobOutcome::RankSilent(silence).exit_code(), 1);
    }

    #[test]
    fn secrets_are_32_hex_chars_and_fresh() {
        let a = generate_secret();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, generate_secret());
    }

    #[test]
    fn rendezvous_is_on_loopback_with_a_real_port() {
        let addr = bind_rendezvous().unwrap().local_addr().unwrap();
        assert!(addr.ip().is_loopback());
        assert_ne!(addr.port(), 0);
    }

    #[test]
    fn rank_environment_has_the_job_and_optional_settings() {
        let coord: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let mut config = LaunchConfig::new("app");
        config.ranks = 4;
        let env = rank_config(&config, 2, coord, "ab").to_env();
        let get = |env: &[(&str, OsString)], key: &str| {
            env.iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_str().unwrap().to_owned())
        };
        assert_eq!(get(&env, "DSM_RANK").as_deref(), Some("2"));
        assert_eq!(get(&env, "DSM_SIZE").as_deref(), Some("4"));
        assert_eq!(get(&env, "DSM_COORD").as_deref(), Some("127.0.0.1:4000"));
        assert_eq!(get(&env, "DSM_JOB_SECRET").as_deref(), Some("ab"));
        assert_eq!(get(&env, "DSM_LAUNCHER").as_deref(), Some("dsmrun"));
        assert_eq!(get(&env, "DSM_LOCAL_RANK").as_deref(), Some("2"));
        assert_eq!(get(&env, "DSM_LOCAL_SIZE").as_deref(), Some("4"));
        assert_eq!(env.len(), 7);

        config.segment_bytes = Some(1 << 20);
        config.connect_timeout = Some(Duration::from_millis(7500));
        config.race = RaceOptions {
            enabled: true,
            log: Some("/tmp/races.log".into()),
            first_only: true,
            ..RaceOptions::default()
        };
        let env = rank_config(&config, 0, coord, "ab").to_env();
        assert_eq!(get(&env, "DSM_SEGMENT").as_deref(), Some("1048576"));
        assert_eq!(get(&env, "DSM_CONNECT_TIMEOUT").as_deref(), Some("7.5"));
        assert_eq!(get(&env, "DSM_RACE").as_deref(), Some("1"));
        assert_eq!(get(&env, "DSM_RACE_EXIT_CODE").as_deref(), Some("66"));
        assert_eq!(get(&env, "DSM_RACE_LOG").as_deref(), Some("/tmp/races.log"));
        assert_eq!(get(&env, "DSM_RACE_FIRST").as_deref(), Some("1"));
        assert_eq!(get(&env, "DSM_RACE_STATS"), None);
        for (key, _) in &env {
            assert!(
                env_vars::LAUNCHER_OWNED.contains(key),
                "{key} missing from LAUNCHER_OWNED"
            );
        }
    }

    fn make_file(path: &Path, mode: u32) {
        fs::write(path, "#!/bin/sh\n").unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn programs_resolve_next_to_the_launcher_before_path() {
        let exe_dir = tempfile::tempdir().unwrap();
        let path_dir = tempfile::tempdir().unwrap();
        make_file(&path_dir.path().join("app"), 0o755);
        make_file(&path_dir.path().join("other"), 0o755);
        let path_var = std::env::join_paths([path_dir.path()]).unwrap();

        let found = resolve_program("app".as_ref(), Some(exe_dir.path()), Some(&path_var));
        assert_eq!(found.unwrap(), path_dir.path().join("app"));

        make_file(&exe_dir.path().join("app"), 0o755);
        let found = resolve_program("app".as_ref(), Some(exe_dir.path()), Some(&path_var));
        assert_eq!(found.unwrap(), exe_dir.path().join("app"));

        // A directory with the program's name does not hide the real one.
        fs::create_dir(exe_dir.path().join("other")).unwrap();
        let found = resolve_program("other".as_ref(), Some(exe_dir.path()), Some(&path_var));
        assert_eq!(found.unwrap(), path_dir.path().join("other"));
    }

    #[test]
    fn missing_and_unexecutable_programs_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path_var = std::env::join_paths([dir.path()]).unwrap();
        let err = resolve_program(
            "nope".as_ref(),
            Some(Path::new("/opt/dsm/bin")),
            Some(&path_var),
        )
        .unwrap_err();
        assert_eq!(err.exit_code(), 127);
        assert_eq!(
            err.to_string(),
            "cannot find program 'nope' (looked in /opt/dsm/bin and on PATH)"
        );

        make_file(&dir.path().join("plain"), 0o644);
        let err = resolve_program("plain".as_ref(), None, Some(&path_var)).unwrap_err();
        assert_eq!(err.exit_code(), 126);
        let err = resolve_program(dir.path().join("plain").as_os_str(), None, None).unwrap_err();
        assert_eq!(err.exit_code(), 126);
        let err = resolve_program(dir.path().as_os_str(), None, None).unwrap_err();
        assert_eq!(err.exit_code(), 126);
        assert!(err.to_string().contains("directory"));
        let err = resolve_program(dir.path().join("gone").as_os_str(), None, None).unwrap_err();
        assert_eq!(err.exit_code(), 127);
        let err = resolve_program("".as_ref(), None, None).unwrap_err();
        assert_eq!(err.exit_code(), 127);
    }
}

//! `dsmrun`, the job launcher of dsm (like `mpirun`): this file owns only the
//! command line — parsing it into a [`LaunchConfig`], the `--help` text, and
//! mapping the outcome to an exit code. Launching and supervising the ranks is
//! the `dsm_launch` library.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use dsm_launch::order::{self, OrderError};
use dsm_launch::{self as launcher, JobOutcome, LaunchConfig, LaunchError};
use dsm_proto::liveness::DEFAULT_LIVENESS;
use dsm_proto::{
    exit_codes, parse_seconds, parse_seconds_or_off, parse_segment_size, RaceOptions,
    ReplayOptions, TraceMode, TraceOptions,
};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

const AFTER_HELP: &str = "\
Each rank runs PROGRAM in its own process group, with stdin from /dev/null.
Every line a rank writes is printed as \"[RANK] line\" on dsmrun's stdout (or
stderr, for the rank's stderr); a line longer than 64 KiB is forwarded in 64 KiB
pieces, each on a prefixed line of its own. A PROGRAM containing '/' is used as a path;
otherwise it is looked up next to the dsmrun executable, then on PATH.
Everything after PROGRAM is passed to it untouched, even if it looks like a
dsmrun option.

Environment of every rank (inherited DSM_* values of these names are dropped):
  DSM_RANK             the rank, 0..N-1
  DSM_SIZE             N
  DSM_COORD            127.0.0.1:PORT, a free port for rank 0's rendezvous
  DSM_COORD_FD         rank 0 only: that socket, bound and listening, inherited
  DSM_LAUNCHER_FD      a pipe only dsmrun writes; ranks stop at its end-of-file,
                       so no rank outlives dsmrun, even after kill -9
  DSM_JOB_SECRET       32 random hex characters, new for every job
  DSM_LAUNCHER         dsmrun
  DSM_LOCAL_RANK       the rank's index among the ranks on this host (= rank)
  DSM_LOCAL_SIZE       ranks on this host (= N)
  DSM_SEGMENT          segment size in bytes          (only with --segment)
  DSM_CONNECT_TIMEOUT  seconds                        (only with --connect-timeout)
  DSM_LIVENESS         seconds, or off                (only with --liveness other than 10)
  DSM_RACE=1 and DSM_RACE_EXIT_CODE=CODE              (only with race detection)
  DSM_RACE_LOG         absolute path of --race-log    (only with --race-log)
  DSM_RACE_SARIF       absolute path of --race-sarif  (only with --race-sarif)
  DSM_RACE_SUPPRESSIONS  the checked entries of --race-suppressions, one a line
  DSM_RACE_STARTED     a file rank 0 creates once every rank joined (with --race, jobs on this host)
  DSM_PINPOINT         the watched elements, ';'-separated (--pinpoint, --pinpoint-log)
  DSM_PINPOINT_DIR     a directory dsmrun makes for the ranks' notes (with DSM_PINPOINT)
  DSM_RACE_FIRST=1, DSM_RACE_STATS=1                  (only with --race-first/--race-stats)
  DSM_RACE_MODE=schedule, DSM_SCHEDULE_IGNORE=a,b     (--race=schedule, --schedule-ignore)
  DSM_TRACE_VALUES     absolute path of --trace-values FILE
  DSM_TRACE_FULL=1, DSM_TRACE_VARS=a,b                (--trace-values-full, --trace-vars)
  DSM_COMPARE          absolute path of --compare FILE
  DSM_COMPARE_CONTINUE=1                              (--compare-continue)
  DSM_TOLERANCE, DSM_REL_TOLERANCE                    (--tolerance, --rel-tolerance)
  DSM_RECORD           part-file prefix FILE.part     (only with --record FILE)
  DSM_REPLAY           absolute path of --replay FILE
  DSM_CHAOS            the seed of --chaos
  DSM_SEM_TRACE        absolute path of --sem-trace FILE
  DSM_SEM_ORDER=safe                                  (--sem-order=safe)
DSM_SEGMENT_ADDR, DSM_PIN, DSM_HOST_MEMORY, DSM_FAST_FAULTS, DSM_STATS_FILE,
DSM_PUSH, DSM_SPIN, DSM_RACE_PHASES, DSM_LOG and DSM_TRANSPORT are passed through
from dsmrun's environment (see the README). By default (auto) ranks that can map the same memory
(one host, one network namespace) talk through shared memory, and when every rank
of the job can (with or without --race) they map one common segment, so no page travels.
DSM_TRANSPORT=rings keeps each rank's own copy of the pages (moved by the protocol
through shared memory); DSM_TRANSPORT=tcp makes every link TCP.

Stopping: when a rank exits non-zero (other than with the race exit code) or
dies from a signal, dsmrun reports that first failure, sends SIGTERM to every
rank's process group and SIGKILL to those still running 2 s later; --timeout
does the same. A rank that exits because it lost a peer (status 71) is not
taken for the cause at once: dsmrun waits 1 s (3 s across hosts) for the
failure behind it. When a rank reports that a peer has sent nothing for the
liveness deadline, dsmrun names that peer as the failure and kills it with
SIGKILL (a stopped process acts on no other signal). On SIGINT, SIGTERM or SIGHUP, dsmrun
forwards that signal to every rank's process group and sends SIGKILL 3 s
later (at once on a second Ctrl-C). Processes a rank started are in its
process group and stop with it; any still holding its output after all ranks
exited are killed.

Exit status:
  0      every rank exited 0
  S      the first failing rank exited with status S (as mpirun passes it on),
         unless S is one of the statuses below or above 128 (then 1)
  1      a rank exited with 0 while the others still needed it, or with a
         status dsmrun keeps for itself; a rank stopped responding (sent
         nothing for the liveness deadline); or dsmrun itself failed (e.g.
         could not start a rank)
  2      invalid command line, DSM_SEGMENT_ADDR, DSM_TRANSPORT, DSM_PUSH or
         DSM_SPIN in dsmrun's environment does not parse, a file the job
         reads (--replay, --compare, --hostfile, --race-suppressions) cannot
         be opened, or a file it would write (--record, --sem-trace; and when
         rank 0 runs here --race-log, --race-sarif, --trace-values) cannot be
         written (all checked before any rank starts)
  65     a record to replay or a reference trace to compare with is damaged
         (not such a file, another version, truncated, or its checksum does
         not match; checked before any rank starts)
  124    --timeout expired
  126    PROGRAM is not executable
  127    PROGRAM was not found
  128+S  the first failing rank was killed by signal S (e.g. 139 for SIGSEGV),
         or dsmrun received signal S (130 for Ctrl-C)
  CODE   with race detection, rank 0 (which reports the races) exited with
         the race exit code (default 66: data races, or with --check check
         findings, were reported) and nothing else failed; another rank that
         exits with it has failed; lock-order dependences alone
         (--race=schedule) leave the status 0
  67     with --replay, the run deviated from the record (another program,
         other arguments or N, or race detection on where the record had it
         off or the other way round, checked before any rank starts; or, while
         running, an acquire or barrier the record does not have there,
         intervals that differ from the recorded ones, or other final values
         in the shared pages); the rank that noticed names the lock, grant
         number and ranks
  68     with --compare, values differ from the reference trace (the first
         difference, or with --compare-continue every differing trace point, is
         printed by rank 0)

Across hosts (--hostfile FILE or -H HOST[:SLOTS],...): each rank on another
host is started as 'AGENT HOST DIR/dsmrun-agent -- PROGRAM ARGS' (AGENT from
--launch-agent, default ssh; dsmrun-agent and PROGRAM at the same paths on every
host). The rank's DSM_* configuration, secret included, goes to the agent's
stdin, never on a command line; -x VAR[=VALUE] and DSM_SEGMENT_ADDR, DSM_PIN,
DSM_HOST_MEMORY, DSM_FAST_FAULTS, DSM_STATS_FILE, DSM_PUSH, DSM_SPIN,
DSM_RACE_PHASES, DSM_LOG, DSM_TRANSPORT from dsmrun's environment go with it.
Rank 0 listens where its host was reached by ssh unless --bind-address or
--interface say otherwise. Failures name the rank and its host; a host whose
agent fails or does not answer within the connect timeout stops the job with
status 1. Closing the agent's stdin (dsmrun exits, is killed, or the connection
breaks) stops the rank. Hosts that are this machine (localhost, loopback
addresses, its host name) run their ranks here.

Value traces: --trace-values FILE records, at every barrier (epochs numbered
as the program counts its barrier() calls) and at finish(), a hash of every
4 KiB block of every named shared allocation, in allocation coordinates, so a
trace made on 1 node compares with a run on any number of nodes. --compare FILE
checks a run against such a trace at every barrier; the first difference is
reported with its epoch, allocation, element ((row, col) for 2-D arrays) and
both values when the reference holds values (--trace-values-full or
--trace-vars), else with the differing block's element range. dsm-compare A B
compares two saved traces.

Recording and replay: --record FILE writes, when the job ends with status 0 or
the race exit code, the order in which ranks got every lock (each acquisition's
lock and grant number, per rank, with a check per barrier) and the program, its
arguments and N; --replay FILE runs the same job again making every lock go to
the ranks in the recorded order, so the same races recur in the same intervals.
--chaos SEED adds random, seeded delays around acquires, critical sections and
barriers to expose other lock orders; combine it with --record to keep one.";

/// Launch N processes of a dsm program, on this machine or on the hosts of a host list, and
/// supervise them.
#[derive(Debug, Parser)]
#[command(
    group(clap::ArgGroup::new("hosts").args(["hostfile", "host"])),
    name = "dsmrun",
    version,
    override_usage = "dsmrun [OPTIONS] [--] PROGRAM [ARGS]...",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Number of ranks (node processes) to start, 1..=256 [default: 1, or with
    /// --hostfile/-H the hosts' total slots]
    #[arg(short = 'n', value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=launcher::MAX_RANKS as i64))]
    ranks: Option<u16>,

    /// Map the shared segment at ADDR (hex, e.g. 0x2e0000000000, page-aligned) in
    /// every rank, on every host (DSM_SEGMENT_ADDR). At start-up every rank checks
    /// that it can map the segment there; if one cannot, the job stops naming the
    /// rank, its host and the address. Without it the ranks agree on the first of
    /// a few candidate bases that is free on every host [default: 0x3d0000000000]
    #[arg(long, value_name = "ADDR", value_parser = parse_segment_base)]
    segment_base: Option<u64>,

    /// Run the ranks on the hosts listed in FILE (Open MPI syntax: one host per
    /// line, optionally "slots=K", default 1; "#" starts a comment; a host named
    /// twice adds up). Hosts other than this machine are reached through the
    /// launch agent; see "Running across machines" in the README
    #[arg(long, value_name = "FILE", conflicts_with = "host")]
    hostfile: Option<PathBuf>,

    // Not a doc comment: rustdoc would read the brackets as a link.
    #[arg(
        short = 'H',
        long = "host",
        value_name = "HOSTS",
        help = "Run the ranks on these hosts: HOST[:SLOTS],... (slots default to 1)"
    )]
    host: Option<String>,

    /// The command that runs a command on another host, as "AGENT HOST COMMAND";
    /// split into words like a shell would (e.g. 'ssh -x -p 2222') [default: ssh]
    #[arg(long, value_name = "CMD", requires = "hosts")]
    launch_agent: Option<String>,

    /// How ranks are laid onto the hosts' slots: slot fills each host before the
    /// next (ranks 0,1 on the first host of two slots), node deals one rank per
    /// host in turn [default: slot]
    #[arg(long, value_name = "POLICY", requires = "hosts")]
    map_by: Option<launcher::hosts::MapBy>,

    /// Allow more ranks than the hosts have slots; the extra ranks go round-robin
    /// over the hosts
    #[arg(long, requires = "hosts")]
    oversubscribe: bool,

    /// Set VAR in every rank's environment, on every host: to VALUE, or to its
    /// value in dsmrun's environment (repeatable)
    #[arg(short = 'x', value_name = "VAR[=VALUE]", value_parser = parse_export)]
    export: Vec<(String, String)>,

    /// Rank 0 listens for the rendezvous at ADDR (an IP address, optionally
    /// with :PORT) on its host, and the other ranks reach it there [default:
    /// 127.0.0.1 for a job on this machine; across hosts the address rank 0's
    /// host was reached at (ssh's SSH_CONNECTION)]
    #[arg(long, value_name = "ADDR", conflicts_with = "interface",
          value_parser = parse_bind_address)]
    bind_address: Option<std::net::SocketAddr>,

    /// Rank 0 listens for the rendezvous on the address of this network
    /// interface of its host (e.g. eth1); the other ranks then connect from
    /// the interface that routes to it
    #[arg(long, value_name = "NAME")]
    interface: Option<String>,

    /// Size of the shared segment, e.g. 1G, 512M, 4096K or plain bytes (binary
    /// units), at most 16T; passed to the ranks as a byte count in DSM_SEGMENT
    #[arg(long, value_name = "SIZE", value_parser = parse_segment_size)]
    segment: Option<u64>,

    /// Wall-clock limit for the whole job; on expiry all ranks are stopped and
    /// dsmrun exits 124 [default: no limit]
    // Negative numbers are taken as values so the parser can say why they
    // are wrong, rather than clap calling them unknown options.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds,
          allow_negative_numbers = true)]
    timeout: Option<Duration>,

    /// How long ranks keep trying to connect to each other at startup;
    /// passed in DSM_CONNECT_TIMEOUT
    // Negative numbers are taken as values so the parser can say why they
    // are wrong, rather than clap calling them unknown options.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds,
          allow_negative_numbers = true)]
    connect_timeout: Option<Duration>,

    /// How long a rank may send its peers nothing before they stop the job
    /// naming it; dsmrun then kills it. Each rank's communication thread sends
    /// heartbeats on idle links, so a rank that only computes for a long time
    /// is not affected: this catches ranks that are stopped, wedged or cut
    /// off. 0 or off turns the check off, e.g. to stop a rank in a debugger.
    /// Passed in DSM_LIVENESS [default: 10]
    #[arg(long, value_name = "SECS", value_parser = parse_deadline,
          allow_negative_numbers = true)]
    liveness: Option<Deadline>,

    /// Turn on data-race detection in the ranks (DSM_RACE=1). Each --race-*
    /// option below implies --race. --race=schedule is schedule mode
    /// (DSM_RACE_MODE=schedule): lock acquire/release edges are left out of
    /// the happens-before order (barriers kept), so accesses that only lock
    /// order separates are reported as lock-order dependences naming the locks:
    /// the program is race-free there but its result may depend on which node
    /// got a lock first. Lock-order dependences alone do not make the race exit
    /// status. The value must be attached (--race=schedule): a bare --race is
    /// plain race detection
    #[arg(
        long,
        value_name = "MODE",
        value_parser = ["race", "schedule"],
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "race"
    )]
    race: Option<String>,

    /// Schedule mode: do not report lock-order dependences on VAR, an
    /// order-independent variable such as a commutative sum (repeatable or
    /// comma-separated; DSM_SCHEDULE_IGNORE=a,b; implies --race=schedule)
    #[arg(long, value_name = "VAR", value_delimiter = ',')]
    schedule_ignore: Vec<String>,

    /// Write every race as one JSON object per line to FILE (all fields, no
    /// collapsing; rank 0 writes it; relative paths are taken from the current
    /// directory) (DSM_RACE_LOG, made absolute; implies --race)
    #[arg(long, value_name = "FILE")]
    race_log: Option<PathBuf>,

    /// Write the run's distinct races (collapsed as in the printed report) to
    /// FILE as SARIF 2.1.0, one result per distinct race, for CI systems and
    /// editors; rank 0 writes it at finish (DSM_RACE_SARIF, made absolute;
    /// implies --race)
    #[arg(long, value_name = "FILE")]
    race_sarif: Option<PathBuf>,

    /// Do not report races that FILE's entries match (known, accepted races):
    /// one entry a line, CLASS:FIELD=VALUE with CLASS race or lock-order and
    /// FIELD variable, file, line (FILE:LINE) or function (`*` wildcards); `#`
    /// comments. Matched races are counted apart and do not set the race exit
    /// status. dsmrun checks the file before any rank starts (implies --race)
    #[arg(long, value_name = "FILE")]
    race_suppressions: Option<PathBuf>,

    /// Pinpoint the source lines of a race: watch element INDEX of VAR in epoch
    /// EPOCH (as a race report names them: `bound[0]@3`; INDEX is the flat index,
    /// row * columns + column for 2-D arrays). Every access to it in that epoch
    /// notes its file, line, column and function, and the race report prints
    /// both sides with their code. Repeatable; implies --race. Use it with
    /// --replay, so that the run takes the recorded synchronization order and
    /// the race recurs in the same intervals (DSM_PINPOINT)
    #[arg(long, value_name = "VAR[INDEX]@EPOCH", value_parser = parse_pin_target)]
    pinpoint: Vec<String>,

    /// Pinpoint every race of an earlier run's race log (--race-log FILE): each
    /// distinct variable, index and epoch in it is watched as with --pinpoint
    /// (implies --race)
    #[arg(long, value_name = "FILE")]
    pinpoint_log: Option<PathBuf>,

    /// Exit status when races were reported (DSM_RACE_EXIT_CODE): rank 0 exits
    /// with it, which is not a failure: the other ranks finish and dsmrun exits
    /// with this code at the end. 0 turns this off; the statuses dsmrun gives other
    /// meanings (2, 65, 67, 68, 71, 124, 126, 127, 128 and above) are refused (implies
    /// --race) [default: 66]
    #[arg(long, value_name = "CODE", value_parser = parse_race_exit_code)]
    race_exit_code: Option<u8>,

    /// Report only first races: those of the first barrier epoch with races,
    /// minus races whose intervals are preceded by another race's (the paper's
    /// section 6.4) (DSM_RACE_FIRST=1; implies --race)
    #[arg(long)]
    race_first: bool,

    /// Print detector statistics on stderr at every barrier and for the run:
    /// intervals, interval pairs compared, concurrent and overlapping pairs,
    /// bitmaps fetched, notice bytes, comparison times (DSM_RACE_STATS=1;
    /// implies --race)
    #[arg(long)]
    race_stats: bool,

    /// Dynamic checks (as the DVM debugger's), from the race detector's access
    /// records: reads of shared elements no node has written since the
    /// allocation (uninitialised use), and accesses outside the region a program
    /// declared for a rank (Dsm::declare_region). Reported like races, in the
    /// race log too; findings make the race exit status (DSM_CHECK=1; implies
    /// --race)
    #[arg(long)]
    check: bool,

    /// Record a value trace of the run in FILE: at every barrier and at finish,
    /// a hash of each 4 KiB block of every shared allocation (rank 0 reads them;
    /// DSM_TRACE_VALUES, made absolute)
    #[arg(long, value_name = "FILE", conflicts_with = "compare")]
    trace_values: Option<PathBuf>,

    /// With --trace-values: keep every allocation's values too, so that a
    /// comparison can name the element and both values (DSM_TRACE_FULL=1)
    #[arg(long, requires = "trace_values")]
    trace_values_full: bool,

    /// With --trace-values: keep the values of these allocations only
    /// (comma-separated names, e.g. grid,forces) (DSM_TRACE_VARS)
    #[arg(
        long,
        value_name = "NAMES",
        requires = "trace_values",
        value_delimiter = ','
    )]
    trace_vars: Vec<String>,

    /// Compare the run at every barrier with the reference trace FILE; at the
    /// first difference rank 0 prints epoch, allocation, element and values and
    /// the job stops with exit status 68 (DSM_COMPARE, made absolute)
    #[arg(long, value_name = "FILE")]
    compare: Option<PathBuf>,

    /// With --compare: report every differing trace point and exit 68 at the
    /// end instead of stopping at the first (DSM_COMPARE_CONTINUE=1)
    #[arg(long, requires = "compare")]
    compare_continue: bool,

    /// With --compare: f64/f32 elements within this absolute difference count
    /// as equal. Needs a reference with values: hashes cannot be compared
    /// within a tolerance (DSM_TOLERANCE) [default: exact]
    #[arg(long, value_name = "ABS", requires = "compare", value_parser = parse_tolerance)]
    tolerance: Option<f64>,

    /// With --compare: f64/f32 elements within REL * max(|a|, |b|) count as
    /// equal (DSM_REL_TOLERANCE) [default: exact]
    #[arg(long, value_name = "REL", requires = "compare", value_parser = parse_tolerance)]
    rel_tolerance: Option<f64>,

    /// Record the synchronization order of the run in FILE: which rank got each
    /// lock acquisition (its grant number), per rank in program order, with a
    /// check at every barrier, and the program, its arguments and N in a header.
    /// Each rank writes its part at finish (DSM_RECORD=FILE.part) and dsmrun
    /// merges them into FILE once the job ends with status 0 or the race exit
    /// code; a failed job leaves no record
    #[arg(long, value_name = "FILE", conflicts_with = "replay")]
    record: Option<PathBuf>,

    /// Replay the synchronization order recorded in FILE: every lock is granted
    /// to the ranks in the recorded order (a request that comes early waits).
    /// The job must be the recorded one (program, arguments, N); a run that
    /// deviates (another acquire, other intervals at a barrier, or other values
    /// left in the shared pages at the end) stops with exit status 67 and a
    /// message naming the lock, grant number and ranks, or the barrier, or the
    /// rank whose values differ (DSM_REPLAY, made absolute)
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,

    /// Chaos mode: random delays, drawn from SEED and the rank, before
    /// acquires, inside critical sections, before barriers and before the
    /// handling of lock messages, so runs take
    /// lock orders a quiet machine rarely shows (DSM_CHAOS). A seed does not
    /// fix the order by itself: use --record to keep it
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,

    /// How race detection orders semaphore operations: observed (a wait after
    /// exactly the signal it consumed in this run) or safe (only what holds under
    /// every feasible pairing of signals with waits, so races another pairing
    /// allows are reported too; epochs that also use locks keep the observed
    /// order); needs race detection (DSM_SEM_ORDER)
    #[arg(long, value_name = "ORDER", value_parser = ["observed", "safe"])]
    sem_order: Option<String>,

    /// Write every completed semaphore operation (node, wait or signal,
    /// semaphore, the signal each wait consumed, vector time), each barrier
    /// passed and each semaphore's initial count to FILE, for dsm-ahb (which
    /// analyses it epoch by epoch); ranks write FILE.rank0,
    /// FILE.rank1, ... (DSM_SEM_TRACE), merged into FILE when the job ends well
    /// (after a failure the parts are kept)
    #[arg(long, value_name = "FILE")]
    sem_trace: Option<PathBuf>,

    /// The program to run, followed by its arguments
    #[arg(value_name = "PROGRAM [ARGS]", required = true, num_args = 1..,
          trailing_var_arg = true)]
    command: Vec<OsString>,
}

/// A `--liveness` value: seconds, or `None` for off.
#[derive(Debug, Clone, Copy)]
struct Deadline(Option<Duration>);

fn parse_tolerance(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| *x >= 0.0 && x.is_finite())
        .ok_or_else(|| format!("'{text}' is not a non-negative number"))
}

fn absolute(path: &std::path::Path, flag: &str) -> anyhow::Result<PathBuf> {
    std::path::absolute(path)
        .with_context(|| format!("cannot make {flag} '{}' absolute", path.display()))
}

/// `--segment-base`: a page-aligned hex address in the 47-bit user address space.
fn parse_segment_base(text: &str) -> Result<u64, String> {
    let digits = text
        .trim()
        .trim_start_matches("0x")
        .trim_start_matches("0X");
    let addr = u64::from_str_radix(digits, 16)
        .map_err(|_| format!("'{text}' is not a hex address (e.g. 0x2e0000000000)"))?;
    if addr == 0 || addr % dsm_proto::PAGE_SIZE as u64 != 0 || addr >= 1 << 47 {
        return Err(format!(
            "'{text}' is not a page-aligned address in the user address space (4K-aligned, below 0x800000000000)"
        ));
    }
    Ok(addr)
}

/// `-x VAR=VALUE`, or `-x VAR` for VAR's value in dsmrun's environment.
fn parse_export(x: &str) -> Result<(String, String), String> {
    match x.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        Some(_) => Err(format!("{x:?}: expected VAR or VAR=VALUE")),
        None => std::env::var(x)
            .map(|v| (x.to_owned(), v))
            .map_err(|_| format!("{x} is not set in dsmrun's environment")),
    }
}

/// `--bind-address`: an IP address, with or without a port (`[v6]:port` for IPv6).
fn parse_bind_address(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Ok((ip, 0).into());
    }
    text.parse()
        .map_err(|e| format!("{text:?} is not an IP address or IP:PORT: {e}"))
}

/// A race exit status that says only that: the statuses dsmrun gives other meanings (see
/// "Exit status" in `--help`) are refused, so a script can tell races from a failure.
fn parse_race_exit_code(text: &str) -> Result<u8, String> {
    let code: u8 = text
        .parse()
        .map_err(|_| format!("{text:?} is not an exit status (0 to 255)"))?;
    let meaning = match code {
        2 => "an invalid command line",
        exit_codes::CORRUPT_INPUT => "a damaged record or trace",
        exit_codes::REPLAY_DIVERGED => "a replay that deviated",
        exit_codes::VALUES_DIFFER => "values that differ from the reference",
        c if i32::from(c) == exit_codes::PEER_LOST => "a rank that lost a peer",
        exit_codes::TIMED_OUT => "an expired --timeout",
        exit_codes::NOT_EXECUTABLE | exit_codes::NOT_FOUND => "a program that cannot run",
        128..=255 => "a rank killed by a signal",
        _ => return Ok(code),
    };
    Err(format!(
        "exit status {code} already means {meaning}; choose another (0 turns the race exit \
         status off)"
    ))
}

fn parse_pin_target(text: &str) -> Result<String, String> {
    text.parse::<dsm_race::pinpoint::PinTarget>()
        .map(|t| t.to_string())
}

/// The elements to watch: `--pinpoint` targets and those of `--pinpoint-log`.
fn pin_targets(
    mut targets: Vec<String>,
    log: Option<&std::path::Path>,
) -> anyhow::Result<Vec<String>> {
    // A file that cannot be read or used is a usage error (status 2), as for the other
    // files dsmrun reads.
    if let Some(path) = log {
        let file = std::fs::File::open(path).map_err(|e| {
            UsageError(format!(
                "cannot open --pinpoint-log '{}': {e}",
                path.display()
            ))
        })?;
        let from_log = dsm_race::pinpoint::targets_from_log(std::io::BufReader::new(file))
            .map_err(|e| UsageError(format!("--pinpoint-log '{}': {e}", path.display())))?;
        if from_log.is_empty() {
            return Err(UsageError(format!(
                "--pinpoint-log '{}' has no races to pinpoint",
                path.display()
            ))
            .into());
        }
        targets.extend(from_log.iter().map(ToString::to_string));
    }
    targets.dedup();
    Ok(targets)
}

/// The entries of a suppression file, checked (comments and blank lines dropped). An
/// unreadable or malformed file is a usage error (status 2).
fn read_suppressions(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        UsageError(format!(
            "cannot read --race-suppressions '{}': {e}",
            path.display()
        ))
    })?;
    let entries = dsm_race::Suppressions::parse(&text)
        .map_err(|e| UsageError(format!("--race-suppressions '{}': {e}", path.display())))?;
    Ok(entries.entries())
}

/// Whether `a` and `b` are one regular file (or one path to a file not made yet).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.is_file() && x.dev() == y.dev() && x.ino() == y.ino(),
        (Err(_), Err(_)) => std::path::absolute(a).ok() == std::path::absolute(b).ok(),
        _ => false,
    }
}

fn parse_deadline(text: &str) -> Result<Deadline, dsm_proto::ValueError> {
    parse_seconds_or_off(text).map(Deadline)
}

impl Cli {
    /// Refuses one file named by two options when one of them writes it: an output
    /// written over an input (the record being replayed, the reference being compared
    /// with) or over another output would lose it. Devices and FIFOs (`/dev/null`) may
    /// be named twice.
    fn check_distinct_files(&self) -> anyhow::Result<()> {
        let outputs = [
            ("--record", &self.record),
            ("--race-log", &self.race_log),
            ("--race-sarif", &self.race_sarif),
            ("--trace-values", &self.trace_values),
            ("--sem-trace", &self.sem_trace),
        ];
        let inputs = [
            ("--replay", &self.replay),
            ("--compare", &self.compare),
            ("--pinpoint-log", &self.pinpoint_log),
            ("--race-suppressions", &self.race_suppressions),
            ("--hostfile", &self.hostfile),
        ];
        let named = |list: &[(&'static str, &Option<PathBuf>)]| -> Vec<(&'static str, PathBuf)> {
            list.iter()
                .filter_map(|(flag, p)| p.as_ref().map(|p| (*flag, p.clone())))
                .collect()
        };
        let (outputs, inputs) = (named(&outputs), named(&inputs));
        for (i, (out_flag, out)) in outputs.iter().enumerate() {
            let others = outputs[i + 1..].iter().chain(&inputs);
            if let Some((flag, _)) = others.into_iter().find(|(_, p)| same_file(out, p)) {
                return Err(UsageError(format!(
                    "{out_flag} and {flag} name the same file '{}': it would be overwritten",
                    out.display()
                ))
                .into());
            }
        }
        Ok(())
    }

    fn into_config(mut self) -> anyhow::Result<LaunchConfig> {
        self.check_distinct_files()?;
        let race = self.race_options()?;
        let trace = self.trace_options()?;
        let (ranks, hosts) = self.host_plan()?;
        let forward_env = self.forward_env()?;
        let bind = match (&self.bind_address, &self.interface) {
            (Some(a), _) => Some(launcher::agent::BindTo::Addr(*a)),
            (None, Some(i)) => {
                // In a job on this host alone, a mistyped interface is a usage error found
                // before anything starts (with a host list it is rank 0's host's).
                if hosts.is_none() {
                    launcher::agent::interface_addr(i)
                        .map_err(|e| UsageError(format!("--interface: {e}")))?;
                }
                Some(launcher::agent::BindTo::Interface(i.clone()))
            }
            (None, None) => None,
        };
        let replay = ReplayOptions {
            record: self
                .record
                .as_deref()
                .map(|p| absolute(p, "--record"))
                .transpose()?,
            replay: self
                .replay
                .as_deref()
                .map(|p| absolute(p, "--replay"))
                .transpose()?,
            chaos: self.chaos,
        };
        let mut command = self.command.into_iter();
        let program = command
            .next()
            .context("no PROGRAM given (see dsmrun --help)")?;
        Ok(LaunchConfig {
            ranks,
            hosts,
            forward_env,
            bind,
            program,
            args: command.collect(),
            segment_bytes: self.segment,
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            liveness: self.liveness.map_or(Some(DEFAULT_LIVENESS), |d| d.0),
            race,
            trace,
            replay,
            sem_trace: self
                .sem_trace
                .map(|p| absolute(&p, "--sem-trace"))
                .transpose()?,
        })
    }

    /// The race detection options; any race option turns detection on.
    fn race_options(&mut self) -> anyhow::Result<RaceOptions> {
        let schedule = self.race.as_deref() == Some("schedule") || !self.schedule_ignore.is_empty();
        let race_on = self.race.is_some()
            || schedule
            || self.race_log.is_some()
            || self.race_sarif.is_some()
            || self.race_suppressions.is_some()
            || !self.pinpoint.is_empty()
            || self.pinpoint_log.is_some()
            || self.race_exit_code.is_some()
            || self.race_first
            || self.race_stats
            || self.check;
        if !race_on {
            if self.sem_order.is_some() {
                // A usage error: clap's message and exit status 2.
                <Cli as clap::CommandFactory>::command()
                    .error(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        "--sem-order needs race detection (--race)",
                    )
                    .exit();
            }
            return Ok(RaceOptions::default());
        }
        let log = self
            .race_log
            .take()
            .map(|log| {
                std::path::absolute(&log)
                    .with_context(|| format!("cannot make --race-log '{}' absolute", log.display()))
            })
            .transpose()?;
        Ok(RaceOptions {
            enabled: true,
            log,
            exit_code: self.race_exit_code.unwrap_or(exit_codes::RACES_FOUND),
            first_only: self.race_first,
            stats: self.race_stats,
            schedule,
            schedule_ignore: std::mem::take(&mut self.schedule_ignore),
            check: self.check,
            pinpoint: pin_targets(
                std::mem::take(&mut self.pinpoint),
                self.pinpoint_log.as_deref(),
            )?,
            sarif: self
                .race_sarif
                .as_deref()
                .map(|p| absolute(p, "--race-sarif"))
                .transpose()?,
            sem_order_safe: self.sem_order.as_deref() == Some("safe"),
            suppressions: self
                .race_suppressions
                .as_deref()
                .map(read_suppressions)
                .transpose()?
                .unwrap_or_default(),
            ..RaceOptions::default()
        })
    }

    /// The value trace options: recording one, or comparing with a reference checked here.
    fn trace_options(&mut self) -> anyhow::Result<TraceOptions> {
        let mode = match (&self.trace_values, &self.compare) {
            (Some(p), _) => TraceMode::Record(absolute(p, "--trace-values")?),
            (None, Some(p)) => TraceMode::Compare(self.checked_reference(p)?),
            (None, None) => TraceMode::Off,
        };
        Ok(TraceOptions {
            mode,
            full: self.trace_values_full,
            vars: std::mem::take(&mut self.trace_vars),
            continue_all: self.compare_continue,
            abs_tolerance_bits: self.tolerance.unwrap_or(0.0).to_bits(),
            rel_tolerance_bits: self.rel_tolerance.unwrap_or(0.0).to_bits(),
        })
    }

    /// The `--compare` reference made absolute, once it is known to be whole and to suit
    /// the tolerances asked for.
    fn checked_reference(&self, p: &Path) -> anyhow::Result<PathBuf> {
        // Open it here so a missing file is dsmrun's clear error, not N ranks'.
        let reference = absolute(p, "--compare")?;
        let file = std::fs::File::open(&reference).map_err(|e| {
            UsageError(format!(
                "cannot open the reference trace '{}': {e}",
                p.display()
            ))
        })?;
        // Read through and checksummed here: a damaged reference is dsmrun's one
        // line before any rank starts, not a difference or a failure half-way.
        let whole = dsm_trace::check_whole(std::io::BufReader::new(file))
            .map_err(|e| CorruptInput(format!("reference trace '{}': {e}", p.display())))?;
        // The ranks check this too, but only after the job has formed.
        let program = self
            .command
            .first()
            .and_then(|c| Path::new(c).file_name())
            .map(|n| n.to_string_lossy().into_owned());
        if program
            .as_ref()
            .is_some_and(|me| *me != whole.header.program)
        {
            return Err(UsageError(format!(
                "reference trace '{}' traces program '{}', not '{}'",
                p.display(),
                whole.header.program,
                program.unwrap_or_default()
            ))
            .into());
        }
        if !whole.has_values && (self.tolerance.is_some() || self.rel_tolerance.is_some()) {
            return Err(UsageError(format!(
                "--tolerance and --rel-tolerance need a reference with values, and \
                 '{}' has hashes only: record it with --trace-values-full (or \
                 --trace-vars NAMES)",
                p.display()
            ))
            .into());
        }
        Ok(reference)
    }

    /// The number of ranks, and the hosts to run them on when the job spans hosts.
    fn host_plan(&mut self) -> anyhow::Result<(usize, Option<launcher::HostPlan>)> {
        let hosts = match (&self.hostfile, &self.host) {
            (Some(file), _) => {
                Some(launcher::hosts::read_hostfile(file).map_err(LaunchError::from)?)
            }
            (None, Some(list)) => {
                Some(launcher::hosts::parse_host_list(list).map_err(LaunchError::from)?)
            }
            (None, None) => None,
        };
        let ranks = match (self.ranks, &hosts) {
            (Some(n), _) => usize::from(n),
            (None, Some(h)) => launcher::hosts::total_slots(h),
            (None, None) => 1,
        };
        let launch_agent_text = self
            .launch_agent
            .take()
            .unwrap_or_else(|| launcher::DEFAULT_LAUNCH_AGENT.to_owned());
        let launch_agent = shell_words::split(&launch_agent_text)
            .ok()
            .filter(|w| !w.is_empty())
            .ok_or_else(|| {
                UsageError(format!(
                    "--launch-agent {launch_agent_text:?} is not a command"
                ))
            })?;
        let hosts = hosts.map(|hosts| launcher::HostPlan {
            hosts,
            map_by: self.map_by.unwrap_or_default(),
            oversubscribe: self.oversubscribe,
            launch_agent,
        });
        Ok((ranks, hosts))
    }

    /// The `-x` variables, and the segment base when one was chosen.
    fn forward_env(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut forward_env = self.export.clone();
        if let Some(base) = self.segment_base {
            forward_env.push((
                dsm_proto::env_vars::SEGMENT_ADDR.to_owned(),
                format!("{base:x}"),
            ));
        }
        Ok(forward_env)
    }
}

/// What `--record` asks dsmrun to do after the job.
struct Recording {
    path: PathBuf,
    prefix: PathBuf,
    header: dsm_replay::Header,
}

/// A damaged input file (exit status 65, `exit_codes::CORRUPT_INPUT`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct CorruptInput(String);

/// Options that do not go together, found after parsing (exit status 2, as clap's).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

/// Checks a record to replay against the job, and points the ranks of a recording job
/// at their part files. Returns what to collect after the job.
fn prepare_order(config: &mut LaunchConfig) -> Result<Option<Recording>, OrderError> {
    let header = order::header_for(
        &config.program,
        &config.args,
        config.ranks,
        config.replay.chaos,
        config.race.enabled,
    );
    if let Some(path) = &config.replay.replay {
        order::check_replay(path, &header)?;
    }
    Ok(config.replay.record.take().map(|path| {
        let prefix = order::part_prefix(&path);
        config.replay.record = Some(prefix.clone());
        Recording {
            path,
            prefix,
            header,
        }
    }))
}

/// After a recording job: merges the parts into the record, or says why there is none.
fn finish_recording(rec: Recording, outcome: &JobOutcome) {
    let complete = matches!(
        outcome,
        JobOutcome::Success | JobOutcome::RaceReported { .. }
    );
    if !complete {
        order::discard_parts(&rec.prefix, rec.header.nodes as usize);
        eprintln!(
            "dsmrun: no record written to '{}': the job did not finish",
            rec.path.display()
        );
        return;
    }
    match order::collect_record(&rec.path, &rec.prefix, rec.header) {
        Ok(summary) => eprintln!(
            "dsmrun: recorded {} lock acquisitions in '{}' ({} bytes{})",
            summary.acquisitions,
            rec.path.display(),
            summary.bytes,
            if summary.acquisitions > 0 {
                format!(
                    ", {:.1} per acquisition",
                    summary.bytes as f64 / summary.acquisitions as f64
                )
            } else {
                String::new()
            }
        ),
        Err(e) => eprintln!("dsmrun: {e}"),
    }
}

fn main() -> ExitCode {
    // Diagnostics are opt-in (DSMRUN_LOG=debug); by default only warnings, so
    // the ranks' output is not drowned.
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("DSMRUN_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let mut race_on = false;
    let mut recording = None;
    let mut pin_dir: Option<PathBuf> = None;
    let mut started: Option<PathBuf> = None;
    match cli.into_config().and_then(|mut config| {
        race_on = config.race.enabled;
        // Before the record's path becomes its parts' prefix, so the message names it.
        launcher::check_outputs(&config)?;
        recording = prepare_order(&mut config)?;
        if race_on && config.hosts.is_none() {
            let marker = std::env::temp_dir().join(format!("dsm-started-{}", std::process::id()));
            let _ = std::fs::remove_file(&marker);
            config.race.started_marker = Some(marker.clone());
            started = Some(marker);
        }
        if !config.race.pinpoint.is_empty() {
            let dir = std::env::temp_dir().join(format!("dsm-pinpoint-{}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| {
                format!("cannot make the pinpoint directory '{}'", dir.display())
            })?;
            config.race.pinpoint_dir = Some(dir.clone());
            pin_dir = Some(dir);
        }
        let outcome = launcher::run(&config)?;
        if let Some(path) = &config.sem_trace {
            if matches!(
                outcome,
                JobOutcome::Success | JobOutcome::RaceReported { .. }
            ) {
                launcher::merge_sem_trace(path, config.ranks).map_err(anyhow::Error::msg)?;
            } else {
                // Name the parts only where the ranks left some: a program that failed
                // before its first semaphore wrote none.
                let left: Vec<usize> = (0..config.ranks)
                    .filter(|&r| dsm_ahb::format::part_path(path, r).exists())
                    .collect();
                if left.is_empty() {
                    eprintln!(
                        "dsmrun: the job failed; no semaphore trace was written to '{}'",
                        path.display()
                    );
                } else {
                    eprintln!(
                        "dsmrun: the job failed; the semaphore trace is left in the per-rank \
                         parts {}.rank<R> of ranks {left:?}",
                        path.display()
                    );
                }
            }
        }
        Ok(outcome)
    }) {
        Ok(outcome) => {
            if let Some(dir) = &pin_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            if let Some(rec) = recording {
                finish_recording(rec, &outcome);
            }
            let clean = matches!(
                outcome,
                JobOutcome::Success | JobOutcome::RaceReported { .. }
            );
            // Jobs on this machine say whether every rank joined (rank 0 made the file);
            // one that never formed analysed nothing and was not cut short.
            let formed = started.as_ref().is_none_or(|m| m.exists());
            if let Some(m) = &started {
                let _ = std::fs::remove_file(m);
            }
            if race_on && !clean && formed {
                // Whatever rank 0 printed last (perhaps "0 data races") covered only the
                // epochs analysed before the failure; say so after everything else.
                eprintln!(
                    "dsmrun: race detection incomplete: the job did not finish, so accesses \
                     after the last completed barrier were not analysed (races reported above \
                     are real; others may have been missed)"
                );
            }
            ExitCode::from(outcome.exit_code())
        }
        Err(err) => {
            eprintln!("dsmrun: {err:#}");
            if let Some(m) = &started {
                let _ = std::fs::remove_file(m);
            }
            if let Some(dir) = &pin_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            if let Some(rec) = recording {
                order::discard_parts(&rec.prefix, rec.header.nodes as usize);
            }
            let code = if let Some(e) = err.downcast_ref::<LaunchError>() {
                e.exit_code()
            } else if let Some(e) = err.downcast_ref::<OrderError>() {
                e.exit_code()
            } else if err.is::<CorruptInput>() {
                dsm_proto::exit_codes::CORRUPT_INPUT
            } else if err.is::<UsageError>() {
                2
            } else {
                1
            };
            ExitCode::from(code)
        }
    }
}

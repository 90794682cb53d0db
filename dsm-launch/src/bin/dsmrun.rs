//! `dsmrun`, the job launcher of dsm (like `mpirun`): this file owns only the
//! command line — parsing it into a [`LaunchConfig`], the `--help` text, and
//! mapping the outcome to an exit code. Launching and supervising the ranks is
//! the `dsm_launch` library.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use dsm_launch::{self as launcher, JobOutcome, LaunchConfig, LaunchError};
use dsm_proto::liveness::DEFAULT_LIVENESS;
use dsm_proto::{exit_codes, parse_seconds, parse_seconds_or_off, parse_segment_size, RaceOptions};
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
  DSM_RACE_FIRST=1, DSM_RACE_STATS=1                  (only with --race-first/--race-stats)
DSM_SEGMENT_ADDR, DSM_PIN, DSM_STATS_FILE, DSM_RACE_PHASES and DSM_LOG are
passed through from dsmrun's environment (see the README).

Stopping: when a rank exits non-zero (other than with the race exit code) or
dies from a signal, dsmrun reports that first failure, sends SIGTERM to every
rank's process group and SIGKILL to those still running 2 s later; --timeout
does the same. A rank that exits because it lost a peer (status 71) is not
taken for the cause at once: dsmrun waits 1 s for the failure behind it. When
a rank reports that a peer has sent nothing for the liveness deadline,
dsmrun names that peer as the failure and kills it with SIGKILL (a stopped
process acts on no other signal). On SIGINT, SIGTERM or SIGHUP, dsmrun
forwards that signal to every rank's process group and sends SIGKILL 3 s
later (at once on a second Ctrl-C). Processes a rank started are in its
process group and stop with it; any still holding its output after all ranks
exited are killed.

Exit status:
  0      every rank exited 0
  1      a rank exited non-zero (the first failure is reported), a rank
         stopped responding (sent nothing for the liveness deadline), or
         dsmrun itself failed (e.g. could not start a rank)
  2      invalid command line
  124    --timeout expired
  126    PROGRAM is not executable
  127    PROGRAM was not found
  128+S  the first failing rank was killed by signal S (e.g. 139 for SIGSEGV),
         or dsmrun received signal S (130 for Ctrl-C)
  CODE   with race detection, a rank exited with the race exit code (default
         66) and nothing else failed";

/// Launch N processes of a dsm program on this machine and supervise them.
#[derive(Debug, Parser)]
#[command(
    name = "dsmrun",
    version,
    override_usage = "dsmrun [OPTIONS] [--] PROGRAM [ARGS]...",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Number of ranks (node processes) to start, 1..=256
    #[arg(short = 'n', value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=launcher::MAX_RANKS as i64))]
    ranks: u16,

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
    /// option below implies --race
    #[arg(long)]
    race: bool,

    /// Write every race as one JSON object per line to FILE (all fields, no
    /// collapsing; rank 0 writes it; relative paths are taken from the current
    /// directory) (DSM_RACE_LOG, made absolute; implies --race)
    #[arg(long, value_name = "FILE")]
    race_log: Option<PathBuf>,

    /// Exit status when races were reported (DSM_RACE_EXIT_CODE): rank 0 exits
    /// with it, which is not a failure: the other ranks finish and dsmrun exits
    /// with this code at the end. 0 turns this off (implies --race) [default: 66]
    #[arg(long, value_name = "CODE")]
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

    /// The program to run, followed by its arguments
    #[arg(value_name = "PROGRAM [ARGS]", required = true, num_args = 1..,
          trailing_var_arg = true)]
    command: Vec<OsString>,
}

/// A `--liveness` value: seconds, or `None` for off.
#[derive(Debug, Clone, Copy)]
struct Deadline(Option<Duration>);

fn parse_deadline(text: &str) -> Result<Deadline, dsm_proto::ValueError> {
    parse_seconds_or_off(text).map(Deadline)
}

impl Cli {
    fn into_config(self) -> anyhow::Result<LaunchConfig> {
        let race_on = self.race
            || self.race_log.is_some()
            || self.race_exit_code.is_some()
            || self.race_first
            || self.race_stats;
        let race = if race_on {
            let log = self
                .race_log
                .map(|log| {
                    std::path::absolute(&log).with_context(|| {
                        format!("cannot make --race-log '{}' absolute", log.display())
                    })
                })
                .transpose()?;
            RaceOptions {
                enabled: true,
                log,
                exit_code: self.race_exit_code.unwrap_or(exit_codes::RACES_FOUND),
                first_only: self.race_first,
                stats: self.race_stats,
                ..RaceOptions::default()
            }
        } else {
            RaceOptions::default()
        };
        let mut command = self.command.into_iter();
        let program = command
            .next()
            .context("no PROGRAM given (see dsmrun --help)")?;
        Ok(LaunchConfig {
            ranks: usize::from(self.ranks),
            program,
            args: command.collect(),
            segment_bytes: self.segment,
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            liveness: self.liveness.map_or(Some(DEFAULT_LIVENESS), |d| d.0),
            race,
        })
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
    match cli.into_config().and_then(|config| {
        race_on = config.race.enabled;
        Ok(launcher::run(&config)?)
    }) {
        Ok(outcome) => {
            let clean = matches!(
                outcome,
                JobOutcome::Success | JobOutcome::RaceReported { .. }
            );
            if race_on && !clean {
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
            let code = err
                .downcast_ref::<LaunchError>()
                .map_or(1, LaunchError::exit_code);
            ExitCode::from(code)
        }
    }
}

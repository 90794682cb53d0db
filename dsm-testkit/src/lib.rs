//! The one harness of dsm's multi-process tests: finding the programs the workspace built,
//! starting them (alone or under `dsmrun`) with their output collected and a watchdog
//! behind them, and skipping visibly when a test cannot run on this machine.
//!
//! Programs are looked up next to the test executable's directory (`target/<profile>/`),
//! where `cargo test --workspace` puts every binary of the workspace. A missing program is
//! a clear panic naming the command that builds it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod weak_atomics;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Far above what a passing run needs; only there so a hung job fails its test instead of
/// the whole suite.
pub const WATCHDOG: Duration = Duration::from_secs(120);

/// The directory holding the workspace's binaries for this test run's profile.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test>-<hash>
    let deps = exe.parent().expect("test executable in a directory");
    if deps.file_name() == Some(OsStr::new("deps")) {
        deps.parent().expect("deps/ has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// Path of the workspace binary `name` (`dsmrun`, `sor`, `dsm-test`, ...).
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace first (`cargo build --release --workspace`, \
         or run the tests with `cargo test --release --workspace`)",
        path.display()
    );
    path
}

/// A command for the workspace binary `name`, stdin from /dev/null.
pub fn command(name: &str) -> Command {
    let mut cmd = Command::new(bin(name));
    cmd.stdin(Stdio::null());
    cmd
}

/// What the multi-process tests run with unless they say otherwise: the page protocol,
/// with shared-memory rings between the ranks. Every rank of a test job runs on this one
/// host, where dsm's default (`DSM_TRANSPORT=auto`) maps one common segment for all of them
/// and no page travels; the tests were written to exercise the protocol (faults, fetches,
/// diffs, pushes) over real processes, so they ask for it. The default's own tests set
/// `DSM_TRANSPORT=auto`.
pub const PROTOCOL_TRANSPORT: (&str, &str) = ("DSM_TRANSPORT", "rings");

/// `dsmrun -n N [dsmrun_args] PROGRAM [args]`, where PROGRAM is a workspace binary name or a
/// path, with `DSM_TRANSPORT=rings` ([`PROTOCOL_TRANSPORT`]; set the variable again on the
/// command to test another transport).
pub fn dsmrun_command(n: usize, dsmrun_args: &[&str], program: &str, args: &[&str]) -> Command {
    let mut cmd = command("dsmrun");
    cmd.env(PROTOCOL_TRANSPORT.0, PROTOCOL_TRANSPORT.1);
    cmd.arg("-n")
        .arg(n.to_string())
        .args(dsmrun_args)
        .arg(program_path(program))
        .args(args);
    cmd
}

/// `program` itself when it is a path (holds a `/`), else the workspace binary of that
/// name ([`bin`]).
pub fn program_path(program: &str) -> PathBuf {
    if program.contains('/') {
        PathBuf::from(program)
    } else {
        bin(program)
    }
}

/// Runs `dsmrun -n N [dsmrun_args] PROGRAM [args]` to completion.
pub fn dsmrun(n: usize, dsmrun_args: &[&str], program: &str, args: &[&str]) -> Run {
    run(dsmrun_command(n, dsmrun_args, program, args))
}

/// Runs `dsmrun -n N --timeout 120 PROGRAM [args]` (watchdog 180 s) with each rank's
/// counters written to `stats/rank-R.json` (`DSM_STATS_FILE`, read them with
/// [`rank_counter`]) and `var` set to `value`, or removed from the environment for `None`.
pub fn dsmrun_with_stats(
    n: usize,
    program: &str,
    args: &[&str],
    (var, value): (&str, Option<&str>),
    stats: &std::path::Path,
) -> Run {
    let mut cmd = dsmrun_command(n, &["--timeout", "120"], program, args);
    cmd.env("DSM_STATS_FILE", stats.join("rank-%r.json"));
    match value {
        Some(v) => cmd.env(var, v),
        None => cmd.env_remove(var),
    };
    start_with_watchdog(cmd, Duration::from_secs(180)).finish()
}

/// Counter `section.key` of rank `rank`'s stats file from [`dsmrun_with_stats`]; panics
/// naming the file when it is missing.
pub fn rank_counter(stats: &std::path::Path, rank: usize, section: &str, key: &str) -> u64 {
    let path = stats.join(format!("rank-{rank}.json"));
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    json[section][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {section}.{key} in {}", path.display()))
}

/// Counter `section.key` summed over ranks `0..n` (see [`rank_counter`]).
pub fn counter_sum(stats: &std::path::Path, n: usize, section: &str, key: &str) -> u64 {
    (0..n).map(|r| rank_counter(stats, r, section, key)).sum()
}

/// Runs `dsmrun -n N [dsmrun_args] --race-log LOG PROGRAM [args]` with `env` added to its
/// environment, LOG being a fresh temporary file; returns the run and the log's JSON
/// objects, one per line (none when the job wrote no log).
pub fn dsmrun_race_logged(
    n: usize,
    dsmrun_args: &[&str],
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Run, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("races.jsonl");
    let log_arg = log.to_str().expect("temporary paths are UTF-8");
    let mut all = dsmrun_args.to_vec();
    all.extend(["--race-log", log_arg]);
    let mut cmd = dsmrun_command(n, &all, program, args);
    cmd.envs(env.iter().copied());
    let out = run(cmd);
    let lines = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("race log lines are JSON"))
        .collect();
    (out, lines)
}

/// How a program ended, with everything it printed.
pub struct Run {
    /// Exit status, `None` if a signal ended it.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Standard output (lossily decoded).
    pub stdout: String,
    /// Standard output as bytes.
    pub stdout_bytes: Vec<u8>,
    /// Standard error (lossily decoded).
    pub stderr: String,
    /// From start to exit.
    pub elapsed: Duration,
    /// The raw status.
    pub status: ExitStatus,
}

impl Run {
    /// Panics, naming `what` and showing the run, unless the job exited 0 and rank 0
    /// printed its "verified" line (the apps' check against their sequential reference).
    #[track_caller]
    pub fn assert_verified(&self, what: &str) {
        assert!(
            self.code == Some(0) && self.stdout.contains("[0] verified:"),
            "{what}: {self:?}"
        );
    }

    /// Standard output, line by line.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lines().map(str::to_owned).collect()
    }

    /// The same as a [`std::process::Output`], for tests written against that.
    pub fn into_output(self) -> std::process::Output {
        std::process::Output {
            status: self.status,
            stdout: self.stdout_bytes,
            stderr: self.stderr.into_bytes(),
        }
    }

    /// Standard output and error together, for searching messages wherever they went.
    pub fn all_output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?} (signal {:?}) after {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.signal, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// A started program whose output is being collected.
pub struct Running {
    child: Child,
    started: Instant,
    watchdog: Duration,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
}

fn collect(mut from: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = from.read_to_end(&mut buf);
        buf
    })
}

/// Starts `cmd` (stdin from /dev/null unless set, stdout and stderr collected).
pub fn start(cmd: Command) -> Running {
    start_with_watchdog(cmd, WATCHDOG)
}

/// [`start`] with a watchdog of its own.
pub fn start_with_watchdog(mut cmd: Command, watchdog: Duration) -> Running {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let stdout = collect(child.stdout.take().expect("piped stdout"));
    let stderr = collect(child.stderr.take().expect("piped stderr"));
    Running {
        child,
        started,
        watchdog,
        stdout,
        stderr,
    }
}

impl Running {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process, for sending it signals or input.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether it has exited yet (without reaping it for good).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the end (killing it when the watchdog expires, which fails the test).
    pub fn finish(mut self) -> Run {
        let status: ExitStatus = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the child") {
                break status;
            }
            if self.started.elapsed() > self.watchdog {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("did not finish within {:?}", self.watchdog);
            }
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        let stdout_bytes = self.stdout.join().expect("stdout collector");
        let stderr = self.stderr.join().expect("stderr collector");
        use std::os::unix::process::ExitStatusExt;
        Run {
            code: status.code(),
            signal: status.signal(),
            stdout: String::from_utf8_lossy(&stdout_bytes).into_owned(),
            stdout_bytes,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            elapsed,
            status,
        }
    }
}

/// Runs `cmd` to completion under the default watchdog.
pub fn run(cmd: Command) -> Run {
    start(cmd).finish()
}

/// True once process `pid` has exited: its `/proc` entry is gone, or it is a zombie (a
/// killed grandchild is reparented and stays a zombie until its new parent reaps it).
pub fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// Says, where the test runner shows it even for passing tests, that `test` did not run
/// and why. Write directly to the stderr handle: the harness captures `eprintln!`, not that.
pub fn skip(test: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}

/// Installs the Debian `packages` that provide `binaries` (absolute paths) if any is
/// missing, as CI must: `apt-get update`, then `apt-get install`. The error says why not
/// (not root, no apt-get, no network), for the caller's visible skip.
pub fn ensure_installed(binaries: &[&str], packages: &[&str]) -> Result<(), String> {
    use std::path::Path;
    use std::process::Stdio;
    // Tests run on threads of one process: two installing at once would find apt's lock
    // taken and skip. One at a time, and the later one sees what the first installed.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|p| p.into_inner());
    if binaries.iter().all(|b| Path::new(b).exists()) {
        return Ok(());
    }
    let root = {
        use std::os::unix::fs::MetadataExt;
        // /proc/self belongs to the effective user.
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    };
    if !root {
        return Err(format!(
            "{binaries:?} missing and installing {packages:?} needs root"
        ));
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            // Another process's apt (an unattended upgrade, another test binary's
            // install) is waited for, not failed on.
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run apt-get: {e}"))
            .and_then(|o| {
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "apt-get {} failed: {}",
                        args.join(" "),
                        String::from_utf8_lossy(&o.stderr).trim()
                    ))
                }
            })
    };
    apt(&["update"])?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend_from_slice(packages);
    apt(&install)?;
    match binaries.iter().find(|b| !Path::new(b).exists()) {
        Some(b) => Err(format!("{b} still missing after installing {packages:?}")),
        None => Ok(()),
    }
}

/// A loopback port nobody listens on right now, for a job's rendezvous.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Runs `ip ARGS` quietly; whether it succeeded.
pub fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Makes `cmd` one rank of a job started by hand (no dsmrun), the way srun- or
/// mpirun-launched ranks start: its place, the rendezvous, the secret and the connect
/// timeout in seconds, with stdout and stderr piped.
pub fn as_rank<'a>(
    cmd: &'a mut Command,
    rank: usize,
    size: usize,
    coord: &str,
    secret: &str,
    connect_timeout_s: u32,
) -> &'a mut Command {
    use dsm_proto::env_vars;
    cmd.env(env_vars::RANK, rank.to_string())
        .env(env_vars::SIZE, size.to_string())
        .env(env_vars::COORD, coord)
        .env(env_vars::JOB_SECRET, secret)
        .env(env_vars::CONNECT_TIMEOUT, connect_timeout_s.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
}

/// C and C++ programs for dsm: compiling them with `dsm-capi/dsmcc` against this build's
/// `libdsm.a`, shared by the C tests on one host (`dsm-capi`) and across hosts (`apps`).
pub mod capi {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// The `dsm-capi` crate's directory (no `..` in it: the sources' paths are those the
    /// race reports name).
    pub fn capi_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("dsm-testkit is in the workspace")
            .join("dsm-capi")
    }

    /// Whether compiler `cc` runs here; prints the visible skip of `test` when not.
    pub fn have(cc: &str, test: &str) -> bool {
        let there = Command::new(cc).arg("--version").output().is_ok();
        if !there {
            super::skip(
                test,
                &format!("no {cc} on this machine (apt-get install -y {cc})"),
            );
        }
        there
    }

    /// A source file of `lib` changed since it was built, if any: one of those cargo's
    /// dep-info file beside it (`libdsm.d`, written with the library) lists, newer than
    /// the library. Without the dep-info file, none.
    fn source_newer_than(lib: &Path) -> Option<PathBuf> {
        let built = std::fs::metadata(lib).and_then(|m| m.modified()).ok()?;
        let info = std::fs::read_to_string(lib.with_extension("d")).ok()?;
        let (_, sources) = info.split_once(": ")?;
        // Paths are separated by spaces; a space inside one is escaped as `\ `.
        let sources = sources.trim().replace("\\ ", "\0");
        sources
            .split(' ')
            .map(|s| PathBuf::from(s.replace('\0', " ")))
            .find(|src| {
                std::fs::metadata(src)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t > built)
            })
    }

    /// Compiles `source` with `dsmcc` (compiler `cc`, `flags`) into `dir`, against the
    /// `libdsm.a` of this build (`cargo build -p dsm-capi` makes it; `cargo test` of another
    /// crate does not); the executable is named after the source. Panics with the compiler's
    /// messages when it fails.
    pub fn build(cc: &str, flags: &[&str], source: &Path, dir: &Path) -> PathBuf {
        let exe = dir.join(source.file_stem().expect("a file name"));
        let lib = super::bin_dir().join("libdsm.a");
        assert!(
            lib.is_file(),
            "{} is missing: build it first (`cargo build --release --workspace`)",
            lib.display()
        );
        if let Some(newer) = source_newer_than(&lib) {
            panic!(
                "{} is older than {}, one of its sources: `cargo test` does not rebuild it; \
                 run `cargo build --release -p dsm-capi` first",
                lib.display(),
                newer.display()
            );
        }
        let out = Command::new(capi_dir().join("dsmcc"))
            .env("DSMCC_CC", cc)
            .env("DSM_LIB", lib)
            .args(flags)
            .arg("-o")
            .arg(&exe)
            .arg(source)
            .output()
            .expect("dsmcc runs");
        assert!(
            out.status.success(),
            "dsmcc {} failed:\n{}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    }

    /// The path of C app `name` (`c-apps/NAME.c`).
    pub fn app_source(name: &str) -> PathBuf {
        capi_dir().join(format!("c-apps/{name}.c"))
    }

    /// C app `name` compiled by gcc as C11 with warnings as errors, `-O2`, into `dir`.
    pub fn build_app(name: &str, dir: &Path) -> PathBuf {
        build(
            "gcc",
            &["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"],
            &app_source(name),
            dir,
        )
    }

    /// The 1-based number of the first line of `source` containing `needle`; panics when
    /// none does.
    pub fn line_of(source: &Path, needle: &str) -> u32 {
        let text =
            std::fs::read_to_string(source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        text.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line of {} contains {needle:?}", source.display()))
            as u32
            + 1
    }

    /// The line of `water.c` that adds a rank's private force sums into the shared
    /// `forces` (under a lock, or without one with `--racy`: the seeded race's both sides).
    pub fn water_force_add_line() -> u32 {
        line_of(
            &app_source("water"),
            "r->forces[j].s[s][a] += r->f[j].s[s][a];",
        )
    }
}

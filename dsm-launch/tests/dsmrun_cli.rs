//! End-to-end tests of the `dsmrun` binary: real processes, with small shell
//! scripts as the program, checking environment, output forwarding, failure,
//! timeout and signal handling, and exit codes.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

/// Far above anything a passing test needs; only there so a hung dsmrun fails
/// the test instead of the whole run.
const WATCHDOG: Duration = Duration::from_secs(20);

type Finished = dsm_testkit::Run;

fn dsmrun() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsmrun"));
    cmd.stdin(Stdio::null());
    cmd
}

fn start(cmd: Command) -> Running {
    Running(dsm_testkit::start_with_watchdog(cmd, WATCHDOG))
}

struct Running(dsm_testkit::Running);

impl Running {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.0.pid() as i32)
    }

    fn finish(self) -> Finished {
        self.0.finish()
    }
}

fn run<I, S>(args: I) -> Finished
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = dsmrun();
    cmd.args(args);
    start(cmd).finish()
}

/// Writes an executable `#!/bin/sh` script and returns its path.
fn script(dir: &TempDir, name: &str, body: &str) -> PathBuf {
    let path = dir.path().join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Polls until `path` holds a pid (scripts write it atomically with `mv`).
fn wait_for_pid(path: &Path) -> Pid {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = fs::read_to_string(path) {
            if let Ok(pid) = text.trim().parse() {
                return Pid::from_raw(pid);
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

fn is_gone(pid: Pid) -> bool {
    dsm_testkit::is_gone(pid.as_raw())
}

/// Parses `[r] KEY=VALUE KEY=VALUE ...` lines into one map per rank.
fn env_report(out: &Finished) -> BTreeMap<usize, BTreeMap<String, String>> {
    let mut ranks = BTreeMap::new();
    for line in out.stdout_lines() {
        let (prefix, rest) = line.split_once("] ").expect("prefixed line");
        let rank: usize = prefix.strip_prefix('[').unwrap().parse().unwrap();
        let vars = rest
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert!(ranks.insert(rank, vars).is_none(), "rank {rank} twice");
    }
    ranks
}

const PRINT_ENV: &str = r#"echo "DSM_RANK=${DSM_RANK-<unset>} DSM_SIZE=${DSM_SIZE-<unset>} DSM_COORD=${DSM_COORD-<unset>} DSM_JOB_SECRET=${DSM_JOB_SECRET-<unset>} DSM_LAUNCHER=${DSM_LAUNCHER-<unset>} DSM_SEGMENT=${DSM_SEGMENT-<unset>} DSM_CONNECT_TIMEOUT=${DSM_CONNECT_TIMEOUT-<unset>} DSM_LIVENESS=${DSM_LIVENESS-<unset>} DSM_RACE=${DSM_RACE-<unset>} DSM_RACE_LOG=${DSM_RACE_LOG-<unset>} DSM_RACE_EXIT_CODE=${DSM_RACE_EXIT_CODE-<unset>} DSM_RACE_FIRST=${DSM_RACE_FIRST-<unset>} DSM_RACE_STATS=${DSM_RACE_STATS-<unset>}""#;

#[test]
fn ranks_get_distinct_ranks_and_a_shared_job() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(&dir, "env.sh", PRINT_ENV);
    let first = run([OsStr::new("-n"), OsStr::new("4"), prog.as_os_str()]);
    assert_eq!(first.code, Some(0), "{first:?}");
    let ranks = env_report(&first);
    assert_eq!(ranks.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    for (rank, vars) in &ranks {
        assert_eq!(vars["DSM_RANK"], rank.to_string(), "{first:?}");
        assert_eq!(vars["DSM_SIZE"], "4");
        assert_eq!(vars["DSM_LAUNCHER"], "dsmrun");
        // Options not given leave their variables unset.
        for unset in [
            "DSM_SEGMENT",
            "DSM_CONNECT_TIMEOUT",
            "DSM_LIVENESS",
            "DSM_RACE",
            "DSM_RACE_LOG",
            "DSM_RACE_EXIT_CODE",
            "DSM_RACE_FIRST",
            "DSM_RACE_STATS",
        ] {
            assert_eq!(vars[unset], "<unset>", "{unset} set: {first:?}");
        }
    }
    let shared = |key: &str| {
        let values: BTreeSet<&String> = ranks.values().map(|v| &v[key]).collect();
        assert_eq!(values.len(), 1, "{key} differs between ranks: {first:?}");
        values.into_iter().next().unwrap().clone()
    };
    let coord = shared("DSM_COORD");
    let (host, port) = coord.split_once(':').unwrap();
    assert_eq!(host, "127.0.0.1");
    assert_ne!(port.parse::<u16>().unwrap(), 0);
    let secret = shared("DSM_JOB_SECRET");
    assert_eq!(secret.len(), 32);
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()), "{secret}");

    let second = run([prog.as_os_str()]);
    assert_eq!(second.code, Some(0), "{second:?}");
    assert_ne!(env_report(&second)[&0]["DSM_JOB_SECRET"], secret);
}

#[test]
fn options_become_environment_and_inherited_values_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(&dir, "env.sh", PRINT_ENV);
    let mut cmd = dsmrun();
    cmd.current_dir(dir.path())
        // Left over from an outer job: must not reach the ranks.
        .env("DSM_RACE_STATS", "1")
        .env("DSM_RANK", "7")
        .env("DSM_LIVENESS", "7")
        .args(["-n", "2", "--segment", "512M", "--connect-timeout", "2.5"])
        .args(["--liveness", "0"])
        .args(["--race-log", "races.log", "--race-first"])
        .arg(&prog);
    let out = start(cmd).finish();
    assert_eq!(out.code, Some(0), "{out:?}");
    let ranks = env_report(&out);
    let log = dir.path().join("races.log");
    for (rank, vars) in &ranks {
        assert_eq!(vars["DSM_RANK"], rank.to_string());
        assert_eq!(vars["DSM_SEGMENT"], (512u64 << 20).to_string());
        assert_eq!(vars["DSM_CONNECT_TIMEOUT"], "2.5");
        assert_eq!(vars["DSM_LIVENESS"], "off");
        // --race-log/--race-first imply --race.
        assert_eq!(vars["DSM_RACE"], "1");
        assert_eq!(vars["DSM_RACE_EXIT_CODE"], "66");
        assert_eq!(Path::new(&vars["DSM_RACE_LOG"]), log);
        assert_eq!(vars["DSM_RACE_FIRST"], "1");
        assert_eq!(vars["DSM_RACE_STATS"], "<unset>", "{out:?}");
    }
}

#[test]
fn output_is_prefixed_per_line_on_the_right_stream() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "talk.sh",
        r#"echo "out one $DSM_RANK"
echo "err $DSM_RANK" >&2
echo "out two $DSM_RANK"
printf '\377\376 raw\n'
printf 'no newline'"#,
    );
    let out = run([OsStr::new("-n"), OsStr::new("3"), prog.as_os_str()]);
    assert_eq!(out.code, Some(0), "{out:?}");
    for rank in 0..3 {
        let rank_lines: Vec<&[u8]> = out
            .stdout_bytes
            .split(|&b| b == b'\n')
            .filter(|l| l.starts_with(format!("[{rank}] ").as_bytes()))
            .collect();
        let expected: Vec<Vec<u8>> = vec![
            format!("[{rank}] out one {rank}").into_bytes(),
            format!("[{rank}] out two {rank}").into_bytes(),
            [format!("[{rank}] ").as_bytes(), b"\xff\xfe raw"].concat(),
            format!("[{rank}] no newline").into_bytes(),
        ];
        assert_eq!(rank_lines, expected, "{out:?}");
        assert!(
            out.stderr
                .lines()
                .any(|l| l == format!("[{rank}] err {rank}")),
            "{out:?}"
        );
    }
    // 4 lines per rank and a newline added after the partial last line.
    assert_eq!(out.stdout_bytes.iter().filter(|&&b| b == b'\n').count(), 12);
    assert!(out.stdout_bytes.ends_with(b"\n"));
    assert!(!out.stdout.contains("err"));
}

#[test]
fn arguments_after_program_pass_through_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "args.sh",
        r#"for a in "$@"; do printf '<%s>\n' "$a"; done"#,
    );
    let out = run([
        OsStr::new("-n"),
        OsStr::new("2"),
        prog.as_os_str(),
        OsStr::new("--timeout"),
        OsStr::new("5"),
        OsStr::new("-n"),
        OsStr::new("3"),
        OsStr::new("--"),
        OsStr::new("a b"),
        OsStr::new(""),
        OsStr::new("--help"),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let expected = ["--timeout", "5", "-n", "3", "--", "a b", "", "--help"];
    for rank in 0..2 {
        let got: Vec<String> = out
            .stdout_lines()
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("[{rank}] ")))
            .map(|l| l.trim_start_matches('<').trim_end_matches('>').to_owned())
            .collect();
        assert_eq!(got, expected, "{out:?}");
    }
}

#[test]
fn failing_rank_stops_the_job_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // Ranks other than 2 run a background grandchild too, to check that the
    // whole process group is stopped, not just the rank itself.
    let prog = script(
        &dir,
        "fail.sh",
        &format!(
            r#"if [ "$DSM_RANK" = 2 ]; then
  while [ ! -f {dir}/child.0 ] || [ ! -f {dir}/child.1 ] || [ ! -f {dir}/child.3 ]; do sleep 0.05; done
  echo "rank two failing" >&2
  exit 3
fi
sleep 60 &
echo $! > {dir}/tmp.$DSM_RANK && mv {dir}/tmp.$DSM_RANK {dir}/child.$DSM_RANK
wait"#,
            dir = dir.path().display()
        ),
    );
    let out = run([OsStr::new("-n"), OsStr::new("4"), prog.as_os_str()]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert!(
        out.stderr
            .contains("dsmrun: rank 2 exited with status 3; stopping the other 3 ranks"),
        "{out:?}"
    );
    assert!(out.stderr.contains("[2] rank two failing"), "{out:?}");
    // Only the first failure is reported as a cause.
    assert_eq!(out.stderr.matches("dsmrun: rank").count(), 1, "{out:?}");
    for rank in [0, 1, 3] {
        let pid = wait_for_pid(&dir.path().join(format!("child.{rank}")));
        assert!(is_gone(pid), "rank {rank}'s child {pid} survived: {out:?}");
    }
}

#[test]
fn rank_killed_by_signal_is_named_and_mapped_to_128_plus_signal() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "kill.sh",
        r#"if [ "$DSM_RANK" = 1 ]; then kill -9 $$; fi
exec sleep 60"#,
    );
    let out = run([OsStr::new("-n"), OsStr::new("3"), prog.as_os_str()]);
    assert_eq!(out.code, Some(137), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert!(
        out.stderr.contains(
            "dsmrun: rank 1 was killed by signal 9 (SIGKILL); stopping the other 2 ranks"
        ),
        "{out:?}"
    );
}

#[test]
fn ranks_ignoring_sigterm_are_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "stubborn.sh",
        &format!(
            r#"if [ "$DSM_RANK" = 0 ]; then
  while [ ! -f {dir}/ready ]; do sleep 0.05; done
  exit 5
fi
trap '' TERM
touch {dir}/ready
sleep 60"#,
            dir = dir.path().display()
        ),
    );
    let out = run([OsStr::new("-n"), OsStr::new("2"), prog.as_os_str()]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(
        out.stderr.contains("rank 0 exited with status 5"),
        "{out:?}"
    );
    assert!(out.stderr.contains("sending SIGKILL"), "{out:?}");
    // SIGTERM is ignored, so this takes the 2 s grace period, and not much more.
    assert!(out.elapsed >= Duration::from_millis(1900), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
}

#[test]
fn timeout_stops_all_ranks_with_124() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(&dir, "sleep.sh", "sleep 60");
    let out = run([
        OsStr::new("-n"),
        OsStr::new("2"),
        OsStr::new("--timeout"),
        OsStr::new("1"),
        prog.as_os_str(),
    ]);
    assert_eq!(out.code, Some(124), "{out:?}");
    assert!(
        out.stderr
            .contains("dsmrun: job timed out after 1 s; stopping all ranks"),
        "{out:?}"
    );
    assert!(out.elapsed >= Duration::from_millis(900), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(8), "{out:?}");
}

#[test]
fn all_ranks_succeeding_exits_0_even_with_a_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(&dir, "ok.sh", "echo fine");
    let out = run([
        OsStr::new("-n"),
        OsStr::new("3"),
        OsStr::new("--timeout"),
        OsStr::new("30"),
        prog.as_os_str(),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    assert_eq!(out.stdout_lines().len(), 3, "{out:?}");
    assert!(!out.stderr.contains("dsmrun:"), "{out:?}");
}

#[test]
fn race_exit_code_waits_for_the_others_and_is_returned() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "race.sh",
        r#"if [ "$DSM_RANK" = 0 ]; then echo "race found"; exit 66; fi
sleep 0.5
echo "done $DSM_RACE_EXIT_CODE""#,
    );
    let out = run([
        OsStr::new("-n"),
        OsStr::new("3"),
        OsStr::new("--race"),
        prog.as_os_str(),
    ]);
    assert_eq!(out.code, Some(66), "{out:?}");
    let lines = out.stdout_lines();
    // The other ranks were not stopped early: they finished their work.
    assert!(lines.contains(&"[1] done 66".to_owned()), "{out:?}");
    assert!(lines.contains(&"[2] done 66".to_owned()), "{out:?}");
    assert!(lines.contains(&"[0] race found".to_owned()), "{out:?}");
    assert!(!out.stderr.contains("stopping"), "{out:?}");
}

#[test]
fn the_race_exit_code_from_a_rank_other_than_0_is_its_failure() {
    // Only rank 0 reports races: another rank exiting with the same status failed, and
    // is named as the cause (with --race-exit-code 1 a failing rank's usual status).
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "fail.sh",
        r#"if [ "$DSM_RANK" = 1 ]; then exit 1; fi
exec sleep 60"#,
    );
    let out = run([
        OsStr::new("-n"),
        OsStr::new("2"),
        OsStr::new("--race-exit-code"),
        OsStr::new("1"),
        prog.as_os_str(),
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert!(
        out.stderr
            .contains("dsmrun: rank 1 exited with status 1; stopping the other rank"),
        "{out:?}"
    );
}

#[test]
fn race_exit_code_is_a_failure_without_race() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "race.sh",
        r#"if [ "$DSM_RANK" = 1 ]; then exit 66; fi
exec sleep 60"#,
    );
    let out = run([OsStr::new("-n"), OsStr::new("2"), prog.as_os_str()]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert!(
        out.stderr
            .contains("dsmrun: rank 1 exited with status 66; stopping the other rank"),
        "{out:?}"
    );
}

#[test]
fn race_exit_code_0_turns_the_convention_off() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "race.sh",
        r#"echo "code=$DSM_RACE_EXIT_CODE"; exit 66"#,
    );
    let out = run([
        OsStr::new("--race-exit-code"),
        OsStr::new("0"),
        prog.as_os_str(),
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stdout_lines().contains(&"[0] code=0".to_owned()),
        "{out:?}"
    );
}

#[test]
fn sigint_stops_the_children_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "wait.sh",
        &format!(
            "echo $$ > {dir}/tmp.$DSM_RANK && mv {dir}/tmp.$DSM_RANK {dir}/pid.$DSM_RANK\nexec sleep 60",
            dir = dir.path().display()
        ),
    );
    let mut cmd = dsmrun();
    cmd.args(["-n", "3"]).arg(&prog);
    let job = start(cmd);
    let pids: Vec<Pid> = (0..3)
        .map(|rank| wait_for_pid(&dir.path().join(format!("pid.{rank}"))))
        .collect();
    assert!(pids.iter().all(|&pid| !is_gone(pid)));
    let interrupted = Instant::now();
    kill(job.pid(), Signal::SIGINT).unwrap();
    let out = job.finish();
    assert_eq!(out.code, Some(130), "{out:?}");
    assert!(interrupted.elapsed() < Duration::from_secs(10), "{out:?}");
    assert!(out.stderr.contains("received SIGINT"), "{out:?}");
    for pid in pids {
        assert!(is_gone(pid), "rank process {pid} lingers: {out:?}");
    }
}

#[test]
fn program_is_found_on_path_by_name() {
    let dir = tempfile::tempdir().unwrap();
    script(&dir, "dsm-test-hello", "echo hello");
    let path = std::env::join_paths(std::iter::once(dir.path().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let mut cmd = dsmrun();
    cmd.env("PATH", path).arg("dsm-test-hello");
    let out = start(cmd).finish();
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout_lines(), vec!["[0] hello".to_owned()]);
}

#[test]
fn unknown_program_exits_127_naming_where_it_looked() {
    let out = run(["-n", "2", "dsm-surely-no-such-program", "--flag"]);
    assert_eq!(out.code, Some(127), "{out:?}");
    let exe_dir = Path::new(env!("CARGO_BIN_EXE_dsmrun")).parent().unwrap();
    assert_eq!(
        out.stderr.trim_end(),
        format!(
            "dsmrun: cannot find program 'dsm-surely-no-such-program' (looked in {} and on PATH)",
            exe_dir.display()
        ),
        "{out:?}"
    );

    let out = run(["./no/such/path"]);
    assert_eq!(out.code, Some(127), "{out:?}");
    assert!(out.stderr.contains("'./no/such/path'"), "{out:?}");
}

#[test]
fn non_executable_program_exits_126() {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("plain.sh");
    fs::write(&prog, "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o644)).unwrap();
    let out = run([prog.as_os_str()]);
    assert_eq!(out.code, Some(126), "{out:?}");
    assert!(out.stderr.contains("not executable"), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

#[test]
fn bad_command_lines_are_clear_errors() {
    for (args, needle) in [
        (vec!["-n", "0", "true"], "'0'"),
        (vec!["-n", "257", "true"], "'257'"),
        (vec!["-n", "two", "true"], "'two'"),
        (vec!["--segment", "lots", "true"], "'lots'"),
        (vec!["--segment", "1.5G", "true"], "fractional"),
        (vec!["--segment", "0", "true"], "greater than zero"),
        (
            vec!["--segment", "17T", "true"],
            "largest shared segment, 16T",
        ),
        (
            vec!["--timeout", "-1", "true"],
            "'-1' is not a number of seconds",
        ),
        (vec!["--timeout", "0", "true"], "--timeout"),
        (
            vec!["--connect-timeout", "soon", "true"],
            "--connect-timeout",
        ),
        (vec!["--race-exit-code", "300", "true"], "--race-exit-code"),
        (
            vec!["--race-exit-code", "124", "true"],
            "exit status 124 already means an expired --timeout",
        ),
        (
            vec!["--race-exit-code", "139", "true"],
            "a rank killed by a signal",
        ),
        (vec!["-x", "=bar", "true"], "expected VAR or VAR=VALUE"),
        (
            vec!["--bind-address", "garbage", "true"],
            "is not an IP address or IP:PORT",
        ),
        (vec!["--liveness", "-1", "true"], "or 0 or off for none"),
        (vec!["--liveness", "never", "true"], "--liveness"),
        (vec!["--no-such-option", "true"], "--no-such-option"),
        (vec![], "PROGRAM"),
    ] {
        let out = run(&args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert!(out.stderr.contains(needle), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
}

#[test]
fn help_documents_options_environment_and_exit_codes() {
    let out = run(["--help"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let help = out.stdout.clone();
    for needle in [
        "-n <N>",
        "--segment",
        "--timeout",
        "--connect-timeout",
        "--liveness",
        "0 or off turns the check off",
        "--race-log",
        "--race-exit-code",
        "--race-first",
        "--race-stats",
        "implies --race",
        "DSM_RANK",
        "DSM_SIZE",
        "DSM_COORD",
        "DSM_JOB_SECRET",
        "DSM_LAUNCHER",
        "DSM_SEGMENT",
        "DSM_CONNECT_TIMEOUT",
        "DSM_LIVENESS",
        "DSM_RACE_LOG",
        "DSM_RACE_EXIT_CODE",
        "DSM_RACE_FIRST",
        "DSM_RACE_STATS",
        "--race=schedule",
        "--schedule-ignore",
        "DSM_RACE_MODE=schedule",
        "DSM_SCHEDULE_IGNORE",
        "lock-order dependences",
        "124",
        "126",
        "127",
        "128+S",
        "130",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
    // The help states the default as text; it must be the one the ranks apply.
    let default = dsm_proto::format_secs(dsm_proto::liveness::DEFAULT_LIVENESS);
    assert!(
        help.contains(&format!("DSM_LIVENESS [default: {default}]"))
            && help.contains(&format!("--liveness other than {default})")),
        "{help}"
    );
}

/// A script for `dsmrun -n 3` in which rank 1 records its pid and stops itself (SIGSTOP),
/// the others wait for that pid file and then run `rest` (shell, rank in `$DSM_RANK`).
fn stopped_rank_1_script(dir: &TempDir, name: &str, rest: &str) -> PathBuf {
    let prelude = format!(
        r#"if [ "$DSM_RANK" = 1 ]; then
  echo $$ > {dir}/tmp.1 && mv {dir}/tmp.1 {dir}/pid.1
  kill -STOP $$
  exit 0
fi
while [ ! -f {dir}/pid.1 ]; do sleep 0.05; done
"#,
        dir = dir.path().display()
    );
    script(dir, name, &format!("{prelude}{rest}"))
}

/// What a real rank 0 prints when rank 1 has sent nothing for a 2 s liveness deadline.
fn rank_1_silent_to_rank_0() -> dsm_proto::liveness::Silence {
    dsm_proto::liveness::Silence::new(0, 1, Duration::from_secs(2), Duration::from_secs(2))
}

/// Runs `prog` under `dsmrun -n 3` and checks that the job failed (status 1) naming the
/// stopped rank 1 as silent to rank 0, alone, and that rank 1 was killed.
fn run_three_expecting_rank_1_silent(prog: &Path, dir: &TempDir) -> Finished {
    let out = run([OsStr::new("-n"), OsStr::new("3"), prog.as_os_str()]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("dsmrun: rank 1 has sent nothing to rank 0 for 2 s (liveness deadline 2 s)"),
        "{out:?}"
    );
    assert_rank_1_alone_named_and_gone(&out, dir);
    out
}

/// dsmrun reported exactly one rank's failure (the stopped rank 1's, checked by the
/// caller), not the peer-lost exits it caused, and the stopped rank was killed.
fn assert_rank_1_alone_named_and_gone(out: &Finished, dir: &TempDir) {
    assert_eq!(out.stderr.matches("dsmrun: rank").count(), 1, "{out:?}");
    let stopped = wait_for_pid(&dir.path().join("pid.1"));
    assert!(
        is_gone(stopped),
        "the stopped rank {stopped} survived: {out:?}"
    );
}

#[test]
fn a_rank_reported_silent_is_named_and_killed() {
    let dir = tempfile::tempdir().unwrap();
    let silence = rank_1_silent_to_rank_0();
    // Rank 1 stops itself; rank 0 then reports it and exits with the peer-lost status
    // (71); rank 2 waits to be stopped.
    let prog = stopped_rank_1_script(
        &dir,
        "silent.sh",
        &format!(
            r#"if [ "$DSM_RANK" = 0 ]; then
  sleep 0.2
  echo "dsm: fatal: {silence}" >&2
  exit 71
fi
exec sleep 60"#
        ),
    );
    // Rank 0's peer-lost exit is a consequence, not reported as the failure.
    let out = run_three_expecting_rank_1_silent(&prog, &dir);
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    assert!(
        out.stderr.contains(
            "dsmrun: rank 1 has sent nothing to rank 0 for 2 s (liveness deadline 2 s): it is stopped, wedged or unreachable; killing it and stopping the job"
        ),
        "{out:?}"
    );
}

/// The losing order for the silence report, forced: rank 0 exits with the peer-lost status
/// first, and the line naming the stopped rank reaches dsmrun 1.5 s later (a process it
/// left behind holds its stderr and prints it), longer than dsmrun waits for a root cause
/// after a peer-lost exit. The exit is only judged once the rank's output has ended, so
/// the stopped rank is still the one named.
#[test]
fn a_silence_report_read_after_the_reporters_exit_still_names_the_stopped_rank() {
    let dir = tempfile::tempdir().unwrap();
    let silence = rank_1_silent_to_rank_0();
    let prog = stopped_rank_1_script(
        &dir,
        "late-silence.sh",
        &format!(
            r#"if [ "$DSM_RANK" = 0 ]; then
  (sleep 1.5; echo "dsm: fatal: {silence}" >&2) &
  exit 71
fi
exec sleep 60"#
        ),
    );
    run_three_expecting_rank_1_silent(&prog, &dir);
}

/// A chain, in the losing order: rank 2 exits at once having lost rank 0; rank 0 exited
/// too, but its report that rank 1 went silent reaches dsmrun 1.5 s later. dsmrun follows
/// rank 2's loss to rank 0 and waits for rank 0's output, which names the stopped rank 1.
#[test]
fn a_chain_of_peer_lost_exits_is_followed_to_the_stopped_rank() {
    let dir = tempfile::tempdir().unwrap();
    let silence = rank_1_silent_to_rank_0();
    let lost = dsm_proto::liveness::PeerLoss {
        reporter: 2,
        lost: 0,
        why: "connection closed".into(),
    };
    let prog = stopped_rank_1_script(
        &dir,
        "chain.sh",
        &format!(
            r#"if [ "$DSM_RANK" = 0 ]; then
  (sleep 1.5; echo "dsm: fatal: {silence}" >&2) &
  exit 71
fi
sleep 0.1
echo "dsm: fatal: {lost}" >&2
exit 71"#
        ),
    );
    run_three_expecting_rank_1_silent(&prog, &dir);
}

/// The losing order for a crashed rank: rank 0 reports losing rank 1 and exits at once,
/// and rank 1's own failure reaches dsmrun 1.5 s later (as when its reaping is delayed on
/// a busy machine). dsmrun names rank 1 and its status, not the survivor.
#[test]
fn a_peer_lost_exit_waits_for_the_lost_ranks_own_failure() {
    let dir = tempfile::tempdir().unwrap();
    let lost = dsm_proto::liveness::PeerLoss {
        reporter: 0,
        lost: 1,
        why: "cannot send barrier-arrive: i/o error: Connection reset by peer (os error 104)"
            .into(),
    };
    let prog = script(
        &dir,
        "late-failure.sh",
        &format!(
            r#"if [ "$DSM_RANK" = 1 ]; then
  sleep 1.5
  exit 5
fi
echo "dsm: fatal: {lost}" >&2
exit 71"#
        ),
    );
    let out = run([OsStr::new("-n"), OsStr::new("2"), prog.as_os_str()]);
    // The failing rank's own status is dsmrun's; the note says which rank it was.
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(
        out.stderr.contains("dsmrun: rank 1 exited with status 5"),
        "{out:?}"
    );
    assert_eq!(out.stderr.matches("dsmrun: rank").count(), 1, "{out:?}");
}

#[test]
fn program_the_kernel_cannot_execute_exits_126() {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("garbage");
    fs::write(&prog, "not a program\n").unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
    let out = run([OsStr::new("-n"), OsStr::new("2"), prog.as_os_str()]);
    assert_eq!(out.code, Some(126), "{out:?}");
    assert!(out.stderr.contains("cannot start rank 0"), "{out:?}");
}

#[test]
fn second_sigint_kills_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "deaf.sh",
        &format!(
            "trap '' INT\ntouch {dir}/ready.$DSM_RANK\nsleep 60",
            dir = dir.path().display()
        ),
    );
    let mut cmd = dsmrun();
    cmd.args(["-n", "2"]).arg(&prog);
    let job = start(cmd);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(0..2).all(|r| dir.path().join(format!("ready.{r}")).exists()) {
        assert!(Instant::now() < deadline, "ranks never started");
        thread::sleep(Duration::from_millis(10));
    }
    let interrupted = Instant::now();
    kill(job.pid(), Signal::SIGINT).unwrap();
    thread::sleep(Duration::from_millis(200));
    kill(job.pid(), Signal::SIGINT).unwrap();
    let out = job.finish();
    assert_eq!(out.code, Some(130), "{out:?}");
    // Well inside the 3 s grace period a single SIGINT would have waited.
    assert!(
        interrupted.elapsed() < Duration::from_millis(2500),
        "{out:?}"
    );
    assert!(out.stderr.contains("received SIGINT again"), "{out:?}");
}

#[test]
fn ranks_read_stdin_from_dev_null() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(&dir, "stdin.sh", "readlink /proc/$$/fd/0; cat");
    let mut cmd = dsmrun();
    // dsmrun's own stdin is an open pipe: a rank inheriting it would hang in cat.
    cmd.stdin(Stdio::piped()).arg(&prog);
    let out = start(cmd).finish();
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout_lines(), vec!["[0] /dev/null".to_owned()]);
}

#[test]
fn long_lines_are_forwarded_in_bounded_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        &dir,
        "long.sh",
        r#"head -c 1000000 /dev/zero | tr '\0' x; echo; echo end"#,
    );
    let out = run([OsStr::new("-n"), OsStr::new("1"), prog.as_os_str()]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines = out.stdout_lines();
    assert_eq!(lines.last().map(String::as_str), Some("[0] end"));
    let mut xs = 0;
    for line in &lines[..lines.len() - 1] {
        let body = line.strip_prefix("[0] ").expect("every piece is prefixed");
        assert!(
            body.len() <= dsm_launch::MAX_FORWARDED_LINE,
            "{}",
            body.len()
        );
        assert!(body.bytes().all(|b| b == b'x'));
        xs += body.len();
    }
    assert_eq!(xs, 1_000_000);
    assert!(lines.len() > 10, "split into pieces: {}", lines.len());
}

#[test]
fn unwritable_output_paths_are_refused_before_any_rank_starts() {
    let dir = TempDir::new().unwrap();
    let marker = dir.path().join("ran");
    let prog = script(&dir, "touch.sh", &format!("touch {}", marker.display()));
    let missing = dir.path().join("no-such-dir");
    let as_dir = dir.path().to_path_buf();
    let cases: [(&str, PathBuf, &str); 6] = [
        ("--record", missing.join("x.rec"), "no directory"),
        ("--race-log", missing.join("r.jsonl"), "no directory"),
        ("--race-sarif", as_dir.clone(), "it is a directory"),
        ("--trace-values", missing.join("t.trace"), "no directory"),
        ("--sem-trace", missing.join("s.trace"), "no directory"),
        ("--race-log", as_dir, "it is a directory"),
    ];
    for (flag, path, why) in cases {
        let out = run([
            OsStr::new("-n"),
            OsStr::new("2"),
            OsStr::new(flag),
            path.as_os_str(),
            prog.as_os_str(),
        ]);
        assert_eq!(out.code, Some(2), "{flag} {}: {out:?}", path.display());
        let want = format!("dsmrun: cannot write {flag} '{}': {why}", path.display());
        assert!(out.stderr.contains(&want), "{flag}: {out:?}");
        assert!(out.stderr.contains("no rank was started"), "{out:?}");
        assert!(!marker.exists(), "{flag}: a rank ran");
    }
    // The record is written whole and renamed into place: a FIFO (or device) by its name
    // is refused, not replaced by a file.
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let out = run([
        OsStr::new("-n"),
        OsStr::new("2"),
        OsStr::new("--record"),
        fifo.as_os_str(),
        prog.as_os_str(),
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("it is not a regular file"), "{out:?}");
    assert!(!marker.exists(), "a rank ran");
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    fs::remove_file(&fifo).unwrap();
    // A writable path is left as it was: nothing is created or truncated by the check.
    let existing = dir.path().join("old.jsonl");
    fs::write(&existing, "kept\n").unwrap();
    let mut config = dsm_launch::LaunchConfig::new("true");
    config.race.enabled = true;
    config.race.log = Some(existing.clone());
    assert!(dsm_launch::check_outputs(&config).is_ok());
    assert_eq!(fs::read_to_string(&existing).unwrap(), "kept\n");
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        2,
        "probe files left"
    );
}

#[test]
fn one_file_named_as_an_output_and_another_file_is_refused_untouched() {
    let dir = TempDir::new().unwrap();
    let marker = dir.path().join("ran");
    let prog = script(&dir, "touch.sh", &format!("touch {}", marker.display()));
    let input = dir.path().join("kept.dsmrec");
    fs::write(&input, "precious").unwrap();
    // The same file through another spelling (a symlink) is still the same file.
    let alias = dir.path().join("alias.dsmrec");
    std::os::unix::fs::symlink(&input, &alias).unwrap();
    let fresh = dir.path().join("new.out");
    let cases: [(&str, &Path, &str, &Path); 4] = [
        ("--race-log", &input, "--replay", &input),
        ("--race-sarif", &alias, "--compare", &input),
        ("--race-sarif", &fresh, "--race-log", &fresh),
        ("--trace-values", &input, "--race-suppressions", &alias),
    ];
    for (out_flag, out_path, other_flag, other_path) in cases {
        let out = run([
            OsStr::new("-n"),
            OsStr::new("2"),
            OsStr::new(out_flag),
            out_path.as_os_str(),
            OsStr::new(other_flag),
            other_path.as_os_str(),
            prog.as_os_str(),
        ]);
        let ctx = format!(
            "{out_flag} {} {other_flag} {}: {out:?}",
            out_path.display(),
            other_path.display()
        );
        assert_eq!(out.code, Some(2), "{ctx}");
        assert!(out.stderr.contains("name the same file"), "{ctx}");
        assert!(!marker.exists(), "{ctx}: a rank ran");
        assert_eq!(fs::read_to_string(&input).unwrap(), "precious", "{ctx}");
        assert!(!fresh.exists(), "{ctx}");
    }
    // Devices may be named twice.
    let out = run([
        "-n",
        "2",
        "--race-log",
        "/dev/null",
        "--race-sarif",
        "/dev/null",
        prog.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn a_pinpoint_log_that_cannot_be_used_is_a_usage_error() {
    let dir = TempDir::new().unwrap();
    let marker = dir.path().join("ran");
    let prog = script(&dir, "touch.sh", &format!("touch {}", marker.display()));
    let garbage = dir.path().join("garbage.jsonl");
    fs::write(&garbage, "not json\n").unwrap();
    let empty = dir.path().join("empty.jsonl");
    fs::write(&empty, "").unwrap();
    let missing = dir.path().join("missing.jsonl");
    let cases: [(&Path, &str); 4] = [
        (&missing, "cannot open --pinpoint-log"),
        (dir.path(), "Is a directory"),
        (&garbage, "line 1 of the race log"),
        (&empty, "has no races to pinpoint"),
    ];
    for (log, why) in cases {
        let out = run([
            OsStr::new("-n"),
            OsStr::new("2"),
            OsStr::new("--pinpoint-log"),
            log.as_os_str(),
            prog.as_os_str(),
        ]);
        assert_eq!(out.code, Some(2), "{}: {out:?}", log.display());
        assert!(out.stderr.contains(why), "{}: {out:?}", log.display());
        assert!(!marker.exists(), "a rank ran");
    }
}

#[test]
fn a_race_exit_is_not_the_last_word_while_the_others_finish() {
    let dir = TempDir::new().unwrap();
    // Rank 0 reports races and exits first; the other finishes a moment later.
    let prog = script(
        &dir,
        "races.sh",
        r#"if [ "$DSM_RANK" = 0 ]; then exit 66; fi
sleep 0.3"#,
    );
    let out = run([
        OsStr::new("-n"),
        OsStr::new("2"),
        OsStr::new("--race"),
        prog.as_os_str(),
    ]);
    assert_eq!(out.code, Some(66), "{out:?}");
    assert!(!out.stderr.contains("waiting for the other"), "{out:?}");
    // One that does not finish is waited for, and dsmrun says so.
    let slow = script(
        &dir,
        "slow.sh",
        r#"if [ "$DSM_RANK" = 0 ]; then exit 66; fi
sleep 3"#,
    );
    let out = run([
        OsStr::new("-n"),
        OsStr::new("2"),
        OsStr::new("--race"),
        slow.as_os_str(),
    ]);
    assert_eq!(out.code, Some(66), "{out:?}");
    assert!(
        out.stderr
            .contains("rank 0 exited with the race exit code 66 (data race found); still waiting for the other rank"),
        "{out:?}"
    );
}

#[test]
fn a_bind_address_that_is_not_this_hosts_is_named() {
    // Binding fails locally (nothing is contacted): the message names the address tried.
    let out = run([
        OsStr::new("-n"),
        OsStr::new("2"),
        OsStr::new("--bind-address"),
        OsStr::new("192.0.2.1"),
        OsStr::new("true"),
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("cannot pick a free TCP port on 192.0.2.1 for the rendezvous"),
        "{out:?}"
    );
}

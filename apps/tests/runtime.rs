//! Multi-process tests of the runtime over real loopback sockets and real page faults:
//! correctness scenarios at N = 1, 2, 4, 8 through dsmrun, segments up to 16T at small
//! memory, and failure handling (a rank that exits with an error, is killed or is stopped,
//! a peer that never connects, a wrong job secret, bookkeeping that does not fit in
//! memory), and a long computation that must not pass for a stopped rank.

use dsm_testkit::free_port;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TEST: &str = env!("CARGO_BIN_EXE_dsm-test");
const SOR: &str = env!("CARGO_BIN_EXE_sor");

fn dsmrun(n: usize, program: &str, args: &[&str]) -> Output {
    dsm_testkit::dsmrun(n, &["--timeout", "120"], program, args).into_output()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn assert_verified(out: &Output, what: &str) {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("[0] verified:"),
        "{what}: status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
}

#[test]
fn sor_equals_sequential_at_every_size() {
    for n in [1, 2, 4, 8] {
        let out = dsmrun(n, SOR, &["--size", "96", "--iters", "12"]);
        assert_verified(&out, &format!("sor at N={n}"));
        assert!(text(&out.stdout).contains("bitwise identical"));
    }
}

#[test]
fn lock_counter_is_exact() {
    for n in [1, 2, 4, 8] {
        let out = dsmrun(n, TEST, &["counter", "--iters", "50"]);
        assert_verified(&out, &format!("counter at N={n}"));
        assert!(
            text(&out.stdout).contains(&format!("counter = {}", 50 * n)),
            "{}",
            text(&out.stdout)
        );
    }
}

#[test]
fn data_passes_through_lock_handoff() {
    for n in [1, 2, 4, 8] {
        assert_verified(
            &dsmrun(n, TEST, &["handoff", "--rounds", "2"]),
            &format!("handoff at N={n}"),
        );
    }
}

#[test]
fn false_sharing_writes_all_survive() {
    for n in [2, 4, 8] {
        assert_verified(
            &dsmrun(n, TEST, &["falseshare", "--rounds", "3"]),
            &format!("falseshare u64 at N={n}"),
        );
        assert_verified(
            &dsmrun(n, TEST, &["falseshare", "--rounds", "3", "--elem", "u8"]),
            &format!("falseshare u8 at N={n}"),
        );
    }
}

#[test]
fn sparse_touch_of_a_large_allocation() {
    for n in [1, 2, 4, 8] {
        assert_verified(
            &dsmrun(n, TEST, &["sparse", "--touches", "16"]),
            &format!("sparse at N={n}"),
        );
    }
}

/// Heap a rank may use in the large-segment tests (`ulimit -d`, RLIMIT_DATA): far above
/// what a 256x256 SOR needs, far below bookkeeping sized by the segment (1 GiB at 1T,
/// 16 GiB at 16T), so a regression fails the job instead of pushing the machine into its
/// OOM killer. The segment itself is shared memory, which this limit does not count.
const RANK_HEAP_LIMIT_KIB: u64 = 256 << 10;

/// Peak RSS a rank may reach in a small run, whatever the segment size.
const SMALL_RUN_RSS_KIB: u64 = 64 << 10;

/// `dsmrun -n 2 --segment SEGMENT PROGRAM ARGS` with the ranks' heap capped at
/// [`RANK_HEAP_LIMIT_KIB`], each rank writing its stats file into `stats`.
fn capped(
    segment: &str,
    program: &str,
    args: &[&str],
    stats: &std::path::Path,
) -> dsm_testkit::Run {
    let run =
        dsm_testkit::dsmrun_command(2, &["--timeout", "60", "--segment", segment], program, args);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -d {RANK_HEAP_LIMIT_KIB} && exec \"$0\" \"$@\""
        ))
        .arg(run.get_program())
        .args(run.get_args())
        .env("DSM_STATS_FILE", stats.join("rank-%r.json"));
    dsm_testkit::start_with_watchdog(cmd, Duration::from_secs(90)).finish()
}

/// Every rank's `peak_rss_kib` from the stats files of a finished 2-rank job.
fn peak_rss_kib(stats: &std::path::Path) -> Vec<u64> {
    (0..2)
        .map(|r| {
            let path = stats.join(format!("rank-{r}.json"));
            let json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            json["peak_rss_kib"]
                .as_u64()
                .unwrap_or_else(|| panic!("no peak_rss_kib in {}", path.display()))
        })
        .collect()
}

#[test]
fn a_1t_segment_costs_only_what_is_touched() {
    let stats = tempfile::tempdir().unwrap();
    let out = capped("1T", SOR, &["--size", "256", "--iters", "5"], stats.path());
    assert_verified(&out.into_output(), "sor in a 1T segment");
    for (rank, rss) in peak_rss_kib(stats.path()).into_iter().enumerate() {
        assert!(
            rss < SMALL_RUN_RSS_KIB,
            "rank {rank} peaked at {rss} KiB of RSS in a 1T segment"
        );
    }
}

#[test]
fn a_16t_segment_works_or_is_refused_clearly() {
    let stats = tempfile::tempdir().unwrap();
    let out = capped("16T", SOR, &["--size", "256", "--iters", "5"], stats.path());
    if out.code == Some(0) {
        assert!(out.stdout.contains("[0] verified:"), "{out:?}");
        for (rank, rss) in peak_rss_kib(stats.path()).into_iter().enumerate() {
            assert!(
                rss < SMALL_RUN_RSS_KIB,
                "rank {rank} peaked at {rss} KiB of RSS in a 16T segment"
            );
        }
        return;
    }
    // A machine without 32 TiB of free address space (two views of the segment) may
    // refuse; it must say so and name the option, never abort or crash.
    assert!(
        out.signal.is_none()
            && !out.stderr.contains("killed by signal")
            && !out.all_output().contains("memory allocation of")
            && out.all_output().contains("--segment"),
        "{out:?}"
    );
    dsm_testkit::skip(
        "a_16t_segment_works_or_is_refused_clearly",
        "this machine refused a 16T segment (clearly)",
    );
}

#[test]
fn bookkeeping_that_does_not_fit_is_an_error_not_an_abort() {
    // A 700 GiB allocation fits the 1T segment, but its page table (4 bytes a page,
    // 700 MiB) does not fit the capped heap: every rank must return the error, not abort.
    let stats = tempfile::tempdir().unwrap();
    let args = ["sparse", "--mib", "716800", "--touches", "1"];
    let out = capped("1T", TEST, &args, stats.path());
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.all_output()
            .contains("out of memory: cannot allocate the page table of 'huge'"),
        "{out:?}"
    );
    assert!(
        !out.all_output().contains("memory allocation of"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("killed by signal"), "{out:?}");
}

#[test]
fn without_dsmrun_a_program_is_a_single_node() {
    let out = Command::new(SOR)
        .args(["--size", "32", "--iters", "3"])
        .env_remove("DSM_RANK")
        .env_remove("DSM_SIZE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("verified: sor 32x32, 3 iterations, 1 node:"));
}

#[test]
fn sor_refuses_a_relaxation_factor_where_it_cannot_converge() {
    for omega in ["NaN", "inf", "-1", "0", "2", "2.5", "x"] {
        let out = Command::new(SOR)
            .args(["--size", "32", "--iters", "3", &format!("--omega={omega}")])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--omega {omega}");
        assert!(
            text(&out.stderr).contains("--omega"),
            "{}",
            text(&out.stderr)
        );
        assert!(!text(&out.stdout).contains("verified"), "--omega {omega}");
    }
}

#[test]
fn rank_exiting_with_error_stops_the_job() {
    let t = Instant::now();
    let out = dsmrun(4, TEST, &["fail", "--rank", "2", "--code", "3"]);
    let elapsed = t.elapsed();
    // The failing rank's own status, passed on as mpirun does.
    assert_eq!(out.status.code(), Some(3));
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    let err = text(&out.stderr);
    assert!(err.contains("rank 2 exited with status 3"), "{err}");
    // A status that would read as one of dsmrun's own (66: races found) is not.
    let out = dsmrun(2, TEST, &["fail", "--rank", "1", "--code", "66"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("rank 1 exited with status 66"));
}

#[test]
fn failed_job_with_race_detection_says_the_analysis_is_incomplete() {
    let out = dsm_testkit::dsmrun(
        2,
        &["--race"],
        TEST,
        &["fail", "--rank", "1", "--code", "3"],
    );
    assert_eq!(out.code, Some(3), "{out:?}");
    let last = out.stderr.lines().last().unwrap_or_default();
    assert!(last.contains("race detection incomplete"), "{out:?}");
    // Without race detection there is no analysis to call incomplete.
    let out = dsm_testkit::dsmrun(2, &[], TEST, &["fail", "--rank", "1", "--code", "3"]);
    assert!(!out.stderr.contains("race detection"), "{out:?}");
    // Nor in a job that never formed: a mistyped program exits with its usage error
    // before any rank joins, and nothing was analysed or cut short.
    let out = dsm_testkit::dsmrun(2, &["--race"], TEST, &["no-such-test"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("unrecognized subcommand"), "{out:?}");
    assert!(!out.stderr.contains("race detection"), "{out:?}");
}

#[test]
fn a_rank_leaving_early_with_status_0_is_named_as_the_cause() {
    let out = dsmrun(3, TEST, &["fail", "--rank", "1", "--code", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("dsmrun: rank 1 exited with status 0 while the other ranks still needed it"),
        "{err}"
    );
}

#[test]
fn segfault_in_a_rank_is_reported_as_sigsegv() {
    let t = Instant::now();
    let out = dsmrun(3, TEST, &["segv", "--rank", "1"]);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(128 + 11), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("rank 1 was killed by signal 11 (SIGSEGV)"),
        "{err}"
    );
    assert!(text(&out.stdout).contains("[1] rank 1 reads unallocated shared memory"));
}

#[test]
fn inconsistent_collective_calls_are_clear_errors() {
    let out = dsmrun(3, TEST, &["alloc-mismatch"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "rank 1 and rank 0 disagree on the shared allocations at the allocation of \
             'table' (before the first barrier)"
        ),
        "{err}"
    );
    assert!(
        !text(&out.stdout).contains("passed"),
        "{}",
        text(&out.stdout)
    );

    let out = dsmrun(2, TEST, &["alloc-twice"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("'table' is allocated already: names must be unique"),
        "{err}"
    );
    assert!(
        !text(&out.stdout).contains("accepted"),
        "{}",
        text(&out.stdout)
    );

    let out = dsmrun(3, TEST, &["barrier-mismatch"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    // Numbered as the program counts its barriers (the allocation before it is not one).
    assert!(
        err.contains(
            "rank 1 reached finish (before the first barrier) while rank 0 is at barrier 1, \
             rank 2 is at barrier 1"
        ),
        "{err}"
    );
}

#[test]
fn killed_rank_stops_the_job() {
    let mut child = dsm_testkit::dsmrun_command(4, &["--timeout", "60"], TEST, &["hang"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut victim = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(pid) = line.strip_prefix("[2] pid ") {
            victim = Some(pid.trim().parse::<i32>().unwrap());
            break;
        }
    }
    let pid = victim.expect("rank 2 printed its pid");
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("rank 2 was killed by signal 9"),
        "stderr: {err}"
    );
}

#[test]
fn no_rank_outlives_a_killed_dsmrun() {
    let mut child = dsm_testkit::dsmrun_command(3, &[], TEST, &["hang", "--seconds", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut pids = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some((_, pid)) = line.split_once("] pid ") {
            pids.push(pid.trim().parse::<i32>().unwrap());
            if pids.len() == 3 {
                break;
            }
        }
    }
    assert_eq!(pids.len(), 3, "every rank printed its pid");
    child.kill().unwrap(); // SIGKILL: dsmrun gets no chance to stop anyone
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|&p| dsm_testkit::is_gone(p)) {
        assert!(
            Instant::now() < deadline,
            "ranks still running 5 s after dsmrun was killed: {:?}",
            pids.iter()
                .filter(|&&p| !dsm_testkit::is_gone(p))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs, when a test ends however it ends, whichever of a job's ranks are still there
/// (SIGKILL ends stopped processes too), so a failing test leaves nothing behind.
struct Reaper(Vec<i32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("dsm-test"));
            if ours && !dsm_testkit::is_gone(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

#[test]
fn stopped_rank_is_named_and_the_job_ends_after_the_liveness_deadline() {
    let mut child = dsm_testkit::dsmrun_command(
        3,
        &["--liveness", "2", "--timeout", "60"],
        TEST,
        &["hang", "--seconds", "60"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut pids = [0i32; 3];
    let mut reaper = Reaper(Vec::new());
    while reaper.0.len() < 3 {
        let line = lines.next().expect("every rank prints its pid").unwrap();
        if let Some((rank, pid)) = line.strip_prefix('[').and_then(|l| l.split_once("] pid ")) {
            let pid = pid.trim().parse().unwrap();
            pids[rank.parse::<usize>().unwrap()] = pid;
            reaper.0.push(pid);
        }
    }
    // Keep reading, so the job's output never blocks.
    std::thread::spawn(move || lines.for_each(drop));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[1]),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if stopped.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the job with a stopped rank was still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = stopped.elapsed();
    let err = stderr.join().unwrap();
    assert!(
        !status.success(),
        "{status:?}
{err}"
    );
    // Not before the peers could know (rank 1 synchronizes every 20 ms until stopped),
    // and not much after: detection takes at most a quarter deadline more.
    assert!(
        elapsed >= Duration::from_millis(1500) && elapsed < Duration::from_secs(10),
        "ended {elapsed:?} after the stop
{err}"
    );
    assert!(
        err.contains("dsmrun: rank 1 has sent nothing to rank "),
        "dsmrun does not name the stopped rank:
{err}"
    );
    assert!(
        err.contains(": rank 1 has sent nothing for "),
        "no rank reported the silence:
{err}"
    );
    // dsmrun killed the stopped rank; the others stopped on their own or by SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|&p| dsm_testkit::is_gone(p)) {
        assert!(
            Instant::now() < deadline,
            "ranks left behind: {:?}
{err}",
            pids.iter()
                .filter(|&&p| !dsm_testkit::is_gone(p))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_rank_computing_for_twice_the_deadline_is_not_taken_for_silent() {
    let out = dsm_testkit::dsmrun(
        3,
        &["--liveness", "1", "--timeout", "60"],
        TEST,
        &["compute", "--seconds", "2.5"],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("[0] verified: rank 0 computed"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("sent nothing"), "{out:?}");
}

/// Starts one rank by hand (no dsmrun), the way srun/mpirun-launched jobs start.
fn rank(r: usize, n: usize, port: u16, secret: &str, args: &[&str]) -> std::process::Child {
    dsm_testkit::as_rank(
        Command::new(TEST).args(args),
        r,
        n,
        &format!("127.0.0.1:{port}"),
        secret,
        2,
    )
    .spawn()
    .unwrap()
}

#[test]
fn a_dead_peer_is_detected_without_dsmrun() {
    let port = free_port();
    let r0 = rank(0, 2, port, "s3cret", &["hang"]);
    let mut r1 = rank(1, 2, port, "s3cret", &["hang"]);
    let mut lines = BufReader::new(r1.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("pid "));
    let t = Instant::now();
    r1.kill().unwrap();
    r1.wait().unwrap();
    let out = r0.wait_with_output().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("lost rank 1"), "{err}");
}

#[test]
fn wrong_job_secret_is_refused() {
    let port = free_port();
    let r0 = rank(0, 2, port, "right-secret", &["counter"]);
    let r1 = rank(1, 2, port, "wrong-secret", &["counter"]);
    let out1 = r1.wait_with_output().unwrap();
    assert!(!out1.status.success());
    let err1 = text(&out1.stderr);
    assert!(
        err1.contains("rank 0 at") && err1.contains("could not prove it knows the job secret"),
        "{err1}"
    );
    // Each cause is printed once.
    assert_eq!(err1.matches("could not prove").count(), 1, "{err1}");
    let out0 = r0.wait_with_output().unwrap();
    assert!(
        !out0.status.success(),
        "rank 0 must not run with a stranger"
    );
    let err0 = text(&out0.stderr);
    assert!(err0.contains("[1]") && err0.contains("timed out"), "{err0}");
    // The refusing side logs why.
    assert!(err0.contains("wrong job secret"), "{err0}");
}

#[test]
fn peer_that_never_connects_is_a_clear_error() {
    let port = free_port();
    let t = Instant::now();
    let out = rank(0, 3, port, "s", &["counter"])
        .wait_with_output()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("timed out") && err.contains("[1, 2]"), "{err}");
    assert!(out.status.signal().is_none(), "an error exit, not a crash");
}

/// 200 idle and 50 garbage connections to rank 0's rendezvous, opened as soon as it
/// listens: the job still starts and verifies in about its normal time.
#[test]
fn strangers_at_the_rendezvous_do_not_stop_the_job() {
    let port = free_port();
    let start = |r: usize| {
        dsm_testkit::as_rank(
            Command::new(SOR).args(["--size", "64", "--iters", "4"]),
            r,
            3,
            &format!("127.0.0.1:{port}"),
            "job-secret",
            30,
        )
        .spawn()
        .unwrap()
    };
    let r0 = start(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut strangers = Vec::new();
    while strangers.len() < 250 {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(mut s) => {
                if strangers.len() % 5 == 0 {
                    use std::io::Write;
                    let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n garbage \xff\xfe");
                }
                strangers.push(s);
            }
            Err(_) => {
                assert!(Instant::now() < deadline, "rank 0 never listened");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    let t = Instant::now();
    let others: Vec<_> = (1..3).map(start).collect();
    let out0 = r0.wait_with_output().unwrap();
    for o in others {
        assert!(o.wait_with_output().unwrap().status.success());
    }
    let took = t.elapsed();
    assert!(out0.status.success(), "{}", text(&out0.stderr));
    assert!(
        text(&out0.stdout).contains("verified:"),
        "{}",
        text(&out0.stdout)
    );
    assert!(
        took < Duration::from_secs(5),
        "the job took {took:?} with strangers connected"
    );
    drop(strangers);
}

#[test]
fn the_race_status_reaches_dsmrun_whatever_main_returns() {
    // dsm-test --ignore-outcome returns success from main after finish().
    let args = ["--ignore-outcome", "own-locks", "--iters", "200"];
    let out = dsm_testkit::dsmrun(2, &["--race"], TEST, &args);
    assert_eq!(out.code, Some(66), "{out:?}");
    assert!(out.stderr.contains("data race"), "{out:?}");
    let out = dsm_testkit::dsmrun(2, &["--race", "--race-exit-code", "9"], TEST, &args);
    assert_eq!(out.code, Some(9), "{out:?}");
    // Without races to report (no detection, or the status turned off) nothing changes.
    let out = dsm_testkit::dsmrun(2, &[], TEST, &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = dsm_testkit::dsmrun(2, &["--race", "--race-exit-code", "0"], TEST, &args);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn an_ordinary_error_prints_its_chain_without_a_backtrace() {
    // A rank started by hand with half a job environment: Dsm::init refuses it.
    let out = Command::new(TEST)
        .arg("counter")
        .env("RUST_BACKTRACE", "1")
        .env("DSM_RANK", "1")
        .env("DSM_SIZE", "2")
        .env("DSM_COORD", "127.0.0.1:1")
        .env_remove("DSM_JOB_SECRET")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: joining the DSM job: bad job environment:"),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

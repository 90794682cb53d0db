//! The shared-memory transport between ranks of one host, in real multi-process jobs: the
//! apps verify against their sequential references over every transport (`DSM_TRANSPORT`
//! unset, `rings` and `tcp`), which links took shared memory is read from each rank's log
//! line, a job whose ranks all share a host maps one common segment (rank 0 says so, no
//! page travels, and race detection or `rings` turns it off), a rank killed with SIGKILL
//! while its ring is in use stops the job with the peer-lost status naming it, and ranks in
//! two network namespaces use TCP between the namespaces and shared memory within each,
//! with no common segment.

use dsm_testkit::{free_port, ip};
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TEST: &str = env!("CARGO_BIN_EXE_dsm-test");
const SOR: &str = env!("CARGO_BIN_EXE_sor");
const FFT: &str = env!("CARGO_BIN_EXE_fft");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What each rank logged about its links: `(rank, shared-memory peers)`.
fn shm_peers(stderr: &str) -> Vec<(usize, String)> {
    stderr
        .lines()
        .filter_map(|l| {
            let at = l.find("rank ")?;
            let rest = &l[at + 5..];
            let (rank, rest) = rest.split_once(": shared memory with ranks ")?;
            let peers = rest.split_once(", TCP")?.0;
            Some((rank.parse().ok()?, peers.to_owned()))
        })
        .collect()
}

/// What rank 0 logs when the job maps one common segment.
const COMMON_SEGMENT: &str = "they map one common segment";

fn dsmrun(n: usize, transport: Option<&str>, program: &str, args: &[&str]) -> Output {
    let mut cmd = dsm_testkit::dsmrun_command(n, &["--timeout", "120"], program, args);
    cmd.env("DSM_LOG", "dsm_net=info,dsm_core=info");
    match transport {
        Some(t) => cmd.env("DSM_TRANSPORT", t),
        None => cmd.env_remove("DSM_TRANSPORT"),
    };
    dsm_testkit::run(cmd).into_output()
}

#[test]
fn apps_verify_over_shared_memory_and_over_tcp() {
    for (n, program, args) in [
        (2, SOR, &["--size", "256", "--iters", "10"][..]),
        (4, SOR, &["--size", "200", "--iters", "7"][..]),
        (2, FFT, &["--dims", "16x16x8"][..]),
        (4, TEST, &["counter", "--iters", "2000"][..]),
        (3, TEST, &["handoff", "--rounds", "2"][..]),
    ] {
        for transport in [None, Some("rings"), Some("tcp")] {
            let out = dsmrun(n, transport, program, args);
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert!(
                out.status.success() && stdout.contains("[0] verified:"),
                "{program} {args:?} N={n} over {transport:?}: {:?}\n{stdout}\n{stderr}",
                out.status
            );
            let mut links = shm_peers(&stderr);
            links.sort();
            let expected: Vec<(usize, String)> = (0..n)
                .map(|r| {
                    let peers: Vec<usize> = match transport {
                        Some("tcp") => vec![],
                        _ => (0..n).filter(|&p| p != r).collect(),
                    };
                    (r, format!("{peers:?}"))
                })
                .collect();
            assert_eq!(links, expected, "{program} over {transport:?}:\n{stderr}");
            assert_eq!(
                stderr.matches(COMMON_SEGMENT).count(),
                usize::from(transport.is_none()),
                "rank 0 says whether the job maps one common segment ({transport:?}):\n{stderr}"
            );
        }
    }
}

/// `(pages_fetched, read_faults + write_faults, diffs_sent)` summed over the ranks of a
/// finished job whose stats went to `stats`.
fn page_traffic(stats: &std::path::Path, n: usize) -> (u64, u64, u64) {
    let sum = |k: &str| dsm_testkit::counter_sum(stats, n, "protocol", k);
    (
        sum("pages_fetched"),
        sum("read_faults") + sum("write_faults"),
        sum("diffs_sent"),
    )
}

const WATER: &str = env!("CARGO_BIN_EXE_water");
const TSP: &str = env!("CARGO_BIN_EXE_tsp");

#[test]
fn ranks_of_one_host_share_one_segment_and_no_page_travels() {
    // Each of these moves pages under the protocol: SOR's boundary rows at barriers,
    // FFT's transpose, Water's molecules under per-molecule locks, TSP's queue under locks.
    for (n, program, args) in [
        (2, SOR, &["--size", "256", "--iters", "10"][..]),
        (4, FFT, &["--dims", "32x32x16"][..]),
        (2, WATER, &["--molecules", "64", "--steps", "2"][..]),
        (3, TSP, &["--cities", "10", "--locked-bound"][..]),
    ] {
        for (transport, race) in [
            (None, false),
            (Some("rings"), false),
            (None, true),
            (Some("rings"), true),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut flags = vec!["--timeout", "120"];
            if race {
                flags.push("--race");
            }
            let mut cmd = dsm_testkit::dsmrun_command(n, &flags, program, args);
            cmd.env("DSM_LOG", "dsm_core=info")
                .env("DSM_STATS_FILE", dir.path().join("rank-%r.json"));
            match transport {
                Some(t) => cmd.env("DSM_TRANSPORT", t),
                None => cmd.env_remove("DSM_TRANSPORT"),
            };
            let run = dsm_testkit::run(cmd);
            let what = format!("{program} {args:?} N={n} {transport:?} race={race}");
            run.assert_verified(&what);
            // Race detection keeps the common segment (and its locks).
            let common = transport.is_none();
            assert_eq!(
                run.all_output().contains(COMMON_SEGMENT),
                common,
                "{what}: {}",
                run.all_output()
            );
            let (fetched, faults, diffs) = page_traffic(dir.path(), n);
            let sum =
                |section: &str, key: &str| dsm_testkit::counter_sum(dir.path(), n, section, key);
            let (host_locks, protocol_locks) = (
                sum("common_memory", "host_lock_acquires"),
                sum("protocol", "lock_acquires"),
            );
            if program == WATER || program == TSP {
                // Their locks are taken in the common memory, or through the protocol.
                assert_eq!(
                    (host_locks > 0, protocol_locks > 0),
                    (common, !common),
                    "{what}: {host_locks} host locks, {protocol_locks} protocol locks"
                );
            }
            if common {
                assert_eq!(
                    (fetched, faults, diffs),
                    (0, 0, 0),
                    "{what}: no fault, fetch or diff in a common segment"
                );
            } else {
                // FFT prefetches what it reads, so it may take no fault at all.
                assert!(
                    fetched > 0,
                    "{what}: the protocol moves pages ({fetched} fetched, {faults} faults)"
                );
            }
        }
    }
}

/// Over rings, a read fault on a co-located home's page takes the page from the link's
/// lane in the faulting thread itself, which also asks the home for it when the page
/// needs nothing else; with the handler's paths off (`DSM_FAST_FAULTS=0`) every page comes
/// in a reply to the comm thread's request. All verify, and race detection too.
#[test]
fn a_faulting_rank_takes_co_located_pages_from_the_lane() {
    for (fast, race) in [(true, false), (false, false), (true, true)] {
        // Which thread gets a page first depends on scheduling: on a loaded machine the
        // comm thread may take every page of one run, so the fast paths get a few runs
        // to show up in (all of them must verify).
        for attempt in 1..=5 {
            let (lane, asked, what) = lane_counts(fast, race);
            if !fast {
                assert_eq!(lane + asked, 0, "{what}: lanes need the handler's paths");
                break;
            }
            if lane > 0 && asked > 0 {
                break;
            }
            assert!(
                attempt < 5,
                "{what}: in 5 runs, no page was taken from a lane or the handler never \
                 asked a home itself"
            );
        }
    }
}

/// One run of SOR over rings for [`a_faulting_rank_takes_co_located_pages_from_the_lane`]:
/// pages taken from a lane, fetches the handler asked itself, and the run's description.
fn lane_counts(fast: bool, race: bool) -> (u64, u64, String) {
    let dir = tempfile::tempdir().unwrap();
    let flags: &[&str] = if race { &["--race"] } else { &[] };
    let mut cmd = dsm_testkit::dsmrun_command(2, flags, SOR, &["--size", "256", "--iters", "10"]);
    cmd.env("DSM_TRANSPORT", "rings")
        .env("DSM_STATS_FILE", dir.path().join("rank-%r.json"));
    if !fast {
        cmd.env("DSM_FAST_FAULTS", "0");
    }
    let run = dsm_testkit::run(cmd);
    let what = format!("SOR over rings, fast faults {fast}, race {race}");
    run.assert_verified(&what);
    let sum = |key: &str| dsm_testkit::counter_sum(dir.path(), 2, "protocol", key);
    let (fetched, lane) = (sum("pages_fetched"), sum("lane_pages"));
    let (asked, requests) = (sum("handler_fetches"), sum("fetch_requests"));
    eprintln!(
        "{what}: {fetched} pages fetched, {lane} from the lane by the faulting thread, \
         {asked} of {requests} requests asked by the handler itself"
    );
    assert!(lane <= fetched && asked <= requests, "{what}");
    (lane, asked, what)
}

/// A faulting thread that asked the home itself and gets no copy within its polling
/// budget hands the wait to its comm thread, which adopts the fetch: with a budget of 1 us
/// almost every such fault does, including those whose copy the home left in the lane
/// while the thread still polled (its announcement sent without a bell), and SOR still
/// verifies. Over TCP too, where the handler wrote its request to the home's socket.
#[test]
fn a_faulting_thread_out_of_budget_hands_its_fetch_to_the_comm_thread() {
    for transport in ["rings", "tcp"] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = dsm_testkit::dsmrun_command(2, &[], SOR, &["--size", "256", "--iters", "20"]);
        cmd.env("DSM_TRANSPORT", transport)
            .env("DSM_SPIN", "1")
            .env("DSM_PUSH", "off")
            .env("DSM_STATS_FILE", dir.path().join("rank-%r.json"));
        let run = dsm_testkit::run(cmd);
        run.assert_verified(&format!("SOR over {transport}, 1 us polling budget"));
        let sum = |key: &str| dsm_testkit::counter_sum(dir.path(), 2, "protocol", key);
        let (asked, handed) = (sum("handler_fetches"), sum("handler_fetches_handed_over"));
        eprintln!(
            "{transport}: {asked} fetches asked by the handler, {handed} handed to the comm \
             thread"
        );
        assert!(handed <= asked);
        assert!(
            handed > 0,
            "{transport}: no handler handed its wait over ({asked} asked) with a 1 us budget"
        );
    }
}

#[test]
fn a_wrong_transport_name_is_a_clear_error() {
    let out = dsmrun(2, Some("infiniband"), TEST, &["counter"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("DSM_TRANSPORT") && err.contains("tcp"),
        "stderr: {err}"
    );
}

/// Starts one rank of `dsm-test` by hand (no dsmrun, so nobody but the peers notices a
/// death), logging its links.
fn rank(r: usize, n: usize, port: u16, args: &[&str]) -> std::process::Child {
    dsm_testkit::as_rank(
        Command::new(TEST).args(args),
        r,
        n,
        &format!("127.0.0.1:{port}"),
        "shm-kill",
        20,
    )
    .env("DSM_LOG", "dsm_net=info")
    .env_remove("DSM_TRANSPORT")
    .spawn()
    .unwrap()
}

#[test]
fn a_rank_killed_while_its_ring_is_in_use_stops_the_job_naming_it() {
    // Without dsmrun, so only the peer can notice: two ranks doing barriers as fast as they
    // can, the rings busy when the victim dies.
    let port = free_port();
    let survivor = rank(0, 2, port, &["hang", "--seconds", "60"]);
    let mut victim = rank(1, 2, port, &["hang", "--seconds", "60"]);
    let mut lines = BufReader::new(victim.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("pid "));
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    let out = survivor.wait_with_output().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "rank 0 took {:?} to stop",
        t.elapsed()
    );
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(dsm_proto::exit_codes::PEER_LOST),
        "{err}"
    );
    assert!(err.contains("lost rank 1"), "{err}");
    assert_eq!(shm_peers(&err), vec![(0, "[1]".to_owned())], "{err}");

    // Under dsmrun with three ranks: the job stops, naming the killed rank first.
    let mut cmd = dsm_testkit::dsmrun_command(3, &["--timeout", "60"], TEST, &["hang"]);
    cmd.env_remove("DSM_TRANSPORT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut job = cmd.spawn().unwrap();
    let mut pid = None;
    for line in BufReader::new(job.stdout.take().unwrap()).lines() {
        if let Some(p) = line.unwrap().strip_prefix("[1] pid ") {
            pid = Some(p.trim().parse::<i32>().unwrap());
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid.expect("rank 1 printed its pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = job.wait_with_output().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("rank 1 was killed by signal 9"), "{err}");
}

/// Two "hosts": network namespaces `<tag>-a` (10.78.0.1) and `<tag>-b` (10.78.0.2) joined
/// by a veth pair; removed on drop.
struct TwoHosts {
    tag: String,
}

impl TwoHosts {
    fn new() -> Option<TwoHosts> {
        let tag = format!("dsmshm{}", std::process::id() % 100_000);
        let h = TwoHosts { tag };
        let (a, b) = (h.ns('a'), h.ns('b'));
        let (va, vb) = (format!("{}va", h.tag), format!("{}vb", h.tag));
        let ok = ip(&["netns", "add", &a])
            && ip(&["netns", "add", &b])
            && ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
            && ip(&["link", "set", &va, "netns", &a])
            && ip(&["link", "set", &vb, "netns", &b])
            && ip(&["-n", &a, "addr", "add", "10.78.0.1/24", "dev", &va])
            && ip(&["-n", &b, "addr", "add", "10.78.0.2/24", "dev", &vb])
            && ip(&["-n", &a, "link", "set", &va, "up"])
            && ip(&["-n", &b, "link", "set", &vb, "up"])
            && ip(&["-n", &a, "link", "set", "lo", "up"])
            && ip(&["-n", &b, "link", "set", "lo", "up"]);
        ok.then_some(h)
    }

    fn ns(&self, host: char) -> String {
        format!("{}-{host}", self.tag)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.ns('a')]);
        ip(&["netns", "del", &self.ns('b')]);
    }
}

#[test]
fn ranks_share_memory_within_a_host_and_use_tcp_between_hosts() {
    let Some(hosts) = TwoHosts::new() else {
        dsm_testkit::skip(
            "ranks_share_memory_within_a_host_and_use_tcp_between_hosts",
            "cannot create network namespaces here (needs root and iproute2)",
        );
        return;
    };
    // Ranks 0 and 1 on host a, 2 and 3 on host b.
    let placement = ['a', 'a', 'b', 'b'];
    let children: Vec<_> = placement
        .iter()
        .enumerate()
        .map(|(r, &host)| {
            dsm_testkit::as_rank(
                Command::new("ip")
                    .args(["netns", "exec", &hosts.ns(host), SOR])
                    .args(["--size", "128", "--iters", "8"]),
                r,
                4,
                "10.78.0.1:7708",
                "two-hosts",
                30,
            )
            .env("DSM_LOG", "dsm_net=info,dsm_core=info")
            .env_remove("DSM_TRANSPORT")
            .spawn()
            .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (r, o) in outs.iter().enumerate() {
        let err = text(&o.stderr);
        assert!(o.status.success(), "rank {r}: {:?}\n{err}", o.status);
        let partner = r ^ 1;
        assert_eq!(
            shm_peers(&err),
            vec![(r, format!("[{partner}]"))],
            "rank {r} shares memory with its host's other rank only:\n{err}"
        );
    }
    let out0 = text(&outs[0].stdout);
    assert!(out0.contains("verified:"), "{out0}");
    let err0 = text(&outs[0].stderr);
    assert!(
        !err0.contains(COMMON_SEGMENT),
        "ranks on two hosts keep their own copies of the pages:\n{err0}"
    );
}

/// Recording the synchronization order needs the protocol's lock grants, so a recorded run
/// in a common segment takes its locks through the protocol, and a replay of it works.
#[test]
fn a_recorded_run_in_a_common_segment_takes_its_locks_through_the_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.dsmrec");
    let args = ["--molecules", "64", "--steps", "2"];
    for mode in ["--record", "--replay"] {
        let stats = dir.path().join(mode.trim_start_matches('-'));
        std::fs::create_dir_all(&stats).unwrap();
        let rec = rec.to_str().unwrap();
        let mut cmd =
            dsm_testkit::dsmrun_command(2, &["--timeout", "120", mode, rec], WATER, &args);
        cmd.env_remove("DSM_TRANSPORT")
            .env("DSM_LOG", "dsm_core=info")
            .env("DSM_STATS_FILE", stats.join("rank-%r.json"));
        let run = dsm_testkit::run(cmd);
        run.assert_verified(mode);
        assert!(run.all_output().contains(COMMON_SEGMENT), "{mode}: {run:?}");
        for r in 0..2 {
            assert_eq!(
                dsm_testkit::rank_counter(&stats, r, "common_memory", "host_lock_acquires"),
                0,
                "{mode}"
            );
        }
        let protocol = dsm_testkit::counter_sum(&stats, 2, "protocol", "lock_acquires");
        assert!(protocol > 0, "{mode}: locks went through the protocol");
    }
}

/// A race-detecting record and its replay keep each rank's own copy of the pages (in one
/// memory a racy read sees whatever was stored last, which a replay cannot reproduce),
/// while a plain `--race` run of the same program maps the common segment.
#[test]
fn race_detecting_records_and_replays_keep_each_ranks_own_copy() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.dsmrec");
    let rec = rec.to_str().unwrap();
    let args = ["--random", "10", "--locked-bound"];
    for flags in [
        &["--race"][..],
        &["--race", "--record", rec],
        &["--race", "--replay", rec],
    ] {
        let mut all = vec!["--timeout", "120"];
        all.extend_from_slice(flags);
        let mut cmd = dsm_testkit::dsmrun_command(2, &all, TSP, &args);
        cmd.env_remove("DSM_TRANSPORT")
            .env("DSM_LOG", "dsm_core=info");
        let run = dsm_testkit::run(cmd);
        run.assert_verified(&format!("{flags:?}"));
        let common = flags.len() == 1;
        assert_eq!(
            run.all_output().contains(COMMON_SEGMENT),
            common,
            "{flags:?}: {run:?}"
        );
    }
}

/// A rank that dies holding a lock of the common memory, while the others sleep on it,
/// stops the job promptly, named as the cause; nobody hangs. Without dsmrun too: the
/// survivors' comm threads see the connection close and end their processes.
#[test]
fn a_rank_dying_with_a_host_lock_stops_the_job() {
    let t = Instant::now();
    let mut cmd =
        dsm_testkit::dsmrun_command(3, &["--timeout", "60"], TEST, &["lock-lost", "--rank", "2"]);
    cmd.env_remove("DSM_TRANSPORT")
        .env("DSM_LOG", "dsm_core=info");
    let run = dsm_testkit::run(cmd);
    let all = run.all_output();
    assert_eq!(run.code, Some(3), "{all}");
    assert!(all.contains(COMMON_SEGMENT), "{all}");
    assert!(all.contains("rank 2 exited with status 3"), "{all}");
    assert!(t.elapsed() < Duration::from_secs(30), "{all}");

    let port = free_port();
    let t = Instant::now();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let mut c = Command::new(TEST);
            c.args(["lock-lost", "--rank", "1"]);
            dsm_testkit::as_rank(&mut c, r, 2, &format!("127.0.0.1:{port}"), "lock-lost", 20)
                .env_remove("DSM_TRANSPORT")
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    assert_eq!(outs[1].status.code(), Some(3));
    let err = text(&outs[0].stderr);
    assert_eq!(
        outs[0].status.code(),
        Some(dsm_proto::exit_codes::PEER_LOST),
        "{err}"
    );
    assert!(err.contains("lost rank 1"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30), "{err}");
}

//! How waiting threads spend the time until their reply (`DSM_SPIN`, dsm-core's `spin`):
//! real ranks over loopback, Water (lock grants, remote faults in the handler, barriers),
//! checked against the sequential reference, with the counters each rank's stats file
//! keeps of waits that ended while polling and waits that slept.

use std::path::Path;

const WATER: &str = env!("CARGO_BIN_EXE_water");

/// `(spin_budget_us, polled, slept)` of each rank.
fn waits(stats: &Path, n: usize) -> Vec<(u64, u64, u64)> {
    let get = |r: usize, k: &str| dsm_testkit::rank_counter(stats, r, "waits", k);
    (0..n)
        .map(|r| (get(r, "spin_budget_us"), get(r, "polled"), get(r, "slept")))
        .collect()
}

/// Ring frames the comm threads of all ranks took while following a run of them.
fn frames_followed(stats: &Path, n: usize) -> u64 {
    dsm_testkit::counter_sum(stats, n, "waits", "frames_followed")
}

fn water(spin: Option<&str>, stats: &Path) -> dsm_testkit::Run {
    dsm_testkit::dsmrun_with_stats(2, WATER, &[], ("DSM_SPIN", spin), stats)
}

fn verified(spin: Option<&str>, stats: &Path) -> Vec<(u64, u64, u64)> {
    water(spin, stats).assert_verified(&format!("water with DSM_SPIN={spin:?}"));
    waits(stats, 2)
}

#[test]
fn off_sleeps_at_once_and_a_budget_polls() {
    let off = tempfile::tempdir().unwrap();
    for (rank, (budget, polled, slept)) in verified(Some("off"), off.path()).into_iter().enumerate()
    {
        assert_eq!(budget, 0, "rank {rank}");
        assert_eq!(polled, 0, "rank {rank}: DSM_SPIN=off never polls");
        assert!(slept > 0, "rank {rank}: Water waits for grants and pages");
    }
    assert_eq!(
        frames_followed(off.path(), 2),
        0,
        "without a budget the comm threads sleep between frames"
    );
    // Water's lock passes send request after request to a rank whose app thread is
    // computing: its comm thread takes them in a run. Whether a run forms depends on
    // timing (a waiting app thread takes ring frames itself), and once, with the other
    // tests of this file running beside it, none formed in a whole run, so up to three
    // runs get the chance.
    let mut followed = Vec::new();
    for _ in 0..3 {
        let long = tempfile::tempdir().unwrap();
        for (rank, (budget, polled, _)) in verified(Some("1000000"), long.path())
            .into_iter()
            .enumerate()
        {
            assert_eq!(budget, 1_000_000, "rank {rank}");
            assert!(
                polled > 0,
                "rank {rank}: with a one-second budget replies come while the waiter polls"
            );
        }
        followed.push(frames_followed(long.path(), 2));
        if followed.last() > Some(&0) {
            return;
        }
    }
    panic!("with a one-second budget no comm thread followed a run of frames: {followed:?}");
}

/// Over TCP the comm thread follows runs of messages too, watching the sockets: with a
/// budget it goes back to its readers when one has data (`sockets_caught`), without one
/// it never watches.
#[test]
fn over_tcp_runs_of_messages_are_followed_on_the_sockets() {
    for (spin, follows) in [("1000000", true), ("off", false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = dsm_testkit::dsmrun_command(2, &[], WATER, &[]);
        cmd.env("DSM_TRANSPORT", "tcp")
            .env("DSM_SPIN", spin)
            .env("DSM_STATS_FILE", dir.path().join("rank-%r.json"));
        dsm_testkit::run(cmd).assert_verified(&format!("water over TCP, DSM_SPIN={spin}"));
        let caught = dsm_testkit::counter_sum(dir.path(), 2, "waits", "sockets_caught");
        assert_eq!(
            frames_followed(dir.path(), 2),
            0,
            "DSM_SPIN={spin}: no rings over TCP"
        );
        if follows {
            // A socket closed at the job's end is readable too, but that is one look per
            // link; Water's lock traffic gives thousands of catches.
            assert!(
                caught > 100,
                "DSM_SPIN={spin}: the comm threads caught only {caught} messages"
            );
        } else {
            assert_eq!(
                caught, 0,
                "DSM_SPIN={spin}: nothing to follow without a budget"
            );
        }
    }
}

#[test]
fn auto_polls_only_with_a_core_per_rank() {
    let dir = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = if cores >= 2 { 200 } else { 0 };
    for (rank, (budget, _, _)) in verified(None, dir.path()).into_iter().enumerate() {
        assert_eq!(budget, expected, "rank {rank} on {cores} cores");
    }
}

/// Pinning (`DSM_PIN=1`) narrows each rank to one core, but the ranks still have a core
/// each: the budget follows the cores the job may use on the host, not the one left to a
/// pinned process (which made every wait sleep, and a remote fault over rings 84 us).
#[test]
fn pinned_ranks_with_a_core_each_still_poll() {
    let dir = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = if cores >= 2 { 200 } else { 0 };
    let run = dsm_testkit::dsmrun_with_stats(2, WATER, &[], ("DSM_PIN", Some("1")), dir.path());
    run.assert_verified("water with DSM_PIN=1");
    for (rank, (budget, polled, _)) in waits(dir.path(), 2).into_iter().enumerate() {
        assert_eq!(budget, expected, "rank {rank} pinned, on {cores} cores");
        if expected > 0 {
            assert!(polled > 0, "rank {rank}: pinned ranks poll");
        }
    }
}

#[test]
fn a_malformed_setting_stops_the_job_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = water(Some("fast"), dir.path());
    assert_eq!(out.code, Some(2), "{out:?}");
    let all = out.all_output();
    assert!(
        all.contains("DSM_SPIN") && all.contains("microseconds"),
        "the error names the variable and what it takes: {all}"
    );
    assert!(
        !all.contains("[0]") && !all.contains("[1]"),
        "dsmrun refuses it before starting any rank: {all}"
    );
}

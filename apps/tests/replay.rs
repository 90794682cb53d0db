//! Recording and replaying the synchronization order (`dsmrun --record`, `--replay`) and
//! chaos mode (`--chaos`), over real processes: the lock-order kernel's output is the
//! lock's schedule, so a replay must print the recorded one, and chaos seeds must show
//! more than one; a replay of another job, or one that leaves the record, stops with 67.
//! TSP and Water `--racy`, whose racy reads a replay does not fix, are in `replay_racy.rs`.

mod common;

use common::s;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

const TEST: &str = env!("CARGO_BIN_EXE_dsm-test");

fn order_line(out: &str) -> String {
    out.lines()
        .find(|l| l.starts_with("[0] order: "))
        .unwrap_or_else(|| panic!("no order line in\n{out}"))
        .to_string()
}

#[test]
fn twenty_replays_of_the_lock_order_reproduce_output_and_race_log() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("lo.dsmrec");
    let log0 = dir.path().join("races0.jsonl");
    let recorded = dsm_testkit::dsmrun(
        4,
        &[
            "--timeout",
            "60",
            "--race-log",
            s(&log0),
            "--record",
            s(&rec),
        ],
        TEST,
        &["lock-order"],
    );
    let ctx = recorded.all_output();
    assert_eq!(recorded.code, Some(66), "{ctx}");
    assert!(
        ctx.contains("dsmrun: recorded 32 lock acquisitions"),
        "{ctx}"
    );
    let want = order_line(&recorded.stdout);
    let want_log = std::fs::read(&log0).unwrap();
    assert!(
        !want_log.is_empty(),
        "the kernel's race is in the log\n{ctx}"
    );
    for i in 0..20 {
        let log = dir.path().join(format!("races{}.jsonl", i + 1));
        let run = dsm_testkit::dsmrun(
            4,
            &[
                "--timeout",
                "60",
                "--race-log",
                s(&log),
                "--replay",
                s(&rec),
            ],
            TEST,
            &["lock-order"],
        );
        let ctx = run.all_output();
        assert_eq!(run.code, Some(66), "replay {i}\n{ctx}");
        assert_eq!(order_line(&run.stdout), want, "replay {i}\n{ctx}");
        assert!(
            std::fs::read(&log).unwrap() == want_log,
            "replay {i}: the race log differs from the recorded run's\n{ctx}"
        );
    }
}

#[test]
fn chaos_seeds_show_other_lock_orders_and_a_chaos_run_replays() {
    let mut orders = BTreeSet::new();
    for seed in 0..20 {
        let run = dsm_testkit::dsmrun(
            4,
            &["--timeout", "60", "--chaos", &seed.to_string()],
            TEST,
            &["lock-order", "--work", "0"],
        );
        assert_eq!(run.code, Some(0), "seed {seed}\n{}", run.all_output());
        orders.insert(order_line(&run.stdout));
    }
    assert!(
        orders.len() >= 2,
        "20 chaos seeds gave one lock order only: {orders:?}"
    );
    // Chaos is recordable: the replay (without chaos) takes the chaos run's order.
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("chaos.dsmrec");
    let recorded = dsm_testkit::dsmrun(
        4,
        &["--timeout", "60", "--chaos", "5", "--record", s(&rec)],
        TEST,
        &["lock-order", "--work", "0"],
    );
    assert_eq!(recorded.code, Some(0), "{}", recorded.all_output());
    let replayed = dsm_testkit::dsmrun(
        4,
        &["--timeout", "60", "--replay", s(&rec)],
        TEST,
        &["lock-order", "--work", "0"],
    );
    assert_eq!(replayed.code, Some(0), "{}", replayed.all_output());
    assert_eq!(order_line(&replayed.stdout), order_line(&recorded.stdout));
}

/// Records `dsm-test lock-order` at N = `n` into `dir`/lo.dsmrec; returns the record's path.
fn record_lock_order(dir: &tempfile::TempDir, n: usize) -> std::path::PathBuf {
    let rec = dir.path().join("lo.dsmrec");
    let recorded = dsm_testkit::dsmrun(
        n,
        &["--timeout", "60", "--record", s(&rec)],
        TEST,
        &["lock-order"],
    );
    assert_eq!(recorded.code, Some(0), "{}", recorded.all_output());
    rec
}

#[test]
fn replaying_another_job_exits_67_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let rec = record_lock_order(&dir, 4);
    let cases: [(usize, &[&str], &str); 3] = [
        (2, &["lock-order"], "4 nodes, not 2"),
        (4, &["lock-order", "--rounds", "9"], "arguments"),
        (4, &["counter"], "arguments"),
    ];
    for (n, args, says) in cases {
        let run = dsm_testkit::dsmrun(n, &["--timeout", "60", "--replay", s(&rec)], TEST, args);
        let ctx = run.all_output();
        assert_eq!(run.code, Some(67), "{args:?} at {n}\n{ctx}");
        assert!(
            run.stderr.contains("cannot replay") && run.stderr.contains(says),
            "{ctx}"
        );
        assert!(run.elapsed < Duration::from_secs(5), "{ctx}");
    }
}

/// Rewrites the record's arguments, so that the header check passes and the run itself
/// must notice that it leaves the record.
fn with_args(rec: &Path, out: &Path, args: &[&str]) {
    let mut record = dsm_replay::Record::from_bytes(&std::fs::read(rec).unwrap()).unwrap();
    record.header.args = args.iter().map(|a| a.to_string()).collect();
    std::fs::write(out, record.to_bytes()).unwrap();
}

#[test]
fn a_replay_that_leaves_the_record_exits_67_naming_lock_grant_and_rank() {
    let dir = tempfile::tempdir().unwrap();
    let rec = record_lock_order(&dir, 4);
    for rounds in ["9", "7"] {
        let args = ["lock-order", "--rounds", rounds];
        let forged = dir.path().join(format!("forged{rounds}.dsmrec"));
        with_args(&rec, &forged, &args);
        let run = dsm_testkit::dsmrun(4, &["--timeout", "60", "--replay", s(&forged)], TEST, &args);
        let ctx = run.all_output();
        assert_eq!(run.code, Some(67), "--rounds {rounds}\n{ctx}");
        assert!(ctx.contains("dsm: replay diverged on rank"), "{ctx}");
        assert!(
            ctx.contains("dsmrun: replay diverged from the record"),
            "{ctx}"
        );
        if rounds == "9" {
            // One acquire more than recorded: the lock, the grant and the ranks are named.
            assert!(ctx.contains("lock \"lock-order\""), "{ctx}");
            assert!(ctx.contains("grant"), "{ctx}");
        } else {
            // One acquire fewer: the barrier after the loop comes early, named as the
            // program counts its barriers (the two allocations before it are not).
            assert!(
                ctx.contains("the program arrives at barrier 1 as its event"),
                "{ctx}"
            );
        }
        assert!(run.elapsed < Duration::from_secs(20), "{ctx}");
    }
}

/// Every rank's part ends with a digest of the values it homes; a replay whose
/// synchronization matches the record but whose values differ (what a racy read that
/// changes no course leaves behind) stops with 67 saying so. The record is altered here so
/// that the check is exercised deterministically.
#[test]
fn a_replay_ending_with_other_values_exits_67() {
    let dir = tempfile::tempdir().unwrap();
    let rec = record_lock_order(&dir, 3);
    let mut record = dsm_replay::Record::from_bytes(&std::fs::read(&rec).unwrap()).unwrap();
    for part in &record.ranks {
        assert!(
            matches!(part.last(), Some(dsm_replay::Event::Values { .. })),
            "every part ends with its values: {part:?}"
        );
    }
    // The unaltered record replays to the end.
    let run = dsm_testkit::dsmrun(
        3,
        &["--timeout", "60", "--replay", s(&rec)],
        TEST,
        &["lock-order"],
    );
    assert_eq!(run.code, Some(0), "{}", run.all_output());
    if let Some(dsm_replay::Event::Values { digest }) = record.ranks[1].last_mut() {
        *digest ^= 1;
    }
    let forged = dir.path().join("forged.dsmrec");
    std::fs::write(&forged, record.to_bytes()).unwrap();
    let run = dsm_testkit::dsmrun(
        3,
        &["--timeout", "60", "--replay", s(&forged)],
        TEST,
        &["lock-order"],
    );
    let ctx = run.all_output();
    assert_eq!(run.code, Some(67), "{ctx}");
    assert!(
        ctx.contains("replay diverged on rank 1: the run ends with other values"),
        "{ctx}"
    );
}

#[test]
fn damaged_records_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let rec = record_lock_order(&dir, 2);
    let bytes = std::fs::read(&rec).unwrap();
    let bad = dir.path().join("bad.dsmrec");
    let cases: [(Vec<u8>, &str); 3] = [
        (bytes[..bytes.len() / 2].to_vec(), "truncated"),
        (
            b"not a record at all".to_vec(),
            "not a dsm synchronization record",
        ),
        (
            {
                let mut b = bytes.clone();
                let i = b.len() - 12;
                b[i] ^= 0x55;
                b
            },
            "corrupt",
        ),
    ];
    for (content, says) in cases {
        std::fs::write(&bad, content).unwrap();
        let run = dsm_testkit::dsmrun(2, &["--replay", s(&bad)], TEST, &["lock-order"]);
        // A damaged input file: exit_codes::CORRUPT_INPUT.
        assert_eq!(run.code, Some(65), "{}", run.all_output());
        assert!(run.stderr.contains(says), "{}", run.stderr);
    }
    let missing = dir.path().join("missing.dsmrec");
    // A record that cannot be opened is a wrong path on the command line.
    let run = dsm_testkit::dsmrun(2, &["--replay", s(&missing)], TEST, &["lock-order"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("cannot read the record"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_record_made_with_race_detection_is_replayed_with_it_only() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("race.dsmrec");
    let rec = rec.to_str().unwrap();
    let args = ["lock-order", "--rounds", "4"];
    let made = dsm_testkit::dsmrun(
        2,
        &["--race", "--race-exit-code", "0", "--record", rec],
        TEST,
        &args,
    );
    assert_eq!(made.code, Some(0), "{}", made.all_output());
    let plain = dsm_testkit::dsmrun(2, &["--replay", rec], TEST, &args);
    assert_eq!(plain.code, Some(67), "{}", plain.all_output());
    assert!(
        plain
            .stderr
            .contains("it was recorded with race detection: add --race to replay it"),
        "{}",
        plain.all_output()
    );
    let raced = dsm_testkit::dsmrun(
        2,
        &["--race", "--race-exit-code", "0", "--replay", rec],
        TEST,
        &args,
    );
    assert_eq!(raced.code, Some(0), "{}", raced.all_output());
}

//! Race detection between barriers (incremental analysis), end to end:
//! - every labelled kernel gives its expected answer when every interval is shipped to the
//!   master as soon as it closes (`DSM_RACE_BATCH=1`), and at every barrier the full
//!   barrier-time analysis of the same run agrees exactly with what the incremental
//!   analysis and the barrier together reported (`DSM_RACE_VERIFY_INCREMENTAL=1` stops the
//!   job if not);
//! - the same oracle holds for TSP and racy Water, in plain and schedule mode;
//! - a program that synchronizes through locks alone (100 000 intervals, no barrier until
//!   `finish`) gets its planted race reported while it runs, with peak memory within 2x of
//!   the same run without detection;
//! - a program whose ranks never meet (each takes its own lock, a shared one every 100th
//!   time; the issue-36 program) runs in memory that does not grow with its length, on one
//!   host (common memory) and over TCP, and its race is reported.

use apps::kernels::{self, Expect};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

const KERNEL: &str = env!("CARGO_BIN_EXE_race-kernel");
const DSM_TEST: &str = env!("CARGO_BIN_EXE_dsm-test");

/// Runs `program` under `dsmrun -n N` with the incremental oracle on and batches of
/// `batch` intervals; returns the exit status, the race log and the whole output.
fn run_verified(
    n: usize,
    race_flag: &str,
    batch: u32,
    program: &str,
    args: &[&str],
) -> (Option<i32>, Vec<Value>, String) {
    let batch_text = batch.to_string();
    let (run, lines) = dsm_testkit::dsmrun_race_logged(
        n,
        &["--timeout", "120", race_flag],
        program,
        args,
        &[
            ("DSM_RACE_BATCH", batch_text.as_str()),
            ("DSM_RACE_VERIFY_INCREMENTAL", "1"),
        ],
    );
    let all = run.all_output();
    assert!(
        !all.contains("disagrees with barrier-time analysis"),
        "{program} {args:?} at N={n}, batch {batch}:\n{all}"
    );
    (run.code, lines, all)
}

#[test]
fn labelled_kernels_give_the_same_answers_analysed_incrementally() {
    for k in kernels::all() {
        for (n, batch) in [(2, 1), (3, 1), (4, 3)] {
            if n < k.min_nodes {
                continue;
            }
            let (code, log, all) = run_verified(n, "--race", batch, KERNEL, &["run", k.name]);
            let ctx = format!("kernel {} at N={n}, batch {batch}\n{all}", k.name);
            assert!(all.contains(&format!("kernel {} done", k.name)), "{ctx}");
            let mut found: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
            for v in &log {
                found
                    .entry(v["variable"].as_str().unwrap().to_string())
                    .or_default()
                    .insert(v["index"].as_u64().unwrap() as usize);
            }
            match (k.expect)(n) {
                Expect::NoRace => {
                    assert_eq!(code, Some(0), "{ctx}");
                    assert!(found.is_empty(), "false positives {found:?}\n{ctx}");
                }
                Expect::Races(want) => {
                    assert_eq!(code, Some(66), "{ctx}");
                    let want_vars: BTreeSet<&str> = want.iter().map(|w| w.0).collect();
                    let got_vars: BTreeSet<&str> = found.keys().map(String::as_str).collect();
                    assert_eq!(got_vars, want_vars, "variables\n{ctx}");
                    for (var, indices) in want {
                        if let Some(indices) = indices {
                            assert_eq!(&found[var], &indices, "indices of {var}\n{ctx}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_oracle_holds_for_tsp_and_racy_water_in_both_modes() {
    let tsp = env!("CARGO_BIN_EXE_tsp");
    let water = env!("CARGO_BIN_EXE_water");
    for flag in ["--race", "--race=schedule"] {
        let (code, _, all) = run_verified(3, flag, 5, tsp, &["--random", "12", "--seed", "3"]);
        assert_eq!(code, Some(66), "tsp {flag}:\n{all}");
        assert!(all.contains("verified:"), "tsp {flag}:\n{all}");
        let (code, _, all) = run_verified(
            3,
            flag,
            5,
            water,
            &["--molecules", "64", "--steps", "2", "--racy"],
        );
        assert_eq!(code, Some(66), "racy water {flag}:\n{all}");
    }
}

/// Rank 0's and the job's largest peak RSS, from the lock-only program's lines.
fn peak_rss_kib(output: &str) -> usize {
    output
        .lines()
        .filter_map(|l| l.split("peak RSS ").nth(1))
        .filter_map(|t| t.trim_end_matches(" KiB").trim().parse::<usize>().ok())
        .max()
        .unwrap_or_else(|| panic!("no peak RSS line in:\n{output}"))
}

#[test]
fn a_lock_only_program_gets_its_race_reported_while_it_runs_in_bounded_memory() {
    for n in [2, 3] {
        let args = ["lock-only", "--intervals", "100000", "--plant"];
        let (raced, lines) = dsm_testkit::dsmrun_race_logged(
            n,
            &["--timeout", "180", "--race"],
            DSM_TEST,
            &args,
            &[],
        );
        let all = raced.all_output();
        assert_eq!(raced.code, Some(66), "N={n}:\n{all}");
        assert!(all.contains("verified: lock-only"), "N={n}:\n{all}");
        assert!(!lines.is_empty(), "N={n}: no race logged\n{all}");
        for v in &lines {
            assert_eq!(v["variable"], "planted", "N={n}: {v}");
            assert_eq!(v["kind"], "read-write", "N={n}: {v}");
        }
        assert!(
            lines.iter().any(|v| v["found_at"] == "running"),
            "N={n}: the planted race was found only at exit\n{all}"
        );
        let plain = dsm_testkit::dsmrun(n, &["--timeout", "180"], DSM_TEST, &args);
        let plain_all = plain.all_output();
        assert_eq!(plain.code, Some(0), "{plain_all}");
        let (with, without) = (peak_rss_kib(&all), peak_rss_kib(&plain_all));
        println!("N={n}: peak RSS {with} KiB with --race, {without} KiB without");
        assert!(
            with <= 2 * without,
            "N={n}: peak RSS {with} KiB with --race, {without} KiB without\n{all}"
        );
    }
}

/// Rank 0's peak RSS line of the own-locks program.
fn rank0_peak_kib(output: &str) -> usize {
    output
        .lines()
        .find(|l| l.contains("rank 0: ") && l.contains("peak RSS "))
        .and_then(|l| l.split("peak RSS ").nth(1))
        .and_then(|t| t.trim_end_matches(" KiB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no rank 0 peak RSS line in:\n{output}"))
}

#[test]
fn memory_of_a_program_without_barriers_does_not_grow_with_its_length() {
    for transport in ["auto", "tcp"] {
        let mut peaks = Vec::new();
        for iters in ["20000", "200000"] {
            let (run, lines) = dsm_testkit::dsmrun_race_logged(
                2,
                &["--timeout", "120", "--race"],
                DSM_TEST,
                &["own-locks", "--iters", iters],
                &[("DSM_TRANSPORT", transport)],
            );
            let all = run.all_output();
            assert_eq!(
                run.code,
                Some(66),
                "{transport}, {iters} iterations:\n{all}"
            );
            assert!(all.contains("verified: own-locks"), "{transport}:\n{all}");
            assert!(
                lines.iter().any(|v| v["variable"] == "planted"
                    && v["kind"] == "read-write"
                    && v["found_at"] == "running"),
                "{transport}, {iters} iterations: the planted race was not reported while \
                 the program ran\n{all}"
            );
            peaks.push(rank0_peak_kib(&all));
        }
        let (short, long) = (peaks[0], peaks[1]);
        println!(
            "{transport}: rank 0 peak RSS {short} KiB at 20 000 iterations, {long} KiB at 200 000"
        );
        assert!(
            long * 2 <= short * 3,
            "{transport}: rank 0 peak RSS grew from {short} KiB to {long} KiB with 10x the iterations"
        );
    }
}

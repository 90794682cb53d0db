//! Schedule mode (`dsmrun --race=schedule`, Hood/Kennedy/Mellor-Crummey): lock edges are
//! left out of the happens-before order, so updates that only lock order separates are
//! reported as lock-order dependences, while plain `--race` reports nothing on the same
//! race-free programs. Real multi-process runs.

use dsm_testkit::Run;
use serde_json::Value;
use std::collections::BTreeSet;

/// Runs `dsmrun -n N FLAGS --race-log LOG PROGRAM ARGS`; returns the run and the log lines.
fn run_logged(n: usize, flags: &[&str], program: &str, args: &[&str]) -> (Run, Vec<Value>) {
    let mut all = vec!["--timeout", "120"];
    all.extend_from_slice(flags);
    dsm_testkit::dsmrun_race_logged(n, &all, program, args, &[])
}

fn ctx(out: &Run) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.code,
        out.stdout,
        tail(&out.stderr)
    )
}

fn tail(s: &str) -> &str {
    &s[s.len().saturating_sub(4000)..]
}

/// Schedule mode reports lock-order dependences (on one of `want` at least), no data
/// races, and exits 0; plain race mode reports nothing.
fn dependences_in_schedule_mode_only(n: usize, program: &str, args: &[&str], want: &[&str]) {
    let (out, log) = run_logged(n, &["--race=schedule"], program, args);
    let c = ctx(&out);
    assert_eq!(
        out.code,
        Some(0),
        "lock-order dependences alone exit 0\n{c}"
    );
    assert!(out.stdout.contains("[0] verified:"), "{c}");
    assert!(out.stderr.contains("LOCK-ORDER DEPENDENCE"), "{c}");
    assert!(!out.stderr.contains("DATA RACE"), "{c}");
    assert!(out.stderr.contains("dsm: 0 data races, "), "{c}");
    assert!(out.stderr.contains("(schedule mode)"), "{c}");
    assert!(!log.is_empty(), "{c}");
    let vars: BTreeSet<&str> = log
        .iter()
        .map(|v| v["variable"].as_str().unwrap())
        .collect();
    assert!(want.iter().any(|w| vars.contains(w)), "{vars:?}\n{c}");
    for v in &log {
        assert_eq!(v["class"], "lock-order", "{v}");
        let locks = v["locks"].as_array().unwrap();
        assert!(locks.iter().all(Value::is_string), "{v}");
    }
    assert!(
        log.iter()
            .any(|v| !v["locks"].as_array().unwrap().is_empty()),
        "some dependence names its lock\n{c}"
    );

    let (out, log) = run_logged(n, &["--race"], program, args);
    let c = ctx(&out);
    assert_eq!(out.code, Some(0), "{c}");
    assert!(out.stdout.contains("[0] verified:"), "{c}");
    assert!(log.is_empty(), "{log:?}\n{c}");
    assert!(
        out.stderr.contains("dsm: 0 data races on 0 variables"),
        "{c}"
    );
    assert!(!out.stderr.contains("LOCK-ORDER"), "{c}");
}

/// Nothing in either mode.
fn clean_in_both_modes(n: usize, program: &str, args: &[&str]) {
    for (flag, summary) in [
        ("--race", "dsm: 0 data races on 0 variables"),
        (
            "--race=schedule",
            "dsm: 0 data races, 0 lock-order dependences on 0 variables (schedule mode)",
        ),
    ] {
        let (out, log) = run_logged(n, &[flag], program, args);
        let c = ctx(&out);
        assert_eq!(out.code, Some(0), "{flag}\n{c}");
        assert!(out.stdout.contains("[0] verified:"), "{flag}\n{c}");
        assert!(log.is_empty(), "{flag}: {log:?}\n{c}");
        assert!(out.stderr.contains(summary), "{flag}\n{c}");
    }
}

#[test]
fn water_has_lock_order_dependences_on_forces() {
    dependences_in_schedule_mode_only(
        2,
        env!("CARGO_BIN_EXE_water"),
        &["--steps", "2"],
        &["forces"],
    );
}

#[test]
fn water_at_four_nodes_too() {
    dependences_in_schedule_mode_only(
        4,
        env!("CARGO_BIN_EXE_water"),
        &["--molecules", "64", "--steps", "2"],
        &["forces"],
    );
}

#[test]
fn tsp_work_queue_has_lock_order_dependences() {
    dependences_in_schedule_mode_only(
        2,
        env!("CARGO_BIN_EXE_tsp"),
        &["--cities", "12", "--locked-bound"],
        // The work queue's entries and its head/tail (which of them depends on timing).
        &["queue", "pool_meta"],
    );
}

#[test]
fn sor_and_fft_are_clean_in_both_modes() {
    clean_in_both_modes(
        4,
        env!("CARGO_BIN_EXE_sor"),
        &["--size", "128", "--iters", "10"],
    );
    clean_in_both_modes(4, env!("CARGO_BIN_EXE_fft"), &[]);
}

#[test]
fn schedule_ignore_mutes_a_variable() {
    let water = env!("CARGO_BIN_EXE_water");
    let args = ["--steps", "2"];
    let (out, log) = run_logged(2, &["--schedule-ignore", "forces"], water, &args);
    let c = ctx(&out);
    assert_eq!(out.code, Some(0), "{c}");
    assert!(log.iter().all(|v| v["variable"] != "forces"), "{c}");
    assert!(!out.stderr.contains("on forces["), "{c}");
    assert!(out.stderr.contains("(schedule mode)"), "{c}");
    let (out, log) = run_logged(
        2,
        &["--schedule-ignore", "forces", "--schedule-ignore", "energy"],
        water,
        &args,
    );
    let c = ctx(&out);
    assert_eq!(out.code, Some(0), "{c}");
    assert!(log.is_empty(), "{log:?}\n{c}");
    assert!(
        out.stderr
            .contains("dsm: 0 data races, 0 lock-order dependences on 0 variables (schedule mode)"),
        "{c}"
    );
}

#[test]
fn the_program_can_mark_a_variable_order_independent() {
    let (out, log) = run_logged(
        2,
        &["--race=schedule"],
        env!("CARGO_BIN_EXE_water"),
        &["--steps", "2", "--order-independent-sums"],
    );
    let c = ctx(&out);
    assert_eq!(out.code, Some(0), "{c}");
    assert!(log.is_empty(), "{log:?}\n{c}");
    assert!(
        out.stderr
            .contains("dsm: 0 data races, 0 lock-order dependences on 0 variables (schedule mode)"),
        "{c}"
    );
}

#[test]
fn real_data_races_stay_data_races_in_schedule_mode() {
    let (out, log) = run_logged(
        2,
        &["--race=schedule"],
        env!("CARGO_BIN_EXE_race-kernel"),
        &["run", "write-write"],
    );
    let c = ctx(&out);
    assert_eq!(out.code, Some(66), "{c}");
    assert!(
        out.stderr.contains("DATA RACE (write-write) on cell[9]"),
        "{c}"
    );
    assert!(
        log.iter()
            .any(|v| v["class"] == "data-race" && v["variable"] == "cell"),
        "{c}"
    );
}

#[test]
fn race_mode_value_is_checked_and_needs_equals() {
    let out = dsm_testkit::dsmrun(2, &["--race=bogus"], "sor", &["--size", "64"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    // `--race PROGRAM` keeps PROGRAM as the program.
    let out = dsm_testkit::dsmrun(
        2,
        &["--timeout", "60", "--race"],
        env!("CARGO_BIN_EXE_sor"),
        &["--size", "64", "--iters", "2"],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("dsm: 0 data races on 0 variables"),
        "{}",
        out.stderr
    );
}

/// Runs `dsm-test ARGS` at N=4 under chaos seed `seed` with schedule mode and a value
/// trace; returns the run, its race log and the trace's bytes.
fn chaos_traced(seed: u64, flags: &[&str], args: &[&str]) -> (Run, Vec<Value>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.dsmtrace");
    let seed = seed.to_string();
    let mut all = vec![
        "--race=schedule",
        "--chaos",
        seed.as_str(),
        "--trace-values",
        trace.to_str().unwrap(),
    ];
    all.extend_from_slice(flags);
    let (out, log) = run_logged(4, &all, env!("CARGO_BIN_EXE_dsm-test"), args);
    let bytes = std::fs::read(&trace).unwrap_or_default();
    (out, log, bytes)
}

/// The guarantee schedule mode gives (Hood et al.): a run with no schedule-mode report
/// computes the same values whatever the schedule. Over 20 chaos seeds at N=4, a program
/// whose only shared updates under a common lock are integer counts (declared
/// order-independent) reports nothing and leaves byte-identical value traces; the lock-order
/// kernel, whose shared list records who got the lock when, reports lock-order dependences
/// and its traces differ between schedules, so the schedules really differ.
#[test]
fn no_schedule_mode_reports_means_the_same_values_under_every_chaos_seed() {
    let clean_args = ["lock-only", "--intervals", "4000"];
    let mut traces = BTreeSet::new();
    for seed in 1..=20u64 {
        let (out, log, trace) = chaos_traced(seed, &["--schedule-ignore", "meetings"], &clean_args);
        assert_eq!(out.code, Some(0), "seed {seed}: {}", ctx(&out));
        assert!(log.is_empty(), "seed {seed}: schedule-mode reports {log:?}");
        assert!(!trace.is_empty(), "seed {seed}: no trace written");
        traces.insert(trace);
    }
    assert_eq!(traces.len(), 1, "value traces differ between schedules");

    let mut orders = BTreeSet::new();
    for seed in 1..=20u64 {
        let (out, log, trace) = chaos_traced(seed, &[], &["lock-order", "--rounds", "6"]);
        assert!(
            out.stdout.contains("verified:"),
            "seed {seed}: {}",
            ctx(&out)
        );
        assert!(
            log.iter()
                .any(|v| v["class"] == "lock-order" && v["variable"] == "order"),
            "seed {seed}: no lock-order dependence on 'order'\n{}",
            ctx(&out)
        );
        orders.insert(trace);
    }
    assert!(orders.len() > 1, "20 chaos seeds gave one schedule");
}

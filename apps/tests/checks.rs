//! `dsmrun --check` end to end: the checks kernel (`dsm-test checks`) reports exactly the
//! uninitialised reads and the write outside a declared region it plants, and nothing when
//! clean; the shipped apps run clean under the checks.

mod common;

use serde_json::Value;
use std::collections::BTreeSet;

const DSM_TEST: &str = env!("CARGO_BIN_EXE_dsm-test");

/// Runs the checks kernel at `n` nodes with `bug`; returns the exit status, the log's
/// objects and the combined output.
fn run_checks(n: usize, bug: &str) -> (Option<i32>, Vec<Value>, String) {
    let (run, lines) = dsm_testkit::dsmrun_race_logged(
        n,
        &["--timeout", "60", "--check"],
        DSM_TEST,
        &["checks", "--bug", bug],
        &[],
    );
    let all = run.all_output();
    assert!(
        run.stdout.contains("verified: checks kernel ran"),
        "N={n} --bug {bug}:\n{all}"
    );
    (run.code, lines, all)
}

fn summary(output: &str) -> &str {
    output
        .lines()
        .find(|l| l.contains("--check:"))
        .unwrap_or_else(|| panic!("no --check summary in:\n{output}"))
}

#[test]
fn a_clean_program_has_no_findings() {
    for n in [2, 3] {
        let (code, log, all) = run_checks(n, "none");
        assert_eq!(code, Some(0), "{all}");
        assert!(log.is_empty(), "{log:?}\n{all}");
        assert!(
            summary(&all).ends_with(
                "0 data races on 0 variables; --check: 0 uninitialised reads, 0 accesses outside declared regions"
            ),
            "{all}"
        );
    }
}

#[test]
fn uninitialised_reads_are_reported_with_their_elements_and_readers() {
    for n in [2, 3, 4] {
        let (code, log, all) = run_checks(n, "uninit");
        assert_eq!(code, Some(66), "{all}");
        let mut readers = BTreeSet::new();
        for v in &log {
            assert_eq!(v["check"], "uninitialised-read", "{v}\n{all}");
            assert_eq!(v["variable"], "field", "{v}");
            assert_eq!(v["epoch"], 2, "{v}");
            assert_eq!(v["indices"], serde_json::json!([3, 4, 5]), "{v}");
            readers.insert(v["rank"].as_u64().unwrap() as usize);
        }
        // Every rank reads the whole field after the first barrier.
        assert_eq!(readers, (0..n).collect(), "{all}");
        assert!(
            summary(&all).contains(&format!("{} uninitialised reads, 0 accesses", 3 * n)),
            "{all}"
        );
        assert!(all.contains("UNINITIALISED READ of field[3]"), "{all}");
    }
}

#[test]
fn a_write_outside_the_declared_region_is_reported() {
    for n in [2, 4] {
        let (code, log, all) = run_checks(n, "region");
        assert_eq!(code, Some(66), "{all}");
        assert_eq!(log.len(), 1, "{log:?}\n{all}");
        let v = &log[0];
        assert_eq!(v["check"], "write-outside-region", "{v}");
        assert_eq!(v["variable"], "field");
        assert_eq!(v["indices"], serde_json::json!([0]));
        assert_eq!(v["rank"], n - 1);
        let band = dsm_core::band(1024, n, n - 1);
        assert_eq!(v["region"], serde_json::json!([band.start, band.end]));
        assert!(
            summary(&all).contains("0 uninitialised reads, 1 access outside"),
            "{all}"
        );
    }
}

#[test]
fn the_shipped_apps_run_clean_under_the_checks() {
    for (app, args, races) in [
        (
            env!("CARGO_BIN_EXE_sor"),
            &["--size", "256", "--iters", "4"][..],
            false,
        ),
        (env!("CARGO_BIN_EXE_fft"), &[][..], false),
        (
            env!("CARGO_BIN_EXE_water"),
            &["--molecules", "64", "--steps", "2"][..],
            false,
        ),
        // TSP reads its bound without the lock on purpose: races, but no check findings.
        (
            env!("CARGO_BIN_EXE_tsp"),
            &["--random", "11", "--seed", "3"][..],
            true,
        ),
    ] {
        let run = dsm_testkit::dsmrun(2, &["--timeout", "120", "--check"], app, args);
        let all = run.all_output();
        assert!(run.stdout.contains("verified:"), "{app}:\n{all}");
        assert_eq!(run.code, Some(if races { 66 } else { 0 }), "{app}:\n{all}");
        assert!(
            summary(&all)
                .ends_with("--check: 0 uninitialised reads, 0 accesses outside declared regions"),
            "{app}:\n{all}"
        );
    }
}

#[test]
fn check_alone_turns_detection_on_even_on_one_node() {
    // --check alone turns detection on; the run says so in its summary.
    let run = dsm_testkit::dsmrun(1, &["--check"], DSM_TEST, &["checks"]);
    let all = run.all_output();
    assert_eq!(run.code, Some(0), "{all}");
    assert!(summary(&all).contains("0 uninitialised reads"), "{all}");
}

#[test]
fn check_findings_are_in_the_sarif_log_which_validates_against_the_schema() {
    for (bug, rule, count) in [
        ("uninit", "dsm/uninitialised-read", 6),
        ("region", "dsm/write-outside-region", 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let sarif = dir.path().join("checks.sarif");
        let run = dsm_testkit::dsmrun(
            2,
            &[
                "--timeout",
                "60",
                "--check",
                "--race-sarif",
                sarif.to_str().unwrap(),
            ],
            DSM_TEST,
            &["checks", "--bug", bug],
        );
        let all = run.all_output();
        assert_eq!(run.code, Some(66), "{all}");
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
        common::assert_valid_sarif(&doc);
        let results = doc["runs"][0]["results"].as_array().unwrap();
        assert_eq!(results.len(), 1, "{doc:#}\n{all}");
        let r = &results[0];
        assert_eq!(r["ruleId"], rule, "{r}");
        assert_eq!(r["properties"]["occurrences"], count, "{r}\n{all}");
        assert_eq!(
            r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"], "field",
            "{r}"
        );
        let rules: Vec<&str> = doc["runs"][0]["tool"]["driver"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert!(rules.contains(&rule), "{rules:?}");
    }
}

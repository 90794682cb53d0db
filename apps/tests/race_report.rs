//! The printed race report collapses repeated races (ThreadSanitizer-style, by variable
//! and the two sides) and `--race-sarif` writes them as SARIF 2.1.0, over a real TSP run
//! whose one racy line used to print a block per interval pair.

mod common;

use serde_json::Value;

const TSP: &str = env!("CARGO_BIN_EXE_tsp");

/// A race log that cannot take what rank 0 writes (`/dev/full` opens, and fails every
/// write) ends the job at once with an error naming the file: rank 0 failed inside a
/// barrier the others wait in, so it must not also wait for them in a finishing barrier.
#[test]
fn a_race_log_that_fails_mid_run_stops_the_job_with_its_name() {
    if !std::path::Path::new("/dev/full").exists() {
        println!("SKIPPED a_race_log_that_fails_mid_run_stops_the_job_with_its_name: no /dev/full");
        return;
    }
    let run = dsm_testkit::dsmrun(
        2,
        &["--timeout", "30", "--race-log", "/dev/full"],
        TSP,
        &["--random", "10", "--seed", "3"],
    );
    let ctx = run.all_output();
    assert_eq!(run.code, Some(1), "{ctx}");
    assert!(
        run.stderr
            .contains("cannot write race log /dev/full: No space left on device"),
        "{ctx}"
    );
    assert!(run.stderr.contains("rank 0 exited with status 1"), "{ctx}");
}

#[test]
fn tsp_races_collapse_and_sarif_lists_each_distinct_race_once() {
    let dir = tempfile::tempdir().unwrap();
    let sarif = dir.path().join("races.sarif");
    let log = dir.path().join("races.jsonl");
    let run = dsm_testkit::dsmrun(
        4,
        &[
            "--timeout",
            "60",
            "--race-sarif",
            sarif.to_str().unwrap(),
            "--race-log",
            log.to_str().unwrap(),
        ],
        TSP,
        &["--random", "14", "--seed", "3"],
    );
    let ctx = run.all_output();
    assert_eq!(run.code, Some(66), "{ctx}");
    let races = std::fs::read_to_string(&log).unwrap().lines().count();
    let blocks = run.stderr.matches("DATA RACE").count();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
    common::assert_valid_sarif(&doc);
    assert_eq!(doc["version"], "2.1.0");
    let results = doc["runs"][0]["results"].as_array().unwrap();
    // Every distinct race is printed once: as many blocks as SARIF results, and (TSP's
    // one racy variable read from a few kinds of intervals) far fewer than races.
    assert_eq!(blocks, results.len(), "{ctx}");
    assert!(
        blocks <= 4 && races > blocks,
        "{blocks} blocks for {races} races\n{ctx}"
    );
    let occurrences: u64 = results
        .iter()
        .map(|r| r["properties"]["occurrences"].as_u64().unwrap())
        .sum();
    assert_eq!(occurrences as usize, races, "{ctx}");
    for r in results {
        assert_eq!(r["ruleId"], "dsm/data-race");
        assert_eq!(
            r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"],
            "bound"
        );
    }
    if races > blocks {
        assert!(run.stderr.contains("distinct race"), "{ctx}");
    }
}

#[test]
fn the_sarif_check_accepts_a_minimal_log_and_rejects_broken_ones() {
    let mut log = serde_json::json!({
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": { "name": "dsm" } },
            "results": [{
                "ruleId": "dsm/data-race",
                "message": { "text": "x" },
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": { "uri": "src/a.rs" },
                        "region": { "startLine": 3 },
                    }
                }],
            }],
        }],
    });
    common::assert_valid_sarif(&log);
    let region = &mut log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"];
    region["startLine"] = serde_json::json!(0);
    let broken = log.clone();
    assert!(
        std::panic::catch_unwind(|| common::assert_valid_sarif(&broken)).is_err(),
        "line 0 is not valid SARIF"
    );
    log["version"] = serde_json::json!("2.0");
    assert!(std::panic::catch_unwind(|| common::assert_valid_sarif(&log)).is_err());
}

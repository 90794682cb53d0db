//! Pinpoint mode (`dsmrun --pinpoint-log`) on every racy labelled kernel: a first run
//! writes the race log, a second watches every raced element of it, and the source lines
//! it reports for the two sides of the races must be exactly the lines marked `// RACE`
//! in the kernel's function (found by grep in `apps/src/kernels.rs`, so nothing here
//! names a line).

mod common;

use apps::kernels::{self, Expect};
use common::race_lines;
use serde_json::Value;
use std::collections::BTreeSet;

const KERNEL: &str = env!("CARGO_BIN_EXE_race-kernel");
const SOURCE: &str = "src/kernels.rs";

#[test]
fn pinpoint_reports_exactly_the_race_lines_of_every_racy_kernel() {
    let source = std::fs::read_to_string(SOURCE).expect("run from the apps crate");
    let mut checked = 0;
    for k in kernels::all() {
        let n = k.min_nodes.max(4);
        if !matches!((k.expect)(n), Expect::Races(_)) {
            continue;
        }
        let want = race_lines(&source, k.name);
        assert!(!want.is_empty(), "{}: no line is marked // RACE", k.name);
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("first.jsonl");
        let second = dir.path().join("second.jsonl");
        let sarif = dir.path().join("races.sarif");
        let run = dsm_testkit::dsmrun(
            n,
            &["--timeout", "60", "--race-log", first.to_str().unwrap()],
            KERNEL,
            &["run", k.name],
        );
        assert_eq!(run.code, Some(66), "{}\n{}", k.name, run.all_output());
        let run = dsm_testkit::dsmrun(
            n,
            &[
                "--timeout",
                "60",
                "--pinpoint-log",
                first.to_str().unwrap(),
                "--race-log",
                second.to_str().unwrap(),
                "--race-sarif",
                sarif.to_str().unwrap(),
            ],
            KERNEL,
            &["run", k.name],
        );
        let ctx = format!("kernel {}\n{}", k.name, run.all_output());
        assert_eq!(run.code, Some(66), "{ctx}");
        let watched: BTreeSet<(String, u64, u64)> = std::fs::read_to_string(&first)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["variable"].as_str().unwrap().to_string(),
                    v["index"].as_u64().unwrap(),
                    v["epoch"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut got = BTreeSet::new();
        let mut located = 0;
        for l in std::fs::read_to_string(&second).unwrap().lines() {
            let v: Value = serde_json::from_str(l).unwrap();
            let key = (
                v["variable"].as_str().unwrap().to_string(),
                v["index"].as_u64().unwrap(),
                v["epoch"].as_u64().unwrap(),
            );
            if !watched.contains(&key) {
                // Raced only in this run's schedule: not watched.
                continue;
            }
            located += 1;
            for side in ["first", "second"] {
                let locs = v[side]["locations"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{side} side not pinpointed: {l}\n{ctx}"));
                assert!(!locs.is_empty(), "{l}\n{ctx}");
                for loc in locs {
                    assert!(
                        loc["file"]
                            .as_str()
                            .unwrap()
                            .ends_with("apps/src/kernels.rs"),
                        "{loc}\n{ctx}"
                    );
                    assert!(
                        loc["function"]
                            .as_str()
                            .is_some_and(|f| f.contains("apps::kernels::")),
                        "{loc}\n{ctx}"
                    );
                    got.insert(loc["line"].as_u64().unwrap() as u32);
                }
            }
        }
        assert!(located > 0, "no watched race recurred\n{ctx}");
        assert_eq!(got, want, "pinpointed lines vs // RACE lines\n{ctx}");
        // SARIF results point at the lines too, so editors can show the race there.
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
        common::assert_valid_sarif(&doc);
        let sarif_lines: BTreeSet<u32> = doc["runs"][0]["results"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["locations"].as_array().unwrap().iter())
            .filter_map(|l| l["physicalLocation"]["region"]["startLine"].as_u64())
            .map(|l| l as u32)
            .collect();
        assert!(
            !sarif_lines.is_empty() && sarif_lines.is_subset(&want),
            "SARIF lines {sarif_lines:?} vs {want:?}\n{ctx}"
        );
        // The printed report shows the code of both sides.
        assert!(run.stderr.contains("      | "), "{ctx}");
        assert!(run.stderr.contains("// RACE"), "{ctx}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} racy kernels");
}

#[test]
fn a_pinpoint_target_that_names_nothing_is_a_warning() {
    const TSP: &str = env!("CARGO_BIN_EXE_tsp");
    for (target, says) in [
        (
            "nosuchvar[0]@3",
            "no allocation is named 'nosuchvar' (the run allocated: ",
        ),
        (
            "bound[99999]@3",
            "index 99999 is past the end of 'bound' (1 element)",
        ),
        (
            "bound[0]@99",
            "the run ended in epoch 4 (3 barriers before finish)",
        ),
        ("bound[0]@2", ""),
    ] {
        let run = dsm_testkit::dsmrun(
            4,
            &["--timeout", "60", "--pinpoint", target],
            TSP,
            &["--random", "14", "--seed", "3"],
        );
        let ctx = format!("{target}\n{}", run.all_output());
        assert_eq!(run.code, Some(66), "{ctx}");
        let warning = format!("dsm: warning: --pinpoint {target} watched nothing: {says}");
        if says.is_empty() {
            assert!(!run.stderr.contains("watched nothing"), "{ctx}");
        } else {
            assert!(run.stderr.contains(&warning), "{ctx}");
        }
    }
}

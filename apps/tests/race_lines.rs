//! Source lines in the run that finds the race: every racy labelled kernel, run once with
//! `--race` (no replay, no pinpoint), must name for both sides of every race the lines
//! marked `// RACE` in the kernel's function (found by grep in `apps/src/kernels.rs`), in
//! the printed report, the race log and the SARIF file (`locations` for one side,
//! `relatedLocations` for the other, each with its function), over each transport.

mod common;

use apps::kernels::{self, Expect};
use common::race_lines;
use serde_json::Value;
use std::collections::BTreeSet;

const KERNEL: &str = env!("CARGO_BIN_EXE_race-kernel");
const SOURCE: &str = "src/kernels.rs";

/// The source lines of a race log's races, both sides; panics where a side has none.
fn logged_lines(log: &str, ctx: &str) -> BTreeSet<u32> {
    let mut lines = BTreeSet::new();
    for l in log.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        for side in ["first", "second"] {
            let locs = v[side]["locations"]
                .as_array()
                .unwrap_or_else(|| panic!("{side} side has no location: {l}\n{ctx}"));
            assert_eq!(locs.len(), 1, "{l}\n{ctx}");
            let loc = &locs[0];
            assert!(
                loc["file"]
                    .as_str()
                    .is_some_and(|f| f.ends_with("apps/src/kernels.rs")),
                "{loc}\n{ctx}"
            );
            assert!(
                loc["column"].as_u64().is_some_and(|c| c > 0),
                "{loc}\n{ctx}"
            );

            lines.insert(loc["line"].as_u64().unwrap() as u32);
        }
    }
    lines
}

/// The SARIF results' lines: each result's own location and its related ones.
fn sarif_lines(doc: &Value, ctx: &str) -> BTreeSet<u32> {
    let mut lines = BTreeSet::new();
    for r in doc["runs"][0]["results"].as_array().unwrap() {
        let primary = &r["locations"][0];
        assert!(
            primary["logicalLocations"][0]["kind"] == "variable",
            "{r}\n{ctx}"
        );
        let related = r["relatedLocations"].as_array().unwrap();
        assert!(!related.is_empty(), "the other side is missing: {r}\n{ctx}");
        for loc in std::iter::once(primary).chain(related) {
            // The function, named at the end from the program's debug information.
            let function = loc["logicalLocations"]
                .as_array()
                .and_then(|l| l.iter().find(|l| l["kind"] == "function"))
                .and_then(|l| l["fullyQualifiedName"].as_str());
            assert!(
                function.is_some_and(|f| f.starts_with("apps::kernels::")),
                "{loc}\n{ctx}"
            );
            let region = &loc["physicalLocation"]["region"];
            let line = region["startLine"]
                .as_u64()
                .unwrap_or_else(|| panic!("no line: {r}\n{ctx}"));
            lines.insert(line as u32);
        }
    }
    lines
}

fn check_first_run_lines(nodes: usize, transport: &str) {
    let source = std::fs::read_to_string(SOURCE).expect("run from the apps crate");
    let mut checked = 0;
    for k in kernels::all() {
        let n = k.min_nodes.max(nodes);
        if !matches!((k.expect)(n), Expect::Races(_)) {
            continue;
        }
        let want = race_lines(&source, k.name);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("races.jsonl");
        let sarif = dir.path().join("races.sarif");
        let mut cmd = dsm_testkit::dsmrun_command(
            n,
            &[
                "--timeout",
                "60",
                "--race-log",
                log.to_str().unwrap(),
                "--race-sarif",
                sarif.to_str().unwrap(),
            ],
            KERNEL,
            &["run", k.name],
        );
        cmd.env("DSM_TRANSPORT", transport);
        let run = dsm_testkit::run(cmd);
        let ctx = format!(
            "kernel {} on {n} nodes over {transport}\n{}",
            k.name,
            run.all_output()
        );
        assert_eq!(run.code, Some(66), "{ctx}");
        let logged = logged_lines(&std::fs::read_to_string(&log).unwrap(), &ctx);
        assert_eq!(logged, want, "logged lines vs // RACE lines\n{ctx}");
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
        common::assert_valid_sarif(&doc);
        let in_sarif = sarif_lines(&doc, &ctx);
        assert!(
            !in_sarif.is_empty() && in_sarif.is_subset(&want),
            "SARIF lines {in_sarif:?} vs {want:?}\n{ctx}"
        );
        // The printed report shows both sides' lines and their code.
        for line in &want {
            assert!(
                run.stderr.contains(&format!("apps/src/kernels.rs:{line}:")),
                "line {line} not printed\n{ctx}"
            );
        }
        assert!(run.stderr.contains("// RACE"), "{ctx}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} racy kernels");
}

// One transport each: the default (one common segment on this host), the page protocol
// over shared-memory rings and over TCP, where the bitmaps and their sites travel.

#[test]
fn every_racy_kernel_names_its_race_lines_in_the_first_run_on_2_nodes_in_one_segment() {
    check_first_run_lines(2, "auto");
}

#[test]
fn every_racy_kernel_names_its_race_lines_in_the_first_run_on_4_nodes_over_rings() {
    check_first_run_lines(4, "rings");
}

#[test]
fn every_racy_kernel_names_its_race_lines_in_the_first_run_on_8_nodes_over_tcp() {
    check_first_run_lines(8, "tcp");
}

//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// `intervals K` of every `dsm-race-stats` line, in order (per barrier).
pub(crate) fn intervals_per_barrier(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains("dsm-race-stats: barrier") || l.contains("dsm-race-stats: finish"))
        .map(|l| {
            let at = l.find("intervals ").expect("stats line names intervals");
            let rest = &l[at..];
            rest[..rest.find(',').unwrap_or(rest.len())].to_string()
        })
        .collect()
}

/// Records `program args` at N = 4 with race detection and replays it `replays` times.
/// A replay that completes must report the same races (byte-identical log) and close the
/// same number of intervals per barrier. With `racy_course`, the program's course
/// depends on racy reads, which a replay does not fix: a replay may then stop with 67
/// saying so (the caller decides what it needs of the completed ones). Returns the
/// recorded run and the completed replays.
pub(crate) fn record_and_replay(
    program: &str,
    args: &[&str],
    replays: usize,
    racy_course: bool,
) -> (dsm_testkit::Run, Vec<dsm_testkit::Run>) {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.dsmrec");
    let log0 = dir.path().join("races0.jsonl");
    let flags = |log: &Path, mode: &str, file: &Path| -> Vec<String> {
        vec![
            "--timeout".into(),
            "120".into(),
            "--race-stats".into(),
            "--race-exit-code".into(),
            "0".into(),
            "--race-log".into(),
            s(log).into(),
            mode.into(),
            s(file).into(),
        ]
    };
    let f = flags(&log0, "--record", &rec);
    let f: Vec<&str> = f.iter().map(String::as_str).collect();
    let recorded = dsm_testkit::dsmrun(4, &f, program, args);
    assert_eq!(recorded.code, Some(0), "{}", recorded.all_output());
    let want_log = std::fs::read(&log0).unwrap();
    assert!(!want_log.is_empty(), "{}", recorded.all_output());
    let want_intervals = intervals_per_barrier(&recorded.stderr);
    assert!(!want_intervals.is_empty(), "{}", recorded.stderr);
    let mut completed = Vec::new();
    for i in 0..replays {
        let log = dir.path().join(format!("races{i}.jsonl"));
        let f = flags(&log, "--replay", &rec);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        let run = dsm_testkit::dsmrun(4, &f, program, args);
        let ctx = run.all_output();
        if racy_course && run.code == Some(67) {
            assert!(
                ctx.contains("dsm: replay diverged on rank")
                    && ctx.contains("dsmrun: replay diverged from the record"),
                "replay {i}\n{ctx}"
            );
            eprintln!("replay {i} diverged (racy reads), as it may: {ctx}");
            continue;
        }
        assert_eq!(run.code, Some(0), "replay {i}\n{ctx}");
        assert!(
            std::fs::read(&log).unwrap() == want_log,
            "replay {i}: other races than the recorded run\n{ctx}"
        );
        assert_eq!(
            intervals_per_barrier(&run.stderr),
            want_intervals,
            "replay {i}: intervals per barrier\n{ctx}"
        );
        completed.push(run);
    }
    (recorded, completed)
}

/// The lines (1-based) marked `// RACE` in the function that runs kernel `name`, read
/// from its `run:` entry in `KERNELS`.
pub(crate) fn race_lines(source: &str, name: &str) -> BTreeSet<u32> {
    let lines: Vec<&str> = source.lines().collect();
    let entry = lines
        .iter()
        .position(|l| l.trim() == format!("name: \"{name}\","))
        .unwrap_or_else(|| panic!("no entry for {name}"));
    let run = lines[entry..]
        .iter()
        .find_map(|l| l.trim().strip_prefix("run: "))
        .expect("every entry has a run function");
    let run = run.trim_start_matches("|d| ");
    let function: String = run
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("fn {function}(")))
        .unwrap_or_else(|| panic!("no fn {function}"));
    let end = start
        + lines[start..]
            .iter()
            .position(|l| *l == "}")
            .expect("functions end");
    (start..end)
        .filter(|&i| lines[i].trim_end().ends_with("// RACE"))
        .map(|i| i as u32 + 1)
        .collect()
}

/// The SARIF 2.1.0 JSON schema, as OASIS publishes it (`data/sarif-schema-2.1.0.json`, from
/// the SARIF specification's repository, `sarif-2.1/schema/`).
const SARIF_SCHEMA: &str = include_str!("../data/sarif-schema-2.1.0.json");

/// Panics, listing what is wrong, unless `log` is a valid SARIF 2.1.0 log.
pub(crate) fn assert_valid_sarif(log: &serde_json::Value) {
    let schema: serde_json::Value =
        serde_json::from_str(SARIF_SCHEMA).expect("the SARIF schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("the SARIF schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(log)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "not valid SARIF 2.1.0:\n{}\n{log:#}",
        errors.join("\n")
    );
}

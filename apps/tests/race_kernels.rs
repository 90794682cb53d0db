//! Every labelled kernel under `dsmrun --race` at N = 2, 3 and 4 (and 8 for some), in each
//! transport a job on one host can use: the ranks' one common segment (the default), each
//! rank its own copy over shared-memory rings, and over TCP. Race-yes kernels must report
//! exactly the expected variables and element indices (no false negatives, no extra
//! reports), race-no kernels must report nothing.

use apps::kernels::{self, Expect};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

const KERNEL: &str = env!("CARGO_BIN_EXE_race-kernel");

/// Kernels also run at N = 8.
const AT_EIGHT: &[&str] = &[
    "missing-barrier",
    "boundary-read",
    "false-sharing",
    "byte-neighbours",
    "third-node-lock",
    "tsp-bound",
    "lock-barrier",
    "sem-ring",
    "sem-bounded-buffer",
    "sem-as-lock",
    "sem-handoff-write-after-signal",
    "sem-handoff-write-before-signal",
    "sem-pairing-dependent",
    "sem-pairing-hidden",
];

/// `DSM_TRANSPORT` of each way a one-host job can run: `auto` maps one common segment.
const TRANSPORTS: [&str; 3] = ["auto", "rings", "tcp"];

/// Runs every kernel that fits `n` nodes in every transport.
fn check_all(n: usize, only: impl Fn(&str) -> bool) {
    for transport in TRANSPORTS {
        for k in kernels::all()
            .iter()
            .filter(|k| k.min_nodes <= n && only(k.name))
        {
            check_mode(k.name, n, &(k.expect)(n), "--race", transport);
        }
    }
}

/// Kernel `name` at `n` nodes under `race_flag` (`--race`, or `--race=schedule`, where
/// lock-order dependences may come on top but the data races must be the same), with
/// `DSM_TRANSPORT=transport`.
fn check_mode(name: &str, n: usize, expect: &Expect, race_flag: &str, transport: &str) {
    let schedule = race_flag == "--race=schedule";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("races.jsonl");
    let log_arg = log.to_str().expect("temporary paths are UTF-8");
    let mut cmd = dsm_testkit::dsmrun_command(
        n,
        &["--timeout", "60", race_flag, "--race-log", log_arg],
        KERNEL,
        &["run", name],
    );
    cmd.env("DSM_TRANSPORT", transport);
    let out = dsm_testkit::run(cmd).into_output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ctx =
        format!("kernel {name} at N={n} over {transport}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains(&format!("kernel {name} done")), "{ctx}");
    let mut found: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for line in std::fs::read_to_string(&log).unwrap_or_default().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_matches_documented_fields(&v, &ctx);
        if v["class"] == "lock-order" {
            assert!(
                schedule,
                "lock-order dependence outside schedule mode\n{ctx}"
            );
            continue;
        }
        assert_eq!(v["class"], "data-race", "{ctx}");
        found
            .entry(v["variable"].as_str().unwrap().to_string())
            .or_default()
            .insert(v["index"].as_u64().unwrap() as usize);
    }
    match expect {
        Expect::NoRace => {
            assert_eq!(out.status.code(), Some(0), "{ctx}");
            assert!(found.is_empty(), "false positives {found:?}\n{ctx}");
            assert!(stderr.contains("dsm: 0 data races"), "{ctx}");
            assert!(!stderr.contains("DATA RACE"), "{ctx}");
        }
        Expect::Races(want) => {
            assert_eq!(out.status.code(), Some(66), "{ctx}");
            let want_vars: BTreeSet<&str> = want.iter().map(|w| w.0).collect();
            let got_vars: BTreeSet<&str> = found.keys().map(String::as_str).collect();
            assert_eq!(got_vars, want_vars, "variables\n{ctx}");
            for (var, indices) in want {
                if let Some(indices) = indices {
                    assert_eq!(&found[*var], indices, "indices of {var}\n{ctx}");
                }
            }
            assert!(stderr.contains("DATA RACE"), "{ctx}");
        }
    }
}

/// The race log's fields as the README's table documents them: `(name, type)` where the
/// type column is as written there.
fn documented_log_fields() -> Vec<(String, String)> {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("### The race log")
        .nth(1)
        .expect("README has a race log section");
    let mut fields = Vec::new();
    for row in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !row.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[1].starts_with('`') {
            continue;
        }
        for name in cells[1].split(',') {
            fields.push((
                name.trim().trim_matches('`').to_string(),
                cells[2].to_string(),
            ));
        }
    }
    assert!(
        fields.len() >= 10,
        "README race log table not found: {fields:?}"
    );
    fields
}

/// Every key of a log line is documented, every documented field is present, and each
/// value has the documented type.
fn assert_matches_documented_fields(v: &Value, ctx: &str) {
    let obj = v.as_object().expect("log lines are objects");
    let fields = documented_log_fields();
    let documented: BTreeSet<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    let present: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
    assert_eq!(present, documented, "race log fields vs README\n{v}\n{ctx}");
    for (name, ty) in &fields {
        let value = &obj[name.as_str()];
        let ok = match ty.as_str() {
            "integer" => value.is_u64(),
            "string" => value.is_string(),
            "string or null" => value.is_string() || value.is_null(),
            "integer or null" => value.is_u64() || value.is_null(),
            "[integer, integer]" => value
                .as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(Value::is_u64)),
            "[string]" => value
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_string)),
            "object" => value.as_object().is_some_and(|side| {
                side.len() == 4 + usize::from(side.contains_key("locations"))
                    && side.get("locations").is_none_or(|l| {
                        l.as_array().is_some_and(|l| {
                            l.iter().all(|l| {
                                l["file"].is_string()
                                    && l["line"].is_u64()
                                    && l["column"].is_u64()
                                    && (l["function"].is_string() || l["function"].is_null())
                            })
                        })
                    })
                    && side["rank"].is_u64()
                    && side["interval"].is_u64()
                    && matches!(side["access"].as_str(), Some("read" | "write"))
                    && side["sync"].is_string()
            }),
            other => panic!("README documents an unknown type {other:?} for {name}"),
        };
        assert!(ok, "field {name} is not {ty}: {v}\n{ctx}");
    }
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = dsm_testkit::command("dsmrun");
    cmd.args(args);
    let out = dsm_testkit::run(cmd).into_output();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sor_with_race_detection_reports_nothing() {
    let (code, stdout, stderr) = run(&[
        "-n",
        "4",
        "--timeout",
        "60",
        "--race",
        env!("CARGO_BIN_EXE_sor"),
        "--size",
        "128",
        "--iters",
        "10",
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("[0] verified:"), "{stdout}");
    assert!(
        stderr.contains("dsm: 0 data races on 0 variables"),
        "{stderr}"
    );
    assert!(!stderr.contains("DATA RACE"), "{stderr}");
}

#[test]
fn race_first_reports_only_the_first_epoch() {
    let (code, _, all) = run(&["-n", "2", "--race", KERNEL, "run", "two-epochs"]);
    assert_eq!(code, Some(66));
    assert!(
        all.contains("on first[0]") && all.contains("on second[1]"),
        "{all}"
    );
    let (code, _, first) = run(&["-n", "2", "--race-first", KERNEL, "run", "two-epochs"]);
    assert_eq!(code, Some(66));
    assert!(first.contains("on first[0]"), "{first}");
    assert!(!first.contains("on second"), "{first}");
    assert!(first.contains("(first races only)"), "{first}");
}

#[test]
fn race_exit_code_zero_still_reports() {
    let (code, _, stderr) = run(&[
        "-n",
        "2",
        "--race-exit-code",
        "0",
        KERNEL,
        "run",
        "write-write",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("DATA RACE (write-write) on cell[9]"),
        "{stderr}"
    );
    assert!(
        stderr.contains("dsm: 1 data race on 1 variable"),
        "{stderr}"
    );
}

#[test]
fn race_stats_print_the_paper_columns() {
    let (code, _, stderr) = run(&["-n", "3", "--race-stats", KERNEL, "run", "boundary-read"]);
    assert_eq!(code, Some(66), "{stderr}");
    for needle in [
        "(epoch 1): intervals",
        "interval pairs",
        "concurrent",
        "overlapping",
        "bitmaps",
        "notice bytes",
        "interval comparison",
        "bitmap round",
        "dsm-race-stats: run:",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in {stderr}");
    }
}

#[test]
fn without_race_flag_nothing_is_recorded() {
    let (code, _, stderr) = run(&["-n", "2", KERNEL, "run", "write-write"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !stderr.contains("DATA RACE") && !stderr.contains("data race"),
        "{stderr}"
    );
}

#[test]
fn at_least_twenty_kernels_of_both_kinds() {
    let all = kernels::all();
    assert!(all.len() >= 20);
    let racy = all
        .iter()
        .filter(|k| matches!((k.expect)(4), Expect::Races(_)))
        .count();
    assert!(
        racy >= 8 && all.len() - racy >= 8,
        "{racy} racy of {}",
        all.len()
    );
}

/// Schedule mode keeps every kernel's data-race answer (lock-order dependences may be
/// reported on top: the kernels' locks are real orderings there).
#[test]
fn schedule_mode_keeps_the_data_race_answers_at_two_nodes() {
    for transport in ["auto", "rings"] {
        for k in kernels::all().iter().filter(|k| k.min_nodes <= 2) {
            check_mode(k.name, 2, &(k.expect)(2), "--race=schedule", transport);
        }
    }
}

#[test]
fn kernels_at_two_nodes() {
    check_all(2, |_| true);
}

#[test]
fn kernels_at_three_nodes() {
    check_all(3, |_| true);
}

#[test]
fn kernels_at_four_nodes() {
    check_all(4, |_| true);
}

#[test]
fn some_kernels_at_eight_nodes() {
    for k in kernels::all().iter().filter(|k| AT_EIGHT.contains(&k.name)) {
        check_mode(k.name, 8, &(k.expect)(8), "--race", "auto");
    }
}

//! `dsm-ahb` on trace files: a small trace's orderings, brute force agreeing, and clear
//! errors (exit 2) on corrupt or inconsistent files.

use std::process::Command;

const AHB: &str = env!("CARGO_BIN_EXE_dsm-ahb");

const TRACE: &str = r#"{"format":"dsm-semtrace","version":1,"nodes":3,"rank":null}
{"sem":{"name":"a","initial":0}}
{"op":{"node":0,"kind":"signal","sem":"a","seq":0,"signal":null,"vt":[]}}
{"op":{"node":1,"kind":"signal","sem":"a","seq":0,"signal":null,"vt":[]}}
{"op":{"node":2,"kind":"wait","sem":"a","seq":null,"signal":[0,0],"vt":[]}}
{"op":{"node":2,"kind":"wait","sem":"a","seq":null,"signal":[1,0],"vt":[]}}
"#;

fn run(contents: &str, args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.semtrace");
    std::fs::write(&p, contents).unwrap();
    let out = Command::new(AHB).args(args).arg(&p).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn second_wait_follows_both_signals_in_every_execution() {
    let (code, out, err) = run(TRACE, &["--depth", "1", "--brute-force"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0:1 signal a -> 2:2 wait a"), "{out}");
    assert!(out.contains("1:1 signal a -> 2:2 wait a"), "{out}");
    assert!(!out.contains("-> 2:1 wait a"), "{out}");
    assert!(out.contains("finds every one of them"), "{out}");
}

#[test]
fn corrupt_and_inconsistent_traces_are_clear_errors() {
    let cases = [
        ("", "empty file"),
        ("garbage\n", "not a dsm semaphore trace header"),
        (
            "{\"format\":\"dsm-semtrace\",\"version\":9,\"nodes\":1,\"rank\":null}\n",
            "version 9",
        ),
        (
            &TRACE.replace("\"signal\":[1,0]", "\"signal\":[0,0]"),
            "consumed twice",
        ),
        (
            &TRACE.replace("\"sem\":\"a\",\"seq\":0", "\"sem\":\"b\",\"seq\":0"),
            "never declared",
        ),
        (&TRACE[..TRACE.len() - 20], "line 6"),
        // A node count no job has: refused, not sized for.
        (
            "{\"format\":\"dsm-semtrace\",\"version\":2,\"nodes\":4294967296,\"rank\":null}\n",
            "4294967296 nodes",
        ),
    ];
    for (text, want) in cases {
        let (code, _, err) = run(text, &[]);
        assert_eq!(code, 2, "{want}: {err}");
        assert!(err.contains(want), "wanted '{want}' in: {err}");
    }
}

fn table1(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(AHB)
        .arg("--table1")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The four percentages (depths 0-3) of the row starting with `name`.
fn row(out: &str, name: &str) -> Vec<f64> {
    row_of(out, name, 4)
}

/// The `cells` percentages of the row starting with `name`.
fn row_of(out: &str, name: &str, cells: usize) -> Vec<f64> {
    let line = out
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{out}"));
    let v: Vec<f64> = line[name.len()..]
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(v.len(), cells, "{line}");
    v
}

#[test]
fn table1_prints_the_paper_beside_a_sound_measurement() {
    let (code, out, err) = table1(&["--events", "30", "--traces", "50", "--seed", "3"]);
    assert_eq!(code, 0, "{err}{out}");
    assert!(out.contains("30 operations, 50 traces (seed 3"), "{out}");
    assert_eq!(
        row(&out, "paper (5726 traces)"),
        vec![54.0, 3.0, 0.26, 0.05]
    );
    let ours = row(&out, "dsm-ahb");
    assert!(ours.iter().all(|p| (0.0..=100.0).contains(p)), "{out}");
    // Deeper never finds less; the rewind alone misses on many random traces.
    assert!(ours.windows(2).all(|w| w[1] <= w[0]), "{out}");
    assert!(ours[0] > ours[3], "{out}");
    row(&out, "Algorithm 2 as printed");
    assert!(out.contains("unsound: dsm-ahb 0 traces"), "{out}");
    assert!(out.contains("time per trace (us): depth 0 "), "{out}");
    assert!(
        out.contains("depth 3 misses, depth 8 finds all orderings of"),
        "{out}"
    );
}

#[test]
fn table1_without_paper_figures_and_misuse() {
    let (code, out, err) = table1(&["--events", "12", "--traces", "20"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no figures for 12 operations"), "{out}");
    row(&out, "dsm-ahb");
    let (code, _, err) = table1(&["some.semtrace"]);
    assert_eq!(code, 2, "{err}");
    let out = Command::new(AHB).args(["--events", "30"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    // Sizes that make no traces (or traces of one node) measure nothing.
    for bad in [["--traces", "0"], ["--max-tasks", "1"], ["--events", "0"]] {
        let (code, _, err) = table1(&bad);
        assert_eq!(code, 2, "{bad:?}: {err}");
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
    }
}

#[test]
fn table1_measures_the_depths_up_to_depth() {
    let (code, out, err) = table1(&["--events", "20", "--traces", "30", "--depth", "1"]);
    assert_eq!(code, 0, "{err}{out}");
    let head = out.lines().find(|l| l.contains("original")).unwrap();
    assert!(
        head.contains("depth 1") && !head.contains("depth 2"),
        "{out}"
    );
    let ours = row_of(&out, "dsm-ahb", 2);
    assert!(ours[1] <= ours[0], "{out}");
    row_of(&out, "Algorithm 2 as printed", 2);
    assert!(out.contains("depth 1 misses, depth 8 finds"), "{out}");
    // Beyond the paper's columns its row says nothing.
    let (code, out, err) = table1(&["--events", "30", "--traces", "5", "--depth", "4"]);
    assert_eq!(code, 0, "{err}{out}");
    let paper = out.lines().find(|l| l.starts_with("paper")).unwrap();
    assert!(paper.trim_end().ends_with('-'), "{out}");
    assert_eq!(row_of(&out, "dsm-ahb", 5).len(), 5);
}

/// Two nodes, three epochs: node 0 signals `a` three times, node 1 waits twice; a barrier;
/// node 1 takes the leftover token and signals `b` twice, node 0 waits on `b` twice; a
/// barrier; node 0 signals `a` once more.
const EPOCHS: &str = r#"{"format":"dsm-semtrace","version":2,"nodes":2,"rank":null}
{"sem":{"name":"a","initial":0}}
{"sem":{"name":"b","initial":0}}
{"op":{"node":0,"kind":"signal","sem":"a","seq":0,"signal":null,"vt":[]}}
{"op":{"node":0,"kind":"signal","sem":"a","seq":1,"signal":null,"vt":[]}}
{"op":{"node":0,"kind":"signal","sem":"a","seq":2,"signal":null,"vt":[]}}
{"barrier":{"node":0,"number":1}}
{"op":{"node":0,"kind":"wait","sem":"b","seq":null,"signal":[1,0],"vt":[]}}
{"op":{"node":0,"kind":"wait","sem":"b","seq":null,"signal":[1,1],"vt":[]}}
{"barrier":{"node":0,"number":2}}
{"op":{"node":0,"kind":"signal","sem":"a","seq":3,"signal":null,"vt":[]}}
{"op":{"node":1,"kind":"wait","sem":"a","seq":null,"signal":[0,0],"vt":[]}}
{"op":{"node":1,"kind":"wait","sem":"a","seq":null,"signal":[0,1],"vt":[]}}
{"barrier":{"node":1,"number":1}}
{"op":{"node":1,"kind":"wait","sem":"a","seq":null,"signal":[0,2],"vt":[]}}
{"op":{"node":1,"kind":"signal","sem":"b","seq":0,"signal":null,"vt":[]}}
{"op":{"node":1,"kind":"signal","sem":"b","seq":1,"signal":null,"vt":[]}}
{"barrier":{"node":1,"number":2}}
"#;

#[test]
fn a_trace_with_barriers_is_analysed_epoch_by_epoch() {
    let (code, out, err) = run(EPOCHS, &["--brute-force"]);
    assert_eq!(code, 0, "{err}");
    let at = |s: &str| out.find(s).unwrap_or_else(|| panic!("no '{s}' in:\n{out}"));
    let e1 = at("# epoch 1: from the start to barrier 1, operations node 0 1-3, node 1 1-2");
    let e2 = at("# epoch 2: from barrier 1 to barrier 2, operations node 0 4-5, node 1 3-5");
    let e3 = at("# epoch 3: from barrier 2 to the end, operations node 0 6-6, node 1 none");
    assert!(e1 < e2 && e2 < e3, "{out}");
    // Epoch 1: node 1's second wait needs two of node 0's signals.
    let first = at("0:1 signal a -> 1:1 wait a");
    let second = at("0:2 signal a -> 1:2 wait a");
    assert!(e1 < first && second < e2, "{out}");
    // Epoch 2: the leftover token orders nothing (node 1's third wait follows no signal
    // of this epoch), and node 0's second wait on b needs both of node 1's signals.
    let b = at("1:5 signal b -> 0:5 wait b");
    assert!(e2 < b && b < e3, "{out}");
    assert!(!out.contains("-> 1:3 wait a"), "{out}");
    assert_eq!(out.matches("finds every one of them").count(), 3, "{out}");
    // Bounded analysis, same per-epoch structure.
    let (code, bounded, err) = run(EPOCHS, &["--depth", "1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        bounded.matches("# always happens before (depth 1)").count(),
        3
    );
    assert!(bounded.contains("1:5 signal b -> 0:5 wait b"), "{bounded}");
}

#[test]
fn malformed_barriers_are_clear_errors() {
    let cases = [
        (
            EPOCHS.replace("{\"node\":1,\"number\":2}", "{\"node\":1,\"number\":3}"),
            "line 18: barrier 3 of node 1, expected barrier 2",
        ),
        (
            EPOCHS.replace("{\"barrier\":{\"node\":1,\"number\":2}}\n", ""),
            "node 0 passed 2 barriers and node 1 1",
        ),
        (
            EPOCHS.replace("\"version\":2", "\"version\":1"),
            "line 7: a barrier record in a version 1 trace",
        ),
        (
            EPOCHS.replace("{\"node\":1,\"number\":1}", "{\"node\":5,\"number\":1}"),
            "node 5 in a 2-node trace",
        ),
        (
            EPOCHS.replace("{\"node\":1,\"number\":1}", "{\"node\":1}"),
            "line 14: missing field `number`",
        ),
    ];
    for (text, want) in &cases {
        let (code, _, err) = run(text, &[]);
        assert_eq!(code, 2, "{want}: {err}");
        assert!(err.contains(want), "wanted '{want}' in: {err}");
    }
}

#[test]
fn a_wait_paired_with_a_signal_after_its_barrier_is_an_error() {
    // Node 0's last signal (after its second barrier) claimed by node 1's first-epoch wait.
    let text = EPOCHS
        .replace("\"signal\":[0,1]", "\"signal\":[0,3]")
        .replace(
            "{\"op\":{\"node\":1,\"kind\":\"wait\",\"sem\":\"a\",\"seq\":null,\"signal\":[0,2]",
            "{\"op\":{\"node\":1,\"kind\":\"wait\",\"sem\":\"a\",\"seq\":null,\"signal\":[0,1]",
        );
    let (code, _, err) = run(&text, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("line 13: wait before barrier 1 paired with signal 3 of node 0 on 'a', which is after it"),
        "{err}"
    );
}

#[test]
fn a_directory_is_refused_in_one_line_that_says_why_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(AHB).arg(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("Is a directory").count(), 1, "{stderr}");
}

/// A version 3 trace: [`TRACE`]'s records and the end record that counts them.
fn trace_v3() -> String {
    TRACE.replace("\"version\":1", "\"version\":3") + "{\"end\":{\"records\":5}}\n"
}

#[test]
fn a_merged_trace_cut_at_a_line_boundary_is_refused() {
    let whole = trace_v3();
    let (code, out, err) = run(&whole, &["--depth", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1:1 signal a -> 2:2 wait a"), "{out}");
    // Without its last line (the end record), and without the last record too: both end
    // at a line boundary and are otherwise well formed.
    let without_end = whole.trim_end().rsplit_once('\n').unwrap().0.to_string() + "\n";
    let shorter = without_end
        .trim_end()
        .rsplit_once('\n')
        .unwrap()
        .0
        .to_string()
        + "\n";
    for cut in [&without_end, &shorter] {
        let (code, _, err) = run(cut, &[]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("without its end record: the file was cut short"),
            "{err}"
        );
    }
    let cases = [
        (
            whole.replace("\"records\":5", "\"records\":4"),
            "counts 4 records, the file has 5",
        ),
        (
            whole.clone() + TRACE.lines().nth(2).unwrap(),
            "a record after the end record",
        ),
        (
            TRACE.replace("\"version\":1", "\"version\":2") + "{\"end\":{\"records\":5}}\n",
            "an end record in a part file or before version 3",
        ),
    ];
    for (text, want) in cases {
        let (code, _, err) = run(&text, &[]);
        assert_eq!(code, 2, "{want}: {err}");
        assert!(err.contains(want), "wanted '{want}' in: {err}");
    }
}

//! End-to-end tests of the `tsp` app: real processes under `dsmrun`. The same optimal
//! length at every node count, every input format solved (optima checked by brute force
//! here and by an independent computation when the data was made), malformed inputs
//! rejected with the line at fault and without a panic, and the race-detection
//! expectations: unlocked bound reads race on `bound` and nothing else, `--locked-bound`
//! is race-free.

use apps::tsp::{heldkarp, input};
use dsm_testkit as common;
use std::path::PathBuf;

use dsm_testkit::{run, Run};
use std::process::Command;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tsp")
        .join(name)
}

/// `tsp ARGS` on `nodes` nodes under dsmrun (with a timeout so nothing can hang).
fn tsp_on(nodes: usize, race: bool, args: &[&str]) -> Run {
    let flags: &[&str] = if race {
        &["--timeout", "120", "--race"]
    } else {
        &["--timeout", "120"]
    };
    common::dsmrun(nodes, flags, env!("CARGO_BIN_EXE_tsp"), args)
}

/// `tsp ARGS` started directly (a one-node job).
fn tsp_alone(args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tsp"));
    cmd.args(args);
    run(cmd)
}

/// The optimal length of the `verified:` line (which must be there).
fn verified_length(r: &Run) -> i64 {
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("verified: tsp "))
        .unwrap_or_else(|| panic!("no verified line: {r:?}"));
    assert!(line.contains("(Held-Karp agrees)"), "{line}");
    let rest = &line[line.find("optimal length ").expect("length") + "optimal length ".len()..];
    rest.split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no length in {line}"))
}

#[test]
fn same_optimum_at_every_node_count() {
    let want = heldkarp::held_karp(&input::random(12, 7, false));
    for nodes in [1, 2, 4, 8] {
        let r = tsp_on(nodes, false, &["--random", "12", "--seed", "7"]);
        assert_eq!(r.code, Some(0), "{nodes} nodes: {r:?}");
        assert_eq!(verified_length(&r), want, "{nodes} nodes: {r:?}");
        assert!(r.stdout.contains(&apps::nodes(nodes)), "{r:?}");
    }
}

#[test]
fn asymmetric_locked_and_tiny_pool_variants() {
    let asym = heldkarp::held_karp(&input::random(11, 9, true));
    let r = tsp_on(3, false, &["--random", "11", "--seed", "9", "--asymmetric"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(verified_length(&r), asym);
    let r = tsp_on(
        2,
        false,
        &[
            "--random",
            "11",
            "--seed",
            "9",
            "--asymmetric",
            "--locked-bound",
        ],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(verified_length(&r), asym);
    // A pool of 3 tours overflows at once: nodes solve what does not fit themselves.
    let sym = heldkarp::held_karp(&input::random(12, 4, false));
    let r = tsp_on(
        4,
        false,
        &[
            "--random",
            "12",
            "--seed",
            "4",
            "--pool",
            "3",
            "--depth-first",
            "6",
        ],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(verified_length(&r), sym);
    assert!(
        !r.stdout.contains("(0 of them because the pool was full)"),
        "pool never overflowed: {r:?}"
    );
    // Everything through the queue (no depth-first subproblems above 0 cities left).
    let r = tsp_on(
        2,
        false,
        &["--random", "8", "--seed", "4", "--depth-first", "0"],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(
        verified_length(&r),
        heldkarp::held_karp(&input::random(8, 4, false))
    );
    // The smallest instances.
    for n in ["1", "2", "3"] {
        let r = tsp_alone(&["--random", n]);
        assert_eq!(r.code, Some(0), "{n} cities: {r:?}");
    }
}

/// Every format, with the optimum computed when the data was made (by a separate
/// brute-force program) and again here by brute force through the library's reader.
#[test]
fn every_input_format_is_solved() {
    let cases = [
        ("matrix_6.txt", 76),
        ("euc2d_8.tsp", 217),
        ("geo_8.tsp", 5484),
        ("att_7.tsp", 3582),
        ("full_matrix_7.atsp", 164),
        ("lower_diag_row_8.tsp", 255),
        ("upper_row_7.tsp", 178),
        ("upper_diag_row_8.tsp", 199),
    ];
    for (k, (name, want)) in cases.into_iter().enumerate() {
        let path = data(name);
        let inst = input::load(&path, input::Format::Auto).expect("test data parses");
        assert_eq!(heldkarp::brute_force(&inst), want, "{name}");
        let p = path.to_str().unwrap();
        let flag = if name.ends_with(".txt") || k % 2 == 0 {
            "--file"
        } else {
            "--tsplib"
        };
        let r = if k % 3 == 0 {
            tsp_on(2, false, &[flag, p])
        } else {
            tsp_alone(&[flag, p])
        };
        assert_eq!(r.code, Some(0), "{name}: {r:?}");
        assert_eq!(verified_length(&r), want, "{name}: {r:?}");
    }
}

#[test]
fn malformed_inputs_name_the_line() {
    let cases = [
        (
            "--file",
            "short_row.txt",
            "line 7: expected 6 weights, found 4",
        ),
        (
            "--file",
            "full_matrix_short_row.atsp",
            "line 8: expected 4 weights, found 3",
        ),
        (
            "--tsplib",
            "bad_token.tsp",
            "line 8: coordinate 'x7' is not a number",
        ),
        (
            "--file",
            "missing_weight_section.tsp",
            "line 4: EDGE_WEIGHT_TYPE is EXPLICIT, but the file has no EDGE_WEIGHT_SECTION",
        ),
        (
            "--tsplib",
            "truncated.tsp",
            "line 8: the file ends after 12 of the 21 weights",
        ),
        (
            "--file",
            "unknown_type.tsp",
            "line 4: unknown EDGE_WEIGHT_TYPE 'XRAY1'",
        ),
        (
            "--file",
            "too_many_cities.tsp",
            "line 4: DIMENSION 40 is more than the 32 cities",
        ),
    ];
    for (k, (flag, name, want)) in cases.into_iter().enumerate() {
        let path = data(&format!("bad/{name}"));
        let p = path.to_str().unwrap();
        let r = if k % 2 == 0 {
            tsp_alone(&[flag, p])
        } else {
            tsp_on(2, false, &[flag, p])
        };
        assert!(matches!(r.code, Some(c) if c != 0), "{name}: {r:?}");
        assert!(r.stderr.contains(want), "{name}: want '{want}': {r:?}");
        // One message for the job, not one per rank.
        assert_eq!(r.stderr.matches(want).count(), 1, "{name}: {r:?}");
        assert!(!r.stderr.contains("panicked"), "{name}: {r:?}");
        assert!(!r.stdout.contains("verified"), "{name}: {r:?}");
    }
    // Argument errors too.
    let r = tsp_alone(&["--random", "40"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("1..=32"), "{r:?}");
    let r = tsp_alone(&["--file", "/nonexistent/x.tsp"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("cannot read"), "{r:?}");
}

#[test]
fn unlocked_bound_reads_race_on_bound_only() {
    let r = tsp_on(4, true, &["--random", "12", "--seed", "3"]);
    assert_eq!(r.code, Some(66), "{r:?}");
    assert!(
        r.stderr.contains("DATA RACE (read-write) on bound"),
        "{r:?}"
    );
    for line in r.stderr.lines().filter(|l| l.contains("DATA RACE")) {
        assert!(
            line.contains(" on bound["),
            "a race on something else: {line}\n{r:?}"
        );
    }
    assert!(r.stderr.contains("data races on 1 variable"), "{r:?}");
    // The result is still right: the race only delays pruning.
    assert_eq!(
        verified_length(&r),
        heldkarp::held_karp(&input::random(12, 3, false))
    );
}

#[test]
fn locked_bound_is_race_free() {
    let r = tsp_on(
        4,
        true,
        &["--random", "12", "--seed", "3", "--locked-bound"],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stderr.contains("dsm: 0 data races"), "{r:?}");
    assert!(!r.stderr.contains("DATA RACE"), "{r:?}");
    assert_eq!(
        verified_length(&r),
        heldkarp::held_karp(&input::random(12, 3, false))
    );
}

#[test]
fn help_describes_the_options() {
    let r = tsp_alone(&["--help"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    for opt in [
        "--random",
        "--seed",
        "--file",
        "--tsplib",
        "--depth-first",
        "--pool",
        "--locked-bound",
        "--no-verify",
    ] {
        assert!(r.stdout.contains(opt), "--help lacks {opt}: {r:?}");
    }
}

#[test]
fn non_regular_and_oversized_inputs_are_refused_without_reading_them() {
    let r = tsp_alone(&["--tsplib", "/dev/zero"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("not a regular file"), "{r:?}");
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.tsp");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(apps::tsp::input::MAX_INPUT_BYTES + 1).unwrap();
    let r = tsp_alone(&["--tsplib", big.to_str().unwrap()]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("larger than"), "{r:?}");
}

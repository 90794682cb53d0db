//! End-to-end tests of the `fft` app under `dsmrun`: the 3-D FFT and the 1-D six-step
//! FFT verify at several node counts with bitwise-identical results (same checksums as at
//! one node), race detection finds no races, and bad arguments are clear errors.

use dsm_testkit as common;

use dsm_testkit::{run, Run as Out};
use std::process::Command;

/// `dsmrun [dsmrun_args] -n N fft [args]`.
fn dsmrun(n: usize, dsmrun_args: &[&str], args: &[&str]) -> Out {
    common::dsmrun(n, dsmrun_args, env!("CARGO_BIN_EXE_fft"), args)
}

/// `fft [args]`, alone (a one-node job).
fn fft(args: &[&str]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fft"));
    cmd.args(args);
    run(cmd)
}

/// The `verified:` line of a successful run, and its two checksums (spectrum, round trip).
fn verified(out: &Out, what: &str) -> (String, String) {
    assert_eq!(out.code, Some(0), "{what}: {out:?}");
    let lines: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("verified:"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: one verified line expected: {out:?}"
    );
    let line = lines[0];
    assert!(
        line.starts_with("[0] verified: fft") || line.starts_with("verified: fft"),
        "{what}: {line}"
    );
    assert!(
        line.contains("parallel ") && line.contains("sequential "),
        "{line}"
    );
    // The timed sequential reference is the same computation, not just a close one.
    assert!(
        line.contains("vs sequential (bitwise identical)"),
        "{what}: {line}"
    );
    let after = |key: &str| -> String {
        let rest = &line[line
            .find(key)
            .unwrap_or_else(|| panic!("no '{key}' in {line}"))
            + key.len()..];
        let hex: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
        assert_eq!(hex.len(), 16, "{what}: bad checksum after '{key}': {line}");
        hex
    };
    (after("; checksum "), after("round-trip checksum "))
}

/// Runs `args` at each node count and checks every run verifies with the checksums of
/// the first.
fn same_result_at(nodes: &[usize], args: &[&str]) {
    let mut first: Option<(usize, (String, String))> = None;
    for &n in nodes {
        let out = dsmrun(n, &[], args);
        let sums = verified(&out, &format!("{args:?} at N={n}"));
        match &first {
            None => first = Some((n, sums)),
            Some((n0, sums0)) => assert_eq!(
                &sums, sums0,
                "{args:?}: checksums at N={n} differ from N={n0}: {out:?}"
            ),
        }
    }
}

#[test]
fn three_d_is_bitwise_identical_at_1_2_3_4_8_nodes() {
    // 8 planes: 3 nodes get uneven bands.
    same_result_at(&[1, 2, 3, 4, 8], &["--dims", "16x16x8"]);
}

#[test]
fn three_d_with_unequal_dims_and_more_nodes_than_planes() {
    // 4 planes on 8 nodes: half the nodes have no plane; 6 nodes split 256 lines unevenly.
    same_result_at(&[1, 6, 8], &["--nx", "8", "--ny", "32", "--nz", "4"]);
    same_result_at(&[1, 3], &["--dims", "32x4x16"]);
}

#[test]
fn three_d_default_size_is_the_papers_input() {
    let out = dsmrun(2, &[], &[]);
    verified(&out, "default size");
    assert!(out.stdout.contains("fft 3-D 64x64x16, 2 nodes"), "{out:?}");
}

#[test]
fn one_d_six_step_is_bitwise_identical_at_1_and_4_nodes() {
    same_result_at(&[1, 4], &["--1d", "-m", "10"]);
    let out = fft(&["--1d", "-m", "10"]);
    assert!(out.stdout.contains("32 x 32"), "{out:?}");
}

#[test]
fn one_d_six_step_handles_odd_m() {
    // 2^11 = 32 x 64: non-square transposes; 3 nodes split 32 and 64 rows unevenly.
    same_result_at(&[1, 3], &["--1d", "-m", "11"]);
}

#[test]
fn race_detection_finds_no_races() {
    for args in [&["--dims", "16x16x8"][..], &["--1d", "-m", "10"][..]] {
        let out = dsmrun(4, &["--race"], args);
        verified(&out, &format!("--race {args:?}"));
        assert!(
            out.stderr.contains("dsm: 0 data races"),
            "--race {args:?}: {out:?}"
        );
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    for (args, needle) in [
        (&["--nx", "48"][..], "48 is not a power of two"),
        (&["--nz", "0"][..], "0 is not a power of two"),
        (&["--ny", "-4"][..], "'-4' is not a positive integer"),
        (&["--nx", "1048576"][..], "larger than the maximum"),
        (&["--1d", "-m", "-3"][..], "-3"),
        (&["--dims", "16x12x8"][..], "12 is not a power of two"),
        (&["--dims", "16x16"][..], "NXxNYxNZ"),
        (&["--dims", "16x16x8", "--nx", "8"][..], "--nx"),
        (&["--1d", "-m", "99"][..], "99"),
        (&["-m", "10"][..], "--1d"),
        (&["--1d", "--nx", "16"][..], "--nx"),
        (&["--bogus"][..], "--bogus"),
    ] {
        let out = fft(args);
        assert_ne!(out.code, Some(0), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains(needle),
            "{args:?}: want '{needle}': {out:?}"
        );
        assert!(!out.stdout.contains("verified"), "{args:?}: {out:?}");
        // The same through dsmrun: the job fails.
        let out = dsmrun(2, &[], args);
        assert_ne!(out.code, Some(0), "dsmrun {args:?}: {out:?}");
        assert!(out.stderr.contains(needle), "dsmrun {args:?}: {out:?}");
    }
}

#[test]
fn help_describes_modes_and_defaults() {
    let out = fft(&["--help"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    for needle in [
        "--nx",
        "--ny",
        "--nz",
        "--dims",
        "--1d",
        "-m <M>",
        "[default: 64]",
        "[default: 16]",
        "64x64x16",
        "six-step",
        "verified:",
    ] {
        assert!(
            out.stdout.contains(needle),
            "--help lacks {needle}: {out:?}"
        );
    }
}

/// The transpose gathers its columns of every remote plane with one prefetch of many
/// chunks, packed into requests of up to 32 pages. At N = 4 each plane holds 16 pages of
/// a rank's lines, so rank 1 needs 768 pages in 48 chunks from 3 homes: one request per
/// chunk (48) would be the old way; batched, at most 768 / 32 plus one per home boundary.
#[test]
fn the_transpose_fetches_its_chunks_in_batched_requests() {
    let dir = tempfile::tempdir().expect("temp dir");
    let stats = dir.path().join("stats-%r.json");
    let mut cmd = common::dsmrun_command(
        4,
        &["--timeout", "120"],
        env!("CARGO_BIN_EXE_fft"),
        &["--dims", "128x128x64", "--no-verify"],
    );
    cmd.env(dsm_core::env_vars::STATS_FILE, &stats);
    let out = run(cmd);
    assert_eq!(out.code, Some(0), "{out:?}");
    let rank1 = std::fs::read_to_string(dir.path().join("stats-1.json")).expect("rank 1 stats");
    let v: serde_json::Value = serde_json::from_str(&rank1).expect("stats are JSON");
    let requests = v["protocol"]["fetch_requests"]
        .as_u64()
        .expect("fetch_requests");
    let pages = v["protocol"]["pages_fetched"]
        .as_u64()
        .expect("pages_fetched");
    assert_eq!(
        pages, 768,
        "rank 1 fetches its lines of the other ranks' planes: {v}"
    );
    assert!(
        requests <= 768 / 32 + 3,
        "{requests} fetch requests for {pages} pages: {v}"
    );
}

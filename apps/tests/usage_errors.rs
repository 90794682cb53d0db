//! The apps' own argument checks answer as clap's do: a usage message and exit status 2
//! (status 1 means a wrong result), before any DSM job is joined.

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin).args(args).output().expect("run the app");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn argument_errors_exit_with_status_2_and_say_why() {
    let cases: &[(&str, &[&str], &str)] = &[
        (env!("CARGO_BIN_EXE_sor"), &["--size", "2"], "--size"),
        (
            env!("CARGO_BIN_EXE_sor"),
            &["--iters", "2", "--inject-bug", "9,0,0"],
            "EPOCH must be 2..=5",
        ),
        (
            env!("CARGO_BIN_EXE_tsp"),
            &["--pool", "0"],
            "--pool must be at least 1",
        ),
        (
            env!("CARGO_BIN_EXE_race-kernel"),
            &["run", "no-such-kernel"],
            "no kernel named",
        ),
        (
            env!("CARGO_BIN_EXE_dsm-test"),
            &["falseshare", "--elem", "u16"],
            "possible values: u64, u8",
        ),
        // dsm-bench panicked on no repetitions, and left node counts to dsmrun (exit 1).
        (env!("CARGO_BIN_EXE_dsm-bench"), &["--reps", "0"], "1..="),
        (
            env!("CARGO_BIN_EXE_dsm-bench"),
            &["--barrier-nodes", "2,300"],
            "300 is not in 2..=256",
        ),
    ];
    for &(bin, args, want) in cases {
        let (code, stderr) = run(bin, args);
        assert_eq!(code, Some(2), "{bin} {args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{bin} {args:?}: want '{want}': {stderr}"
        );
        assert!(
            stderr.contains("Usage:") || stderr.contains("--help"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{bin} {args:?}: {stderr}");
    }
}

/// A job too small for a race kernel is a usage error found before the job forms: no rank
/// starts the analysis, so dsmrun does not call it incomplete.
#[test]
fn a_kernel_given_too_few_nodes_is_refused_before_the_job_forms() {
    let run = dsm_testkit::dsmrun(
        2,
        &["--race"],
        env!("CARGO_BIN_EXE_race-kernel"),
        &["run", "third-node-lock"],
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("needs at least 3 nodes, not 2"),
        "{run:?}"
    );
    assert!(!run.stderr.contains("race detection incomplete"), "{run:?}");
}

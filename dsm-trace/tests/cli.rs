//! `dsm-compare` as a user runs it: usage errors and unreadable traces exit 2 with a
//! message. (Also makes `cargo test` build the binary that the apps' trace tests use.)

use std::process::Command;

fn dsm_compare(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dsm-compare"))
        .args(args)
        .output()
        .expect("dsm-compare runs")
}

#[test]
fn missing_files_and_bad_usage_exit_2_with_a_message() {
    let out = dsm_compare(&["/nonexistent/a.dsmtrace", "/nonexistent/b.dsmtrace"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/a.dsmtrace"), "{err}");
    let out = dsm_compare(&[]);
    assert_eq!(out.status.code(), Some(2));
    // A directory opens, but is no trace to read, damaged or not.
    let dir = std::env::temp_dir();
    let out = dsm_compare(&[dir.to_str().unwrap(), "/nonexistent/b.dsmtrace"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("it is a directory"), "{err}");
}

#[test]
fn help_names_the_exit_statuses() {
    let out = dsm_compare(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("68"), "{help}");
}

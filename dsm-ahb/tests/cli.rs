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
    ];
    for (text, want) in cases {
        let (code, _, err) = run(text, &[]);
        assert_eq!(code, 2, "{want}: {err}");
        assert!(err.contains(want), "wanted '{want}' in: {err}");
    }
}

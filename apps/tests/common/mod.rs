//! What the app test files share: running a program (alone or under dsmrun) with a
//! watchdog, and its exit code and output, printed readably when an assertion fails.

#![allow(dead_code)] // each test file uses a different part

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Far above what a passing run needs; only there so a hung job fails the test.
const WATCHDOG: Duration = Duration::from_secs(120);

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion (stdin from /dev/null), killing it after the watchdog.
pub fn run(mut cmd: Command) -> Run {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("start");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > WATCHDOG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {WATCHDOG:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Run {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// `dsmrun -n N [dsmrun_args] PROGRAM [args]`.
pub fn dsmrun(n: usize, dsmrun_args: &[&str], program: &str, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsmrun"));
    cmd.arg("-n")
        .arg(n.to_string())
        .args(dsmrun_args)
        .arg(program)
        .args(args);
    run(cmd)
}

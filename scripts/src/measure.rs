//! Running one measured child: a wall-clock limit, its peak resident set, and (for dsmrun
//! jobs) the peak resident set of each rank.
//!
//! The driver does not wait for measured programs itself. It starts itself again as a small
//! helper (`dsm-bench-report measure ...`) that runs the program and then asks the kernel
//! for `RUSAGE_CHILDREN`: in a process whose only child is the program, that is the peak
//! RSS of the program and of every descendant it waited for (dsmrun waits for its ranks),
//! with no unsafe code and no dependence on `/usr/bin/time`. The same helper enforces the
//! time limit on the program's whole process group, and, when asked, samples the
//! `VmHWM` of the program's direct children (dsmrun's ranks) so that the report can give
//! the sum over ranks as well as the maximum.

use anyhow::{bail, Context, Result};
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// What the helper found out about the program, written as JSON to its report file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HelperReport {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Peak RSS of the program and its waited-for descendants (KiB).
    pub max_rss_kb: Option<u64>,
    /// Sampled peak RSS (`VmHWM`, KiB) of each direct child of the program, in start order.
    pub child_peak_rss_kb: Vec<u64>,
}

/// The helper's side: runs `program args` with a time limit and writes a [`HelperReport`].
pub fn helper_main(
    timeout: Duration,
    report: &Path,
    sample_children: bool,
    program: &OsString,
    args: &[OsString],
) -> Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        // Its own process group, so that a timeout stops everything it started.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
    let pid = child.id() as i32;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_children.then(|| {
        let done = done.clone();
        std::thread::spawn(move || sample_children_rss(pid, &done))
    });
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let mut timed_out = false;
    let status = match rx.recv_timeout(timeout) {
        Ok(s) => s,
        Err(_) => {
            timed_out = true;
            let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
            match rx.recv_timeout(Duration::from_secs(3)) {
                Ok(s) => s,
                Err(_) => {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                    rx.recv().context("waiting for the killed program")?
                }
            }
        }
    }
    .context("waiting for the program")?;
    let _ = waiter.join();
    done.store(true, Ordering::Relaxed);
    let child_peak_rss_kb = sampler.and_then(|h| h.join().ok()).unwrap_or_default();
    // Linux reports ru_maxrss in KiB.
    let max_rss_kb = getrusage(UsageWho::RUSAGE_CHILDREN)
        .ok()
        .map(|u| u.max_rss().max(0) as u64)
        .filter(|&kb| kb > 0);
    let r = HelperReport {
        code: status.code(),
        signal: status.signal(),
        timed_out,
        max_rss_kb,
        child_peak_rss_kb,
    };
    std::fs::write(report, serde_json::to_vec(&r)?)
        .with_context(|| format!("writing {}", report.display()))?;
    Ok(())
}

/// Polls `VmHWM` of `parent`'s children until `done`. `VmHWM` only grows, so the last
/// sample of each child is its peak up to that moment; what a rank allocates in its last
/// few milliseconds may be missed, which the report says.
fn sample_children_rss(parent: i32, done: &AtomicBool) -> Vec<u64> {
    let mut peaks: BTreeMap<(u64, i32), u64> = BTreeMap::new();
    let mut start_of: BTreeMap<i32, u64> = BTreeMap::new();
    while !done.load(Ordering::Relaxed) {
        for (pid, start) in children_of(parent) {
            start_of.insert(pid, start);
            if let Some(kb) = vm_hwm_kb(pid) {
                let e = peaks.entry((start, pid)).or_insert(0);
                *e = (*e).max(kb);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    peaks.into_values().collect()
}

/// Direct children of `parent` with their start times (for a stable order).
fn children_of(parent: i32) -> Vec<(i32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may contain spaces and parentheses: fields start after the last ')'.
        let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        let ppid: i32 = fields.get(1)?.parse().ok()?;
        let start: u64 = fields.get(19)?.parse().ok()?;
        (ppid == parent).then_some((pid, start))
    })
    .collect()
}

fn vm_hwm_kb(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A program to run under the helper.
#[derive(Clone, Debug)]
pub struct Spec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// Sample the peak RSS of the program's direct children (dsmrun's ranks).
    pub sample_children: bool,
}

impl Spec {
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>, timeout: Duration) -> Self {
        Spec {
            program: program.into(),
            args,
            env: Vec::new(),
            timeout,
            sample_children: false,
        }
    }

    /// The command line as a person would type it (for reports).
    pub fn display(&self) -> String {
        let mut s: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push(self.program.file_name().map_or_else(
            || self.program.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ));
        s.extend(self.args.iter().cloned());
        s.join(" ")
    }
}

/// Everything the driver learns from one run.
#[derive(Clone, Debug, Default)]
pub struct Raw {
    pub report: HelperReport,
    pub stdout: String,
    pub stderr: String,
    pub wall_s: f64,
}

impl Raw {
    pub fn exit_text(&self) -> String {
        let r = &self.report;
        if r.timed_out {
            "timed out".into()
        } else if let Some(c) = r.code {
            format!("exit status {c}")
        } else if let Some(s) = r.signal {
            format!("killed by signal {s}")
        } else {
            "unknown exit".into()
        }
    }
}

/// Runs `spec` under the helper (this same executable, `measure` subcommand), capturing
/// its output. `scratch` is a directory for the helper's report file.
pub fn run(spec: &Spec, scratch: &Path, id: usize) -> Result<Raw> {
    let me = std::env::current_exe().context("locating the driver executable")?;
    let report = scratch.join(format!("helper-{id}.json"));
    let _ = std::fs::remove_file(&report);
    let mut cmd = Command::new(me);
    cmd.arg("measure")
        .arg("--timeout-ms")
        .arg(spec.timeout.as_millis().to_string())
        .arg("--report")
        .arg(&report);
    if spec.sample_children {
        cmd.arg("--sample-children");
    }
    cmd.arg("--").arg(&spec.program).args(&spec.args);
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd.stdin(Stdio::null());
    let t = Instant::now();
    let out = cmd.output().context("starting the measuring helper")?;
    let wall_s = t.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = match std::fs::read(&report) {
        Ok(t) => t,
        Err(_) => bail!(
            "the measuring helper failed ({}): {}",
            out.status,
            crate::parse::tail(&stderr, 5)
        ),
    };
    let _ = std::fs::remove_file(&report);
    Ok(Raw {
        report: serde_json::from_slice(&text).context("reading the helper's report")?,
        stdout,
        stderr,
        wall_s,
    })
}

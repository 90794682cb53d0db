//! The suite itself: what each mode runs (inputs, node counts, repetitions), the C peer
//! programs built for it, turning each planned job into a command line, and running the
//! jobs one after another under a progress bar. Runs are strictly sequential: on a
//! 2-core machine two measured jobs at once would time each other.

use crate::measure::{self, Spec};
use crate::model::{
    BenchTransport, CRunner, Job, Outcome, Purpose, RunRecord, Runner, Settings, Variant,
};
use crate::parse::{self, Tool};
use anyhow::{Context, Result};
use dsm_proto::env_vars;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Quick,
    Normal,
    Full,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Normal => "normal",
            Mode::Full => "full",
        }
    }
}

/// The race kernels run by dsm and by the peer detectors (the C translations in
/// `scripts/c/kernels.c` carry the same names), with whether each has a race.
pub const KERNELS: &[(&str, bool)] = &[
    ("unprotected-counter", true),
    ("missing-barrier", true),
    ("tsp-bound", true),
    ("write-write", true),
    ("different-locks", true),
    ("locked-counter", false),
    ("with-barrier", false),
    ("false-sharing", false),
];

/// An application and the input it is benchmarked with.
#[derive(Clone, Debug)]
pub struct AppSpec {
    pub name: &'static str,
    /// The paper's input, in words.
    pub paper: &'static str,
    pub args: Vec<String>,
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The four applications with the paper's inputs (SOR's iteration count is not in the
/// paper; 100 is the app's default). They take well under a second each on today's CPUs,
/// so `--quick` keeps them and only halves SOR's iterations (its TSan run is the longest).
pub fn app_specs(mode: Mode) -> Vec<AppSpec> {
    let sor_iters = if mode == Mode::Quick { "50" } else { "100" };
    vec![
        AppSpec {
            name: "sor",
            paper: "512x512",
            args: strs(&["--size", "512", "--iters", sor_iters]),
        },
        AppSpec {
            name: "fft",
            paper: "64x64x16",
            args: strs(&["--dims", "64x64x16"]),
        },
        AppSpec {
            name: "tsp",
            paper: "19 cities",
            args: strs(&["--random", "19"]),
        },
        AppSpec {
            name: "water",
            paper: "216 molecules, 5 steps",
            args: strs(&["--molecules", "216", "--steps", "5"]),
        },
    ]
}

/// The scaled inputs of the "dsm vs threads" table (the same in every mode): large enough
/// that the kernels run for tenths of a second rather than milliseconds.
pub fn vs_threads_specs() -> Vec<AppSpec> {
    vec![
        AppSpec {
            name: "sor",
            paper: "512x512",
            args: strs(&["--size", "2048", "--iters", "50"]),
        },
        AppSpec {
            name: "sor",
            paper: "512x512",
            args: strs(&["--size", "1024", "--iters", "100"]),
        },
        AppSpec {
            name: "fft",
            paper: "64x64x16",
            args: strs(&["--dims", "128x128x64"]),
        },
    ]
}

/// The inputs of the race-cost table: the apps on inputs long enough that a run's own
/// time, not start-up, is what `--race` is measured against.
pub fn race_cost_specs() -> Vec<AppSpec> {
    let spec = |name, paper, args: &[&str]| AppSpec {
        name,
        paper,
        args: strs(args),
    };
    vec![
        spec("sor", "512x512", &["--size", "1024", "--iters", "50"]),
        spec("sor", "512x512", &["--size", "2048", "--iters", "50"]),
        spec("fft", "64x64x16", &["--dims", "128x128x64"]),
        spec(
            "tsp",
            "19 cities",
            &["--random", "20", "--seed", "3", "--locked-bound"],
        ),
        spec(
            "water",
            "216 molecules, 5 steps",
            &["--molecules", "216", "--steps", "5"],
        ),
        spec(
            "water",
            "216 molecules, 5 steps",
            &["--molecules", "1000", "--steps", "2"],
        ),
    ]
}

/// The inputs of the round-trip model: the race-cost inputs, and Water's other lock
/// granularity beside its default (one lock per molecule): `--locks block` takes one lock
/// per node's block of molecules, far fewer acquires for the same result.
pub fn round_trip_specs() -> Vec<AppSpec> {
    let mut specs = race_cost_specs();
    let block: Vec<AppSpec> = specs
        .iter()
        .filter(|a| a.name == "water")
        .map(|a| AppSpec {
            args: a
                .args
                .iter()
                .cloned()
                .chain(strs(&["--locks", "block"]))
                .collect(),
            ..a.clone()
        })
        .collect();
    specs.extend(block);
    specs
}

/// Repetitions, node counts and limits of a mode.
#[derive(Clone, Debug)]
pub struct Knobs {
    pub mode: Mode,
    pub cores: usize,
    /// Off/on pairs per app and node count.
    pub reps: usize,
    pub reps_oversubscribed: usize,
    pub table_nodes: Vec<usize>,
    pub skipped_nodes: Vec<usize>,
    pub breakdown_nodes: Vec<usize>,
    /// Node counts run only for the speedup plot (the table's own runs serve its N).
    pub speedup_extra_nodes: Vec<usize>,
    pub speedup_reps: usize,
    pub peer_threads: usize,
    pub peer_reps: usize,
    pub valgrind: bool,
    pub valgrind_reps: usize,
    pub kernel_nodes: usize,
    pub bench_reps: usize,
    /// dsm-bench runs: a run disturbed by other load is slow throughout, so the report
    /// takes the median of several runs' medians.
    pub bench_runs: usize,
    pub app_timeout_s: u64,
    /// N of the "dsm vs threads" table, and its alternating repetitions.
    pub vs_threads_nodes: usize,
    pub vs_threads_reps: usize,
    /// The race-cost table: node counts, alternating off/on pairs, and the transports
    /// (the default first; `--quick` measures only it).
    pub race_cost_nodes: Vec<usize>,
    pub race_cost_reps: usize,
    pub race_cost_transports: Vec<&'static str>,
    /// The round-trip model's runs (over TCP): node counts and repetitions.
    pub round_trip_nodes: Vec<usize>,
    pub round_trip_reps: usize,
}

impl Knobs {
    pub fn new(mode: Mode, cores: usize) -> Self {
        let quick = mode == Mode::Quick;
        Knobs {
            mode,
            cores,
            reps: if quick { 3 } else { 7 },
            reps_oversubscribed: if quick { 2 } else { 7 },
            table_nodes: vec![2, 8],
            skipped_nodes: vec![],
            // The paper's Figure 3 is at 8 processors; on fewer cores the N = 2 breakdown
            // is the one whose small components are above the scheduling noise.
            breakdown_nodes: if quick { vec![2] } else { vec![2, 8] },
            speedup_extra_nodes: vec![1, 4],
            speedup_reps: if quick { 1 } else { 3 },
            peer_threads: 2,
            peer_reps: if quick { 3 } else { 7 },
            valgrind: mode == Mode::Full,
            valgrind_reps: 3,
            kernel_nodes: 2,
            bench_reps: if quick { 300 } else { 1000 },
            bench_runs: 3,
            app_timeout_s: if quick { 60 } else { 300 },
            vs_threads_nodes: 2,
            vs_threads_reps: if quick { 1 } else { 5 },
            race_cost_nodes: vec![2, 4, 8],
            // Single runs on two cores vary by a quarter: three repetitions left a cell's
            // median ratio 10-20% apart from one run of the suite to the next.
            race_cost_reps: if quick { 1 } else { 7 },
            race_cost_transports: if quick {
                vec!["auto"]
            } else {
                vec!["auto", "rings", "tcp"]
            },
            round_trip_nodes: vec![2],
            round_trip_reps: if quick { 1 } else { 3 },
        }
    }

    /// Repetitions at `n` nodes: fewer in --quick where ranks outnumber the cores.
    pub fn reps_at(&self, n: usize) -> usize {
        if n > self.cores {
            self.reps_oversubscribed
        } else {
            self.reps
        }
    }

    pub fn settings(&self, apps: &[AppSpec]) -> Settings {
        let sor = apps.iter().find(|a| a.name == "sor");
        let sor_input = sor.map_or_else(String::new, |a| a.args.join(" "));
        Settings {
            mode: self.mode.name().into(),
            reps: self.reps,
            reps_oversubscribed: self.reps_oversubscribed,
            table_nodes: self.table_nodes.clone(),
            skipped_nodes: self.skipped_nodes.clone(),
            breakdown_nodes: self.breakdown_nodes.clone(),
            speedup_nodes: {
                let mut v: Vec<usize> = self
                    .speedup_extra_nodes
                    .iter()
                    .chain(&self.table_nodes)
                    .copied()
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            },
            inputs: apps
                .iter()
                .map(|a| (a.name.to_string(), a.args.join(" ")))
                .collect(),
            peer_sor: sor_input.clone(),
            peer_threads: self.peer_threads,
            peer_reps: self.peer_reps,
            valgrind_sor: if self.valgrind {
                sor_input
            } else {
                String::new()
            },
            valgrind_reps: if self.valgrind { self.valgrind_reps } else { 0 },
            kernel_nodes: self.kernel_nodes,
            bench_reps: self.bench_reps,
            vs_threads: vs_threads_specs()
                .iter()
                .filter(|v| apps.iter().any(|a| a.name == v.name))
                .map(|v| (v.name.to_string(), v.args.join(" ")))
                .collect(),
            vs_threads_nodes: self.vs_threads_nodes,
            vs_threads_reps: self.vs_threads_reps,
        }
    }
}

/// SOR's size and iteration count from its arguments (the C version runs the same).
pub fn sor_size(args: &[String]) -> Option<(usize, usize)> {
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1)?.parse().ok())
    };
    Some((get("--size")?, get("--iters")?))
}

/// Where things are.
#[derive(Clone, Debug)]
pub struct Paths {
    pub repo: PathBuf,
    pub out_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub c_dir: PathBuf,
    /// Scratch space for C builds, stats files and helper reports.
    pub work: PathBuf,
}

/// The C builds and detectors available for the comparison.
#[derive(Clone, Debug)]
pub struct Tools {
    /// Plain -O2 builds of sor.c and kernels.c (also what valgrind runs).
    pub plain: Result<(PathBuf, PathBuf), String>,
    pub tsan: Result<(PathBuf, PathBuf), String>,
    pub valgrind: Result<String, String>,
    /// The C row's programs.
    pub c_apps: CAppBins,
}

/// The C row's programs (issue 33): the C SOR of `dsm-capi/c-apps`, `sor.c` built by
/// `dsmcc` against this build's `libdsm.a` and `sor_threads.c` built by gcc, plain and
/// with ThreadSanitizer. Each is there or says why not.
#[derive(Clone, Debug)]
pub struct CAppBins {
    pub dsm: Result<PathBuf, String>,
    pub threads: Result<PathBuf, String>,
    pub tsan: Result<PathBuf, String>,
}

impl CAppBins {
    /// None of them (tests, and a run that could not build them).
    pub fn missing(why: &str) -> Self {
        CAppBins {
            dsm: Err(why.into()),
            threads: Err(why.into()),
            tsan: Err(why.into()),
        }
    }

    /// The program `runner` runs.
    pub fn get(&self, runner: CRunner) -> Result<&PathBuf, String> {
        match runner {
            CRunner::Dsm | CRunner::DsmRace => &self.dsm,
            CRunner::Threads => &self.threads,
            CRunner::ThreadsTsan => &self.tsan,
        }
        .as_ref()
        .map_err(Clone::clone)
    }
}

impl Tools {
    pub fn available(&self, tool: Tool) -> Result<(), String> {
        match tool {
            Tool::Plain => self.plain.as_ref().map(|_| ()).map_err(Clone::clone),
            Tool::Tsan => self.tsan.as_ref().map(|_| ()).map_err(Clone::clone),
            Tool::Helgrind | Tool::Drd => {
                self.plain.as_ref().map_err(Clone::clone)?;
                self.valgrind.as_ref().map(|_| ()).map_err(Clone::clone)
            }
        }
    }
}

fn compile(
    c_dir: &Path,
    work: &Path,
    name: &str,
    suffix: &str,
    extra: &[&str],
) -> Result<PathBuf, String> {
    let src = c_dir.join(format!("{name}.c"));
    let exe = work.join(format!("{name}{suffix}"));
    let out = Command::new("gcc")
        .args(["-O2", "-g", "-std=c11", "-Wall"])
        .args(extra)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-pthread")
        .output()
        .map_err(|e| format!("gcc not found ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "gcc {} failed: {}",
            extra.join(" "),
            parse::tail(&String::from_utf8_lossy(&out.stderr), 3)
        ));
    }
    Ok(exe)
}

/// Runs a build command; its error is the command's last lines of stderr.
fn build_with(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what} cannot run ({e})"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {}",
            parse::tail(&String::from_utf8_lossy(&out.stderr), 3)
        ))
    }
}

/// Builds the C row's programs (see [`CAppBins`]) into `paths.work`.
pub fn prepare_c_apps(paths: &Paths) -> CAppBins {
    let capi = paths.repo.join("dsm-capi");
    let lib = paths.bin_dir.join("libdsm.a");
    let dsm = if lib.is_file() {
        let exe = paths.work.join("capi-sor");
        build_with(
            Command::new(capi.join("dsmcc"))
                .env("DSMCC_CC", "gcc")
                .env("DSM_LIB", &lib)
                .arg("-O2")
                .arg("-o")
                .arg(&exe)
                .arg(capi.join("c-apps/sor.c")),
            "dsmcc -O2 c-apps/sor.c",
        )
        .map(|()| exe)
    } else {
        Err(format!("{} not built", lib.display()))
    };
    let threads = |suffix: &str, extra: &[&str]| -> Result<PathBuf, String> {
        let exe = paths.work.join(format!("capi-sor-threads{suffix}"));
        build_with(
            Command::new("gcc")
                .args(["-O2", "-g", "-pthread"])
                .args(extra)
                .arg("-o")
                .arg(&exe)
                .arg(capi.join("c-apps/sor_threads.c"))
                .arg("-lm"),
            &format!("gcc {} c-apps/sor_threads.c", extra.join(" ")),
        )
        .map(|()| exe)
    };
    let plain = threads("", &[]);
    // As for scripts/c: a TSan build that compiles may still not start.
    let tsan = threads("-tsan", &["-fsanitize=thread"]).and_then(|exe| {
        build_with(
            Command::new(&exe).args(["2", "16", "1"]),
            "the TSan build of sor_threads",
        )
        .map(|()| exe)
    });
    CAppBins {
        dsm,
        threads: plain,
        tsan,
    }
}

/// Builds the C programs (plain and with ThreadSanitizer) and looks for valgrind.
pub fn prepare_tools(paths: &Paths, knobs: &Knobs) -> Tools {
    let build = |suffix: &str, extra: &[&str]| -> Result<(PathBuf, PathBuf), String> {
        Ok((
            compile(&paths.c_dir, &paths.work, "sor", suffix, extra)?,
            compile(&paths.c_dir, &paths.work, "kernels", suffix, extra)?,
        ))
    };
    let plain = build("", &[]);
    let tsan = build("-tsan", &["-fsanitize=thread"]).and_then(|bins| {
        // A sanitizer that compiles may still fail to start (e.g. an unsupported memory
        // layout); a failed probe says so once instead of failing every run.
        let out = Command::new(&bins.1)
            .args(["locked-counter", "2"])
            .output()
            .map_err(|e| format!("cannot run the TSan build: {e}"))?;
        if out.status.success() {
            Ok(bins)
        } else {
            Err(format!(
                "the TSan build does not run ({}): {}",
                out.status,
                parse::tail(&String::from_utf8_lossy(&out.stderr), 3)
            ))
        }
    });
    let valgrind = if !knobs.valgrind {
        Err("Helgrind and DRD run only with --full".to_string())
    } else {
        match Command::new("valgrind").arg("--version").output() {
            Ok(o) if o.status.success() => {
                Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
            }
            _ => Err("valgrind not found (scripts/bench --full installs it with apt-get)".into()),
        }
    };
    Tools {
        plain,
        tsan,
        valgrind,
        c_apps: prepare_c_apps(paths),
    }
}

/// Whether an app's binary is there (the apps are developed alongside this suite).
pub fn app_available(paths: &Paths, app: &str) -> Result<(), String> {
    let p = paths.bin_dir.join(app);
    if p.is_file() {
        Ok(())
    } else {
        Err(format!("binary not found ({})", p.display()))
    }
}

/// The runners of the "dsm vs threads" table, in the order of its first repetition.
pub const VS_THREADS_RUNNERS: &[Runner] = &[
    Runner::Threads,
    Runner::Dsm,
    Runner::DsmRings,
    Runner::DsmTcp,
];

/// `DSM_TRANSPORT` of a dsm-bench run: `auto` (the default: on one host one common
/// segment, where dsm-bench's remote fault, write fault and page hand-off fault nothing),
/// `rings` or `tcp`.
pub fn primitives_transport(transport: BenchTransport) -> &'static str {
    transport.env()
}

/// `DSM_TRANSPORT` of a dsm runner of the "dsm vs threads" table (`None` for threads).
pub fn runner_transport(runner: Runner) -> Option<&'static str> {
    match runner {
        Runner::Threads => None,
        Runner::Dsm => Some("auto"),
        Runner::DsmRings => Some("rings"),
        Runner::DsmTcp => Some("tcp"),
    }
}

fn rotate<T: Clone>(v: &[T], by: usize) -> Vec<T> {
    let k = by % v.len().max(1);
    v[k..].iter().chain(&v[..k]).cloned().collect()
}

/// Every job of the run, in execution order. Variants of one app and node count are
/// interleaved within each repetition (and their order rotates from one repetition to
/// the next), so slow drifts in machine load hit all of them alike.
pub fn plan(knobs: &Knobs, apps: &[AppSpec], tools: &Tools, paths: &Paths) -> Vec<Job> {
    let apps: Vec<&AppSpec> = apps
        .iter()
        .filter(|a| app_available(paths, a.name).is_ok())
        .collect();
    let mut jobs = table_plan(knobs, &apps);
    jobs.extend(speedup_plan(knobs, &apps));
    jobs.extend(peer_plan(knobs, &apps, tools));
    jobs.extend(vs_threads_plan(knobs, &apps));
    jobs.extend(race_cost_plan(knobs, paths));
    jobs.extend(round_trip_plan(knobs, paths));
    jobs.extend(kernel_plan(knobs, tools, paths));
    jobs.extend(primitives_plan(knobs, paths));
    jobs
}

/// The application table's jobs, with the breakdown's phase variants at its node counts.
fn table_plan(knobs: &Knobs, apps: &[&AppSpec]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &n in &knobs.table_nodes {
        let variants: &[Variant] = if knobs.breakdown_nodes.contains(&n) {
            &[
                Variant::Off,
                Variant::On,
                Variant::Record,
                Variant::Notices,
                Variant::Compare,
            ]
        } else {
            &[Variant::Off, Variant::On]
        };
        for rep in 0..knobs.reps_at(n) {
            for a in apps {
                for v in rotate(variants, rep) {
                    jobs.push(Job::App {
                        app: a.name.into(),
                        purpose: Purpose::Table,
                        nodes: n,
                        variant: v,
                        rep,
                        args: a.args.clone(),
                        transport: None,
                    });
                }
            }
        }
    }
    jobs
}

/// The speedup plot's runs at node counts the table does not run.
fn speedup_plan(knobs: &Knobs, apps: &[&AppSpec]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &n in &knobs.speedup_extra_nodes {
        for rep in 0..knobs.speedup_reps {
            for a in apps {
                jobs.push(Job::App {
                    app: a.name.into(),
                    purpose: Purpose::Speedup,
                    nodes: n,
                    variant: Variant::Off,
                    rep,
                    args: a.args.clone(),
                    transport: None,
                });
            }
        }
    }
    jobs
}

/// SOR under the other detectors and the C row, at the table's SOR size.
fn peer_plan(knobs: &Knobs, apps: &[&AppSpec], tools: &Tools) -> Vec<Job> {
    let mut jobs = Vec::new();
    let Some((size, iters)) = apps
        .iter()
        .find(|a| a.name == "sor")
        .and_then(|a| sor_size(&a.args))
    else {
        return jobs;
    };
    for rep in 0..knobs.peer_reps {
        for tool in [Tool::Plain, Tool::Tsan, Tool::Helgrind, Tool::Drd] {
            let valgrind = matches!(tool, Tool::Helgrind | Tool::Drd);
            if tools.available(tool).is_err() || (valgrind && rep >= knobs.valgrind_reps) {
                continue;
            }
            jobs.push(Job::CSor {
                tool,
                size,
                iters,
                threads: knobs.peer_threads,
                rep,
            });
        }
        // The C row: the same C kernel with threads and on dsm, alternating.
        for runner in rotate(&CRunner::ALL, rep) {
            if tools.c_apps.get(runner).is_ok() {
                jobs.push(Job::CApp {
                    runner,
                    size,
                    iters,
                    nodes: knobs.peer_threads,
                    rep,
                });
            }
        }
    }
    jobs
}

/// dsm against plain threads: the four runners alternate, their order rotating from one
/// repetition to the next.
fn vs_threads_plan(knobs: &Knobs, apps: &[&AppSpec]) -> Vec<Job> {
    let scaled: Vec<AppSpec> = vs_threads_specs()
        .into_iter()
        .filter(|v| apps.iter().any(|a| a.name == v.name))
        .collect();
    let mut jobs = Vec::new();
    for rep in 0..knobs.vs_threads_reps {
        for v in &scaled {
            for runner in rotate(VS_THREADS_RUNNERS, rep) {
                jobs.push(Job::VsThreads {
                    app: v.name.into(),
                    args: v.args.clone(),
                    nodes: knobs.vs_threads_nodes,
                    runner,
                    rep,
                });
            }
        }
    }
    jobs
}

/// Each planted-race kernel under dsm and under each C detector available.
fn kernel_plan(knobs: &Knobs, tools: &Tools, paths: &Paths) -> Vec<Job> {
    let have_kernels = app_available(paths, "race-kernel").is_ok();
    let mut jobs = Vec::new();
    for &(kernel, _) in KERNELS {
        if have_kernels {
            jobs.push(Job::DsmKernel {
                kernel: kernel.into(),
                nodes: knobs.kernel_nodes,
            });
        }
        for tool in [Tool::Tsan, Tool::Helgrind, Tool::Drd] {
            if tools.available(tool).is_ok() {
                jobs.push(Job::CKernel {
                    tool,
                    kernel: kernel.into(),
                    threads: knobs.peer_threads,
                });
            }
        }
    }
    jobs
}

/// The dsm-bench runs, each over every transport.
fn primitives_plan(knobs: &Knobs, paths: &Paths) -> Vec<Job> {
    let mut jobs = Vec::new();
    if app_available(paths, "dsm-bench").is_ok() {
        for rep in 0..knobs.bench_runs {
            for transport in BenchTransport::ALL {
                jobs.push(Job::primitives(knobs.bench_reps, rep, transport));
            }
        }
    }
    jobs
}

/// The race-cost table's jobs: for each repetition, input, N and transport, the run
/// without `--race` and with it, their order alternating from one repetition to the next.
fn race_cost_plan(knobs: &Knobs, paths: &Paths) -> Vec<Job> {
    let specs: Vec<AppSpec> = race_cost_specs()
        .into_iter()
        .filter(|a| app_available(paths, a.name).is_ok())
        .collect();
    let mut jobs = Vec::new();
    for rep in 0..knobs.race_cost_reps {
        for a in &specs {
            for &n in &knobs.race_cost_nodes {
                for &transport in &knobs.race_cost_transports {
                    for variant in rotate(&[Variant::Off, Variant::On], rep) {
                        jobs.push(Job::App {
                            app: a.name.into(),
                            purpose: Purpose::RaceCost,
                            nodes: n,
                            variant,
                            rep,
                            args: a.args.clone(),
                            transport: Some(transport.into()),
                        });
                    }
                }
            }
        }
    }
    jobs
}

/// The round-trip model's jobs: each input at each N over TCP without `--race`, where
/// every link is a socket and each rank fetches its own copies, as between hosts.
fn round_trip_plan(knobs: &Knobs, paths: &Paths) -> Vec<Job> {
    let specs: Vec<AppSpec> = round_trip_specs()
        .into_iter()
        .filter(|a| app_available(paths, a.name).is_ok())
        .collect();
    let mut jobs = Vec::new();
    for rep in 0..knobs.round_trip_reps {
        for a in &specs {
            for &n in &knobs.round_trip_nodes {
                jobs.push(Job::App {
                    app: a.name.into(),
                    purpose: Purpose::RoundTrips,
                    nodes: n,
                    variant: Variant::Off,
                    rep,
                    args: a.args.clone(),
                    transport: Some("tcp".into()),
                });
            }
        }
    }
    jobs
}

/// Valgrind's own argument list for a tool run.
fn valgrind_args(tool: Tool) -> Vec<String> {
    let name = if tool == Tool::Helgrind {
        "helgrind"
    } else {
        "drd"
    };
    vec![
        format!("--tool={name}"),
        format!("--error-exitcode={}", Tool::RACE_EXIT),
    ]
}

/// The command line of a job.
pub fn spec_for(
    job: &Job,
    knobs: &Knobs,
    paths: &Paths,
    tools: &Tools,
    scratch: &Path,
) -> Result<Spec, String> {
    let specs = JobSpecs {
        knobs,
        paths,
        tools,
        scratch,
        dsmrun: paths.bin_dir.join("dsmrun"),
    };
    Ok(match job {
        Job::App {
            app,
            purpose,
            nodes,
            variant,
            args,
            transport,
            ..
        } => specs.app(app, *purpose, *nodes, *variant, args, transport.as_deref()),
        Job::DsmKernel { kernel, nodes } => specs.dsm_kernel(kernel, *nodes),
        Job::CSor {
            tool,
            size,
            iters,
            threads,
            ..
        } => c_tool_spec(
            *tool,
            specs.c_bins(*tool)?.0,
            vec![size.to_string(), iters.to_string(), threads.to_string()],
            if matches!(tool, Tool::Helgrind | Tool::Drd) {
                900
            } else {
                300
            },
        ),
        Job::CApp {
            runner,
            size,
            iters,
            nodes,
            ..
        } => specs.c_app(*runner, *size, *iters, *nodes)?,
        Job::CKernel {
            tool,
            kernel,
            threads,
        } => c_tool_spec(
            *tool,
            specs.c_bins(*tool)?.1,
            vec![kernel.clone(), threads.to_string()],
            120,
        ),
        Job::Primitives { reps, .. } => specs.primitives(
            *reps,
            job.bench_transport().unwrap_or(BenchTransport::Rings),
        ),
        Job::VsThreads {
            app,
            args,
            nodes,
            runner,
            ..
        } => specs.vs_threads(app, args, *nodes, *runner),
    })
}

/// What every job's command line draws on.
struct JobSpecs<'a> {
    knobs: &'a Knobs,
    paths: &'a Paths,
    tools: &'a Tools,
    scratch: &'a Path,
    dsmrun: PathBuf,
}

impl JobSpecs<'_> {
    /// The C SOR and kernels programs a tool runs (valgrind runs the plain build).
    fn c_bins(&self, tool: Tool) -> Result<(PathBuf, PathBuf), String> {
        match tool {
            Tool::Tsan => self.tools.tsan.clone(),
            _ => self.tools.plain.clone(),
        }
    }

    /// `dsmrun -n N --timeout T` with the arguments that follow it, under the apps' timeout.
    fn dsmrun_args(&self, nodes: usize) -> Vec<String> {
        vec![
            "-n".to_string(),
            nodes.to_string(),
            "--timeout".into(),
            self.knobs.app_timeout_s.to_string(),
        ]
    }

    fn dsmrun(&self, args: Vec<String>) -> Spec {
        Spec::new(
            &self.dsmrun,
            args,
            Duration::from_secs(self.knobs.app_timeout_s + 20),
        )
    }

    fn app(
        &self,
        app: &str,
        purpose: Purpose,
        nodes: usize,
        variant: Variant,
        args: &[String],
        transport: Option<&str>,
    ) -> Spec {
        let mut a = self.dsmrun_args(nodes);
        if variant.race() {
            // Races (TSP has them on purpose) must not turn a timing run into a failure.
            a.extend(strs(&["--race", "--race-exit-code", "0"]));
        }
        a.push("--".into());
        a.push(self.paths.bin_dir.join(app).display().to_string());
        a.extend(args.iter().cloned());
        let mut spec = self.dsmrun(a);
        spec.env.push((
            "DSM_STATS_FILE".into(),
            self.scratch.join("stats-%r.json").display().to_string(),
        ));
        if let Some(p) = variant.phases_env() {
            spec.env.push(("DSM_RACE_PHASES".into(), p.into()));
        }
        // The transport a user gets (one common segment on this host, with or without
        // --race) unless the job names one.
        spec.env.push((
            env_vars::TRANSPORT.into(),
            transport.unwrap_or("auto").into(),
        ));
        // Only SOR's rows in the application tables report dsm's memory. Sampling costs
        // CPU that the ranks share (SOR 1024 at N = 2 over TCP ran about 10% slower
        // under it), so the race-cost and round-trip runs, which report no memory, go
        // without.
        spec.sample_children = app == "sor"
            && nodes == self.knobs.peer_threads
            && matches!(purpose, Purpose::Table | Purpose::Speedup);
        spec
    }

    fn dsm_kernel(&self, kernel: &str, nodes: usize) -> Spec {
        let mut spec = Spec::new(
            &self.dsmrun,
            vec![
                "-n".into(),
                nodes.to_string(),
                "--timeout".into(),
                "60".into(),
                "--race".into(),
                "--".into(),
                self.paths.bin_dir.join("race-kernel").display().to_string(),
                "run".into(),
                kernel.into(),
            ],
            Duration::from_secs(80),
        );
        spec.sample_children = true;
        spec
    }

    /// The C row: the C SOR under dsmrun or as a threaded program.
    fn c_app(
        &self,
        runner: CRunner,
        size: usize,
        iters: usize,
        nodes: usize,
    ) -> Result<Spec, String> {
        let exe = self.tools.c_apps.get(runner)?.clone();
        let sor_args = [size.to_string(), iters.to_string()];
        if runner.dsm() {
            let mut a = self.dsmrun_args(nodes);
            if runner == CRunner::DsmRace {
                a.push("--race".into());
            }
            a.push("--".into());
            a.push(exe.display().to_string());
            a.extend(sor_args);
            let mut spec = self.dsmrun(a);
            spec.env.push((env_vars::TRANSPORT.into(), "auto".into()));
            Ok(spec)
        } else {
            let tool = if runner == CRunner::ThreadsTsan {
                Tool::Tsan
            } else {
                Tool::Plain
            };
            let mut a = vec![nodes.to_string()];
            a.extend(sor_args);
            Ok(c_tool_spec(tool, exe, a, 300))
        }
    }

    fn primitives(&self, reps: usize, transport: BenchTransport) -> Spec {
        let mut spec = Spec::new(
            self.paths.bin_dir.join("dsm-bench"),
            vec!["--reps".into(), reps.to_string()],
            Duration::from_secs(600),
        );
        spec.env.push((
            env_vars::TRANSPORT.into(),
            primitives_transport(transport).into(),
        ));
        spec
    }

    fn vs_threads(&self, app: &str, args: &[String], nodes: usize, runner: Runner) -> Spec {
        let Some(transport) = runner_transport(runner) else {
            let mut a = vec!["--threads".to_string(), nodes.to_string()];
            a.extend(args.iter().cloned());
            return Spec::new(
                self.paths.bin_dir.join(app),
                a,
                Duration::from_secs(self.knobs.app_timeout_s),
            );
        };
        let mut a = self.dsmrun_args(nodes);
        a.push("--".into());
        a.push(self.paths.bin_dir.join(app).display().to_string());
        a.extend(args.iter().cloned());
        let mut spec = self.dsmrun(a);
        spec.env
            .push((env_vars::TRANSPORT.into(), transport.into()));
        spec
    }
}

/// A C program run directly, under TSan's options, or under valgrind.
fn c_tool_spec(tool: Tool, exe: PathBuf, args: Vec<String>, timeout: u64) -> Spec {
    let mut spec = if matches!(tool, Tool::Helgrind | Tool::Drd) {
        let mut a = valgrind_args(tool);
        a.push(exe.display().to_string());
        a.extend(args);
        Spec::new("valgrind", a, Duration::from_secs(timeout))
    } else {
        Spec::new(exe, args, Duration::from_secs(timeout))
    };
    if tool == Tool::Tsan {
        spec.env.push((
            "TSAN_OPTIONS".into(),
            format!("exitcode={} halt_on_error=0", Tool::RACE_EXIT),
        ));
    }
    spec
}

fn failed(error: String, raw: Option<&measure::Raw>) -> Outcome {
    Outcome {
        ok: false,
        error: Some(error),
        stderr_tail: raw.map_or_else(String::new, |r| parse::tail(&r.stderr, 12)),
        wall_s: raw.map_or(0.0, |r| r.wall_s),
        max_rss_kb: raw.and_then(|r| r.report.max_rss_kb),
        ..Outcome::default()
    }
}

/// Reads what a finished run produced into an [`Outcome`].
pub fn interpret(job: &Job, raw: &measure::Raw, scratch: &Path) -> Outcome {
    let r = &raw.report;
    if r.timed_out {
        return failed("timed out".into(), Some(raw));
    }
    let mut o = Outcome {
        ok: true,
        wall_s: raw.wall_s,
        max_rss_kb: r.max_rss_kb,
        rank_rss_kb: r.child_peak_rss_kb.clone(),
        ..Outcome::default()
    };
    let code = r.code;
    match job {
        Job::App { .. } => {
            if code != Some(0) {
                return failed(raw.exit_text(), Some(raw));
            }
            match parse::parse_verified(&raw.stdout) {
                Ok(t) => {
                    o.parallel_s = Some(t.parallel_s);
                    o.sequential_s = t.sequential_s;
                }
                Err(e) => return failed(e, Some(raw)),
            }
            o.races = parse::parse_race_summary(&raw.stderr).map(|(n, _)| n);
            o.stats = read_stats(scratch).ok();
            if let Some(s) = &o.stats {
                if !s.rank_peak_rss_kb.is_empty() {
                    o.rank_rss_kb = s.rank_peak_rss_kb.clone();
                }
            }
        }
        Job::DsmKernel { .. } => {
            let summary = parse::parse_race_summary(&raw.stderr);
            match code {
                Some(0) | Some(66) => {
                    o.found_race = Some(code == Some(66) || summary.is_some_and(|(n, _)| n > 0));
                    o.races = summary.map(|(n, _)| n);
                }
                _ => return failed(raw.exit_text(), Some(raw)),
            }
        }
        Job::CSor { tool, .. } | Job::CKernel { tool, .. } => {
            if code != Some(0) && code != Some(Tool::RACE_EXIT) {
                return failed(raw.exit_text(), Some(raw));
            }
            let all = format!("{}\n{}", raw.stdout, raw.stderr);
            o.found_race = Some(parse::tool_found_race(*tool, &all));
            if matches!(job, Job::CSor { .. }) {
                match parse::parse_c_time(&raw.stdout) {
                    Some(t) => o.parallel_s = Some(t),
                    None => return failed("no `time <x> s` line".into(), Some(raw)),
                }
            }
        }
        Job::CApp { runner, .. } => {
            // A race reported on race-free SOR is a false alarm the report shows, not a
            // failed run.
            let race_exit = if runner.dsm() { 66 } else { Tool::RACE_EXIT };
            if code != Some(0) && code != Some(race_exit) {
                return failed(raw.exit_text(), Some(raw));
            }
            match parse::parse_verified(&raw.stdout) {
                Ok(t) => o.parallel_s = Some(t.parallel_s),
                Err(e) => return failed(e, Some(raw)),
            }
            o.found_race = match runner {
                CRunner::DsmRace => Some(
                    code == Some(race_exit)
                        || parse::parse_race_summary(&raw.stderr).is_some_and(|(n, _)| n > 0),
                ),
                CRunner::ThreadsTsan => Some(parse::tool_found_race(
                    Tool::Tsan,
                    &format!("{}\n{}", raw.stdout, raw.stderr),
                )),
                CRunner::Threads | CRunner::Dsm => None,
            };
        }
        Job::VsThreads { runner, .. } => {
            if code != Some(0) {
                return failed(raw.exit_text(), Some(raw));
            }
            let times = match runner {
                Runner::Threads => parse::parse_threads(&raw.stdout),
                Runner::Dsm | Runner::DsmRings | Runner::DsmTcp => {
                    parse::parse_verified(&raw.stdout)
                }
            };
            match times {
                Ok(t) => {
                    o.parallel_s = Some(t.parallel_s);
                    o.sequential_s = t.sequential_s;
                }
                Err(e) => return failed(e, Some(raw)),
            }
        }
        Job::Primitives { .. } => {
            if code != Some(0) {
                return failed(raw.exit_text(), Some(raw));
            }
            match serde_json::from_str::<serde_json::Value>(&raw.stdout) {
                Ok(v) => match parse::parse_bench(&v) {
                    Ok(_) => o.bench = Some(v),
                    Err(e) => return failed(e, Some(raw)),
                },
                Err(e) => return failed(format!("dsm-bench printed no JSON: {e}"), Some(raw)),
            }
        }
    }
    o
}

fn read_stats(dir: &Path) -> Result<parse::JobStats, String> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let p = e.map_err(|e| e.to_string())?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("stats-") && name.ends_with(".json") {
            let text = std::fs::read_to_string(&p).map_err(|e| e.to_string())?;
            files.push(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?);
        }
    }
    parse::combine_stats(&files)
}

/// Runs every job in order, with a progress bar on stderr (or one line per failure and
/// per part when stderr is not a terminal).
pub fn execute(
    jobs: &[Job],
    knobs: &Knobs,
    paths: &Paths,
    tools: &Tools,
) -> Result<Vec<RunRecord>> {
    let tty = std::io::stderr().is_terminal();
    let pb = ProgressBar::with_draw_target(
        Some(jobs.len() as u64),
        if tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    pb.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32.cyan/blue}] {pos}/{len} eta {eta} {wide_msg}",
        )
        .context("progress bar template")?
        .progress_chars("=> "),
    );
    let mut records = Vec::with_capacity(jobs.len());
    let mut last_part = "";
    for (i, job) in jobs.iter().enumerate() {
        let part = match job {
            Job::App {
                purpose: Purpose::Table,
                ..
            } => "applications",
            Job::App {
                purpose: Purpose::RaceCost,
                ..
            } => "cost of --race",
            Job::App {
                purpose: Purpose::RoundTrips,
                ..
            } => "round trips",
            Job::App { .. } => "speedup",
            Job::CSor { .. } | Job::CApp { .. } => "SOR under other race detectors",
            Job::CKernel { .. } | Job::DsmKernel { .. } => "race kernels",
            Job::Primitives { .. } => "DSM primitives",
            Job::VsThreads { .. } => "dsm vs threads",
        };
        if part != last_part && !tty {
            eprintln!("bench: [{}/{}] {part}", i + 1, jobs.len());
        }
        last_part = part;
        pb.set_message(job.describe());
        let scratch = paths.work.join(format!("job-{i}"));
        let outcome = match std::fs::create_dir_all(&scratch)
            .map_err(|e| e.to_string())
            .and_then(|_| spec_for(job, knobs, paths, tools, &scratch))
        {
            Err(e) => failed(e, None),
            Ok(spec) => match measure::run(&spec, &scratch, i) {
                Ok(raw) => interpret(job, &raw, &scratch),
                Err(e) => failed(format!("{e:#}"), None),
            },
        };
        let _ = std::fs::remove_dir_all(&scratch);
        if !outcome.ok {
            let line = format!(
                "bench: failed: {}: {}",
                job.describe(),
                outcome.error.as_deref().unwrap_or("?")
            );
            if tty {
                pb.println(line);
            } else {
                eprintln!("{line}");
            }
        }
        records.push(RunRecord {
            job: job.clone(),
            outcome,
        });
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(records)
}

/// The command line a job ran, for the failure list.
pub fn command_line(job: &Job, knobs: &Knobs, paths: &Paths, tools: &Tools) -> String {
    spec_for(job, knobs, paths, tools, &paths.work.join("job")).map_or_else(|e| e, |s| s.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sor_size_from_args() {
        assert_eq!(
            sor_size(&strs(&["--size", "64", "--iters", "7"])),
            Some((64, 7))
        );
        assert_eq!(sor_size(&strs(&["--size", "64"])), None);
    }

    #[test]
    fn rotation() {
        assert_eq!(rotate(&[1, 2, 3], 1), vec![2, 3, 1]);
        assert_eq!(rotate(&[1, 2, 3], 3), vec![1, 2, 3]);
        assert_eq!(rotate::<i32>(&[], 2), Vec::<i32>::new());
    }

    #[test]
    fn modes() {
        let q = Knobs::new(Mode::Quick, 2);
        assert_eq!(q.table_nodes, vec![2, 8]);
        assert_eq!((q.reps_at(2), q.reps_at(8)), (3, 2));
        assert_eq!(Knobs::new(Mode::Quick, 16).reps_at(8), 3);
        let n = Knobs::new(Mode::Normal, 2);
        assert_eq!((n.reps_at(2), n.reps_at(8)), (7, 7));
        assert!(!n.valgrind && Knobs::new(Mode::Full, 2).valgrind);
        assert_eq!((q.vs_threads_nodes, q.vs_threads_reps), (2, 1));
    }

    fn no_tools() -> Tools {
        Tools {
            plain: Err("not built".into()),
            tsan: Err("not built".into()),
            valgrind: Err("not run".into()),
            c_apps: CAppBins::missing("not built"),
        }
    }

    /// The C row's programs from the real sources with this machine's gcc: with no
    /// `libdsm.a` in the bin directory the dsm program says so (the report's visible
    /// skip), and the threaded one builds and verifies, or says why gcc could not.
    #[test]
    fn c_row_programs_build_or_say_why() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let tmp = std::env::temp_dir().join(format!("dsm-c-row-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let paths = Paths {
            c_dir: repo.join("scripts/c"),
            repo: repo.into(),
            work: tmp.clone(),
            ..paths_in(&tmp)
        };
        let bins = prepare_c_apps(&paths);
        let why = bins.get(CRunner::DsmRace).unwrap_err();
        assert!(why.ends_with("libdsm.a not built"), "{why}");
        match bins.get(CRunner::Threads) {
            Ok(exe) => {
                let out = Command::new(exe).args(["2", "16", "1"]).output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains("verified: c sor_threads 16x16"), "{text}");
            }
            Err(why) => {
                assert!(why.starts_with("gcc "), "{why}");
                eprintln!("skipped building the C row's programs: {why}");
            }
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }

    fn paths_in(dir: &Path) -> Paths {
        Paths {
            repo: dir.into(),
            out_dir: dir.join("out"),
            bin_dir: dir.join("bin"),
            c_dir: dir.join("c"),
            work: dir.join("work"),
        }
    }

    fn transport_of(spec: &Spec) -> Option<&str> {
        spec.env
            .iter()
            .find(|(k, _)| k == env_vars::TRANSPORT)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn primitives_run_with_the_default_over_rings_and_over_tcp() {
        let knobs = Knobs::new(Mode::Quick, 2);
        let dir = std::env::temp_dir();
        let paths = paths_in(&dir);
        let spec = |tcp: bool, common: bool| {
            let job = Job::Primitives {
                reps: 10,
                rep: 0,
                tcp,
                common,
            };
            spec_for(&job, &knobs, &paths, &no_tools(), &dir).unwrap()
        };
        for ((tcp, common), transport) in [
            ((false, false), "rings"),
            ((true, false), "tcp"),
            ((false, true), "auto"),
        ] {
            let s = spec(tcp, common);
            assert_eq!(transport_of(&s), Some(transport));
            assert!(
                s.display()
                    .starts_with(&format!("DSM_TRANSPORT={transport} dsm-bench --reps 10")),
                "{}",
                s.display()
            );
        }
        let common = Job::primitives(10, 2, BenchTransport::Common);
        assert_eq!(
            common,
            Job::Primitives {
                reps: 10,
                rep: 2,
                tcp: false,
                common: true
            }
        );
        assert_eq!(
            common.describe(),
            "DSM_TRANSPORT=auto dsm-bench --reps 10 (run 3)"
        );
        // A job recorded before the common segment run still loads, as a rings run.
        let old: Job =
            serde_json::from_str(r#"{"kind": "primitives", "reps": 10, "rep": 0}"#).unwrap();
        assert_eq!(old.bench_transport(), Some(BenchTransport::Rings));
    }

    #[test]
    fn app_runs_use_the_transport_a_user_gets_with_and_without_race_detection() {
        let knobs = Knobs::new(Mode::Quick, 2);
        let dir = std::env::temp_dir();
        let paths = paths_in(&dir);
        for variant in [Variant::Off, Variant::Record, Variant::On] {
            let job = Job::App {
                app: "sor".into(),
                purpose: Purpose::Table,
                nodes: 2,
                variant,
                rep: 0,
                args: vec![],
                transport: None,
            };
            let spec = spec_for(&job, &knobs, &paths, &no_tools(), &dir).unwrap();
            assert_eq!(transport_of(&spec), Some("auto"), "{variant:?}");
        }
    }

    #[test]
    fn each_vs_threads_runner_sets_its_transport() {
        let knobs = Knobs::new(Mode::Quick, 2);
        let dir = std::env::temp_dir();
        let paths = paths_in(&dir);
        let spec = |runner: Runner| {
            let job = Job::VsThreads {
                app: "sor".into(),
                args: strs(&["--size", "64", "--iters", "2"]),
                nodes: 2,
                runner,
                rep: 0,
            };
            spec_for(&job, &knobs, &paths, &no_tools(), &dir).unwrap()
        };
        let threads = spec(Runner::Threads);
        assert_eq!(transport_of(&threads), None);
        assert!(threads.display().starts_with("sor --threads 2"));
        for (runner, transport) in [
            (Runner::Dsm, "auto"),
            (Runner::DsmRings, "rings"),
            (Runner::DsmTcp, "tcp"),
        ] {
            let s = spec(runner);
            assert_eq!(transport_of(&s), Some(transport), "{runner:?}");
            assert!(
                s.display()
                    .starts_with(&format!("DSM_TRANSPORT={transport} dsmrun -n 2 ")),
                "{}",
                s.display()
            );
        }
    }

    #[test]
    fn plan_runs_the_four_kinds_and_the_three_primitives() {
        let dir = std::env::temp_dir().join(format!("dsm-bench-plan-{}", std::process::id()));
        let paths = paths_in(&dir);
        std::fs::create_dir_all(&paths.bin_dir).unwrap();
        for app in ["sor", "fft", "dsm-bench"] {
            std::fs::write(paths.bin_dir.join(app), "").unwrap();
        }
        let knobs = Knobs::new(Mode::Normal, 2);
        let jobs = plan(&knobs, &app_specs(Mode::Normal), &no_tools(), &paths);
        let _ = std::fs::remove_dir_all(&dir);
        let vs: Vec<(usize, &str, Runner)> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::VsThreads {
                    args, runner, rep, ..
                } if args.join(" ") == "--dims 128x128x64" => Some((*rep, "fft", *runner)),
                _ => None,
            })
            .collect();
        assert_eq!(vs.len(), 4 * knobs.vs_threads_reps);
        let order = |rep: usize| -> Vec<Runner> {
            vs.iter()
                .filter(|(r, _, _)| *r == rep)
                .map(|(_, _, runner)| *runner)
                .collect()
        };
        assert_eq!(order(0), VS_THREADS_RUNNERS);
        assert_eq!(
            order(1),
            [
                Runner::Dsm,
                Runner::DsmRings,
                Runner::DsmTcp,
                Runner::Threads
            ]
        );
        let all_vs = jobs
            .iter()
            .filter(|j| matches!(j, Job::VsThreads { .. }))
            .count();
        assert_eq!(all_vs, 3 * 4 * knobs.vs_threads_reps);
        let prims: Vec<(usize, BenchTransport)> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Primitives { rep, .. } => Some((*rep, j.bench_transport()?)),
                _ => None,
            })
            .collect();
        assert_eq!(prims.len(), 3 * knobs.bench_runs);
        for rep in 0..knobs.bench_runs {
            let ran: Vec<BenchTransport> = prims
                .iter()
                .filter(|(r, _)| *r == rep)
                .map(|(_, t)| *t)
                .collect();
            assert_eq!(ran, BenchTransport::ALL, "repetition {rep}");
        }
    }

    #[test]
    fn vs_threads_inputs_follow_the_apps() {
        let k = Knobs::new(Mode::Quick, 2);
        let all = k.settings(&app_specs(Mode::Quick));
        assert_eq!(
            all.vs_threads,
            vec![
                ("sor".to_string(), "--size 2048 --iters 50".to_string()),
                ("sor".to_string(), "--size 1024 --iters 100".to_string()),
                ("fft".to_string(), "--dims 128x128x64".to_string()),
            ]
        );
        let only_tsp: Vec<AppSpec> = app_specs(Mode::Quick)
            .into_iter()
            .filter(|a| a.name == "tsp")
            .collect();
        assert!(k.settings(&only_tsp).vs_threads.is_empty());
    }
}

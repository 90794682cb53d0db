//! `dsm-bench-report`: the benchmark driver behind `scripts/bench`. Runs the suite, writes
//! `latest.json` and `latest.md` (and the plots, through `scripts/plot.py`) into the
//! results directory, and prints the targets' summary on stdout.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use scripts::analysis;
use scripts::model::Report;
use scripts::parse::Tool;
use scripts::suite::{self, Knobs, Mode, Paths};
use scripts::{machine, measure, render};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs dsm's benchmark suite: the applications with and without race detection (the
/// paper's Tables 1 and 3 and Figure 3), SOR and race kernels under ThreadSanitizer (and
/// Helgrind and DRD with --full), the DSM primitives and the speedups. Use it through
/// `scripts/bench`, which builds everything first.
#[derive(Parser, Debug)]
#[command(name = "dsm-bench-report", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Fewer repetitions, SOR with 50 iterations, no phase runs at N = 8: about 20 s.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Also run Helgrind and DRD (valgrind).
    #[arg(long)]
    full: bool,
    /// Repository root (C sources in scripts/c, plot script in scripts/).
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// Where the dsm binaries are [default: next to this executable].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Results directory [default: REPO/bench-results].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these apps (comma-separated), e.g. to try one app.
    #[arg(long, value_delimiter = ',')]
    apps: Option<Vec<String>>,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Re-renders a report's Markdown from its JSON (prints it on stdout).
    Render { json: PathBuf },
    /// The round-trip model for one job: reads its ranks' stats files (`DSM_STATS_FILE`),
    /// prints the round trips each rank waited for and what the job would lose at one-way
    /// delays of 25, 100 and 500 us; with --delay-us D --base-us B, the difference the model
    /// predicts between a run at one-way delay D and one at B (e.g. across namespaces and
    /// on loopback, each half a measured round trip).
    RoundTrips {
        #[arg(long, requires = "base_us")]
        delay_us: Option<f64>,
        #[arg(long, requires = "delay_us")]
        base_us: Option<f64>,
        #[arg(required = true)]
        stats_files: Vec<PathBuf>,
    },
    /// Internal: runs one program with a time limit and reports its peak RSS.
    #[command(hide = true)]
    Measure {
        #[arg(long)]
        timeout_ms: u64,
        #[arg(long)]
        report: PathBuf,
        #[arg(long)]
        sample_children: bool,
        #[arg(last = true, required = true)]
        command: Vec<OsString>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match &cli.cmd {
        Some(Cmd::Measure {
            timeout_ms,
            report,
            sample_children,
            command,
        }) => measure::helper_main(
            Duration::from_millis(*timeout_ms),
            report,
            *sample_children,
            &command[0],
            &command[1..],
        ),
        Some(Cmd::Render { json }) => {
            let text = std::fs::read_to_string(json)
                .with_context(|| format!("reading {}", json.display()))?;
            let r: Report = serde_json::from_str(&text).context("parsing the report")?;
            print!("{}", render::render(&r));
            Ok(())
        }
        Some(Cmd::RoundTrips {
            delay_us,
            base_us,
            stats_files,
        }) => round_trips(stats_files, delay_us.zip(*base_us)),
        None => run(&cli),
    }
}

fn round_trips(files: &[PathBuf], check: Option<(f64, f64)>) -> Result<()> {
    use scripts::delay;
    let values = files
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", f.display()))
        })
        .collect::<Result<Vec<serde_json::Value>>>()?;
    let stats = scripts::parse::combine_stats(&values).map_err(anyhow::Error::msg)?;
    let ranks = &stats.rank_waits;
    if ranks.is_empty() {
        bail!("the stats files have no delay counters (written by an older dsm?)");
    }
    for w in ranks {
        println!(
            "rank {}: {} round trips, {} delays: {}",
            w.rank,
            w.round_trips(),
            w.delays(),
            w.breakdown()
        );
    }
    let critical = delay::critical_rank(ranks).context("no ranks")?;
    println!("slowest rank: {}", critical.rank);
    for d in delay::DELAYS_US {
        let loss = delay::projected_loss_s(ranks, d).context("no ranks")?;
        println!("loss at D = {d} us: {loss:.6} s");
    }
    if let Some((d, base)) = check {
        let diff = delay::predicted_difference_s(ranks, d, base).context("no ranks")?;
        println!("predicted difference at D = {d} us over {base} us: {diff:.6} s");
    }
    Ok(())
}

const PLOTS: &[&str] = &["breakdown.png", "speedup.png", "peers.png", "slowdown.png"];

fn run(cli: &Cli) -> Result<()> {
    let started = Instant::now();
    let mode = if cli.quick {
        Mode::Quick
    } else if cli.full {
        Mode::Full
    } else {
        Mode::Normal
    };
    let paths = prepare_paths(cli)?;
    let machine = machine::machine();
    let date = machine::now_utc();
    let knobs = Knobs::new(mode, machine.cores);
    let mut specs = suite::app_specs(mode);
    if let Some(only) = &cli.apps {
        specs.retain(|a| only.iter().any(|o| o == a.name));
    }
    eprintln!("bench: building the C peer programs");
    let tools = suite::prepare_tools(&paths, &knobs);
    let jobs = suite::plan(&knobs, &specs, &tools, &paths);
    eprintln!(
        "bench: {} runs, mode {} ({} cores); results in {}",
        jobs.len(),
        mode.name(),
        machine.cores,
        paths.out_dir.display()
    );
    let records = suite::execute(&jobs, &knobs, &paths, &tools)?;

    let ctx = analysis_context(&paths, &knobs, &specs, &tools, machine);
    let command = |j: &scripts::model::Job| suite::command_line(j, &knobs, &paths, &tools);
    let mut report = analysis::analyze(&ctx, records, &command);
    report.date = date;
    report.git = machine::git_describe(&paths.repo);
    if let Ok(v) = &tools.valgrind {
        report.notes.push(format!("valgrind: {v}"));
    }
    let md_path = write_results(cli, &paths, &mut report, started)?;
    let _ = std::fs::remove_dir_all(&paths.work);

    print!("{}", render::summary(&report));
    println!(
        "report: {} ({} runs, {} failed, {:.0} s)",
        md_path.display(),
        report.runs.len(),
        report
            .failures
            .iter()
            .map(|f| f.count.max(1))
            .sum::<usize>(),
        report.duration_s
    );
    Ok(())
}

/// The run's directories from the command line, with the work directory created; fails
/// early when dsmrun has not been built.
fn prepare_paths(cli: &Cli) -> Result<Paths> {
    let repo = cli
        .repo
        .canonicalize()
        .with_context(|| format!("repository {}", cli.repo.display()))?;
    let bin_dir = match &cli.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("executable has no directory")?
            .to_path_buf(),
    };
    let out_dir = cli
        .out
        .clone()
        .unwrap_or_else(|| repo.join("bench-results"));
    let work = out_dir.join(".work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let paths = Paths {
        repo: repo.clone(),
        out_dir,
        bin_dir,
        c_dir: repo.join("scripts").join("c"),
        work,
    };
    if suite::app_available(&paths, "dsmrun").is_err() {
        bail!(
            "dsmrun not found in {}: build the workspace first (scripts/bench does)",
            paths.bin_dir.display()
        );
    }
    Ok(paths)
}

/// What the analysis needs beyond the runs: the settings, and what could not run and why.
fn analysis_context(
    paths: &Paths,
    knobs: &Knobs,
    specs: &[suite::AppSpec],
    tools: &suite::Tools,
    machine: scripts::model::Machine,
) -> analysis::Context {
    let mut missing_apps = std::collections::BTreeMap::new();
    for a in specs
        .iter()
        .map(|a| a.name)
        .chain(["race-kernel", "dsm-bench"])
    {
        if let Err(why) = suite::app_available(paths, a) {
            missing_apps.insert(a.to_string(), why);
        }
    }
    let mut missing_tools = std::collections::BTreeMap::new();
    for t in [Tool::Plain, Tool::Tsan, Tool::Helgrind, Tool::Drd] {
        if let Err(why) = tools.available(t) {
            missing_tools.insert(t, why);
        }
    }
    let missing_c = scripts::model::CRunner::ALL
        .into_iter()
        .filter_map(|r| tools.c_apps.get(r).err().map(|why| (r, why)))
        .collect();
    analysis::Context {
        settings: knobs.settings(specs),
        machine,
        missing_apps,
        apps: specs.iter().map(|a| a.name.to_string()).collect(),
        kernels: suite::KERNELS
            .iter()
            .map(|(k, r)| (k.to_string(), *r))
            .collect(),
        missing_tools,
        missing_c,
    }
}

/// Writes `latest.json` (before the plots, which read it, and again after), the plots
/// and `latest.md`; returns the Markdown's path.
fn write_results(
    cli: &Cli,
    paths: &Paths,
    report: &mut Report,
    started: Instant,
) -> Result<PathBuf> {
    let out_dir = &paths.out_dir;
    let json_path = out_dir.join("latest.json");
    let write_json = |r: &Report| -> Result<()> {
        std::fs::write(&json_path, serde_json::to_string_pretty(r)? + "\n")
            .with_context(|| format!("writing {}", json_path.display()))
    };
    report.duration_s = started.elapsed().as_secs_f64();
    write_json(report)?;
    if cli.no_plots {
        report.plots_note = Some("--no-plots was given".into());
    } else {
        match plots(
            &paths.repo.join("scripts").join("plot.py"),
            &json_path,
            out_dir,
        ) {
            Ok(p) => report.plots = p,
            Err(e) => report.plots_note = Some(e),
        }
    }
    report.duration_s = started.elapsed().as_secs_f64();
    write_json(report)?;
    let md_path = out_dir.join("latest.md");
    std::fs::write(&md_path, render::render(report))
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(md_path)
}

/// Runs the plot script; returns the PNG names it wrote, or why there are none.
fn plots(script: &Path, json: &Path, out_dir: &Path) -> Result<Vec<String>, String> {
    for p in PLOTS {
        let _ = std::fs::remove_file(out_dir.join(p));
    }
    let out = Command::new("python3")
        .arg(script)
        .arg(json)
        .arg(out_dir)
        .output()
        .map_err(|e| format!("python3 not found ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            scripts::parse::tail(&String::from_utf8_lossy(&out.stderr), 3)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| PLOTS.contains(l) && out_dir.join(l).is_file())
        .map(String::from)
        .collect())
}

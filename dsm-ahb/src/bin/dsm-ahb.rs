//! `dsm-ahb`: the orderings of a semaphore trace (`dsmrun --sem-trace`) that hold in every
//! feasible execution, or (`--table1`) the paper's Table 1 measured for this analysis.
//! Exit status: 0 done, 1 the analysis reported an ordering the brute force rejects,
//! 2 usage error or unreadable/corrupt trace.

use anyhow::Context;
use clap::Parser;
use dsm_ahb::table1::{self, PAPER};
use dsm_ahb::{analyse, brute_force, edges, format, is_subset, observed, GenParams, Order, Trace};
use std::io::BufReader;
use std::process::ExitCode;

/// Print the "always happens before" orderings of a semaphore trace.
#[derive(Parser, Debug)]
#[command(
    name = "dsm-ahb",
    version,
    after_help = "\
Each line of output is one ordering between operations of two different nodes,
'node:position op semaphore -> node:position op semaphore' (positions count a
node's semaphore operations from 1 over the whole run); orderings implied by
program order and transitivity are left out. A trace with barriers is analysed
one epoch (the operations between two barriers) at a time, each under a line
'# epoch E: ...': a barrier orders everything before it before everything after
it. Given several files, they are taken as the per-rank parts (FILE.rank<R>) of
one run and merged first.

With --table1 no file is read: random traces of --events operations are generated
as in the paper's Figure 5 and the share of them where the analysis at depths 0
(the rewind alone) to --depth (default 3 there, as in the paper) misses an
ordering of the brute force is printed beside the paper's Table 1, with the
paper's Algorithm 2 as printed for comparison.
Exit status: 0 done, 1 the analysis reported an ordering the brute force rejects,
2 usage error or unreadable/corrupt trace."
)]
struct Cli {
    /// How deep the expansion searches each candidate signal's own needs (0: the rewind
    /// alone); higher finds more orderings and costs more (exponential in the depth).
    /// Default 2; with --table1, the deepest depth measured (default 3)
    #[arg(long)]
    depth: Option<u32>,
    /// Compute the exact order by exhaustive search of the reachable states instead
    /// (only for small traces), and say what the bounded analysis at --depth misses
    #[arg(long)]
    brute_force: bool,
    /// Most states the brute-force search may visit
    #[arg(long, default_value_t = 50_000_000)]
    max_states: u64,
    /// Also print the order the run itself observed (its signal-to-wait pairing)
    #[arg(long)]
    observed: bool,
    /// Measure the paper's Table 1 on random traces instead of reading a file
    #[arg(long, conflicts_with_all = ["files", "brute_force", "observed"])]
    table1: bool,
    /// --table1: operations per trace (the paper has figures for 30, 35 and 40)
    #[arg(long, default_value_t = 30, requires = "table1",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    events: usize,
    /// --table1: traces generated
    #[arg(long, default_value_t = 5000, requires = "table1",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    traces: usize,
    /// --table1: seed of the random generator
    #[arg(long, default_value_t = 1, requires = "table1")]
    seed: u64,
    /// --table1: nodes per trace are drawn from 2 to this (the paper does not say its own)
    #[arg(long, default_value_t = 4, requires = "table1",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
    max_tasks: usize,
    /// --table1: semaphores per trace are drawn from 1 to this (nor this)
    #[arg(long, default_value_t = 3, requires = "table1",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_sems: usize,
    /// The trace file (or the per-rank parts of one)
    #[arg(required_unless_present = "table1")]
    files: Vec<std::path::PathBuf>,
}

fn load(files: &[std::path::PathBuf]) -> anyhow::Result<Trace> {
    let open = |p: &std::path::PathBuf| {
        std::fs::File::open(p)
            .map(BufReader::new)
            .with_context(|| format!("cannot open {}", p.display()))
    };
    if files.len() == 1 {
        format::read_trace(open(&files[0])?)
            .with_context(|| format!("semaphore trace {}", files[0].display()))
    } else {
        let parts = files.iter().map(open).collect::<Result<Vec<_>, _>>()?;
        format::merge_parts(parts, std::io::sink()).context("merging the part files")
    }
}

/// Prints an order's orderings; `offset[node]` is added to positions (the operations of
/// the node in earlier epochs).
fn print(trace: &Trace, offset: &[usize], title: &str, order: &Order) {
    let e = edges(order);
    println!("# {title}: {} orderings", e.len());
    let name = |(node, pos): (usize, usize)| {
        let ev = &trace.events[node][pos];
        let op = match ev.op {
            dsm_ahb::Op::Wait => "wait",
            dsm_ahb::Op::Signal => "signal",
        };
        format!(
            "{node}:{} {op} {}",
            offset[node] + pos + 1,
            trace.sem_names[ev.sem]
        )
    };
    for (a, b) in e {
        println!("{} -> {}", name(a), name(b));
    }
}

/// Prints Table 1 for `cli.events`; `Ok(false)` if some ordering was unsound.
fn table(cli: &Cli) -> anyhow::Result<bool> {
    let params = GenParams {
        max_tasks: cli.max_tasks,
        max_sems: cli.max_sems,
        events: cli.events,
        max_initial: 0,
    };
    let max_depth = cli.depth.unwrap_or(3);
    let depths = max_depth as usize + 1;
    let row = table1::measure(params, cli.traces, cli.seed, max_depth)?;
    println!(
        "# Table 1, {} operations, {} traces (seed {}, MaxTasks {}, MaxSemaphores {})",
        cli.events, cli.traces, cli.seed, cli.max_tasks, cli.max_sems
    );
    println!("# % of traces missing at least one ordering of the brute force (reachable states)");
    let head: Vec<String> = (0..depths)
        .map(|d| {
            if d == 0 {
                format!("{:>8}", "original")
            } else {
                format!("{:>8}", format!("depth {d}"))
            }
        })
        .collect();
    println!("{:<28} {}", "", head.join(" "));
    let line = |name: &str, v: Vec<Option<f64>>| {
        let cells: Vec<String> = v
            .iter()
            .map(|x| x.map_or(format!("{:>8}", "-"), |x| format!("{x:>8.2}")))
            .collect();
        println!("{name:<28} {}", cells.join(" "));
    };
    match PAPER.iter().find(|p| p.0 == cli.events) {
        Some(&(_, figures, n)) => line(
            &format!("paper ({n} traces)"),
            (0..depths).map(|d| figures.get(d).copied()).collect(),
        ),
        None => println!("{:<28} (no figures for {} operations)", "paper", cli.events),
    }
    let pcts = |v: &[usize]| v.iter().map(|&m| Some(row.pct(m))).collect();
    line("dsm-ahb (original: rewind)", pcts(&row.missed));
    line("Algorithm 2 as printed", pcts(&row.printed_missed));
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / cli.traces.max(1) as f64;
    let times: Vec<String> = row
        .time
        .iter()
        .enumerate()
        .map(|(d, &t)| format!("depth {d} {:.0}", us(t)))
        .collect();
    println!(
        "time per trace (us): {}; brute force {:.0}",
        times.join(", "),
        us(row.brute_time)
    );
    if max_depth < table1::DEEP {
        println!(
            "of the {} traces depth {max_depth} misses, depth {} finds all orderings of {}",
            row.missed[depths - 1],
            table1::DEEP,
            row.deeper_finds
        );
    }
    println!(
        "complete executions only would change the reference on {:.2} % of traces",
        row.pct(row.complete_differs)
    );
    let unsound: usize = row.unsound.iter().sum();
    println!(
        "unsound: dsm-ahb {} traces, as printed {} traces",
        unsound,
        row.printed_unsound.iter().sum::<usize>()
    );
    Ok(unsound == 0)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.table1 {
        return Ok(if table(&cli)? {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let whole = load(&cli.files)?;
    let depth = cli.depth.unwrap_or(2);
    let epochs = whole.epochs();
    for (k, epoch) in epochs.iter().enumerate() {
        let (trace, offset) = (&epoch.trace, &epoch.offset[..]);
        if epochs.len() > 1 {
            let ops: Vec<String> = (0..trace.nodes())
                .map(|j| {
                    let n = trace.events[j].len();
                    if n == 0 {
                        format!("node {j} none")
                    } else {
                        format!("node {j} {}-{}", offset[j] + 1, offset[j] + n)
                    }
                })
                .collect();
            let end = if k + 1 == epochs.len() {
                "the end".to_string()
            } else {
                format!("barrier {}", k + 1)
            };
            let start = if k == 0 {
                "the start".to_string()
            } else {
                format!("barrier {k}")
            };
            println!(
                "# epoch {}: from {start} to {end}, operations {}",
                k + 1,
                ops.join(", ")
            );
        }
        let context = || format!("epoch {}", k + 1);
        let obs = observed(trace).with_context(context)?;
        if cli.observed {
            print(trace, offset, "observed order", &obs);
        }
        let bounded = analyse(trace, depth).with_context(context)?;
        if cli.brute_force {
            let exact = brute_force(trace, cli.max_states).with_context(context)?;
            print(trace, offset, "always happens before (brute force)", &exact);
            anyhow::ensure!(
                is_subset(&bounded, &exact),
                "internal error: the bounded analysis reports an ordering the brute force \
                 rejects (epoch {})",
                k + 1
            );
            let missed = edges(&exact).len().saturating_sub(edges(&bounded).len());
            println!(
                "# the analysis at depth {depth} {}",
                if bounded == exact {
                    "finds every one of them".to_string()
                } else {
                    format!("misses some of them (about {missed} direct orderings)")
                }
            );
        } else {
            print(
                trace,
                offset,
                &format!("always happens before (depth {depth})"),
                &bounded,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dsm-ahb: {e:#}");
            ExitCode::from(2)
        }
    }
}

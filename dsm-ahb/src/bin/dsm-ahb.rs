//! `dsm-ahb`: the orderings of a semaphore trace (`dsmrun --sem-trace`) that hold in every
//! feasible execution. Exit status: 0 done, 2 usage error or unreadable/corrupt trace.

use anyhow::Context;
use clap::Parser;
use dsm_ahb::{analyse, brute_force, edges, format, is_subset, observed, Order, Trace};
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
node's semaphore operations from 1); orderings implied by program order and
transitivity are left out. Given several files, they are taken as the per-rank
parts (FILE.rank<R>) of one run and merged first.
Exit status: 0 done, 2 usage error or unreadable/corrupt trace."
)]
struct Cli {
    /// Levels of Observation 4 the analysis applies (0: the rewind alone); higher finds
    /// more orderings and costs more (exponential in the depth)
    #[arg(long, default_value_t = 2)]
    depth: u32,
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
    /// The trace file (or the per-rank parts of one)
    #[arg(required = true)]
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

fn print(trace: &Trace, title: &str, order: &Order) {
    let e = edges(order);
    println!("# {title}: {} orderings", e.len());
    let name = |(node, pos): (usize, usize)| {
        let ev = &trace.events[node][pos];
        let op = match ev.op {
            dsm_ahb::Op::Wait => "wait",
            dsm_ahb::Op::Signal => "signal",
        };
        format!("{node}:{} {op} {}", pos + 1, trace.sem_names[ev.sem])
    };
    for (a, b) in e {
        println!("{} -> {}", name(a), name(b));
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let trace = load(&cli.files)?;
    let obs = observed(&trace)?;
    if cli.observed {
        print(&trace, "observed order", &obs);
    }
    let bounded = analyse(&trace, cli.depth)?;
    if cli.brute_force {
        let exact = brute_force(&trace, cli.max_states)?;
        print(&trace, "always happens before (brute force)", &exact);
        anyhow::ensure!(
            is_subset(&bounded, &exact),
            "internal error: the bounded analysis reports an ordering the brute force rejects"
        );
        let missed = edges(&exact).len().saturating_sub(edges(&bounded).len());
        println!(
            "# the analysis at depth {} {}",
            cli.depth,
            if bounded == exact {
                "finds every one of them".to_string()
            } else {
                format!("misses some of them (about {missed} direct orderings)")
            }
        );
    } else {
        print(
            &trace,
            &format!("always happens before (depth {})", cli.depth),
            &bounded,
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dsm-ahb: {e:#}");
            ExitCode::from(2)
        }
    }
}

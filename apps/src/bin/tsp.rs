//! `tsp`: travelling salesman by parallel branch and bound on the DSM, verified against
//! Held-Karp dynamic programming.

use anyhow::Context;
use apps::tsp::{heldkarp, input, search, Instance};
use apps::tsp::{COMFORTABLE_CITIES, MAX_CITIES, VERIFY_MAX_CITIES};
use apps::{fail, secs};
use clap::Parser;
use dsm_core::Dsm;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const DEFAULT_CITIES: usize = 19;
const DEFAULT_SEED: u64 = 1;

/// Exact travelling salesman by parallel branch and bound on the DSM, checked with
/// Held-Karp.
///
/// All nodes share a priority queue of partial tours (best lower bound first) and the
/// best length found so far; a node expands large partial tours through the queue and
/// solves small ones depth-first on its own. As in the original program the search reads the shared bound without a
/// lock (a deliberate data race; `--locked-bound` is the race-free variant). Rank 0
/// checks the optimal length with Held-Karp (up to 20 cities) and prints a `verified:`
/// line; a disagreement exits with status 1, an unreadable input with status 2.
///
/// The `sequential(Held-Karp)` time on that line is the verifier's: dynamic programming,
/// a different algorithm from the branch and bound, so a speedup computed against it
/// compares different algorithms (compare parallel times across node counts instead).
#[derive(Parser, Debug)]
#[command(name = "tsp", version)]
struct Args {
    /// Random instance with N cities, 1..=32 (the default instance has 19)
    #[arg(long, value_name = "N", visible_alias = "cities",
          conflicts_with_all = ["file", "tsplib"])]
    random: Option<usize>,
    /// Seed of the random instance
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Make the random instance asymmetric (each direction drawn separately)
    #[arg(long)]
    asymmetric: bool,
    /// Read the instance from a file: a matrix file (the city count N on the first
    /// line, then N lines of N integer weights) or a TSPLIB file, told apart by content
    #[arg(long, value_name = "PATH", conflicts_with = "tsplib")]
    file: Option<PathBuf>,
    /// Read a TSPLIB .tsp/.atsp file (EUC_2D, CEIL_2D, GEO, ATT, or EXPLICIT weights)
    #[arg(long, value_name = "PATH")]
    tsplib: Option<PathBuf>,
    /// Solve partial tours with at most K unvisited cities depth-first on one node
    /// instead of expanding them through the shared queue [default: N-4]
    #[arg(long, value_name = "K")]
    depth_first: Option<usize>,
    /// Capacity of the shared pool of partial tours; when it is full, a node solves the
    /// children that do not fit depth-first itself [default: every tour the queue can
    /// hold at threshold K, at most 65536]
    #[arg(long, value_name = "TOURS")]
    pool: Option<usize>,
    /// Most partial tours a node takes from the queue per lock acquire: more means fewer
    /// acquires of the queue's lock (round trips across hosts), but a node may hold work
    /// another node is idle for
    #[arg(long, value_name = "B", default_value_t = search::DEFAULT_BATCH)]
    batch: usize,
    /// Read the shared bound only under its lock (the race-free variant): a lock acquire
    /// per read of the bound instead of a plain read that may see a stale bound (which
    /// only prunes less)
    #[arg(long)]
    locked_bound: bool,
    /// Skip the Held-Karp check (it is skipped anyway above 20 cities)
    #[arg(long)]
    no_verify: bool,
    /// Every rank prints its DSM protocol counters (faults, diffs, lock acquires) at the end
    #[arg(long)]
    dsm_stats: bool,
}

fn load(args: &Args) -> Result<Instance, String> {
    if let Some(p) = &args.tsplib {
        input::load(p, input::Format::Tsplib)
    } else if let Some(p) = &args.file {
        input::load(p, input::Format::Auto)
    } else {
        let n = args.random.unwrap_or(DEFAULT_CITIES);
        Ok(input::random(n, args.seed, args.asymmetric))
    }
}

fn main() -> ExitCode {
    apps::main_with(run)
}

fn run() -> anyhow::Result<ExitCode> {
    apps::init_logging();
    let args = Args::parse();
    check_args(&args);
    let loaded = load(&args);
    let mut dsm = Dsm::init().context("joining the DSM job")?;
    let rank = dsm.rank();
    let Some(inst) = agreed_instance(&mut dsm, loaded)? else {
        let _ = dsm.finish()?;
        return Ok(ExitCode::from(2));
    };
    let n = inst.n;
    if rank == 0 && n > COMFORTABLE_CITIES {
        eprintln!("tsp: warning: {n} cities; the search may take very long");
    }
    let depth_first = args
        .depth_first
        .unwrap_or_else(|| search::default_depth_first(n));
    let cfg = search::Config {
        depth_first,
        pool: args
            .pool
            .unwrap_or_else(|| search::default_pool(n, depth_first)),
        batch: args.batch,
        locked_bound: args.locked_bound,
    };
    let solver = search::Solver::new(&inst);
    let shared = search::setup(&mut dsm, &solver, &cfg)?;
    let t = Instant::now();
    let stats = search::run(&mut dsm, &shared, &solver, &cfg)?;
    search::publish_stats(&dsm, &shared, &stats);
    dsm.barrier()?;
    let parallel = secs(t);
    if rank == 0 {
        let out = search::outcome(&dsm, &shared);
        report_tour(&args, &inst, &out, dsm.size(), parallel);
        report_stats(&cfg, &out);
    }
    if args.dsm_stats {
        println!("dsm-stats: rank {rank}: {:?}", dsm.stats());
    }
    Ok(dsm.finish()?.exit_code())
}

/// Exits with a usage error on arguments clap cannot check.
fn check_args(args: &Args) {
    if let Some(n) = args.random {
        if !(1..=MAX_CITIES).contains(&n) {
            apps::usage_error::<Args>(format!(
                "--random {n}: the number of cities must be in 1..={MAX_CITIES}"
            ));
        }
    }
    if args.pool == Some(0) {
        apps::usage_error::<Args>("--pool must be at least 1");
    }
    if args.batch == 0 {
        apps::usage_error::<Args>("--batch must be at least 1");
    }
}

/// The instance every node read, once all agree on it; `None` (said on stderr) when a
/// node could not read it or read a different one.
fn agreed_instance(
    dsm: &mut Dsm,
    loaded: Result<Instance, String>,
) -> anyhow::Result<Option<Instance>> {
    let rank = dsm.rank();
    // Every node reads the input itself; they must agree before sharing anything.
    let mine = loaded.as_ref().map_or(0, Instance::fingerprint);
    let all = search::agree_on_input(dsm, mine)?;
    match loaded {
        Err(msg) => {
            if rank == 0 || all[0] != 0 {
                eprintln!("tsp: {msg}");
            }
            Ok(None)
        }
        Ok(_) if all.iter().any(|&f| f != mine) => {
            if rank == 0 {
                let odd: Vec<String> = (0..all.len())
                    .filter(|&r| all[r] != mine)
                    .map(|r| r.to_string())
                    .collect();
                eprintln!(
                    "tsp: ranks {} could not read the instance or read a different one",
                    odd.join(", ")
                );
            }
            Ok(None)
        }
        Ok(inst) => Ok(Some(inst)),
    }
}

/// Rank 0's check of the shared best tour and its `verified:` (or `done:`) line; a wrong
/// tour, or a length Held-Karp disagrees with, fails the run.
fn report_tour(args: &Args, inst: &Instance, out: &search::Outcome, nodes: usize, parallel: f64) {
    let n = inst.n;
    let tour_text = out
        .tour
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    if !inst.is_tour(&out.tour) || inst.tour_length(&out.tour) != out.length {
        fail(&format!(
            "tsp {n} cities: the shared best tour [{tour_text}] is not a tour of length {} (its length is {})",
            out.length,
            inst.tour_length(&out.tour)
        ));
    }
    let what = format!("tsp {n} cities ({})", inst.name);
    let bound_mode = if args.locked_bound {
        "locked bound"
    } else {
        "unlocked bound reads"
    };
    if args.no_verify || n > VERIFY_MAX_CITIES {
        let why = if args.no_verify {
            "--no-verify".to_string()
        } else {
            format!("Held-Karp is only run up to {VERIFY_MAX_CITIES} cities")
        };
        println!(
            "done: {what}, length {} (not verified: {why}), tour {tour_text}, {}, {bound_mode}, parallel {parallel:.4} s",
            out.length,
            apps::nodes(nodes)
        );
    } else {
        let t = Instant::now();
        let want = heldkarp::held_karp(inst);
        let sequential = secs(t);
        if want != out.length {
            fail(&format!(
                "{what}: branch and bound found length {} but Held-Karp says {want}",
                out.length
            ));
        }
        println!(
            "verified: {what}, optimal length {} (Held-Karp agrees), tour {tour_text}, {}, {bound_mode}, parallel {parallel:.4} s, sequential(Held-Karp) {sequential:.4} s",
            out.length,
            apps::nodes(nodes)
        );
    }
}

/// Rank 0's `stats:` line: the search's counters summed over the nodes.
fn report_stats(cfg: &search::Config, out: &search::Outcome) {
    let mut total = search::Stats::default();
    for s in &out.per_node {
        total.add(s);
    }
    println!(
        "stats: depth-first threshold {} unvisited cities, pool {}: {} tours expanded, {} subproblems solved depth-first ({} of them because the pool was full), {} search nodes, {} pruned, {} bound improvements, {} queue-lock and {} bound-lock acquires, {} idle waits",
        cfg.depth_first,
        cfg.pool,
        total.expanded,
        total.subproblems,
        total.overflow,
        total.dfs_nodes,
        total.pruned,
        total.improvements,
        total.queue_locks,
        total.bound_locks,
        total.idle
    );
}

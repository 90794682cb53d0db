//! `water`: N-squared water molecular dynamics on the DSM, verified against a sequential
//! run of the same simulation and for energy conservation.

use anyhow::Context;
use apps::water::{self, LockMode, Params, RunOptions};
use apps::{fail, secs};
use clap::{Parser, ValueEnum};
use dsm_core::Dsm;
use std::process::ExitCode;
use std::time::Instant;

/// Molecular dynamics of liquid water (flexible 3-site TIP3P-like molecules, Lennard-Jones
/// plus Coulomb within a cutoff of half the periodic box, 6th-order Gear
/// predictor-corrector), molecules block-partitioned over the nodes, force sums added
/// under locks. Rank 0 prints the energies of every step, reruns the simulation
/// sequentially, checks that the energies agree to a relative 1e-9 and that the total
/// energy is conserved (drift within 5e-5 + 5e-7 per step of |K| + |U| at the default time
/// step, more for longer steps), and prints a `verified:` line with timings; a failure
/// exits with status 1. The sequential time is that of the same simulation on local
/// memory (no DSM, no locks), timed like the parallel run (the steps, not the setup).
#[derive(Parser, Debug)]
#[command(name = "water", version)]
struct Args {
    /// Number of molecules; must be a perfect cube (they start on a k x k x k lattice).
    #[arg(long, default_value_t = water::DEFAULT_MOLECULES, value_parser = parse_molecules)]
    molecules: usize,
    /// Number of time steps.
    #[arg(long, default_value_t = water::DEFAULT_STEPS)]
    steps: usize,
    /// Time step in femtoseconds.
    #[arg(long, default_value_t = water::DEFAULT_DT_FS, value_parser = parse_dt, allow_negative_numbers = true)]
    dt: f64,
    /// Lock granularity for adding force sums. `molecule`: one lock per molecule, as
    /// water-nsquared does: short critical sections, but thousands of acquires per node and
    /// force phase, whose tokens are asked for ahead in batches (across hosts an acquire
    /// otherwise waits a round trip when the lock was last held elsewhere).
    /// `block`: one lock per node's block of molecules: N acquires per node and phase,
    /// but a node adds a whole block under one lock, so the others wait longer for it.
    /// Same result up to the order of the floating-point sums.
    #[arg(long, value_enum, default_value_t = Locks::Molecule)]
    locks: Locks,
    /// Seeded bug: add the inter-molecular force sums into the shared "forces" array
    /// without their locks (a write-write race). Verification is skipped.
    #[arg(long)]
    racy: bool,
    /// Skip the sequential check (for timing runs only).
    #[arg(long)]
    no_verify: bool,
    /// Mark the lock-protected sums ("forces", "energy") as order-independent, so that
    /// schedule mode (`dsmrun --race=schedule`) does not report their lock-order
    /// dependences (`Dsm::order_independent`; floating-point sums commute up to rounding).
    #[arg(long)]
    order_independent_sums: bool,
}

fn parse_molecules(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    Params::new(n, 0, water::DEFAULT_DT_FS).map(|_| n)
}

fn parse_dt(s: &str) -> Result<f64, String> {
    let dt: f64 = s.parse().map_err(|e| format!("{e}"))?;
    Params::new(1, 0, dt).map(|_| dt)
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Locks {
    Block,
    Molecule,
}

fn main() -> ExitCode {
    apps::main_with(run)
}

fn run() -> anyhow::Result<ExitCode> {
    apps::init_logging();
    let args = Args::parse();
    let p = Params::new(args.molecules, args.steps, args.dt).map_err(anyhow::Error::msg)?;
    let opts = RunOptions {
        locks: match args.locks {
            Locks::Block => LockMode::Block,
            Locks::Molecule => LockMode::Molecule,
        },
        racy: args.racy,
    };
    let mut dsm = Dsm::init().context("joining the DSM job")?;
    let (rank, nodes) = (dsm.rank(), dsm.size());
    if args.order_independent_sums {
        dsm.order_independent("forces");
        dsm.order_independent("energy");
    }
    if rank == 0 {
        let geo = p.geometry();
        println!(
            "water: {} molecules, {} steps of {} fs, box {:.4} A, cutoff {:.4} A, {}, {:?} locks{}",
            p.molecules,
            p.steps,
            p.dt * 1e3,
            geo.side,
            geo.cutoff,
            apps::nodes(nodes),
            opts.locks,
            if opts.racy { ", RACY force sums" } else { "" }
        );
    }
    let shared = water::setup(&mut dsm, &p)?;
    let t = Instant::now();
    let got = water::run(&mut dsm, &shared, &p, opts, |step, e| {
        println!("{}", water::step_line(&p, step, e));
    })?;
    let parallel = secs(t);
    if rank == 0 {
        let what = format!(
            "water {} molecules, {} steps, {}",
            p.molecules,
            p.steps,
            apps::nodes(nodes)
        );
        let drift = water::energy_drift(&got);
        let bound = water::drift_bound(&p);
        if args.no_verify {
            println!(
                "done: {what}: energy drift {drift:.3e}, parallel {parallel:.4} s (not verified)"
            );
        } else {
            // Timed like the parallel run: the simulation, not the initial state.
            let init = water::initial_state(&p);
            let t = Instant::now();
            let (want, _) = water::simulate(&p, init);
            let sequential = secs(t);
            let diff = water::max_rel_diff(&got, &want);
            let seq_drift = water::energy_drift(&want);
            if args.racy {
                println!(
                    "unverified: {what} with --racy (verification skipped): energies vs sequential max rel diff {diff:.3e}, energy drift {drift:.3e}, parallel {parallel:.4} s, sequential {sequential:.4} s"
                );
            } else {
                if diff.is_nan() || diff > water::MATCH_TOLERANCE {
                    let step = got
                        .iter()
                        .zip(&want)
                        .position(|(g, w)| {
                            water::max_rel_diff(&[*g], &[*w]) > water::MATCH_TOLERANCE
                        })
                        .unwrap_or(0);
                    fail(&format!(
                        "{what}: energies differ from the sequential run by {diff:.3e} relative (tolerance {:.0e}); first at step {step}: got total {:.9} want {:.9} kJ/mol",
                        water::MATCH_TOLERANCE,
                        water::kj(got.get(step).map_or(f64::NAN, |e| e.total())),
                        water::kj(want[step].total()),
                    ));
                }
                if [drift, seq_drift].iter().any(|d| d.is_nan() || *d > bound) {
                    fail(&format!(
                        "{what}: total energy not conserved: drift {drift:.3e} (sequential {seq_drift:.3e}) of |K(0)|+|U(0)| exceeds the bound {bound:.2e}"
                    ));
                }
                println!(
                    "verified: {what}: energies match sequential (max rel diff {diff:.3e}), energy drift {drift:.3e} (bound {bound:.2e}), parallel {parallel:.4} s, sequential {sequential:.4} s"
                );
            }
        }
    }
    Ok(dsm.finish()?.exit_code())
}

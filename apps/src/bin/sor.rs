//! `sor`: red-black SOR on the DSM, verified bitwise against a sequential run.

use anyhow::Context;
use apps::{fail, secs, sor};
use clap::Parser;
use dsm_core::Dsm;
use std::process::ExitCode;
use std::time::Instant;

/// Red-black successive over-relaxation on an N x N grid shared by all nodes. Rank 0
/// checks the result against a sequential computation (must be bitwise identical) and
/// prints a `verified:` line with timings; any mismatch exits with status 1. The
/// sequential time (and the speedup) is that of a plain optimised loop on a local grid,
/// with the same updates in the same order and no DSM, timed like the parallel run
/// (iterations only).
#[derive(Parser, Debug)]
#[command(name = "sor", version)]
struct Args {
    /// Grid size N (N x N points of f64), at least 3.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(3..))]
    size: u64,
    /// Red-black iterations.
    #[arg(long, default_value_t = 100)]
    iters: usize,
    /// Over-relaxation factor, strictly between 0 and 2 (where SOR converges).
    #[arg(long, default_value_t = sor::DEFAULT_OMEGA, value_parser = parse_omega)]
    omega: f64,
    /// Skip the sequential check (for timing runs only).
    #[arg(long)]
    no_verify: bool,
    /// Testing value traces: add 1.0 to element (ROW, COL) just before the program's
    /// EPOCH-th barrier (initialisation is barrier 1; EPOCH is 2..=2*iters+1), so a
    /// comparison reports barrier EPOCH first. Implies --no-verify.
    #[arg(long, value_name = "EPOCH,ROW,COL", value_parser = parse_inject)]
    inject_bug: Option<sor::Inject>,
    /// No DSM: run the same kernel split over N plain threads of this one process (rows
    /// banded as across dsm's nodes, a barrier after each colour), check it bitwise
    /// against the sequential code and print a `threads:` line with both times. The
    /// baseline dsm at N nodes is measured against.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          conflicts_with = "inject_bug")]
    threads: Option<u64>,
}

fn parse_inject(text: &str) -> Result<sor::Inject, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let [e, r, c] = parts[..] else {
        return Err(format!("'{text}' is not EPOCH,ROW,COL"));
    };
    let num = |s: &str| {
        s.parse::<usize>()
            .map_err(|_| format!("'{s}' is not a number"))
    };
    Ok(sor::Inject {
        epoch: u32::try_from(num(e)?).map_err(|e| e.to_string())?,
        row: num(r)?,
        col: num(c)?,
    })
}

fn parse_omega(text: &str) -> Result<f64, String> {
    let omega: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if omega > 0.0 && omega < 2.0 {
        Ok(omega)
    } else {
        Err(format!(
            "{omega} is outside (0, 2), where successive over-relaxation converges"
        ))
    }
}

/// Fails (the app convention) unless `got` equals the sequential `want` bit for bit and is
/// finite: bitwise agreement of two NaN grids is not a verified result. Returns the checksum.
fn verified_checksum(what: &str, n: usize, got: &[f64], want: &[f64]) -> f64 {
    let differ = |(a, b): (&f64, &f64)| a.to_bits() != b.to_bits();
    let diffs = got.iter().zip(want).filter(|&p| differ(p)).count();
    if let Some(k) = got.iter().zip(want).position(differ) {
        fail(&format!(
            "{what}: {diffs} points differ from the sequential result; first at ({}, {}): got {} want {}",
            k / n,
            k % n,
            got[k],
            want[k]
        ));
    }
    let checksum: f64 = got.iter().sum();
    if !checksum.is_finite() {
        fail(&format!(
            "{what}: the result is not finite (checksum {checksum})"
        ));
    }
    checksum
}

/// `--threads N`: the threaded kernel and the sequential one on local grids, each timed
/// over the iterations only (the grid initialised beforehand), compared bitwise.
fn run_threads(n: usize, iters: usize, omega: f64, threads: usize) -> ExitCode {
    if threads > n {
        fail(&format!("--threads {threads} is more than the {n} rows"));
    }
    let mut want = sor::initial_grid(n);
    let t = Instant::now();
    sor::iterate(&mut want, n, iters, omega);
    let sequential = secs(t);
    let mut got = sor::initial_grid(n);
    let t = Instant::now();
    sor::iterate_threads(&mut got, n, iters, omega, threads);
    let threaded = secs(t);
    let checksum = verified_checksum(&format!("sor {n}x{n}, {threads} threads"), n, &got, &want);
    println!(
        "threads: sor {n}x{n}, {iters} iterations, {threads} threads: bitwise identical to sequential (checksum {checksum:.6}); threads {threaded:.4} s, sequential {sequential:.4} s, speedup {:.2}x",
        sequential / threaded
    );
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    apps::main_with(run)
}

fn run() -> anyhow::Result<ExitCode> {
    apps::init_logging();
    let args = Args::parse();
    let n = args.size as usize;
    if let Some(bug) = args.inject_bug {
        let last = 2 * args.iters + 1;
        if bug.epoch < 2 || bug.epoch as usize > last || bug.row >= n || bug.col >= n {
            apps::usage_error::<Args>(format!(
                "--inject-bug {},{},{}: EPOCH must be 2..={last} and ROW, COL below {n}",
                bug.epoch, bug.row, bug.col
            ));
        }
    }
    if let Some(threads) = args.threads {
        return Ok(run_threads(n, args.iters, args.omega, threads as usize));
    }
    let mut dsm = Dsm::init().context("joining the DSM job")?;
    let grid = sor::setup(&mut dsm, n)?;
    let t = Instant::now();
    sor::run_with(&mut dsm, &grid, n, args.iters, args.omega, args.inject_bug)?;
    let parallel = secs(t);
    if dsm.rank() == 0 {
        let mut got = vec![0.0f64; n * n];
        dsm.view(&grid).read_into(0, &mut got);
        if args.no_verify || args.inject_bug.is_some() {
            println!(
                "done: sor {n}x{n}, {} iterations, {}: parallel {parallel:.4} s (not verified)",
                args.iters,
                apps::nodes(dsm.size())
            );
        } else {
            // Timed like the parallel run: the iterations only, not the initialisation.
            let mut want = sor::initial_grid(n);
            let t = Instant::now();
            sor::iterate(&mut want, n, args.iters, args.omega);
            let sequential = secs(t);
            let checksum = verified_checksum(&format!("sor {n}x{n}"), n, &got, &want);
            println!(
                "verified: sor {n}x{n}, {} iterations, {}: bitwise identical to sequential (checksum {checksum:.6}); parallel {parallel:.4} s, sequential {sequential:.4} s, speedup {:.2}x",
                args.iters,
                apps::nodes(dsm.size()),
                sequential / parallel
            );
        }
    }
    Ok(dsm.finish()?.exit_code())
}

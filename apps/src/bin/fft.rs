//! `fft`: a 3-D complex FFT (or the SPLASH-2 style 1-D six-step FFT) on the DSM, verified
//! against a sequential FFT and a forward-then-inverse round trip.

use anyhow::Context;
use apps::fft::{
    self, bitwise_eq, checksum, max_rel_err, six_step_shape, Dims, Direction, Fft, Fft3d, SixStep,
    C64, DEFAULT_M, MAX_M,
};
use apps::{fail, secs};
use clap::Parser;
use dsm_core::Dsm;
use std::process::ExitCode;
use std::time::Instant;

/// Largest relative error accepted against the sequential FFT and in the round trip.
const TOLERANCE: f64 = 1e-9;

const AFTER_HELP: &str = "\
3-D mode (default): nz planes of nx * ny complex points are split across the nodes in
bands; each node transforms its planes along x and y, then (after a barrier) gathers a
band of z-lines from all planes into the shared array `trans` and transforms them along
z. 1-D mode (--1d): the six-step FFT on 2^M points viewed as a 2^floor(M/2) x
2^ceil(M/2) matrix: transpose, FFT rows, twiddle, transpose, FFT rows, transpose; rows
are split across the nodes and each transpose goes through shared memory, with a
barrier between phases.

Input: deterministic pseudo-random values in [-1, 1)^2 (SplitMix64, fixed seed).
Rank 0 checks the result against a sequential FFT of the same input and checks that
the parallel inverse transform of the result reproduces the input (both: max relative
error <= 1e-9), then prints a line starting with `verified:` with the timings and the
checksums (FNV-1a of the f64 bit patterns) of the spectrum and of the round trip; they
are the same at every node count. A wrong result exits with status 1.

The sequential time (and the speedup) is that of the same FFT on local memory, no DSM:
the same line transforms in the same order (so the result is bitwise the same), with
cache-friendly transposes, its plans made beforehand as the parallel run's are in its
setup, timed like the parallel run (the forward transform only).

Examples:
  dsmrun -n 4 fft                        # 64x64x16
  dsmrun -n 3 fft --dims 128x64x32
  dsmrun -n 8 fft --1d -m 18
  dsmrun -n 4 --race fft --nx 16 --ny 16 --nz 8";

/// Complex FFT on the DSM: 3-D (default 64x64x16, the paper's input) or the 1-D six-step
/// FFT (--1d), verified against a sequential FFT and an inverse round trip.
#[derive(Parser, Debug)]
#[command(name = "fft", version, after_help = AFTER_HELP)]
struct Args {
    // Negative numbers are taken as values so the parser can say why they are wrong,
    // rather than clap calling them unknown options.
    /// Points along x (a power of two)
    #[arg(long, value_name = "NX", value_parser = fft::parse_dim, default_value_t = fft::DEFAULT_DIMS.nx,
          allow_negative_numbers = true)]
    nx: usize,
    /// Points along y (a power of two)
    #[arg(long, value_name = "NY", value_parser = fft::parse_dim, default_value_t = fft::DEFAULT_DIMS.ny,
          allow_negative_numbers = true)]
    ny: usize,
    /// Points along z, the distributed dimension (a power of two)
    #[arg(long, value_name = "NZ", value_parser = fft::parse_dim, default_value_t = fft::DEFAULT_DIMS.nz,
          allow_negative_numbers = true)]
    nz: usize,
    /// All three sizes at once, e.g. 64x64x16 (instead of --nx/--ny/--nz)
    #[arg(long, value_name = "NXxNYxNZ", conflicts_with_all = ["nx", "ny", "nz"])]
    dims: Option<Dims>,
    /// Run the 1-D six-step FFT on 2^M points instead of the 3-D FFT
    #[arg(long = "1d", conflicts_with_all = ["nx", "ny", "nz", "dims"])]
    one_d: bool,
    /// log2 of the number of points of the 1-D FFT (odd M is fine)
    #[arg(short = 'm', value_name = "M", default_value_t = DEFAULT_M, requires = "one_d",
          value_parser = clap::value_parser!(u32).range(0..=MAX_M as i64),
          allow_negative_numbers = true)]
    m: u32,
    /// Skip the checks (for timing runs only)
    #[arg(long)]
    no_verify: bool,
    /// No DSM: run the 3-D forward FFT split over N plain threads of this one process
    /// (planes, then z-lines, banded as across dsm's nodes, a barrier between), check it
    /// bitwise against the sequential FFT and print a `threads:` line with both times. The
    /// baseline dsm at N nodes is measured against.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          conflicts_with_all = ["one_d", "no_verify"])]
    threads: Option<u64>,
}

/// Reports rank 0's checks: fails (exit 1) on a wrong result, else prints `verified:`.
struct Outcome {
    what: String,
    nodes: usize,
    spectrum: Vec<C64>,
    sequential_spectrum: Vec<C64>,
    /// A second, independent reference (1-D: the direct radix-2 FFT), if any.
    direct: Option<Vec<C64>>,
    round_trip: Vec<C64>,
    input: Vec<C64>,
    parallel: f64,
    sequential: f64,
}

impl Outcome {
    fn report(self) {
        let err = max_rel_err(&self.spectrum, &self.sequential_spectrum);
        if !within_tolerance(err) {
            fail(&format!(
                "{}, {}: max relative error {err:.3e} against the sequential FFT (tolerance {TOLERANCE:e})",
                self.what, nodes(self.nodes)
            ));
        }
        let identical = bitwise_eq(&self.spectrum, &self.sequential_spectrum);
        let mut direct_note = String::new();
        if let Some(direct) = &self.direct {
            let e = max_rel_err(&self.spectrum, direct);
            if !within_tolerance(e) {
                fail(&format!(
                    "{}, {}: max relative error {e:.3e} against the direct radix-2 FFT (tolerance {TOLERANCE:e})",
                    self.what, nodes(self.nodes)
                ));
            }
            direct_note = format!(", {e:.2e} vs direct radix-2 FFT");
        }
        let rt = max_rel_err(&self.round_trip, &self.input);
        if !within_tolerance(rt) {
            fail(&format!(
                "{}, {}: inverse of the result differs from the input: max relative error {rt:.3e} (tolerance {TOLERANCE:e})",
                self.what, nodes(self.nodes)
            ));
        }
        println!(
            "verified: fft {}, {}: max rel err {err:.2e} vs sequential ({}){direct_note}, round trip {rt:.2e}; checksum {:016x}, round-trip checksum {:016x}; parallel {:.4} s, sequential {:.4} s, speedup {:.2}x",
            self.what,
            nodes(self.nodes),
            if identical { "bitwise identical" } else { "not bitwise identical" },
            checksum(&self.spectrum),
            checksum(&self.round_trip),
            self.parallel,
            self.sequential,
            self.sequential / self.parallel
        );
    }
}

/// Whether a relative error passes (false for NaN).
fn within_tolerance(err: f64) -> bool {
    err <= TOLERANCE
}

/// "1 node", "4 nodes".
fn nodes(n: usize) -> String {
    format!("{n} node{}", if n == 1 { "" } else { "s" })
}

fn run_3d(dsm: &mut Dsm, dims: Dims, verify: bool) -> anyhow::Result<()> {
    let what = format!("3-D {dims}");
    let s = Fft3d::setup(dsm, dims).context("setting up the 3-D FFT")?;
    let t = Instant::now();
    s.forward(dsm)?;
    let parallel = secs(t);
    let spectrum = (dsm.rank() == 0).then(|| s.spectrum(dsm));
    if !verify {
        if dsm.rank() == 0 {
            println!(
                "done: fft {what}, {}: parallel {parallel:.4} s (not verified)",
                nodes(dsm.size())
            );
        }
        return Ok(());
    }
    dsm.barrier()?;
    s.inverse(dsm)?;
    if let Some(spectrum) = spectrum {
        let round_trip = s.data(dsm);
        let input = fft::input_range(0..dims.len());
        let mut reference = input.clone();
        let seq = fft::Fft3dSeq::new(dims);
        let t = Instant::now();
        seq.transform(&mut reference, Direction::Forward);
        let sequential = secs(t);
        Outcome {
            what,
            nodes: dsm.size(),
            spectrum,
            sequential_spectrum: reference,
            direct: None,
            round_trip,
            input,
            parallel,
            sequential,
        }
        .report();
    }
    Ok(())
}

fn run_1d(dsm: &mut Dsm, m: u32, verify: bool) -> anyhow::Result<()> {
    let (n1, n2) = six_step_shape(m);
    let n = n1 * n2;
    let what = format!("1-D six-step 2^{m} = {n} points ({n1} x {n2})");
    let s = SixStep::setup(dsm, m).context("setting up the six-step FFT")?;
    let t = Instant::now();
    s.forward(dsm)?;
    let parallel = secs(t);
    let spectrum = (dsm.rank() == 0).then(|| s.spectrum(dsm));
    if !verify {
        if dsm.rank() == 0 {
            println!(
                "done: fft {what}, {}: parallel {parallel:.4} s (not verified)",
                nodes(dsm.size())
            );
        }
        return Ok(());
    }
    dsm.barrier()?;
    s.inverse(dsm)?;
    if let Some(spectrum) = spectrum {
        let round_trip = s.data(dsm);
        let input = fft::input_range(0..n);
        let seq = fft::SixStepSeq::new(m);
        // Buffers written before timing (cloned, not zero-allocated, so their pages are
        // already mapped), as the parallel run's shared arrays are set up before its own.
        let (mut reference, mut scratch) = (input.clone(), input.clone());
        let t = Instant::now();
        seq.transform_into(&input, &mut reference, &mut scratch, Direction::Forward);
        let sequential = secs(t);
        let mut direct = input.clone();
        Fft::new(n).transform(&mut direct, Direction::Forward);
        Outcome {
            what,
            nodes: dsm.size(),
            spectrum,
            sequential_spectrum: reference,
            direct: Some(direct),
            round_trip,
            input,
            parallel,
            sequential,
        }
        .report();
    }
    Ok(())
}

/// `--threads N`: the threaded forward FFT and the sequential one on local buffers (all
/// written before timing, so their pages are mapped), compared bitwise.
fn run_threads(dims: Dims, threads: usize) -> ExitCode {
    let input = fft::input_range(0..dims.len());
    let seq = fft::Fft3dSeq::new(dims);
    let mut want = input.clone();
    let t = Instant::now();
    seq.transform(&mut want, Direction::Forward);
    let sequential = secs(t);
    let (mut a, mut trans) = (input.clone(), input);
    let t = Instant::now();
    seq.forward_threads(&mut a, &mut trans, threads);
    let threaded = secs(t);
    let got = fft::transpose_spectrum(&trans, dims);
    if !bitwise_eq(&got, &want) {
        fail(&format!(
            "fft 3-D {dims}, {threads} threads: max relative error {:.3e} against the sequential FFT, which it must equal bitwise",
            max_rel_err(&got, &want)
        ));
    }
    println!(
        "threads: fft 3-D {dims}, {threads} threads: bitwise identical to sequential (checksum {:016x}); threads {threaded:.4} s, sequential {sequential:.4} s, speedup {:.2}x",
        checksum(&got),
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
    let dims = args.dims.unwrap_or(Dims {
        nx: args.nx,
        ny: args.ny,
        nz: args.nz,
    });
    if let Some(threads) = args.threads {
        return Ok(run_threads(dims, threads as usize));
    }
    let mut dsm = Dsm::init().context("joining the DSM job")?;
    if args.one_d {
        run_1d(&mut dsm, args.m, !args.no_verify)?;
    } else {
        run_3d(&mut dsm, dims, !args.no_verify)?;
    }
    Ok(dsm.finish()?.exit_code())
}

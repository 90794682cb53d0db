//! Applications that run on dsm (SOR, FFT, TSP, Water, labelled race kernels) and the
//! helpers they share: timing, result checking and reporting conventions. Every app
//! verifies its own result against a sequential reference, prints a line starting with
//! `verified:` on success, and exits non-zero on a wrong result.
#![forbid(unsafe_code)]

pub mod fft;
pub mod kernels;
pub mod sor;
pub mod tsp;
pub mod water;

use std::process::ExitCode;
use std::time::Instant;

/// SplitMix64: a tiny generator whose output is fixed by its definition, so inputs made
/// from a seed are the same on every platform and with every version of every crate.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..k` (the modulo bias is irrelevant for instance generation).
    pub fn below(&mut self, k: u64) -> u64 {
        self.next_u64() % k
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller; one of the pair is used, for simplicity).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]: the logarithm stays finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Installs dsm's logging for an app: `tracing` events at the level `DSM_LOG` asks for
/// (env-filter syntax, default `warn`) on stderr, coloured only when stderr is a terminal.
/// The runtime never installs a subscriber itself; a program that wants its own calls
/// something else instead.
pub fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env(dsm_core::env_vars::LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// "1 node" or "N nodes", for the apps' result lines.
pub fn nodes(n: usize) -> String {
    if n == 1 {
        "1 node".to_string()
    } else {
        format!("{n} nodes")
    }
}

/// Seconds since `t`.
pub fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Runs a program's body and turns its error into one line on stderr (`error: ` and the
/// error's chain of causes) and exit status 1. Returning the error from `main` instead
/// would print its debug form, and with `RUST_BACKTRACE` set (common in Rust shells) a
/// full backtrace from every rank for an ordinary error such as a refused join; panics
/// keep their backtraces.
pub fn main_with(body: impl FnOnce() -> anyhow::Result<ExitCode>) -> ExitCode {
    match body() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Exits with a usage error (status 2, clap's form and exit status) for arguments that
/// clap cannot check alone: a value out of range given the others, say. Status 1 means a
/// wrong result.
pub fn usage_error<A: clap::CommandFactory>(msg: impl std::fmt::Display) -> ! {
    A::command()
        .error(clap::error::ErrorKind::ValueValidation, msg)
        .exit()
}

/// Prints a failure line and exits with status 1: the convention for a wrong result.
pub fn fail(msg: &str) -> ! {
    eprintln!("FAILED: {msg}");
    std::process::exit(1)
}

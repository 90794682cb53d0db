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

use std::time::Instant;

/// Seconds since `t`.
pub fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Prints a failure line and exits with status 1: the convention for a wrong result.
pub fn fail(msg: &str) -> ! {
    eprintln!("FAILED: {msg}");
    std::process::exit(1)
}

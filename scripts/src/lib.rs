//! The benchmark suite of dsm (binary `dsm-bench-report`, started by `scripts/bench`).
//!
//! It runs the applications with and without race detection and with the detector's
//! phases, the C translations of SOR and of some race kernels under ThreadSanitizer,
//! Helgrind and DRD, and `dsm-bench`, and writes `bench-results/latest.{json,md}` plus the
//! plots. Planning and running ([`suite`], [`measure`]) are kept apart from the pure parts
//! ([`parse`], [`stats`], [`analysis`], [`delay`], [`render`]) so that the latter are unit-tested
//! without starting a process.

pub mod analysis;
pub mod delay;
pub mod machine;
pub mod measure;
pub mod model;
pub mod parse;
pub mod render;
pub mod stats;
pub mod suite;

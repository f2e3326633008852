//! Helpers for this crate's own tests, benchmarks and command-line program: the seed's
//! workloads, the peak-throughput microbenchmarks and the GPU compile checks. Not part of the
//! API: hidden from the docs, with no stability promise.

#[cfg(feature = "gpu")]
pub use gpu_compile::{compile_check_nvidia, hipcc_check_arguments};
pub use peak::{measure_peak, PeakUnit};

#[cfg(feature = "gpu")]
mod gpu_compile;
mod peak;
pub mod workloads;

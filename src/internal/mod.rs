//! Helpers for this crate's own tests, benchmarks and command-line program: the seed's
//! workloads, the peak-throughput microbenchmarks and the GPU compile checks. Not part of the
//! API: hidden from the docs, with no stability promise.

pub use crate::cpu::peak::{measure_peak, PeakUnit};
#[cfg(feature = "gpu")]
pub use crate::gpu::source::{compile_check_nvidia, hipcc_check_arguments};

pub mod workloads;

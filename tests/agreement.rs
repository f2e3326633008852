//! Property tests: the CPU kernel (every instruction-set path this CPU has) against the f64
//! oracle, within the derived tolerance of `varlen_attn::oracle` (its module docs hold the
//! derivation: one ulp of the output type at the oracle value, plus `max|v| · (u_T/2 + small
//! f32 terms)`; for bf16 that is one bf16 ulp plus about `2^-9 · max|v|`).
//!
//! Random batches (including empty sequences and `batch = 0`), Lq ≠ Lk, GQA/MQA, head dims from
//! 1 to 256 with D_v ≠ D, causal and sliding windows, soft-capping, explicit scales, strided
//! views of every kind, all three element types. Outputs start as NaN, so a row the kernel
//! forgets to write fails.

mod common;

use common::cases::{case, check};
use common::cpu_paths;
use half::{bf16, f16};
use proptest::prelude::*;
use varlen_attn::{Backend, CpuIsa, Element};

/// The CPU paths of this machine, each with the CPU backend.
fn paths<T: Element>() -> Vec<(Backend, CpuIsa)> {
    cpu_paths::<T>().into_iter().map(|isa| (Backend::Cpu, isa)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn bf16_matches_the_oracle(case in case()) {
        check::<bf16>(&case, &paths::<bf16>())?;
    }

    #[test]
    fn f16_matches_the_oracle(case in case()) {
        check::<f16>(&case, &paths::<f16>())?;
    }

    #[test]
    fn f32_matches_the_oracle(case in case()) {
        check::<f32>(&case, &paths::<f32>())?;
    }
}

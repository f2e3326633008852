//! Finite inputs across the whole finite range, on every CPU path (the checks are in
//! `common/extreme.rs`): the oracle's answer within its tolerance, or below the edge of f32
//! `Error::BeyondF32`; never inf or NaN silently.

mod common;

use common::extreme::{check_extreme, check_paths, cpu, extreme, uniform};
use common::Rng;
use half::{bf16, f16};
use ndarray::Array3;
use proptest::prelude::*;
use varlen_attn::{oracle, Error, Params, F32_EDGE};

/// f32 q = k = v uniform in [-m/2, m/2], 40 tokens, 2 heads, head_dim
/// 64. Up to m = 1e5 every score fits f32; m = 1e6 still does (scores up to 1e13); these gave
/// 2048 and 2112 non-finite outputs before the softmax rounded its logits before subtracting
/// the max.
#[test]
fn large_f32_inputs_give_the_oracle_answer() {
    for m in [3e4, 1e5, 1e6, 1e12, 1e17] {
        let mut rng = Rng::new(1);
        let x = uniform::<f32>(&mut rng, (40, 2, 64), m);
        check_paths(&cpu::<f32>(), &x, &x, &x, &[40], &[40], &Params::default()).unwrap();
    }
}

/// bf16 inputs in [-2, 2] with scales up to 1e30 (5,494 to 7,700
/// non-finite outputs before the fix, on the scalar and AVX2 paths); with a soft-cap and a
/// causal mask too.
#[test]
fn huge_scales_give_the_oracle_answer() {
    let mut rng = Rng::new(2);
    let q = uniform::<bf16>(&mut rng, (70, 2, 64), 4.0);
    let k = uniform::<bf16>(&mut rng, (70, 2, 64), 4.0);
    let v = uniform::<bf16>(&mut rng, (70, 2, 64), 4.0);
    for scale in [1e8f32, 1e10, 1e20, 1e30] {
        for (causal, softcap) in [(false, None), (true, None), (false, Some(30.0))] {
            let p = Params { softmax_scale: Some(scale), causal, softcap, ..Params::default() };
            check_paths(&cpu::<bf16>(), &q, &k, &v, &[30, 40], &[30, 40], &p).unwrap();
        }
    }
}

/// Magnitudes where hardware bf16 products (AVX-512 BF16's `vdpbf16ps`, AMX's `tdpbf16ps`)
/// treat subnormal inputs as zero and flush subnormal results: bf16 q, k uniform in [-1, 1), v
/// of magnitude `m` down to bf16's smallest subnormal, with and without a causal mask. Before
/// the fix the bf16 paths left the bound from m = 1e-37 (AVX-512 BF16) and m = 1e-36 (`Auto`).
#[test]
fn tiny_values_give_the_oracle_answer() {
    for m in [1e-20, 1e-30, 1e-36, 1e-37, 3e-38, 1e-39, 1e-40, 2e-41] {
        let mut rng = Rng::new(3);
        let q = uniform::<bf16>(&mut rng, (40, 2, 64), 2.0);
        let k = uniform::<bf16>(&mut rng, (40, 2, 64), 2.0);
        let v = uniform::<bf16>(&mut rng, (40, 2, 64), 2.0 * m);
        for causal in [false, true] {
            let p = Params { causal, ..Params::default() };
            check_paths(&cpu::<bf16>(), &q, &k, &v, &[40], &[40], &p).unwrap();
            let (q32, k32, v32) = (q.mapv(|x| x.to_f32()), k.mapv(|x| x.to_f32()), v.mapv(|x| x.to_f32()));
            check_paths(&cpu::<f32>(), &q32, &k32, &v32, &[40], &[40], &p).unwrap();
        }
    }
}

/// One row's tolerance follows the values it sees: a sequence of tiny values beside one of
/// ordinary values in the same call, and under a causal mask the first keys tiny, the rest
/// ordinary.
#[test]
fn tiny_values_beside_ordinary_ones() {
    let mut rng = Rng::new(4);
    let q = uniform::<bf16>(&mut rng, (64, 2, 32), 2.0);
    let k = uniform::<bf16>(&mut rng, (64, 2, 32), 2.0);
    let mut v = uniform::<bf16>(&mut rng, (64, 2, 32), 2.0);
    for t in 0..24 {
        for h in 0..2 {
            for d in 0..32 {
                v[[t, h, d]] = bf16::from_f32(v[[t, h, d]].to_f32() * 1e-38);
            }
        }
    }
    for causal in [false, true] {
        let p = Params { causal, ..Params::default() };
        check_paths(&cpu::<bf16>(), &q, &k, &v, &[24, 40], &[24, 40], &p).unwrap();
        check_paths(&cpu::<bf16>(), &q, &k, &v, &[64], &[64], &p).unwrap();
    }
}

/// Scores whose products fall below f32's normal range, scaled back up by a huge scale: tiny q
/// and k with scales up to 1e35, and subnormal q against large k.
#[test]
fn tiny_scores_under_huge_scales() {
    for (mq, mk, scale) in [(1e-20, 1e-20, 1e35f32), (1e-25, 1e-15, 1e30), (1e-39, 1e15, 1e20), (1e-40, 1e-2, 1e36)] {
        let mut rng = Rng::new(5);
        let q = uniform::<bf16>(&mut rng, (30, 2, 64), mq);
        let k = uniform::<bf16>(&mut rng, (30, 1, 64), mk);
        let v = uniform::<bf16>(&mut rng, (30, 1, 64), 2.0);
        for causal in [false, true] {
            let p = Params { causal, softmax_scale: Some(scale), ..Params::default() };
            check_paths(&cpu::<bf16>(), &q, &k, &v, &[30], &[30], &p).unwrap();
        }
    }
}

/// Past the edge the fast paths refuse, naming the bound, and the oracle still answers.
#[test]
fn inputs_beyond_the_edge_are_refused() {
    let x = Array3::from_elem((3, 1, 64), 1e19f32);
    let err = varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 3], &[0, 3], &Params::default()).unwrap_err();
    assert!(matches!(err, Error::BeyondF32 { quantity, .. } if quantity.contains("max|q|")), "{err}");
    assert!(err.to_string().contains("2^126"), "{err}");

    // Values whose P·V sums could overflow: bf16 values of 1e37 over 40 keys.
    let small = Array3::from_elem((40, 1, 8), bf16::from_f32(0.5));
    let big = Array3::from_elem((40, 1, 8), bf16::from_f32(1e37));
    let err = varlen_attn::forward(small.view(), small.view(), big.view(), &[0, 40], &[0, 40], &Params::default())
        .unwrap_err();
    assert!(matches!(err, Error::BeyondF32 { quantity, .. } if quantity.contains("max|v|")), "{err}");
    let exact =
        oracle::forward(small.view(), small.view(), big.view(), &[0, 40], &[0, 40], &Params::default()).unwrap();
    assert_eq!(exact[[0, 0, 0]], bf16::from_f32(1e37));

    // A scale that pushes moderate scores over the edge.
    let ones = Array3::from_elem((2, 1, 4), 1.0f32);
    let p = Params { softmax_scale: Some(3e37), ..Params::default() };
    assert!(matches!(
        varlen_attn::forward(ones.view(), ones.view(), ones.view(), &[0, 2], &[0, 2], &p),
        Err(Error::BeyondF32 { .. })
    ));

    // Factors that overflow f32 on their own: a scale near f32::MAX (scale · log2(e)), a
    // soft-cap near f32's smallest normal (scale / softcap; found by the fuzzer: zero scores
    // times an infinite factor gave NaN).
    let tiny = Array3::from_elem((2, 1, 4), 1e-30f32);
    for (scale, softcap) in [(Some(3e38f32), None), (Some(6.4), Some(1.1755e-38f32))] {
        let p = Params { softmax_scale: scale, softcap, ..Params::default() };
        let err = varlen_attn::forward(tiny.view(), tiny.view(), tiny.view(), &[0, 2], &[0, 2], &p).unwrap_err();
        assert!(matches!(err, Error::BeyondF32 { quantity, .. } if quantity.contains("scale")), "{err}");
    }
    // Just inside: an extreme but finite factor scale / softcap = 1e20.
    let mut zeros = Array3::from_elem((20, 1, 4), 0.0f32);
    zeros[[3, 0, 1]] = 1e-30;
    let p = Params { softmax_scale: Some(1e-10), softcap: Some(1e-30), ..Params::default() };
    check_paths(&cpu::<f32>(), &zeros, &zeros, &zeros, &[20], &[20], &p).unwrap();

    // Non-finite values do not count: they keep their own semantics (propagation).
    let mut nan = Array3::from_elem((2, 1, 4), 1.0f32);
    nan[[0, 0, 0]] = f32::INFINITY;
    assert!(varlen_attn::forward(nan.view(), ones.view(), ones.view(), &[0, 2], &[0, 2], &Params::default()).is_ok());
    assert!(F32_EDGE < f32::MAX as f64 / 3.0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// f32 magnitudes from its subnormals (1e-44) to past the edge (1e20: scores of 1e40 and
    /// more).
    #[test]
    fn f32_magnitudes_across_the_finite_range(case in extreme(-44.0, 20.0)) {
        check_extreme::<f32>(&case, &cpu::<f32>())?;
    }

    /// bf16 has f32's exponent range (its smallest subnormal is 9.2e-41).
    #[test]
    fn bf16_magnitudes_across_the_finite_range(case in extreme(-40.0, 20.0)) {
        check_extreme::<bf16>(&case, &cpu::<bf16>())?;
    }

    /// f16's normal range is 6e-5 to 65504 (subnormals down to 6e-8); only the scale can take it
    /// to the edge.
    #[test]
    fn f16_magnitudes_across_the_finite_range(case in extreme(-7.2, 4.8)) {
        check_extreme::<f16>(&case, &cpu::<f16>())?;
    }
}

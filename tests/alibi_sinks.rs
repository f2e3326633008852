//! ALiBi slopes and attention sinks on every CPU path: hand-computed cases, then random problems
//! (per-head and per-sequence slopes, sinks, masks, soft-caps, GQA, `Lq ≠ Lk`) against the f64
//! oracle, output and LSE.

mod common;

use common::extreme::{check_paths, cpu};
use common::{cpu_paths, random_tensor, Rng};
use half::{bf16, f16};
use ndarray::Array3;
use proptest::prelude::*;
use varlen_attn::{forward_with_lse, oracle, Backend, Element, Params};

/// One query, keys of equal scores: ALiBi weighs key `j` by `exp(-slope · |Lk - 1 - j|)`, and a
/// sink adds `exp(sink)` to the denominator alone.
#[test]
fn hand_computed_weights() {
    let q = Array3::<f32>::zeros((1, 1, 8));
    let k = Array3::<f32>::zeros((3, 1, 8));
    let v = Array3::from_shape_vec((3, 1, 1), vec![1.0f32, 10.0, 100.0]).unwrap();
    let (slope, sink) = (0.5f64, 0.25f64);
    let weights = [(-2.0 * slope).exp(), (-slope).exp(), 1.0];
    let expect_alibi = (weights[0] + 10.0 * weights[1] + 100.0 * weights[2]) / weights.iter().sum::<f64>();
    let expect_sink = 111.0 / (3.0 + sink.exp());
    let expect_both =
        (weights[0] + 10.0 * weights[1] + 100.0 * weights[2]) / (weights.iter().sum::<f64>() + sink.exp());
    let cases = [
        (Some(vec![slope as f32]), None, expect_alibi, weights.iter().sum::<f64>().ln()),
        (None, Some(vec![sink as f32]), expect_sink, (3.0 + sink.exp()).ln()),
        (
            Some(vec![slope as f32]),
            Some(vec![sink as f32]),
            expect_both,
            (weights.iter().sum::<f64>() + sink.exp()).ln(),
        ),
    ];
    for (alibi_slopes, sinks, expect, expect_lse) in cases {
        let base = Params { alibi_slopes, sinks, ..Params::default() };
        let reference = oracle::reference(q.view(), k.view(), v.view(), &[0, 1], &[0, 3], &base).unwrap();
        assert!((reference.out[[0, 0, 0]] - expect).abs() < 1e-12, "{base:?}: {}", reference.out[[0, 0, 0]]);
        assert!((reference.lse[[0, 0]] - expect_lse).abs() < 1e-12);
        for isa in cpu_paths::<f32>() {
            let params = Params { cpu_isa: isa, backend: Backend::Cpu, ..base.clone() };
            let (out, lse) = forward_with_lse(q.view(), k.view(), v.view(), &[0, 1], &[0, 3], &params).unwrap();
            assert!((out[[0, 0, 0]] as f64 - expect).abs() < 1e-4, "{isa:?} {base:?}: {}", out[[0, 0, 0]]);
            assert!((lse[[0, 0]] as f64 - expect_lse).abs() < 1e-5, "{isa:?} {base:?}: {}", lse[[0, 0]]);
        }
    }
}

/// A row that sees no key still has its sink: output 0, LSE the sink (not -inf).
#[test]
fn rows_that_see_no_key_take_the_sink_as_their_lse() {
    let x = Array3::<bf16>::from_elem((4, 2, 8), bf16::from_f32(0.5));
    // The first sequence has queries and no keys.
    let params = Params { sinks: Some(vec![1.5, -3.0]), ..Params::default() };
    for isa in cpu_paths::<bf16>() {
        let p = Params { cpu_isa: isa, backend: Backend::Cpu, ..params.clone() };
        let (out, lse) = forward_with_lse(x.view(), x.view(), x.view(), &[0, 2, 4], &[0, 0, 4], &p).unwrap();
        assert!(out.slice(ndarray::s![..2, .., ..]).iter().all(|&o| o == bf16::ZERO), "{isa:?}");
        assert_eq!((lse[[0, 0]], lse[[1, 1]]), (1.5, -3.0), "{isa:?}");
    }
}

/// Large sinks and steep slopes: the sink joins the max, so exp(sink) cannot overflow.
#[test]
fn large_sinks_and_steep_slopes_stay_finite() {
    let mut rng = Rng::new(8);
    let q = random_tensor::<bf16>(&mut rng, (50, 2, 64), 1.0);
    let k = random_tensor::<bf16>(&mut rng, (50, 1, 64), 1.0);
    let v = random_tensor::<bf16>(&mut rng, (50, 1, 64), 1.0);
    for (slopes, sinks) in [(vec![50.0, 1e3], vec![200.0, -200.0]), (vec![1e-6, 0.0], vec![80.0, 0.0])] {
        let base = Params { alibi_slopes: Some(slopes), sinks: Some(sinks), causal: true, ..Params::default() };
        check_paths(&cpu::<bf16>(), &q, &k, &v, &[20, 30], &[20, 30], &base).unwrap();
    }
}

/// One random problem: lengths, masks, slopes (per head or per sequence and head, some of
/// either sign), sinks, the data seed.
#[derive(Clone, Debug)]
struct Case {
    q_lengths: Vec<usize>,
    k_extra: Vec<usize>,
    head_dim: usize,
    causal: bool,
    window_left: Option<usize>,
    softcap: Option<f32>,
    per_sequence: bool,
    alibi: bool,
    sinks: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0usize..=40, 1..=3),
        prop::collection::vec(0usize..=30, 3),
        prop::sample::select(vec![8usize, 64, 72]),
        any::<bool>(),
        prop::option::weighted(0.3, 0usize..20),
        prop::option::weighted(0.3, 1.0f32..50.0),
        any::<bool>(),
        prop::bool::weighted(0.8),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(q_lengths, k_extra, head_dim, causal, window_left, softcap, per_sequence, alibi, sinks, seed)| Case {
                q_lengths,
                k_extra,
                head_dim,
                causal,
                window_left,
                softcap,
                per_sequence,
                alibi,
                sinks,
                seed,
            },
        )
}

fn check_case<T: Element>(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(c.seed);
    let (heads, kv_heads) = (4, 2);
    // Keys from 10 fewer than the queries (rows before the diagonal's start) to 20 more.
    let k_lengths: Vec<usize> = c.q_lengths.iter().zip(&c.k_extra).map(|(&q, &e)| (q + e).saturating_sub(10)).collect();
    let (total_q, total_k) = (c.q_lengths.iter().sum(), k_lengths.iter().sum());
    let q = random_tensor::<T>(&mut rng, (total_q, heads, c.head_dim), 1.0);
    let k = random_tensor::<T>(&mut rng, (total_k, kv_heads, c.head_dim), 1.0);
    let v = random_tensor::<T>(&mut rng, (total_k, kv_heads, c.head_dim), 1.0);
    let slope_count = if c.per_sequence { heads * c.q_lengths.len() } else { heads };
    let slopes: Vec<f32> =
        (0..slope_count).map(|i| (rng.uniform() as f32 - 0.2) * 2f32.powi(-(i as i32 % 5))).collect();
    let sinks: Vec<f32> = (0..heads).map(|_| (rng.uniform() as f32 - 0.5) * 10.0).collect();
    let base = Params {
        causal: c.causal,
        window_left: c.window_left,
        softcap: c.softcap,
        alibi_slopes: c.alibi.then_some(slopes),
        sinks: c.sinks.then_some(sinks),
        ..Params::default()
    };
    check_paths(&cpu::<T>(), &q, &k, &v, &c.q_lengths, &k_lengths, &base)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn bf16_with_alibi_and_sinks_matches_the_oracle(c in case()) {
        check_case::<bf16>(&c)?;
    }

    #[test]
    fn f16_with_alibi_and_sinks_matches_the_oracle(c in case()) {
        check_case::<f16>(&c)?;
    }

    #[test]
    fn f32_with_alibi_and_sinks_matches_the_oracle(c in case()) {
        check_case::<f32>(&c)?;
    }
}

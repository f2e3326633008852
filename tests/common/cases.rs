//! The property-test problem generator and checker shared by the CPU (`agreement.rs`) and GPU
//! (`gpu.rs`) suites.

use super::{cu_seqlens, random_tensor, Layout, Rng, Stored, LAYOUTS};
use ndarray::{s, Array2, Array3};
use proptest::prelude::*;
use varlen_attn::{oracle, Backend, CpuIsa, Element, Params};

/// One generated problem (the data comes from `seed`).
#[derive(Clone, Debug)]
pub struct Case {
    q_lengths: Vec<usize>,
    k_lengths: Vec<usize>,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    head_dim_v: usize,
    causal: bool,
    window_left: Option<usize>,
    window_right: Option<usize>,
    softcap: Option<f32>,
    scale: Option<f32>,
    amplitude: f32,
    layouts: [Layout; 4],
    seed: u64,
}

fn head_dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        prop::sample::select(vec![1usize, 8, 64, 72, 80, 96, 128, 256]),
        prop::sample::select(vec![2usize, 3, 15, 16, 17, 31, 33, 63, 65, 127, 129]),
        1usize..=256,
    ]
}

/// Sequence lengths around the block edges (16-key strips, 64-row/64-key blocks) and beyond.
fn length() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0usize..=20,
        3 => prop::sample::select(vec![15usize, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]),
        2 => 0usize..=140,
    ]
}

/// Lengths of long sequences: enough keys that the GPU splits one or two heads' keys across
/// blocks (a split must spare each block 1024 keys), few enough for the f64 oracle (~0.5
/// GFLOP/s).
fn long_length() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 1500usize..=2600,
        1 => prop::sample::select(vec![0usize, 1, 129, 511, 512, 513, 640]),
    ]
}

/// Head sizes up to 128 (the long cases' oracle time grows with them).
fn narrow_head_dim() -> impl Strategy<Value = usize> {
    prop_oneof![prop::sample::select(vec![64usize, 72, 80, 128]), 1usize..=128]
}

/// Problems of up to five sequences around the block edges, up to two KV heads of up to three
/// query heads each.
pub fn case() -> impl Strategy<Value = Case> {
    case_of(0..=5, length, head_dim, 1..=2, vec![1, 2, 3])
}

/// Problems of one or two long sequences, one KV head of one or two query heads.
pub fn long_case() -> impl Strategy<Value = Case> {
    case_of(1..=2, long_length, narrow_head_dim, 1..=1, vec![1, 2])
}

fn case_of<L: Strategy<Value = usize>, D: Strategy<Value = usize> + 'static>(
    batch: std::ops::RangeInclusive<usize>,
    length: fn() -> L,
    head_dim: fn() -> D,
    kv_heads: std::ops::RangeInclusive<usize>,
    groups: Vec<usize>,
) -> impl Strategy<Value = Case> {
    batch
        .prop_flat_map(move |batch| {
            let shapes = (
                prop::collection::vec(length(), batch),
                prop::collection::vec(length(), batch),
                kv_heads.clone(),
                prop::sample::select(groups.clone()),
                head_dim(),
                prop_oneof![Just(None), head_dim().prop_map(Some)],
            );
            let params = (
                any::<bool>(),
                prop::option::weighted(0.3, 0usize..=80),
                prop::option::weighted(0.3, 0usize..=80),
                prop::option::weighted(0.25, 0.5f32..50.0),
                prop::option::weighted(0.25, 0.01f32..2.0),
            );
            let data = (
                prop::sample::select(vec![0.25f32, 1.0, 3.0]),
                prop::array::uniform4(prop::sample::select(LAYOUTS.to_vec())),
                any::<u64>(),
            );
            (shapes, params, data)
        })
        .prop_map(
            |(
                (q_lengths, k_lengths, kv_heads, group, head_dim, dv),
                (causal, left, right, softcap, scale),
                (amplitude, layouts, seed),
            )| Case {
                q_lengths,
                k_lengths,
                kv_heads,
                group,
                head_dim,
                head_dim_v: dv.unwrap_or(head_dim),
                causal,
                window_left: left,
                window_right: if causal { None } else { right },
                softcap,
                scale,
                amplitude,
                layouts,
                seed,
            },
        )
}

/// Runs `case` on each of `paths` (backend and CPU instruction set) and checks each against
/// the oracle.
pub fn check<T: Element>(case: &Case, paths: &[(Backend, CpuIsa)]) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(case.seed);
    let (total_q, total_k): (usize, usize) = (case.q_lengths.iter().sum(), case.k_lengths.iter().sum());
    let heads = case.kv_heads * case.group;
    let q = random_tensor::<T>(&mut rng, (total_q, heads, case.head_dim), case.amplitude);
    let k = random_tensor::<T>(&mut rng, (total_k, case.kv_heads, case.head_dim), case.amplitude);
    let v = random_tensor::<T>(&mut rng, (total_k, case.kv_heads, case.head_dim_v), 1.0);
    let (q, k, v) =
        (Stored::new(&q, case.layouts[0]), Stored::new(&k, case.layouts[1]), Stored::new(&v, case.layouts[2]));
    let (cu_q, cu_k) = (cu_seqlens(&case.q_lengths), cu_seqlens(&case.k_lengths));
    let base = Params {
        causal: case.causal,
        window_left: case.window_left,
        window_right: case.window_right,
        softcap: case.softcap,
        softmax_scale: case.scale,
        ..Params::default()
    };

    let reference = oracle::reference(q.view(), k.view(), v.view(), &cu_q, &cu_k, &base);
    for &(backend, isa) in paths {
        let params = Params { cpu_isa: isa, backend, ..base.clone() };
        // Output and LSE start as NaN, in a padded (strided) buffer when the case says so.
        let dv = case.head_dim_v;
        let pad = if case.layouts[3] == Layout::Padded { 5 } else { 0 };
        let mut out_storage = Array3::from_elem((total_q, heads, dv + pad), T::from_f32(f32::NAN));
        let mut lse = Array2::from_elem((heads, total_q), f32::NAN);
        let result = varlen_attn::forward_with_lse_into(
            q.view(),
            k.view(),
            v.view(),
            &cu_q,
            &cu_k,
            &params,
            out_storage.slice_mut(s![.., .., ..dv]),
            lse.view_mut(),
        );
        match (&reference, result) {
            (Err(expected), Err(got)) => prop_assert_eq!(expected, &got, "{:?}", isa),
            (Ok(reference), Ok(())) => {
                let out = out_storage.slice(s![.., .., ..dv]);
                let report = reference.compare(out);
                prop_assert!(report.worst.is_none(), "{:?} out: {}", isa, report);
                let report = reference.compare_lse(lse.view());
                prop_assert!(report.worst.is_none(), "{:?} lse: {}", isa, report);
                // Padding the caller owns is left alone.
                prop_assert!(out_storage.slice(s![.., .., dv..]).iter().all(|x| x.to_f32().is_nan()));
            }
            (expected, got) => {
                prop_assert!(false, "{:?}: oracle {:?} but kernel {:?}", isa, expected.as_ref().err(), got)
            }
        }
    }
    Ok(())
}

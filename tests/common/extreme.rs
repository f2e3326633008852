//! Finite inputs across the whole finite range, shared by the CPU (`extreme_values.rs`) and GPU
//! (`gpu.rs`) suites: a path either agrees with the f64 oracle (within its derived tolerance,
//! and finite wherever the oracle is) or, beyond the documented edge of f32
//! (`varlen_attn::F32_EDGE`), returns `Error::BeyondF32`; never inf or NaN silently.

use super::{cu_seqlens, Rng};
use ndarray::Array3;
use proptest::prelude::*;
use varlen_attn::{forward_with_lse, oracle, Backend, CpuIsa, Element, Error, Params};

/// `[tokens, heads, dim]` values uniform in `[-amplitude/2, amplitude/2]`.
pub fn uniform<T: Element>(rng: &mut Rng, shape: (usize, usize, usize), amplitude: f64) -> Array3<T> {
    Array3::from_shape_simple_fn(shape, || T::from_f32(((rng.uniform() - 0.5) * amplitude) as f32))
}

/// The edge test computed independently of the crate: whether any bound of the fast paths'
/// f32 arithmetic reaches 2^126.
pub fn beyond_edge<T: Element>(
    q: &Array3<T>,
    k: &Array3<T>,
    v: &Array3<T>,
    k_lengths: &[usize],
    scale: f64,
    softcap: Option<f32>,
) -> bool {
    let max = |x: &Array3<T>| x.iter().map(|e| e.to_f32().abs() as f64).fold(0.0, f64::max);
    let d = q.dim().2 as f64;
    let longest = k_lengths.iter().copied().max().unwrap_or(0) as f64;
    let edge = 2f64.powi(126);
    d * max(q) * max(k) * (2.0 * scale).max(1.0) >= edge
        || max(v) * longest >= edge
        || 2.0 * scale >= edge
        || softcap.is_some_and(|c| scale / c as f64 >= edge)
}

/// Every CPU path of this machine for element type `T`, as `check_paths` takes them.
pub fn cpu<T: Element>() -> Vec<(Backend, CpuIsa)> {
    super::cpu_paths::<T>().into_iter().map(|isa| (Backend::Cpu, isa)).collect()
}

/// Runs `paths` on one problem and checks each against the oracle (or the edge).
pub fn check_paths<T: Element>(
    paths: &[(Backend, CpuIsa)],
    q: &Array3<T>,
    k: &Array3<T>,
    v: &Array3<T>,
    q_lengths: &[usize],
    k_lengths: &[usize],
    base: &Params,
) -> Result<(), TestCaseError> {
    let (cu_q, cu_k) = (cu_seqlens(q_lengths), cu_seqlens(k_lengths));
    let reference = oracle::reference(q.view(), k.view(), v.view(), &cu_q, &cu_k, base).unwrap();
    let scale = base.softmax_scale.map_or(1.0 / (q.dim().2 as f64).sqrt(), f64::from);
    let beyond = beyond_edge(q, k, v, k_lengths, scale, base.softcap);
    for &(backend, isa) in paths {
        let params = Params { cpu_isa: isa, backend, ..base.clone() };
        match forward_with_lse(q.view(), k.view(), v.view(), &cu_q, &cu_k, &params) {
            Err(Error::BeyondF32 { .. }) => prop_assert!(beyond, "{isa:?}: refused inputs inside the edge"),
            Err(e) => prop_assert!(false, "{isa:?}: {e}"),
            Ok((out, lse)) => {
                prop_assert!(!beyond, "{isa:?}: accepted inputs beyond the edge");
                for (&got, &exact) in out.iter().zip(&reference.out) {
                    let finite = oracle::round_to::<T>(exact).to_f32().is_finite();
                    prop_assert!(
                        !finite || got.to_f32().is_finite(),
                        "{isa:?}: {got:?} where the oracle has {exact:e}"
                    );
                }
                let report = reference.compare(out.view());
                prop_assert!(report.worst.is_none(), "{isa:?} out: {report}");
                let report = reference.compare_lse(lse.view());
                prop_assert!(report.worst.is_none(), "{isa:?} lse: {report}");
            }
        }
    }
    Ok(())
}

/// One random problem of the property test: magnitudes of q, k and v (decimal exponents), the
/// scale's, the data seed.
#[derive(Clone, Debug)]
pub struct Extreme {
    exponents: [f64; 3],
    scale_exponent: Option<f64>,
    softcap: Option<f32>,
    causal: bool,
    head_dim: usize,
    lengths: Vec<usize>,
    seed: u64,
}

/// Decimal exponents of the magnitudes from `lo` to `hi`, the scale's from -30 to 30, soft-caps
/// moderate or from 1e-37 to 1e37.
pub fn extreme(lo: f64, hi: f64) -> impl Strategy<Value = Extreme> {
    (
        prop::array::uniform3(lo..hi),
        prop::option::weighted(0.7, -30.0f64..30.0),
        prop::option::weighted(0.3, prop_oneof![0.5f32..50.0, (-37.0f64..37.0).prop_map(|e| 10f64.powf(e) as f32)]),
        any::<bool>(),
        prop::sample::select(vec![1usize, 8, 64, 72, 128]),
        prop::collection::vec(0usize..=80, 1..=3),
        any::<u64>(),
    )
        .prop_map(|(exponents, scale_exponent, softcap, causal, head_dim, lengths, seed)| Extreme {
            exponents,
            scale_exponent,
            softcap,
            causal,
            head_dim,
            lengths,
            seed,
        })
}

/// Generates the data of `case` and checks `paths` on it.
pub fn check_extreme<T: Element>(case: &Extreme, paths: &[(Backend, CpuIsa)]) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(case.seed);
    let total = case.lengths.iter().sum();
    let [mq, mk, mv] = case.exponents.map(|e| 10f64.powf(e));
    let q = uniform::<T>(&mut rng, (total, 2, case.head_dim), mq);
    let k = uniform::<T>(&mut rng, (total, 1, case.head_dim), mk);
    let v = uniform::<T>(&mut rng, (total, 1, case.head_dim), mv);
    let p = Params {
        softmax_scale: case.scale_exponent.map(|e| 10f64.powf(e) as f32),
        softcap: case.softcap,
        causal: case.causal,
        ..Params::default()
    };
    check_paths(paths, &q, &k, &v, &case.lengths, &case.lengths, &p)
}

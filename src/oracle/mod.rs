//! The scalar reference: the plain attention formula in `f64`, for tests (ours and yours).
//!
//! No tiling, no SIMD, no online softmax, no code shared with the fast kernels beyond input
//! validation (so it returns exactly the same errors): for every sequence, head and query row it
//! lists the visible keys, takes `s_j = scale · q·k_j` (then `softcap · tanh(s_j / softcap)`,
//! then minus ALiBi's `slope · |i + Lk - Lq - j|`), `m = max(s_j, sink)`, `p_j = exp(s_j - m)`,
//! and returns `Σ p_j v_j / (Σ p_j + exp(sink - m))` and `lse = m + ln(Σ p_j + exp(sink - m))`
//! (the sink terms only with sinks), all in `f64`.
//!
//! Use [`forward`] where you want the crate's result type, [`reference()`] for the unrounded `f64`
//! values with per-row error bounds, and [`Reference::compare`] to check another
//! implementation's output against them with a derived tolerance.
//!
//! ```
//! use ndarray::Array3;
//! use varlen_attn::{oracle, Params};
//!
//! let q = Array3::from_shape_fn((5, 2, 4), |(t, h, d)| (t + h + d) as f32 * 0.1);
//! let k = q.clone();
//! let v = Array3::from_shape_fn((5, 2, 4), |(t, _, d)| (t * d) as f32);
//! let cu = [0, 2, 5];
//! let fast = varlen_attn::forward(q.view(), k.view(), v.view(), &cu, &cu, &Params::default())?;
//! let reference = oracle::reference(q.view(), k.view(), v.view(), &cu, &cu, &Params::default())?;
//! let report = reference.compare(fast.view());
//! assert!(report.worst.is_none(), "{report}");
//! # Ok::<(), varlen_attn::Error>(())
//! ```

mod rounding;
mod tolerance;

pub use rounding::round_to;
pub use tolerance::{Comparison, Mismatch};

use crate::element::Element;
use crate::error::Error;
use crate::layout::shape3;
use crate::params::Params;
use crate::problem::Problem;
use ndarray::{Array2, Array3, ArrayView3};

/// The smallest normal f32, `2^-126`.
const F32_MIN_NORMAL: f64 = f32::MIN_POSITIVE as f64;

/// The oracle's `f64` results with what is needed to bound another implementation's error.
#[derive(Clone, Debug)]
pub struct Reference {
    /// `[rows, num_heads, head_dim_v]`: the attention output, unrounded. The rows are all of
    /// q's tokens for [`reference()`], the chosen tokens for [`reference_rows`].
    pub out: Array3<f64>,
    /// `[num_heads, rows]`: natural log of the softmax denominator; `-inf` for rows that see
    /// no key.
    pub lse: Array2<f64>,
    /// The q token of each row of `out`.
    pub tokens: Vec<usize>,
    /// `[rows, num_heads]`: per-row terms of the error bound (see [`Reference::tolerance`]).
    pub bounds: Array2<RowBound>,
    /// The element type of the inputs.
    pub dtype: crate::DType,
}

/// Per-row quantities that bound a fast implementation's rounding error.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RowBound {
    /// Number of keys the row sees.
    pub visible: usize,
    /// Largest `|v|` over the visible keys, all of `head_dim_v`.
    pub v_max: f64,
    /// Bound on the absolute error of any one score computed in `f32`
    /// (`scale · (γ_D · max_j Σ_d |q_d k_jd| + D · 2^-126)`, plus the soft-cap's own error;
    /// the `2^-126` per product covers products below f32's normal range, which hardware bf16
    /// dot products flush to zero).
    pub score_error: f64,
}

/// Attention in `f64`, rounded once to `T` (round to nearest, ties to even).
///
/// Same arguments, shapes, semantics and errors as [`crate::forward`].
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{oracle, Params};
/// let x = Array3::<f32>::ones((3, 1, 2));
/// let out = oracle::forward(x.view(), x.view(), x.view(), &[0, 3], &[0, 3], &Params::default())?;
/// assert_eq!(out[[2, 0, 1]], 1.0);
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`crate::forward`].
pub fn forward<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<Array3<T>, Error> {
    forward_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, params).map(|(out, _)| out)
}

/// [`forward`] with the log-sum-exp `[num_heads, total_q]`, rounded to `f32`.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{oracle, Params};
/// let x = Array3::<f32>::zeros((4, 1, 2));
/// let (_, lse) = oracle::forward_with_lse(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &Params::default())?;
/// assert!((lse[[0, 0]] - 4f32.ln()).abs() < 1e-6); // four equal scores of 0
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`crate::forward`].
pub fn forward_with_lse<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<(Array3<T>, Array2<f32>), Error> {
    let r = reference(q, k, v, cu_seqlens_q, cu_seqlens_k, params)?;
    Ok((r.out.mapv(round_to::<T>), r.lse.mapv(|x| x as f32)))
}

/// The unrounded `f64` results for every query token, with per-row error-bound terms.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{oracle, Params};
/// let x = Array3::<f32>::ones((2, 1, 3));
/// let r = oracle::reference(x.view(), x.view(), x.view(), &[0, 2], &[0, 2], &Params::default())?;
/// assert_eq!(r.out[[1, 0, 2]], 1.0);
/// assert_eq!(r.bounds[[1, 0]].visible, 2);
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`crate::forward`].
pub fn reference<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<Reference, Error> {
    let tokens: Vec<usize> = (0..q.dim().0).collect();
    reference_rows(q, k, v, cu_seqlens_q, cu_seqlens_k, params, &tokens)
}

/// [`reference()`] for keys and values in a paged cache ([`crate::forward_paged`]'s arguments):
/// the sequences' keys are gathered, entry by entry of the block table, into packed tensors,
/// which the formula then reads.
///
/// ```
/// use ndarray::{Array2, Array3, Array4};
/// use varlen_attn::{forward_paged, oracle, PagedKv, Params};
/// let cache = Array4::from_shape_fn((3, 4, 1, 2), |(b, s, _, d)| (b * 4 + s + d) as f32 / 8.0);
/// let table = Array2::from_shape_vec((2, 2), vec![2, 0, 1, 2])?;
/// let kv = PagedKv { k_cache: cache.view(), v_cache: cache.view(), block_table: table.view() };
/// let q = Array3::<f32>::ones((3, 1, 2));
/// let (cu_q, cu_k) = ([0, 1, 3], [0, 6, 14]);
/// let out = forward_paged(q.view(), &kv, &cu_q, &cu_k, &Params::default())?;
/// let reference = oracle::reference_paged(q.view(), &kv, &cu_q, &cu_k, &Params::default())?;
/// assert!(reference.compare(out.view()).worst.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`crate::forward_paged`].
pub fn reference_paged<T: Element>(
    q: ArrayView3<T>,
    kv: &crate::PagedKv<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<Reference, Error> {
    let (k, v) = crate::paged::gather(&q, kv, cu_seqlens_q, cu_seqlens_k, params)?;
    reference(q, k.view(), v.view(), cu_seqlens_q, cu_seqlens_k, params)
}

/// [`reference()`] for the chosen query tokens only (in the order given), so that large problems
/// can be spot-checked: its cost is proportional to the keys those rows see.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{oracle, Params};
/// let x = Array3::<f32>::ones((6, 1, 3));
/// let r = oracle::reference_rows(x.view(), x.view(), x.view(), &[0, 6], &[0, 6], &Params::default(), &[5, 0])?;
/// assert_eq!(r.out.dim(), (2, 1, 3));
/// assert_eq!(r.tokens, vec![5, 0]);
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`crate::forward`]; a token index out of range is reported as a shape error of
/// `"tokens"`.
pub fn reference_rows<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
    tokens: &[usize],
) -> Result<Reference, Error> {
    let problem = Problem::new(shape3(&q), shape3(&k), shape3(&v), cu_seqlens_q, cu_seqlens_k, params)?;
    if let Some(&bad) = tokens.iter().find(|&&t| t >= problem.total_q) {
        return Err(Error::Shape { arg: "tokens", axis: 0, expected: problem.total_q, got: bad });
    }
    let (heads, dv) = (problem.num_heads, problem.head_dim_v);
    let group = problem.group_size();
    let scale = problem.scale_exact;
    let softcap = problem.softcap.map(f64::from);
    let (left, right) = (problem.mask.left, problem.mask.right);
    let u32_ = crate::DType::F32.unit_roundoff();
    let d = problem.head_dim as f64;
    let gamma_d = d * u32_ / (1.0 - d * u32_);

    let mut out = Array3::<f64>::zeros((tokens.len(), heads, dv));
    let mut lse = Array2::<f64>::from_elem((heads, tokens.len()), f64::NEG_INFINITY);
    let mut bounds = Array2::<RowBound>::default((tokens.len(), heads));
    let mut scores: Vec<(usize, f64)> = Vec::new();

    for (row, &token) in tokens.iter().enumerate() {
        // The sequence holding this token: the last b with cu_seqlens_q[b] <= token that is
        // not empty.
        let b = cu_seqlens_q.partition_point(|&c| c as usize <= token) - 1;
        let (q0, q1) = (cu_seqlens_q[b] as i64, cu_seqlens_q[b + 1] as i64);
        let (k0, k1) = (cu_seqlens_k[b] as i64, cu_seqlens_k[b + 1] as i64);
        let i = token as i64 - q0;
        let diagonal = i + (k1 - k0) - (q1 - q0);
        let sees = |j: i64| {
            left.is_none_or(|l| j >= diagonal.saturating_sub(l as i64))
                && right.is_none_or(|r| j <= diagonal.saturating_add(r as i64))
        };
        for h in 0..heads {
            let hk = h / group;
            let slope = problem.alibi_slope(b, h).map_or(0.0, f64::from);
            let sink = problem.sink(h).map(f64::from);
            scores.clear();
            let mut abs_dot_max = 0f64;
            let mut bias_max = 0f64;
            let mut v_max = 0f64;
            for j in (0..k1 - k0).filter(|&j| sees(j)) {
                let key = (k0 + j) as usize;
                let (mut dot, mut abs_dot) = (0f64, 0f64);
                for (&a, &b) in q.slice(ndarray::s![token, h, ..]).iter().zip(k.slice(ndarray::s![key, hk, ..])) {
                    let (a, b) = (a.to_f32() as f64, b.to_f32() as f64);
                    dot += a * b;
                    abs_dot += (a * b).abs();
                }
                let mut s = scale * dot;
                if let Some(c) = softcap {
                    s = c * (s / c).tanh();
                }
                // ALiBi: after the scale and the soft-cap, by the distance from the diagonal.
                let bias = slope * (diagonal - j).abs() as f64;
                bias_max = bias_max.max(bias.abs());
                s -= bias;
                scores.push((key, s));
                abs_dot_max = abs_dot_max.max(abs_dot);
                for &x in v.slice(ndarray::s![key, hk, ..]) {
                    v_max = v_max.max((x.to_f32() as f64).abs());
                }
            }
            let softcap_error = softcap.map_or(0.0, |c| 8.0 * c * u32_);
            // The bias's distance (exact below 2^24), product and subtraction, each rounded in f32.
            let alibi_error = 3.0 * u32_ * bias_max;
            bounds[[row, h]] = RowBound {
                visible: scores.len(),
                v_max,
                score_error: scale * ((gamma_d + 3.0 * u32_) * abs_dot_max + d * F32_MIN_NORMAL)
                    + softcap_error
                    + alibi_error,
            };
            // The max, with NaN winning so that NaN scores give NaN rows as IEEE arithmetic
            // would.
            // A sink joins the max (and the denominator below), so that a large one cannot
            // overflow the sum.
            let m = scores.iter().fold(sink.unwrap_or(f64::NEG_INFINITY), |m, &(_, s)| {
                if s.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    m.max(s)
                }
            });
            if m == f64::NEG_INFINITY {
                // No visible key, or every score is -inf: output 0, LSE -inf.
                continue;
            }
            let mut denominator = sink.map_or(0.0, |s| (s - m).exp());
            let mut acc = vec![0f64; dv];
            for &(key, s) in &scores {
                let p = (s - m).exp();
                denominator += p;
                for (a, &x) in acc.iter_mut().zip(v.slice(ndarray::s![key, hk, ..])) {
                    *a += p * x.to_f32() as f64;
                }
            }
            for (o, a) in out.slice_mut(ndarray::s![row, h, ..]).iter_mut().zip(&acc) {
                *o = a / denominator;
            }
            lse[[h, row]] = m + denominator.ln();
        }
    }
    Ok(Reference { out, lse, tokens: tokens.to_vec(), bounds, dtype: T::DTYPE })
}

//! Shared by the fuzz targets: runs one attention call through a public entry point and checks
//! it against the oracle.

use ndarray::{s, Array2, Array3, ArrayView3};
use varlen_attn::{oracle, Element, Error, Params};

/// Whether an error comes only from the fast path (the oracle has no instruction sets).
pub fn fast_path_only(e: &Error) -> bool {
    matches!(e, Error::IsaUnavailable { .. } | Error::Param { name: "cpu_isa", .. })
}

/// Calls `entry` (0: forward, 1: forward_with_lse, 2: forward_into, 3: forward_with_lse_into)
/// and the oracle on the same arguments; panics on any disagreement. With `finite_normal`
/// inputs (no NaN, infinity or subnormal; any magnitude) the results must be within the
/// oracle's tolerance wherever the oracle's rounded output is finite, or the fast path must
/// refuse them as beyond f32's edge exactly when they are; otherwise only the shapes, the
/// errors and the absence of a crash are checked.
#[allow(clippy::too_many_arguments)]
pub fn check<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
    entry: u8,
    out_shape_error: bool,
    finite_normal: bool,
) {
    let reference = oracle::reference(q, k, v, cu_q, cu_k, params);
    let expected_shape = (q.dim().0, q.dim().1, v.dim().2);
    let out_shape =
        if out_shape_error { (expected_shape.0 + 1, expected_shape.1, expected_shape.2) } else { expected_shape };
    let result: Result<(Array3<T>, Option<Array2<f32>>), Error> = match entry % 4 {
        0 => varlen_attn::forward(q, k, v, cu_q, cu_k, params).map(|o| (o, None)),
        1 => varlen_attn::forward_with_lse(q, k, v, cu_q, cu_k, params).map(|(o, l)| (o, Some(l))),
        2 => {
            // A padded, NaN-filled output: every element of the view must be written, none beyond.
            let mut storage = Array3::from_elem((out_shape.0, out_shape.1, out_shape.2 + 1), T::from_f32(f32::NAN));
            let r =
                varlen_attn::forward_into(q, k, v, cu_q, cu_k, params, storage.slice_mut(s![.., .., ..out_shape.2]));
            assert!(storage.slice(s![.., .., out_shape.2]).iter().all(|x| x.to_f32().is_nan()), "wrote past the view");
            r.map(|()| (storage.slice(s![.., .., ..out_shape.2]).to_owned(), None))
        }
        _ => {
            let mut out = Array3::from_elem(out_shape, T::from_f32(f32::NAN));
            let mut lse = Array2::from_elem((out_shape.1, out_shape.0), f32::NAN);
            varlen_attn::forward_with_lse_into(q, k, v, cu_q, cu_k, params, out.view_mut(), lse.view_mut())
                .map(|()| (out, Some(lse)))
        }
    };
    compare(reference, result, q, k, v, cu_q, cu_k, params, out_shape_error, finite_normal);
}

/// Checks a fast path's `result` against the oracle's `reference` for the same problem (`q`,
/// `k`, `v` packed, whichever way the fast path read them): the same error, or the edge of f32
/// exactly where the fast path refused, or (`finite_normal`) results within the oracle's bound.
#[allow(clippy::too_many_arguments)]
pub fn compare<T: Element>(
    reference: Result<oracle::Reference, Error>,
    result: Result<(Array3<T>, Option<Array2<f32>>), Error>,
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
    out_shape_error: bool,
    finite_normal: bool,
) {
    let expected_shape = (q.dim().0, q.dim().1, v.dim().2);
    match (reference, result) {
        (_, Err(e)) if fast_path_only(&e) => {}
        (Err(expected), Err(got)) => {
            if out_shape_error && matches!(got, Error::Shape { arg: "out", .. }) {
                return;
            }
            assert_eq!(expected, got, "fast path and oracle disagree on the error");
        }
        (Ok(_), Err(Error::BeyondF32 { .. })) => {
            assert!(beyond_f32_edge(q, k, v, cu_q, cu_k, params), "refused as beyond f32's edge inputs inside it");
        }
        (Ok(_), Err(got)) => {
            assert!(
                out_shape_error && matches!(got, Error::Shape { arg: "out", .. }),
                "fast path refused what the oracle accepted: {got}"
            );
        }
        (Err(expected), Ok(_)) => panic!("fast path accepted what the oracle refused: {expected}"),
        (Ok(mut reference), Ok((out, lse))) => {
            assert!(!out_shape_error, "a wrongly shaped output was accepted");
            assert_eq!(out.dim(), expected_shape);
            if finite_normal {
                assert!(!beyond_f32_edge(q, k, v, cu_q, cu_k, params), "accepted inputs beyond f32's edge");
                // Where the oracle's output overflows T, f32 may round either way: not compared.
                for (exact, got) in reference.out.iter_mut().zip(&out) {
                    if !oracle::round_to::<T>(*exact).to_f32().is_finite() {
                        *exact = got.to_f32() as f64;
                    }
                }
                let report = reference.compare(out.view());
                assert!(report.worst.is_none(), "out of tolerance: {report}");
                if let Some(lse) = lse {
                    let report = reference.compare_lse(lse.view());
                    assert!(report.worst.is_none(), "LSE out of tolerance: {report}");
                }
            }
        }
    }
}

/// The documented edge (`varlen_attn::F32_EDGE`), computed here independently: whether
/// `head_dim · max|q| · max|k| · max(1, 2·scale)`, `max|v| · (longest key sequence)`,
/// `2·scale`, `scale / softcap`, `max|alibi slope| · (longest Lq + longest Lk)` or `max|sink|`
/// reaches 2^126.
pub fn beyond_f32_edge<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
) -> bool {
    let max = |x: ArrayView3<T>| x.iter().map(|e| e.to_f32().abs() as f64).fold(0.0, f64::max);
    let d = q.dim().2 as f64;
    let scale = params.softmax_scale.map_or(1.0 / d.sqrt(), f64::from);
    let longest = cu_k.windows(2).map(|w| (w[1] - w[0]) as f64).fold(0.0, f64::max);
    let longest_q = cu_q.windows(2).map(|w| (w[1] - w[0]) as f64).fold(0.0, f64::max);
    let largest = |x: &Option<Vec<f32>>| x.iter().flatten().fold(0f64, |m, &s| m.max((s as f64).abs()));
    let edge = 2f64.powi(126);
    d * max(q) * max(k) * (2.0 * scale).max(1.0) >= edge
        || max(v) * longest >= edge
        || 2.0 * scale >= edge
        || params.softcap.is_some_and(|c| scale / c as f64 >= edge)
        || largest(&params.alibi_slopes) * (longest_q + longest) >= edge
        || largest(&params.sinks) >= edge
}

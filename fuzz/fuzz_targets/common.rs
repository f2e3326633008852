//! Shared by the fuzz targets: runs one attention call through a public entry point and checks
//! it against the oracle.

use ndarray::{s, Array2, Array3, ArrayView3};
use varlen_attn::{oracle, Element, Error, Params};

/// Whether an error comes only from the fast path (the oracle has no instruction sets).
pub fn fast_path_only(e: &Error) -> bool {
    matches!(e, Error::IsaUnavailable { .. } | Error::Param { name: "cpu_isa", .. })
}

/// Calls `entry` (0: forward, 1: forward_with_lse, 2: forward_into, 3: forward_with_lse_into)
/// and the oracle on the same arguments; panics on any disagreement. With `finite_moderate`
/// inputs the results must be within the oracle's tolerance; otherwise (NaN, infinities,
/// subnormals, huge values) only the shapes, the errors and the absence of a crash are checked.
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
    finite_moderate: bool,
) {
    let reference = oracle::reference(q, k, v, cu_q, cu_k, params);
    let expected_shape = (q.dim().0, q.dim().1, v.dim().2);
    let out_shape = if out_shape_error { (expected_shape.0 + 1, expected_shape.1, expected_shape.2) } else { expected_shape };
    let result: Result<(Array3<T>, Option<Array2<f32>>), Error> = match entry % 4 {
        0 => varlen_attn::forward(q, k, v, cu_q, cu_k, params).map(|o| (o, None)),
        1 => varlen_attn::forward_with_lse(q, k, v, cu_q, cu_k, params).map(|(o, l)| (o, Some(l))),
        2 => {
            // A padded, NaN-filled output: every element of the view must be written, none beyond.
            let mut storage = Array3::from_elem((out_shape.0, out_shape.1, out_shape.2 + 1), T::from_f32(f32::NAN));
            let r = varlen_attn::forward_into(q, k, v, cu_q, cu_k, params, storage.slice_mut(s![.., .., ..out_shape.2]));
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
    match (reference, result) {
        (_, Err(e)) if fast_path_only(&e) => {}
        (Err(expected), Err(got)) => {
            if out_shape_error && matches!(got, Error::Shape { arg: "out", .. }) {
                return;
            }
            assert_eq!(expected, got, "fast path and oracle disagree on the error");
        }
        (Ok(_), Err(got)) => {
            assert!(out_shape_error && matches!(got, Error::Shape { arg: "out", .. }), "fast path refused what the oracle accepted: {got}");
        }
        (Err(expected), Ok(_)) => panic!("fast path accepted what the oracle refused: {expected}"),
        (Ok(reference), Ok((out, lse))) => {
            assert!(!out_shape_error, "a wrongly shaped output was accepted");
            assert_eq!(out.dim(), expected_shape);
            if finite_moderate {
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

//! Targeted checks of the semantics: LSE values, rows that see no key, empty sequences, NaN and
//! infinity propagation, the rounding of the output, the bottom-right mask alignment.

mod common;

use common::{check_non_finite_inputs_stay_in_their_sequence, cpu_paths, cu_seqlens, random_tensor, Rng};
use half::bf16;
use ndarray::{s, Array3};
use varlen_attn::{forward_with_lse, oracle, Params};

fn params_for(isa: varlen_attn::CpuIsa, base: &Params) -> Params {
    Params { cpu_isa: isa, backend: varlen_attn::Backend::Cpu, ..base.clone() }
}

#[test]
fn lse_of_equal_scores_is_the_log_of_the_key_count() {
    let q = Array3::<bf16>::default((10, 2, 72));
    let k = Array3::from_elem((7 + 300, 2, 72), bf16::from_f32(0.5));
    for isa in cpu_paths::<bf16>() {
        let (out, lse) = forward_with_lse(
            q.view(),
            k.view(),
            k.view(),
            &[0, 4, 10],
            &[0, 7, 307],
            &params_for(isa, &Params::default()),
        )
        .unwrap();
        for h in 0..2 {
            for t in 0..10 {
                let keys = if t < 4 { 7.0f32 } else { 300.0 };
                assert!(
                    (lse[[h, t]] - keys.ln()).abs() <= 2.0 * f32::EPSILON * keys.ln(),
                    "{isa:?} lse[{h},{t}] = {}",
                    lse[[h, t]]
                );
            }
        }
        assert!(out.iter().all(|&x| x == bf16::from_f32(0.5)));
    }
}

#[test]
fn lse_matches_the_oracle_with_softcap_and_scale() {
    let mut rng = Rng::new(7);
    let q = random_tensor::<f32>(&mut rng, (50, 4, 40), 2.0);
    let k = random_tensor::<f32>(&mut rng, (90, 2, 40), 2.0);
    let v = random_tensor::<f32>(&mut rng, (90, 2, 24), 1.0);
    let base = Params { softcap: Some(5.0), softmax_scale: Some(0.3), window_left: Some(20), ..Params::default() };
    let cu_q = [0, 20, 20, 50];
    let cu_k = [0, 70, 80, 90];
    let reference = oracle::reference(q.view(), k.view(), v.view(), &cu_q, &cu_k, &base).unwrap();
    for isa in cpu_paths::<f32>() {
        let (out, lse) = forward_with_lse(q.view(), k.view(), v.view(), &cu_q, &cu_k, &params_for(isa, &base)).unwrap();
        let report = reference.compare_lse(lse.view());
        assert!(report.worst.is_none(), "{isa:?}: {report}");
        assert!(report.max_abs_error < 1e-5, "{isa:?}: {report}");
        assert!(reference.compare(out.view()).worst.is_none());
    }
}

/// Rows that see no key get 0 and LSE -inf: no keys at all, causal rows above the
/// bottom-right diagonal, windows that exclude everything.
#[test]
fn rows_that_see_no_key_are_zero_with_lse_minus_infinity() {
    let mut rng = Rng::new(3);
    // Sequence 0: 5 queries, 0 keys. Sequence 1: 6 queries, 2 keys (causal: rows 0..4 see
    // nothing). Sequence 2: 3 queries, 4 keys.
    let cu_q = cu_seqlens(&[5, 6, 3]);
    let cu_k = cu_seqlens(&[0, 2, 4]);
    let q = random_tensor::<bf16>(&mut rng, (14, 3, 16), 1.0);
    let k = random_tensor::<bf16>(&mut rng, (6, 3, 16), 1.0);
    let v = random_tensor::<bf16>(&mut rng, (6, 3, 16), 1.0);
    for isa in cpu_paths::<bf16>() {
        let p = params_for(isa, &Params { causal: true, ..Params::default() });
        let (out, lse) = forward_with_lse(q.view(), k.view(), v.view(), &cu_q, &cu_k, &p).unwrap();
        let empty_rows: Vec<usize> = (0..5).chain(5..9).collect();
        for &t in &empty_rows {
            assert!(out.slice(s![t, .., ..]).iter().all(|&x| x.to_f32() == 0.0), "{isa:?} row {t}");
            assert!(lse.column(t).iter().all(|&x| x == f32::NEG_INFINITY), "{isa:?} row {t}");
        }
        for t in 9..14 {
            assert!(lse.column(t).iter().all(|&x| x.is_finite()), "{isa:?} row {t}");
        }
        let reference = oracle::reference(q.view(), k.view(), v.view(), &cu_q, &cu_k, &p).unwrap();
        assert!(reference.compare(out.view()).worst.is_none());

        // A window that sees nothing at all: keys strictly to the right of the diagonal only
        // exist with a right window, so left = 0, right = 0 with more queries than keys.
        let p = params_for(isa, &Params { window_left: Some(0), window_right: Some(0), ..Params::default() });
        let (out, lse) = forward_with_lse(q.view(), k.view(), v.view(), &cu_q, &cu_k, &p).unwrap();
        assert!(out.slice(s![5..9, .., ..]).iter().all(|&x| x.to_f32() == 0.0));
        assert!(lse.slice(s![.., 5..9]).iter().all(|&x| x == f32::NEG_INFINITY));
        assert!(lse.slice(s![.., 9..11]).iter().all(|&x| x.is_finite()));
    }
}

#[test]
fn empty_query_sequences_are_skipped() {
    let mut rng = Rng::new(11);
    let cu_q = cu_seqlens(&[0, 3, 0, 0, 2]);
    let cu_k = cu_seqlens(&[4, 5, 6, 0, 3]);
    let q = random_tensor::<f32>(&mut rng, (5, 2, 8), 1.0);
    let k = random_tensor::<f32>(&mut rng, (18, 2, 8), 1.0);
    let v = random_tensor::<f32>(&mut rng, (18, 2, 8), 1.0);
    let reference = oracle::reference(q.view(), k.view(), v.view(), &cu_q, &cu_k, &Params::default()).unwrap();
    for isa in cpu_paths::<f32>() {
        let out =
            varlen_attn::forward(q.view(), k.view(), v.view(), &cu_q, &cu_k, &params_for(isa, &Params::default()))
                .unwrap();
        assert!(reference.compare(out.view()).worst.is_none());
    }
    // No query tokens at all.
    let none = Array3::<f32>::zeros((0, 2, 8));
    let out =
        varlen_attn::forward(none.view(), k.view(), v.view(), &[0, 0, 0, 0, 0, 0], &cu_k, &Params::default()).unwrap();
    assert_eq!(out.dim(), (0, 2, 8));
}

/// NaN in q poisons exactly its own row; NaN or infinity in k or v poisons the rows that see
/// that key and no others (0 · inf would be NaN, so masked keys must be skipped, not zeroed).
#[test]
fn non_finite_inputs_reach_only_the_rows_that_see_them() {
    let mut rng = Rng::new(5);
    let (lq, heads, d) = (80, 2, 24);
    let q0 = random_tensor::<bf16>(&mut rng, (lq, heads, d), 1.0);
    let k0 = random_tensor::<bf16>(&mut rng, (lq, heads, d), 1.0);
    let v0 = random_tensor::<bf16>(&mut rng, (lq, heads, d), 1.0);
    let cu = [0, lq as i32];
    let causal = Params { causal: true, ..Params::default() };
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let (mut q, mut k, mut v) = (q0.clone(), k0.clone(), v0.clone());
        q[[10, 1, 3]] = bf16::from_f32(bad);
        k[[50, 0, 7]] = bf16::from_f32(bad);
        v[[70, 1, 2]] = bf16::from_f32(bad);
        let reference = oracle::reference(q.view(), k.view(), v.view(), &cu, &cu, &causal).unwrap();
        for isa in cpu_paths::<bf16>() {
            let (out, _) = forward_with_lse(q.view(), k.view(), v.view(), &cu, &cu, &params_for(isa, &causal)).unwrap();
            let report = reference.compare(out.view());
            assert!(report.worst.is_none(), "{isa:?} {bad}: {report}");
            // Rows before key 50 (head 0) stay finite; before key 70 (head 1) only the row of the
            // bad query is not, and in every column.
            assert!(out.slice(s![..50, 0, ..]).iter().all(|x| x.to_f32().is_finite()), "{isa:?} {bad}");
            let non_finite = out.slice(s![..70, 1, ..]).iter().filter(|x| !x.to_f32().is_finite()).count();
            assert_eq!(non_finite, d, "{isa:?} {bad}");
            assert!(out.slice(s![10, 1, ..]).iter().all(|x| x.to_f32().is_nan()), "{isa:?} {bad}");
        }
    }
}

/// NaN or infinity in one sequence reaches no other sequence of the batch, on every CPU path.
#[test]
fn non_finite_inputs_stay_in_their_sequence() {
    for isa in cpu_paths::<bf16>() {
        check_non_finite_inputs_stay_in_their_sequence(&params_for(isa, &Params::default()));
        check_non_finite_inputs_stay_in_their_sequence(&params_for(isa, &Params { causal: true, ..Params::default() }));
    }
}

/// The output is rounded once, to nearest with ties to even, from the f32 result.
#[test]
fn output_is_rounded_once_to_nearest_even() {
    // Equal scores over two keys: the exact mean of 1 + 2^-7 and 1 + 2^-6 is 1 + 1.5 · 2^-7,
    // exactly halfway between two bf16 values; ties-to-even picks 1 + 2^-6 (truncation or
    // rounding twice would not).
    let q = Array3::<bf16>::default((1, 1, 2));
    let k = Array3::<bf16>::default((2, 1, 2));
    let mut v = Array3::<bf16>::default((2, 1, 2));
    v[[0, 0, 0]] = bf16::from_f32(1.0 + 2f32.powi(-7));
    v[[1, 0, 0]] = bf16::from_f32(1.0 + 2f32.powi(-6));
    v[[0, 0, 1]] = bf16::from_f32(1.0);
    v[[1, 0, 1]] = bf16::from_f32(1.0 + 2f32.powi(-6)); // mean 1 + 2^-7, exact
    for isa in cpu_paths::<bf16>() {
        let out =
            varlen_attn::forward(q.view(), k.view(), v.view(), &[0, 1], &[0, 2], &params_for(isa, &Params::default()))
                .unwrap();
        assert_eq!(out[[0, 0, 0]].to_f32(), 1.0 + 2f32.powi(-6), "{isa:?}");
        assert_eq!(out[[0, 0, 1]].to_f32(), 1.0 + 2f32.powi(-7), "{isa:?}");
    }
}

/// With more keys than queries the causal diagonal is aligned to the bottom-right corner: the
/// last query sees every key, the first sees Lk - Lq + 1.
#[test]
fn causal_mask_is_bottom_right_aligned() {
    let (lq, lk) = (3usize, 5usize);
    let q = Array3::<f32>::zeros((lq, 1, 4));
    let k = Array3::<f32>::zeros((lk, 1, 4));
    let v = Array3::from_shape_fn((lk, 1, 4), |(t, _, _)| t as f32);
    let p = Params { causal: true, ..Params::default() };
    let (out, lse) = forward_with_lse(q.view(), k.view(), v.view(), &[0, lq as i32], &[0, lk as i32], &p).unwrap();
    // Row i averages keys 0..=i + 2.
    for i in 0..lq {
        let seen = i + lk - lq + 1;
        assert_eq!(out[[i, 0, 0]], (seen - 1) as f32 / 2.0);
        assert!((lse[[0, i]] - (seen as f32).ln()).abs() < 1e-6);
    }
}

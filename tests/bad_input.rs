//! Every class of bad input gets its own, specific error (and a message naming the argument),
//! never a panic. Each call goes through both the fast path and the oracle, which must agree.

use ndarray::{Array2, Array3, ArrayD, IxDyn};
use varlen_attn::{oracle, Backend, CpuIsa, CuSeqlensRule, Error, Params};

/// Runs `forward` and the oracle on the given shapes and cu_seqlens; both must fail alike.
fn error_of(
    q: (usize, usize, usize),
    k: (usize, usize, usize),
    v: (usize, usize, usize),
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
) -> Error {
    let (q, k, v) = (Array3::<f32>::zeros(q), Array3::<f32>::zeros(k), Array3::<f32>::zeros(v));
    let fast = varlen_attn::forward(q.view(), k.view(), v.view(), cu_q, cu_k, params).expect_err("must be refused");
    let slow = oracle::forward(q.view(), k.view(), v.view(), cu_q, cu_k, params).expect_err("oracle must refuse");
    assert_eq!(fast, slow);
    assert!(!fast.to_string().is_empty());
    fast
}

fn shapes_error(q: (usize, usize, usize), k: (usize, usize, usize), v: (usize, usize, usize)) -> Error {
    error_of(q, k, v, &[0, q.0 as i32], &[0, k.0 as i32], &Params::default())
}

fn cu_error(cu_q: &[i32], cu_k: &[i32]) -> Error {
    error_of((6, 2, 8), (5, 2, 8), (5, 2, 8), cu_q, cu_k, &Params::default())
}

fn params_error(params: Params) -> Error {
    error_of((4, 2, 8), (4, 2, 8), (4, 2, 8), &[0, 4], &[0, 4], &params)
}

#[test]
fn wrong_rank() {
    let flat = ArrayD::<f32>::zeros(IxDyn(&[4, 16]));
    let err = varlen_attn::view3("k", flat.view()).unwrap_err();
    assert_eq!(err, Error::Rank { arg: "k", expected: 3, got: 2, layout: "[total_k, num_kv_heads, head_dim]" });
    assert_eq!(err.to_string(), "k has rank 2, expected 3 ([total_k, num_kv_heads, head_dim])");
    let deep = ArrayD::<f32>::zeros(IxDyn(&[1, 4, 2, 8]));
    assert!(matches!(varlen_attn::view3("q", deep.view()), Err(Error::Rank { got: 4, .. })));
}

#[test]
fn mismatched_dims() {
    assert_eq!(
        shapes_error((4, 2, 8), (4, 2, 16), (4, 2, 8)),
        Error::Shape { arg: "k", axis: 2, expected: 8, got: 16 }
    );
    assert_eq!(shapes_error((4, 2, 8), (4, 2, 8), (5, 2, 8)), Error::Shape { arg: "v", axis: 0, expected: 4, got: 5 });
    let err = shapes_error((4, 2, 8), (4, 2, 8), (4, 1, 8));
    assert_eq!(err, Error::Shape { arg: "v", axis: 1, expected: 2, got: 1 });
    assert_eq!(err.to_string(), "v has 1 on axis 1 (heads), expected 2 to match k");
}

#[test]
fn heads_not_a_multiple() {
    assert_eq!(shapes_error((4, 6, 8), (4, 4, 8), (4, 4, 8)), Error::Heads { num_heads: 6, num_kv_heads: 4 });
    assert_eq!(shapes_error((4, 2, 8), (4, 0, 8), (4, 0, 8)), Error::Heads { num_heads: 2, num_kv_heads: 0 });
    assert_eq!(shapes_error((4, 0, 8), (4, 1, 8), (4, 1, 8)), Error::Heads { num_heads: 0, num_kv_heads: 1 });
    assert!(Error::Heads { num_heads: 6, num_kv_heads: 4 }.to_string().contains("num_heads 6"));
}

#[test]
fn head_dims_out_of_range() {
    assert_eq!(shapes_error((4, 2, 0), (4, 2, 0), (4, 2, 8)), Error::HeadDim { arg: "q", got: 0, max: 256 });
    assert_eq!(shapes_error((4, 2, 257), (4, 2, 257), (4, 2, 8)), Error::HeadDim { arg: "q", got: 257, max: 256 });
    assert_eq!(shapes_error((4, 2, 8), (4, 2, 8), (4, 2, 0)), Error::HeadDim { arg: "v", got: 0, max: 256 });
    let err = shapes_error((4, 2, 8), (4, 2, 8), (4, 2, 300));
    assert_eq!(err, Error::HeadDim { arg: "v", got: 300, max: 256 });
    assert_eq!(err.to_string(), "v head_dim 300 is not supported: it must be between 1 and 256");
}

#[test]
fn cu_seqlens_of_different_lengths() {
    assert_eq!(cu_error(&[0, 2, 6], &[0, 5]), Error::CuSeqlensLength { q_len: 3, k_len: 2 });
}

#[test]
fn cu_seqlens_too_short() {
    assert_eq!(cu_error(&[], &[0, 5]), Error::CuSeqlensTooShort { arg: "cu_seqlens_q", len: 0 });
    assert_eq!(cu_error(&[0, 6], &[5]), Error::CuSeqlensTooShort { arg: "cu_seqlens_k", len: 1 });
}

#[test]
fn cu_seqlens_not_starting_at_zero() {
    let err = cu_error(&[1, 6], &[0, 5]);
    assert_eq!(err, Error::CuSeqlens { arg: "cu_seqlens_q", index: 0, value: 1, reason: CuSeqlensRule::FirstNotZero });
    assert_eq!(err.to_string(), "cu_seqlens_q[0] = 1: the first entry must be 0");
}

#[test]
fn cu_seqlens_decreasing() {
    let err = cu_error(&[0, 4, 6], &[0, 3, 2]);
    assert_eq!(err, Error::CuSeqlens { arg: "cu_seqlens_k", index: 2, value: 2, reason: CuSeqlensRule::Decreasing });
}

#[test]
fn cu_seqlens_negative() {
    let err = cu_error(&[0, -2, 6], &[0, 3, 5]);
    assert_eq!(err, Error::CuSeqlens { arg: "cu_seqlens_q", index: 1, value: -2, reason: CuSeqlensRule::Negative });
}

#[test]
fn cu_seqlens_not_ending_at_the_totals() {
    let err = cu_error(&[0, 2, 5], &[0, 3, 5]);
    assert_eq!(
        err,
        Error::CuSeqlens { arg: "cu_seqlens_q", index: 2, value: 5, reason: CuSeqlensRule::LastNotTotal { total: 6 } }
    );
    assert_eq!(err.to_string(), "cu_seqlens_q[2] = 5: the last entry must equal the token count 6");
    let err = cu_error(&[0, 2, 6], &[0, 3, 7]);
    assert_eq!(
        err,
        Error::CuSeqlens { arg: "cu_seqlens_k", index: 2, value: 7, reason: CuSeqlensRule::LastNotTotal { total: 5 } }
    );
    // A prefix sum past i32::MAX cannot describe these tensors either.
    let err = cu_error(&[0, 6], &[0, i32::MAX]);
    assert!(matches!(err, Error::CuSeqlens { reason: CuSeqlensRule::LastNotTotal { total: 5 }, .. }));
}

#[test]
fn bad_scale_and_softcap() {
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let err = params_error(Params { softmax_scale: Some(bad), ..Params::default() });
        assert!(matches!(err, Error::Param { name: "softmax_scale", .. }), "{err}");
        assert!(err.to_string().contains("must be finite and positive"));
        let err = params_error(Params { softcap: Some(bad), ..Params::default() });
        assert!(matches!(err, Error::Param { name: "softcap", .. }), "{err}");
    }
}

#[test]
fn bad_alibi_slopes_and_sinks() {
    // Two heads (params_error's problem), one sequence: 2 slopes, or 1 · 2 per sequence.
    for (slopes, fragment) in [(vec![0.5], "1 slopes"), (vec![0.5; 3], "3 slopes")] {
        let err = params_error(Params { alibi_slopes: Some(slopes), ..Params::default() });
        assert!(matches!(err, Error::Param { name: "alibi_slopes", .. }), "{err}");
        assert!(err.to_string().contains(fragment) && err.to_string().contains("num_heads"), "{err}");
    }
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let err = params_error(Params { alibi_slopes: Some(vec![0.5, bad]), ..Params::default() });
        assert!(
            matches!(err, Error::Param { name: "alibi_slopes", .. }) && err.to_string().contains("finite"),
            "{err}"
        );
        let err = params_error(Params { sinks: Some(vec![bad, 0.0]), ..Params::default() });
        assert!(matches!(err, Error::Param { name: "sinks", .. }) && err.to_string().contains("finite"), "{err}");
    }
    let err = params_error(Params { sinks: Some(vec![0.0; 3]), ..Params::default() });
    assert!(matches!(err, Error::Param { name: "sinks", .. }) && err.to_string().contains("3 sinks"), "{err}");
    // Slopes whose bias passes the range of f32.
    let zeros = Array3::<f32>::zeros((4, 2, 8));
    let p = Params { alibi_slopes: Some(vec![1e38, 0.0]), ..Params::default() };
    let err = varlen_attn::forward(zeros.view(), zeros.view(), zeros.view(), &[0, 4], &[0, 4], &p).unwrap_err();
    assert!(matches!(err, Error::BeyondF32 { quantity, .. } if quantity.contains("slope")), "{err}");
    // The GPU carries at most 256 slopes and sinks together in its parameter block: beyond
    // that, a clear refusal (checked before any device is opened), not a wrong answer.
    let x = Array3::from_elem((4, 200, 8), half::bf16::ZERO);
    let p = Params {
        sinks: Some(vec![0.0; 200]),
        alibi_slopes: Some(vec![0.1; 200]),
        backend: Backend::Gpu,
        ..Params::default()
    };
    let err = varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &p).unwrap_err();
    if cfg!(feature = "gpu") {
        assert!(matches!(&err, Error::GpuUnsupported(why) if why.contains("400 ALiBi slopes and sinks")), "{err}");
    } else {
        assert_eq!(err, Error::GpuNotCompiled);
    }
    // `Auto` computes them on the CPU.
    let auto = Params { backend: Backend::Auto, ..p };
    assert!(varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &auto).is_ok());
}

#[test]
fn causal_with_a_right_window() {
    let err = params_error(Params { causal: true, window_right: Some(3), ..Params::default() });
    assert!(matches!(err, Error::Param { name: "window_right", .. }));
    // Some(0) is what causal means: accepted.
    let x = Array3::<f32>::zeros((4, 2, 8));
    let p = Params { causal: true, window_right: Some(0), ..Params::default() };
    assert!(varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &p).is_ok());
}

#[test]
fn wrongly_shaped_outputs() {
    let x = Array3::<f32>::zeros((4, 2, 8));
    let v = Array3::<f32>::zeros((4, 2, 6));
    let p = Params::default();
    for (shape, axis, expected, got) in [((5, 2, 6), 0, 4, 5), ((4, 3, 6), 1, 2, 3), ((4, 2, 8), 2, 6, 8)] {
        let mut out = Array3::<f32>::zeros(shape);
        let err =
            varlen_attn::forward_into(x.view(), x.view(), v.view(), &[0, 4], &[0, 4], &p, out.view_mut()).unwrap_err();
        assert_eq!(err, Error::Shape { arg: "out", axis, expected, got });
    }
    let mut out = Array3::<f32>::zeros((4, 2, 6));
    let mut lse = Array2::<f32>::zeros((4, 2));
    let err = varlen_attn::forward_with_lse_into(
        x.view(),
        x.view(),
        v.view(),
        &[0, 4],
        &[0, 4],
        &p,
        out.view_mut(),
        lse.view_mut(),
    )
    .unwrap_err();
    assert_eq!(err, Error::Shape { arg: "lse", axis: 0, expected: 2, got: 4 });
    assert_eq!(err.to_string(), "lse has 4 on axis 0 (num_heads), expected 2 to match the inputs");
}

#[test]
fn gpu_backend_without_a_gpu() {
    let x = Array3::<f32>::zeros((4, 2, 8));
    let p = Params { backend: Backend::Gpu, ..Params::default() };
    let err = varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &p).unwrap_err();
    if cfg!(feature = "gpu") {
        // f32 is served by the CPU even with the feature, so ask for bf16 too.
        let y = Array3::<half::bf16>::default((4, 2, 8));
        let err = varlen_attn::forward(y.view(), y.view(), y.view(), &[0, 4], &[0, 4], &p);
        match err {
            Ok(_) => eprintln!("note: a GPU answered; the no-device error is not exercised here"),
            Err(e) => assert!(matches!(e, Error::NoDevice(_) | Error::GpuUnsupported(_)), "{e}"),
        }
    } else {
        assert_eq!(err, Error::GpuNotCompiled);
        assert!(err.to_string().contains("`gpu` cargo feature"));
    }
    // Auto never fails for want of a GPU.
    let auto = Params { backend: Backend::Auto, ..Params::default() };
    assert!(varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &auto).is_ok());
}

#[test]
fn forced_instruction_sets() {
    let x = Array3::<f32>::zeros((4, 2, 8));
    let p = Params { cpu_isa: CpuIsa::Avx512Bf16, ..Params::default() };
    let err = varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &p).unwrap_err();
    if cfg!(target_arch = "x86_64") {
        assert!(matches!(err, Error::Param { name: "cpu_isa", .. }), "{err}");
    } else {
        assert_eq!(err, Error::IsaUnavailable { isa: "avx512-bf16" });
    }
    // Forcing a path either runs it or names it as missing.
    for isa in [CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Neon] {
        let p = Params { cpu_isa: isa, ..Params::default() };
        match varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &p) {
            Ok(out) => assert!(out.iter().all(|&y| y == 0.0)),
            Err(err) => assert_eq!(err, Error::IsaUnavailable { isa: isa.name() }),
        }
    }
}

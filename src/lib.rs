//! Variable-length ("packed", `cu_seqlens`) multi-head attention, forward pass.
//!
//! Many sequences of different lengths are packed along one token axis, as vLLM's prefill and
//! vision encoders lay them out; `cu_seqlens_q` and `cu_seqlens_k` are the prefix sums of their
//! lengths. For each sequence `b` and query head `h`:
//!
//! ```text
//! out[b, h] = softmax(scale · Q[b, h] K[b, h / (H / H_kv)]ᵀ + mask) · V[b, h / (H / H_kv)]
//! ```
//!
//! with `scale = 1/sqrt(head_dim)` by default, the softmax and all accumulation in f32, and the
//! output rounded once (to nearest even) to the input type.
//!
//! - [`forward`], [`forward_with_lse`], [`forward_into`]: the fast path. On the CPU, a
//!   FlashAttention-style blocked online softmax with SIMD (for bf16, AMX tiles or AVX-512 BF16
//!   dot products where the CPU has them; otherwise a register-blocked f32 microkernel on
//!   AVX-512, AVX2+FMA, NEON or scalar code), parallel with rayon. With the `gpu` feature, the
//!   same call can run on a GPU.
//! - [`oracle`]: the plain formula in f64, public, for your own tests.
//!
//! # Example
//!
//! ```
//! use half::bf16;
//! use ndarray::Array3;
//! use varlen_attn::{forward, oracle, Params};
//!
//! // Two sequences of 3 and 5 tokens, 4 query heads sharing 2 key/value heads, head_dim 8.
//! let cu_seqlens = [0, 3, 8];
//! let q = Array3::from_shape_fn((8, 4, 8), |(t, h, d)| bf16::from_f32(((t * 7 + h * 3 + d) % 11) as f32 / 11.0));
//! let k = Array3::from_shape_fn((8, 2, 8), |(t, h, d)| bf16::from_f32(((t * 5 + h + d * 2) % 13) as f32 / 13.0));
//! let v = Array3::from_shape_fn((8, 2, 8), |(t, h, d)| bf16::from_f32((t + h + d) as f32));
//!
//! let params = Params { causal: true, ..Params::default() };
//! let out = forward(q.view(), k.view(), v.view(), &cu_seqlens, &cu_seqlens, &params)?;
//! assert_eq!(out.dim(), (8, 4, 8));
//!
//! // The first token of each sequence sees only itself under the causal mask.
//! assert_eq!(out[[3, 0, 0]], v[[3, 0, 0]]);
//!
//! // Within the derived tolerance of the f64 oracle.
//! let reference = oracle::reference(q.view(), k.view(), v.view(), &cu_seqlens, &cu_seqlens, &params)?;
//! assert!(reference.compare(out.view()).worst.is_none());
//! # Ok::<(), varlen_attn::Error>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "candle")]
pub mod candle;
mod cpu;
mod element;
mod error;
pub mod gpu;
#[doc(hidden)]
pub mod internal;
mod layout;
mod mask;
pub mod oracle;
mod paged;
mod params;
mod problem;

pub use element::{DType, Element};
pub use error::{CuSeqlensRule, Error};
pub use paged::{forward_paged, forward_paged_into, forward_paged_with_lse, forward_paged_with_lse_into, PagedKv};
pub use params::{Backend, CpuIsa, Params};
pub use problem::{F32_EDGE, MAX_HEAD_DIM};

use layout::{shape3, BlockTable, KvRows, LseMut, PagedRows, Rows, RowsMut};
use ndarray::{Array2, Array3, ArrayView3, ArrayViewD, ArrayViewMut2, ArrayViewMut3};
use problem::{KeysValues, Problem};

/// Attention forward: returns `out [total_q, num_heads, head_dim_v]`.
///
/// - `q`: `[total_q, num_heads, head_dim]`; `k`: `[total_k, num_kv_heads, head_dim]`;
///   `v`: `[total_k, num_kv_heads, head_dim_v]`. Any strides (sliced or transposed views).
///   `num_heads` must be a multiple of `num_kv_heads` (query head `h` reads kv head
///   `h / (num_heads / num_kv_heads)`); head dims from 1 to [`MAX_HEAD_DIM`].
/// - `cu_seqlens_q`, `cu_seqlens_k`: `batch + 1` prefix sums each, starting at 0, ending at
///   `total_q` and `total_k`. Sequence `b` owns query tokens
///   `cu_seqlens_q[b]..cu_seqlens_q[b+1]` and key tokens `cu_seqlens_k[b]..cu_seqlens_k[b+1]`.
///   Sequences may be empty; query and key lengths may differ.
/// - A query row that sees no key (no keys, or all masked out) gets output 0.
/// - NaN and infinity in the inputs propagate as IEEE arithmetic would, to the rows that see them.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{forward, Params};
/// let q = Array3::<f32>::zeros((6, 2, 4));
/// let v = Array3::from_shape_fn((6, 2, 4), |(t, _, _)| t as f32);
/// // Sequence 0: tokens 0..2, sequence 1: tokens 2..6. Equal scores: each row averages its
/// // sequence's values.
/// let out = forward(q.view(), q.view(), v.view(), &[0, 2, 6], &[0, 2, 6], &Params::default())?;
/// assert_eq!(out[[0, 0, 0]], 0.5);
/// assert_eq!(out[[5, 1, 3]], 3.5);
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// Any shape, head count, head dimension, `cu_seqlens` or parameter problem (see [`Error`]),
/// before any work is done; [`Error::GpuNotCompiled`], [`Error::NoDevice`] or [`Error::Gpu`]
/// for `Backend::Gpu`; [`Error::IsaUnavailable`] for a forced instruction set the CPU lacks;
/// [`Error::BeyondF32`] for finite inputs so large that f32 scores or sums could overflow
/// (beyond [`F32_EDGE`]).
pub fn forward<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<Array3<T>, Error> {
    let problem = Problem::new(shape3(&q), shape3(&k), shape3(&v), cu_seqlens_q, cu_seqlens_k, params)?;
    let mut out = Array3::from_elem(problem.out_shape(), T::default());
    execute(&problem, q, KeysValues::Packed(k, v), params, out.view_mut(), None)?;
    Ok(out)
}

/// [`forward`] that also returns the log-sum-exp `[num_heads, total_q]` of each row: the natural
/// log of the softmax denominator, `ln Σ_j exp(s_j)` over the scaled (and soft-capped) scores
/// the row sees; `-inf` for a row that sees no key.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{forward_with_lse, Params};
/// let x = Array3::<f32>::zeros((3, 1, 4));
/// let (out, lse) = forward_with_lse(x.view(), x.view(), x.view(), &[0, 3], &[0, 3], &Params::default())?;
/// assert_eq!(out.dim(), (3, 1, 4));
/// assert!((lse[[0, 2]] - 3f32.ln()).abs() < 1e-6);
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`forward`].
pub fn forward_with_lse<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<(Array3<T>, Array2<f32>), Error> {
    let problem = Problem::new(shape3(&q), shape3(&k), shape3(&v), cu_seqlens_q, cu_seqlens_k, params)?;
    let mut out = Array3::from_elem(problem.out_shape(), T::default());
    let mut lse = Array2::from_elem((problem.num_heads, problem.total_q), f32::NEG_INFINITY);
    execute(&problem, q, KeysValues::Packed(k, v), params, out.view_mut(), Some(lse.view_mut()))?;
    Ok((out, lse))
}

/// [`forward`] into an output the caller owns, `[total_q, num_heads, head_dim_v]`, any strides.
/// Allocates nothing once the worker threads' scratch has grown to the problem's size.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{forward_into, Params};
/// let x = Array3::<f32>::ones((4, 2, 8));
/// let mut out = Array3::<f32>::zeros((4, 2, 8));
/// forward_into(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &Params::default(), out.view_mut())?;
/// assert!(out.iter().all(|&y| y == 1.0));
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`forward`], and [`Error::Shape`] with `arg: "out"` for a wrongly shaped output.
pub fn forward_into<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
    out: ArrayViewMut3<T>,
) -> Result<(), Error> {
    let problem = Problem::new(shape3(&q), shape3(&k), shape3(&v), cu_seqlens_q, cu_seqlens_k, params)?;
    problem.check_output("out", out.shape())?;
    execute(&problem, q, KeysValues::Packed(k, v), params, out, None)
}

/// [`forward_into`] that also writes the log-sum-exp into `lse [num_heads, total_q]`.
///
/// ```
/// use ndarray::{Array2, Array3};
/// use varlen_attn::{forward_with_lse_into, Params};
/// let x = Array3::<f32>::ones((4, 2, 8));
/// let (mut out, mut lse) = (Array3::<f32>::zeros((4, 2, 8)), Array2::<f32>::zeros((2, 4)));
/// forward_with_lse_into(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &Params::default(), out.view_mut(), lse.view_mut())?;
/// assert!((lse[[1, 3]] - (4f32.ln() + 8f32.sqrt())).abs() < 1e-5);
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`forward_into`], and [`Error::Shape`] with `arg: "lse"` for a wrongly shaped LSE.
#[allow(clippy::too_many_arguments)]
pub fn forward_with_lse_into<T: Element>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
    out: ArrayViewMut3<T>,
    lse: ArrayViewMut2<f32>,
) -> Result<(), Error> {
    let problem = Problem::new(shape3(&q), shape3(&k), shape3(&v), cu_seqlens_q, cu_seqlens_k, params)?;
    problem.check_output("out", out.shape())?;
    problem.check_output("lse", lse.shape())?;
    execute(&problem, q, KeysValues::Packed(k, v), params, out, Some(lse))
}

/// Routes a validated problem to its backend.
pub(crate) fn execute<T: Element>(
    problem: &Problem,
    q: ArrayView3<T>,
    kv: KeysValues<T>,
    params: &Params,
    mut out: ArrayViewMut3<T>,
    mut lse: Option<ArrayViewMut2<f32>>,
) -> Result<(), Error> {
    // ALiBi slopes and sinks ride in the kernel's parameter block: `Auto` keeps the few calls
    // with more than it holds on the CPU, without trying the GPU.
    let gpu_first = match params.backend {
        Backend::Gpu => true,
        Backend::Auto => gpu::is_usable(T::DTYPE) && gpu::check_modifiers(problem).is_ok(),
        _ => false,
    };
    // Where the CPU's streaming decode kernel will run, it checks K's and V's range itself.
    let magnitudes = problem.check_magnitudes(q.view(), &kv, !gpu_first && cpu::streams(problem))?;
    if gpu_first {
        if params.backend == Backend::Gpu {
            return gpu::forward(problem, q, &kv, out, lse);
        }
        match gpu::forward(problem, q.view(), &kv, out.view_mut(), lse.as_mut().map(|l| l.view_mut())) {
            Ok(()) => return Ok(()),
            Err(e) => log::warn!("varlen-attn: GPU failed ({e}); running on the CPU instead"),
        }
    }
    let (k, v) = match &kv {
        KeysValues::Packed(k, v) => (KvRows::Packed(Rows::new(k)), KvRows::Packed(Rows::new(v))),
        KeysValues::Paged(k, v, table) => {
            let table = BlockTable::new(table);
            (KvRows::Paged(PagedRows::new(k), table), KvRows::Paged(PagedRows::new(v), table))
        }
    };
    let io = cpu::Io { q: Rows::new(&q), k, v, out: RowsMut::new(&mut out), lse: lse.as_mut().map(LseMut::new) };
    cpu::forward(problem, io, params.cpu_isa, magnitudes)
}

/// Turns a dynamic-rank view (as read from a file) into the rank-3 view the entry points take,
/// or [`Error::Rank`] naming `arg`.
///
/// ```
/// use ndarray::{ArrayD, IxDyn};
/// use varlen_attn::{view3, Error};
/// let good = ArrayD::<f32>::zeros(IxDyn(&[4, 2, 8]));
/// assert_eq!(view3("q", good.view())?.dim(), (4, 2, 8));
/// let bad = ArrayD::<f32>::zeros(IxDyn(&[4, 16]));
/// assert!(matches!(view3("q", bad.view()), Err(Error::Rank { arg: "q", expected: 3, got: 2, .. })));
/// # Ok::<(), Error>(())
/// ```
///
/// # Errors
/// [`Error::Rank`] when `view` does not have exactly 3 axes.
pub fn view3<'a, T>(arg: &'static str, view: ArrayViewD<'a, T>) -> Result<ArrayView3<'a, T>, Error> {
    let got = view.ndim();
    view.into_dimensionality().map_err(|_| Error::Rank { arg, expected: 3, got, layout: layout_of(arg) })
}

/// The layout the argument `arg` must have, for [`Error::Rank`].
pub(crate) fn layout_of(arg: &str) -> &'static str {
    match arg {
        "q" => "[total_q, num_heads, head_dim]",
        "k" => "[total_k, num_kv_heads, head_dim]",
        "v" => "[total_k, num_kv_heads, head_dim_v]",
        "k_cache" => "[num_blocks, block_size, num_kv_heads, head_dim]",
        "v_cache" => "[num_blocks, block_size, num_kv_heads, head_dim_v]",
        _ => "[tokens, heads, head_dim]",
    }
}

/// The CPU instruction set a call with element type `T` and `params.cpu_isa` runs on, e.g. to
/// label benchmark results. (With `CpuIsa::Auto`, problems of under a million multiply-adds
/// run on AVX-512 BF16 rather than AMX, whose tile set-up would cost more than the work.)
///
/// ```
/// use varlen_attn::{cpu_isa_for, CpuIsa, Params};
/// assert_ne!(cpu_isa_for::<f32>(&Params::default()), CpuIsa::Auto);
/// ```
pub fn cpu_isa_for<T: Element>(params: &Params) -> CpuIsa {
    cpu::resolved_isa::<T>(params.cpu_isa, true)
}

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! candle integration (the `candle` feature): drop-in replacements, on candle tensors, for
//! `candle_flash_attn`'s variable-length calls and for candle-nn's `flash_attn_varlen_cpu`.
//!
//! CPU tensors of bf16, f16 and f32 are read in place, whatever their strides (the storage is
//! viewed, not copied), and the output is a new CPU tensor written once. Every call runs
//! [`crate::forward`]'s CPU path (`Backend::Cpu`), so results equal it bit for bit. CUDA
//! tensors are refused with a clear error: candle's `cuda` feature builds CUDA kernels with
//! `nvcc` (the README says where that stands).
//!
//! Errors are `candle_core::Error`s whose message names the argument, as [`crate::Error`]
//! does.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! // Two images of 3 and 5 tokens, 2 heads of 8 dims, packed.
//! let q = Tensor::randn(0f32, 1.0, (8, 2, 8), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let cu = Tensor::new(&[0u32, 3, 8], &Device::Cpu)?;
//! let out = varlen_attn::candle::flash_attn_varlen(&q, &q, &q, &cu, &cu, 5, 5, 8f32.powf(-0.5), false)?;
//! assert_eq!((out.dims(), out.dtype()), (&[8, 2, 8][..], DType::BF16));
//! # Ok::<(), candle_core::Error>(())
//! ```

use crate::element::Element;
use crate::{Backend, PagedKv, Params};
use candle_core::{DType, Device, Storage, Tensor};
use ndarray::{ArrayView, ArrayViewMut2, ArrayViewMut3, Ix3, Ix4, IxDyn, ShapeBuilder};

type Result<T> = candle_core::Result<T>;

/// `candle_flash_attn::flash_attn_varlen`: attention over packed sequences.
///
/// `q [total_q, num_heads, head_dim]`, `k [total_k, num_kv_heads, head_dim]`, `v [total_k,
/// num_kv_heads, head_dim_v]` (bf16, f16 or f32, one dtype, CPU, any strides);
/// `seqlens_q`/`seqlens_k`: cumulative lengths, `batch + 1` entries (u32, or i64/i32).
/// `max_seqlen_q`/`max_seqlen_k` are accepted for compatibility and not needed (the lengths
/// are read from the seqlens). `causal` aligns to the bottom-right corner. Returns
/// `[total_q, num_heads, head_dim_v]` in the input dtype.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::ones((4, 1, 8), candle_core::DType::F32, &Device::Cpu)?;
/// let cu = Tensor::new(&[0u32, 4], &Device::Cpu)?;
/// let out = varlen_attn::candle::flash_attn_varlen(&x, &x, &x, &cu, &cu, 4, 4, 0.35, true)?;
/// assert_eq!(out.to_vec3::<f32>()?[3][0][7], 1.0);
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// A candle error naming the argument for wrong ranks, dtypes, devices or shapes, bad
/// seqlens, and every error [`crate::forward`] reports.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let _ = (max_seqlen_q, max_seqlen_k);
    let params = Params { softmax_scale: Some(softmax_scale), causal, ..cpu() };
    with_cumulative(q, k, v, seqlens_q, seqlens_k, &params, false).map(|(out, _)| out)
}

/// `candle_flash_attn::flash_attn_varlen_windowed`: [`flash_attn_varlen`] with a sliding
/// window (`window_size_left = None, window_size_right = Some(0)` is the causal mask; `None`
/// is unbounded).
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::ones((6, 2, 8), candle_core::DType::F16, &Device::Cpu)?;
/// let cu = Tensor::new(&[0u32, 6], &Device::Cpu)?;
/// let out = varlen_attn::candle::flash_attn_varlen_windowed(&x, &x, &x, &cu, &cu, 6, 6, 0.35, Some(2), Some(0))?;
/// assert_eq!(out.dims(), &[6, 2, 8]);
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// As [`flash_attn_varlen`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let _ = (max_seqlen_q, max_seqlen_k);
    let params = Params {
        softmax_scale: Some(softmax_scale),
        window_left: window_size_left,
        window_right: window_size_right,
        ..cpu()
    };
    with_cumulative(q, k, v, seqlens_q, seqlens_k, &params, false).map(|(out, _)| out)
}

/// `candle_flash_attn::flash_attn_varlen_alibi_windowed_softcap`: [`flash_attn_varlen_windowed`]
/// with Gemma-style soft-capping of the scaled scores (`softcap · tanh(s / softcap)`).
/// `alibi_slopes` (f32, `[num_heads]` or `[batch, num_heads]`) as FlashAttention-2 takes them.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::ones((5, 2, 8), candle_core::DType::BF16, &Device::Cpu)?;
/// let cu = Tensor::new(&[0u32, 2, 5], &Device::Cpu)?;
/// let out = varlen_attn::candle::flash_attn_varlen_alibi_windowed_softcap(
///     &x, &x, &x, None, &cu, &cu, 3, 3, 0.35, None, None, 30.0)?;
/// assert_eq!(out.dims(), &[5, 2, 8]);
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// As [`flash_attn_varlen`], and for `alibi_slopes` not f32 of one of those shapes (or not one
/// slope per head, or per sequence and head).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let _ = (max_seqlen_q, max_seqlen_k);
    let params = Params {
        softmax_scale: Some(softmax_scale),
        window_left: window_size_left,
        window_right: window_size_right,
        softcap: Some(softcap),
        alibi_slopes: slopes(alibi_slopes)?,
        ..cpu()
    };
    with_cumulative(q, k, v, seqlens_q, seqlens_k, &params, false).map(|(out, _)| out)
}

/// [`flash_attn_varlen`] that also returns the log-sum-exp of each row, `[num_heads, total_q]`
/// f32 (natural log of the softmax denominator; `-inf` for a row that sees no key).
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::zeros((3, 1, 4), candle_core::DType::F32, &Device::Cpu)?;
/// let cu = Tensor::new(&[0u32, 3], &Device::Cpu)?;
/// let (out, lse) = varlen_attn::candle::flash_attn_varlen_with_lse(&x, &x, &x, &cu, &cu, 3, 3, 0.5, false)?;
/// assert!((lse.to_vec2::<f32>()?[0][2] - 3f32.ln()).abs() < 1e-6);
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// As [`flash_attn_varlen`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<(Tensor, Tensor)> {
    let _ = (max_seqlen_q, max_seqlen_k);
    let params = Params { softmax_scale: Some(softmax_scale), causal, ..cpu() };
    let (out, lse) = with_cumulative(q, k, v, seqlens_q, seqlens_k, &params, true)?;
    Ok((out, lse.expect("asked for")))
}

/// candle-nn's `flash_attn_varlen_cpu` convention: `seqlens_q`/`seqlens_k` hold each
/// sequence's length (`[batch]`, u32), not their prefix sums. Its window rules carry over: with
/// `window_left` set and `window_right` unset the window is causal to the right; `window_right`
/// without `window_left` is refused; `causal` caps the right side at the diagonal. `alibi_slopes`
/// as in [`flash_attn_varlen_alibi_windowed_softcap`]. Unlike candle-nn's, this call also takes
/// bf16.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::ones((8, 2, 8), candle_core::DType::BF16, &Device::Cpu)?;
/// let lengths = Tensor::new(&[3u32, 5], &Device::Cpu)?;
/// let out = varlen_attn::candle::flash_attn_varlen_cpu(&x, &x, &x, None, &lengths, &lengths, 5, 5, 0.35, true, None, None)?;
/// assert_eq!(out.dims(), &[8, 2, 8]);
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// As [`flash_attn_varlen`], for bad `alibi_slopes`, and for a right window without a left one.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_cpu(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
    window_left: Option<usize>,
    window_right: Option<usize>,
) -> Result<Tensor> {
    let _ = (max_seqlen_q, max_seqlen_k);
    let right = match (window_left, window_right) {
        (None, Some(_)) => candle_core::bail!("varlen-attn: window_right needs window_left (candle-nn's rule)"),
        (Some(_), None) => Some(0),
        (_, right) => right,
    };
    let params = Params {
        softmax_scale: Some(softmax_scale),
        window_left,
        window_right: if causal { Some(0) } else { right },
        alibi_slopes: slopes(alibi_slopes)?,
        ..cpu()
    };
    let prefix = |arg, t| prefix_sums(&cumulative(arg, t)?);
    run(q, k, v, prefix("seqlens_q", seqlens_q)?, prefix("seqlens_k", seqlens_k)?, &params, false).map(|(out, _)| out)
}

/// Paged K/V (mistral.rs's `flash_attn_varlen_paged_windowed` convention):
/// [`flash_attn_varlen_windowed`] with `k_cache [num_blocks, block_size, num_kv_heads,
/// head_dim]`, `v_cache` likewise, and `block_table [batch, max_blocks]` (u32, i64 or i32);
/// each sequence's key count comes from `seqlens_k` (cumulative, `batch + 1` entries). Any block
/// size; see [`crate::forward_paged`].
///
/// ```
/// use candle_core::{Device, Tensor};
/// let cache = Tensor::ones((3, 16, 1, 8), candle_core::DType::BF16, &Device::Cpu)?;
/// let q = Tensor::ones((2, 2, 8), candle_core::DType::BF16, &Device::Cpu)?;
/// let table = Tensor::new(&[[2u32, 0], [1, 1]], &Device::Cpu)?;
/// let (cu_q, cu_k) = (Tensor::new(&[0u32, 1, 2], &Device::Cpu)?, Tensor::new(&[0u32, 20, 36], &Device::Cpu)?);
/// let out = varlen_attn::candle::flash_attn_varlen_paged_windowed(&q, &cache, &cache, &table, &cu_q, &cu_k, 1, 20, 0.35, None, Some(0))?;
/// assert_eq!(out.dims(), &[2, 2, 8]);
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// # Errors
/// As [`flash_attn_varlen`], for caches that are not rank 4, and for block tables that are not
/// rank-2 integers or whose entries a sequence reads name no block.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_paged_windowed(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    block_table: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let _ = (max_seqlen_q, max_seqlen_k);
    let params = Params {
        softmax_scale: Some(softmax_scale),
        window_left: window_size_left,
        window_right: window_size_right,
        ..cpu()
    };
    if block_table.rank() != 2 {
        candle_core::bail!(
            "varlen-attn: block_table must have rank 2 [batch, max_blocks], got shape {:?}",
            block_table.dims()
        );
    }
    let (rows, columns) = block_table.dims2()?;
    let table = cumulative("block_table", &block_table.flatten_all()?)?;
    let table = ndarray::Array2::from_shape_vec((rows, columns), table).expect("sized by its dims");
    let (cu_q, cu_k) = (cumulative("seqlens_q", seqlens_q)?, cumulative("seqlens_k", seqlens_k)?);
    check_cpu_same_dtype(q, [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)])?;
    match q.dtype() {
        DType::BF16 => paged_typed::<half::bf16>(q, k_cache, v_cache, table.view(), &cu_q, &cu_k, &params),
        DType::F16 => paged_typed::<half::f16>(q, k_cache, v_cache, table.view(), &cu_q, &cu_k, &params),
        DType::F32 => paged_typed::<f32>(q, k_cache, v_cache, table.view(), &cu_q, &cu_k, &params),
        other => candle_core::bail!("varlen-attn: q, k_cache and v_cache must be bf16, f16 or f32, got {other:?}"),
    }
}

/// The paged call on CPU tensors of element type `T`, read in place.
fn paged_typed<T: Element + candle_core::WithDType>(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    table: ndarray::ArrayView2<i32>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
) -> Result<Tensor> {
    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = k_cache.storage_and_layout();
    let (v_storage, v_layout) = v_cache.storage_and_layout();
    let qv = view::<T, Ix3>("q", &q_storage, q_layout)?;
    let kv = PagedKv {
        k_cache: view::<T, Ix4>("k_cache", &k_storage, k_layout)?,
        v_cache: view::<T, Ix4>("v_cache", &v_storage, v_layout)?,
        block_table: table,
    };
    let (total_q, heads) = (qv.dim().0, qv.dim().1);
    let dv = kv.v_cache.dim().3;
    let mut out = vec![T::default(); total_q * heads * dv];
    let out_view = ArrayViewMut3::from_shape((total_q, heads, dv), &mut out[..]).expect("sized above");
    crate::forward_paged_into(qv, &kv, cu_q, cu_k, params, out_view).map_err(error)?;
    Tensor::from_vec(out, (total_q, heads, dv), &Device::Cpu)
}

/// The defaults of every call here: the CPU path (see the module docs).
fn cpu() -> Params {
    Params { backend: Backend::Cpu, ..Params::default() }
}

/// The slopes of an `alibi_slopes` tensor: f32, `[num_heads]` or `[batch, num_heads]`.
fn slopes(alibi_slopes: Option<&Tensor>) -> Result<Option<Vec<f32>>> {
    let Some(t) = alibi_slopes else { return Ok(None) };
    if t.dtype() != candle_core::DType::F32 || t.rank() == 0 || t.rank() > 2 {
        candle_core::bail!(
            "varlen-attn: alibi_slopes must be f32 of shape [num_heads] or [batch, num_heads], got {:?} {:?}",
            t.dtype(),
            t.dims()
        );
    }
    Ok(Some(t.flatten_all()?.to_vec1::<f32>()?))
}

fn error(e: crate::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("varlen-attn: {e}")).bt()
}

/// A rank-1 integer tensor (u32, i64 or i32) on the CPU.
fn integers(arg: &str, t: &Tensor) -> Result<Vec<i64>> {
    if t.rank() != 1 {
        candle_core::bail!("varlen-attn: {arg} must have rank 1, got shape {:?}", t.dims());
    }
    if !t.device().is_cpu() {
        candle_core::bail!("varlen-attn: {arg} must be on the CPU (this build runs CPU tensors only)");
    }
    Ok(match t.dtype() {
        DType::U32 => t.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => t.to_vec1::<i64>()?,
        DType::I32 => t.to_vec1::<i32>()?.into_iter().map(i64::from).collect(),
        other => candle_core::bail!("varlen-attn: {arg} must be u32, i64 or i32, got {other:?}"),
    })
}

/// The entries of an integer tensor as i32: cumulative lengths (`batch + 1` entries, the
/// crate's `cu_seqlens`) or per-sequence lengths.
fn cumulative(arg: &str, t: &Tensor) -> Result<Vec<i32>> {
    integers(arg, t)?
        .into_iter()
        .map(|x| {
            i32::try_from(x).map_err(|_| candle_core::Error::Msg(format!("varlen-attn: {arg} holds {x}, beyond i32")))
        })
        .collect()
}

/// `[0, l0, l0 + l1, …]`, or an error past i32.
fn prefix_sums(lengths: &[i32]) -> Result<Vec<i32>> {
    let mut sums = Vec::with_capacity(lengths.len() + 1);
    sums.push(0i32);
    for &l in lengths {
        let last = *sums.last().expect("not empty");
        sums.push(
            last.checked_add(l).ok_or_else(|| candle_core::Error::Msg("varlen-attn: seqlens sum past i32".into()))?,
        );
    }
    Ok(sums)
}

/// [`run`] with cumulative seqlens tensors (candle-flash-attn's convention).
fn with_cumulative(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    run(q, k, v, cumulative("seqlens_q", seqlens_q)?, cumulative("seqlens_k", seqlens_k)?, params, with_lse)
}

/// Runs the call on CPU tensors of one dtype.
fn run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    check_cpu_same_dtype(q, [("q", q), ("k", k), ("v", v)])?;
    match q.dtype() {
        DType::BF16 => run_typed::<half::bf16>(q, k, v, &cu_q, &cu_k, params, with_lse),
        DType::F16 => run_typed::<half::f16>(q, k, v, &cu_q, &cu_k, params, with_lse),
        DType::F32 => run_typed::<f32>(q, k, v, &cu_q, &cu_k, params, with_lse),
        other => candle_core::bail!("varlen-attn: q, k and v must be bf16, f16 or f32, got {other:?}"),
    }
}

/// A view of a CPU tensor's storage of rank `D`, in place (its layout's offset and strides).
fn view<'a, T: Element + candle_core::WithDType, D: ndarray::Dimension>(
    arg: &'static str,
    storage: &'a Storage,
    layout: &candle_core::Layout,
) -> Result<ArrayView<'a, T, D>> {
    let (rank, expected) = (layout.dims().len(), D::NDIM.expect("a fixed rank"));
    if rank != expected {
        return Err(error(crate::Error::Rank { arg, expected, got: rank, layout: crate::layout_of(arg) }));
    }
    let Storage::Cpu(cpu) = storage else {
        candle_core::bail!("varlen-attn: {arg} is not on the CPU");
    };
    let all = cpu.as_slice::<T>()?;
    let data = all.get(layout.start_offset()..).unwrap_or(&[]);
    let view = ArrayView::from_shape(IxDyn(layout.dims()).strides(IxDyn(layout.stride())), data)
        .map_err(|e| candle_core::Error::Msg(format!("varlen-attn: {arg}'s layout cannot be viewed in place ({e})")))?;
    Ok(view.into_dimensionality::<D>().expect("rank checked above"))
}

/// Checks that `tensors` are CPU tensors of `q`'s dtype.
fn check_cpu_same_dtype(q: &Tensor, tensors: [(&str, &Tensor); 3]) -> Result<()> {
    for (arg, t) in tensors {
        if !t.device().is_cpu() {
            candle_core::bail!(
                "varlen-attn: {arg} is on {:?}; this build runs CPU tensors only (see the README's candle section)",
                t.device()
            );
        }
        if t.dtype() != q.dtype() {
            candle_core::bail!(
                "varlen-attn: {arg} is {:?} but q is {:?}: they must share a dtype",
                t.dtype(),
                q.dtype()
            );
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_typed<T: Element + candle_core::WithDType>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = k.storage_and_layout();
    let (v_storage, v_layout) = v.storage_and_layout();
    let qv = view::<T, Ix3>("q", &q_storage, q_layout)?;
    let kv = view::<T, Ix3>("k", &k_storage, k_layout)?;
    let vv = view::<T, Ix3>("v", &v_storage, v_layout)?;
    let (total_q, heads) = (qv.dim().0, qv.dim().1);
    let dv = vv.dim().2;
    let mut out = vec![T::default(); total_q * heads * dv];
    let out_view = ArrayViewMut3::from_shape((total_q, heads, dv), &mut out[..]).expect("sized above");
    let lse = if with_lse {
        let mut lse = vec![0f32; heads * total_q];
        let lse_view = ArrayViewMut2::from_shape((heads, total_q), &mut lse[..]).expect("sized above");
        crate::forward_with_lse_into(qv, kv, vv, cu_q, cu_k, params, out_view, lse_view).map_err(error)?;
        Some(Tensor::from_vec(lse, (heads, total_q), &Device::Cpu)?)
    } else {
        crate::forward_into(qv, kv, vv, cu_q, cu_k, params, out_view).map_err(error)?;
        None
    };
    Ok((Tensor::from_vec(out, (total_q, heads, dv), &Device::Cpu)?, lse))
}

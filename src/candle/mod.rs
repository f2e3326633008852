//! candle integration (the `candle` feature): drop-in replacements, on candle tensors, for
//! `candle_flash_attn`'s variable-length calls and for candle-nn's `flash_attn_varlen_cpu`.
//!
//! CPU tensors of bf16, f16 and f32 are read in place, whatever their strides (the storage is
//! viewed, not copied), and the output is a new CPU tensor written once. Every call runs
//! [`crate::forward`]'s CPU path (`Backend::Cpu`), so results equal it bit for bit.
//!
//! With the `candle-cuda` feature, CUDA tensors (bf16, f16) run on the GPU kernel: read in
//! place, written into a tensor candle allocates, on the stream of their candle device, with
//! the cu_seqlens read on the device (the path of [`crate::gpu::forward_device_seqlens`], whose
//! results they equal bit for bit). Without it, CUDA tensors are refused with a clear error.
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

use crate::{Backend, Params};
use candle_core::{DType, Tensor};

mod cpu;
#[cfg(feature = "candle-cuda")]
mod cuda;

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
    let (cu_q, cu_k) =
        (prefix_sums(&cumulative("seqlens_q", seqlens_q)?)?, prefix_sums(&cumulative("seqlens_k", seqlens_k)?)?);
    if q.device().is_cuda() {
        // The device path reads cumulative lengths from device memory.
        let (cu_q, cu_k) = (Tensor::new(cu_q.as_slice(), q.device())?, Tensor::new(cu_k.as_slice(), q.device())?);
        return on_cuda(q, k, v, &cu_q, &cu_k, &params, false).map(|(out, _)| out);
    }
    cpu::run(q, k, v, &cu_q, &cu_k, &params, false).map(|(out, _)| out)
}

/// Paged K/V (mistral.rs's `flash_attn_varlen_paged_windowed` convention):
/// [`flash_attn_varlen_windowed`] with `k_cache [num_blocks, block_size, num_kv_heads,
/// head_dim]`, `v_cache` likewise, and `block_table [batch, max_blocks]` (u32, i64 or i32);
/// each sequence's key count comes from `seqlens_k` (cumulative, `batch + 1` entries). Any block
/// size; see [`crate::forward_paged`]. On CUDA tensors (`candle-cuda`) the caches are read in
/// place; the block table and the seqlens are read to the host, where they are checked, and
/// travel back with the launch (a synchronization the packed calls do not have).
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
    if q.device().is_cuda() {
        return on_cuda_paged(q, k_cache, v_cache, table.view(), &cu_q, &cu_k, &params);
    }
    cpu::run_paged(q, k_cache, v_cache, table.view(), &cu_q, &cu_k, &params)
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

/// Checks that `tensors` are on `q`'s device and of its dtype.
fn check_like_q(q: &Tensor, tensors: &[(&str, &Tensor)]) -> Result<()> {
    for &(arg, t) in tensors {
        if !t.device().same_device(q.device()) {
            candle_core::bail!(
                "varlen-attn: {arg} is on {:?} but q is on {:?}: they must share a device",
                t.device(),
                q.device()
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

/// The entries of a rank-1 integer tensor (u32, i64 or i32), read to the host.
fn integers(arg: &str, t: &Tensor) -> Result<Vec<i64>> {
    if t.rank() != 1 {
        candle_core::bail!("varlen-attn: {arg} must have rank 1, got shape {:?}", t.dims());
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

/// The call with cumulative seqlens tensors (candle-flash-attn's convention), on q's device:
/// CPU tensors on the CPU path, CUDA tensors on the GPU kernel.
fn with_cumulative(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    if q.device().is_cuda() {
        return on_cuda(q, k, v, seqlens_q, seqlens_k, params, with_lse);
    }
    let (cu_q, cu_k) = (cumulative("seqlens_q", seqlens_q)?, cumulative("seqlens_k", seqlens_k)?);
    cpu::run(q, k, v, &cu_q, &cu_k, params, with_lse)
}

#[cfg(feature = "candle-cuda")]
use cuda::{run as on_cuda, run_paged as on_cuda_paged};

/// Without the `candle-cuda` feature, CUDA tensors are refused.
#[cfg(not(feature = "candle-cuda"))]
fn on_cuda_paged(
    q: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: ndarray::ArrayView2<i32>,
    _: &[i32],
    _: &[i32],
    _: &Params,
) -> Result<Tensor> {
    candle_core::bail!(
        "varlen-attn: q is on {:?}: CUDA tensors need the `candle-cuda` feature (see the README's candle section)",
        q.device()
    )
}

/// Without the `candle-cuda` feature, CUDA tensors are refused.
#[cfg(not(feature = "candle-cuda"))]
fn on_cuda(
    q: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &Params,
    _: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    candle_core::bail!(
        "varlen-attn: q is on {:?}: CUDA tensors need the `candle-cuda` feature (see the README's candle section)",
        q.device()
    )
}

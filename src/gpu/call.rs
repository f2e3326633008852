//! `forward_device`: attention on tensors already in device memory.

use super::device::Device;
use super::tensor::{DeviceBuffer, DeviceTensor, DeviceTensorMut};
use crate::element::Element;
use crate::error::Error;
use crate::params::Params;
use crate::problem::Problem;
use ndarray::ArrayView2;

/// Attention on tensors already in device memory, queued on `device`'s stream (it returns
/// before the GPU finishes; [`Device::download`] and [`Device::synchronize`] wait). Same
/// semantics and validation as [`crate::forward`]; `cu_seqlens` come from the host, where they
/// are checked (and, for batches of over 64 sequences, copied: a few bytes). `lse`, if given,
/// receives `[num_heads, total_q]`.
///
/// Two differences, as the values are not read on the host: with a causal or windowed mask, a
/// NaN or infinity in `v` can reach rows of the same key tile (64 or 128 keys) that do not see
/// its key (0 · inf is NaN in the tensor cores; the host-array call refuses the GPU for such
/// inputs, see the README's semantics); and inputs beyond the edge of f32
/// ([`crate::F32_EDGE`]), which the host-array call refuses with [`Error::BeyondF32`], may
/// give inf or NaN here.
///
/// ```no_run
/// use half::bf16;
/// use varlen_attn::gpu::{forward_device, Device, DeviceTensor, DeviceTensorMut};
/// let device = Device::open(0)?;
/// let host = vec![bf16::from_f32(0.5); 4 * 2 * 64];
/// let q = device.upload(&host)?;
/// let mut out = device.zeros::<bf16>(host.len())?;
/// let shape = [4, 2, 64];
/// forward_device(&device, DeviceTensor::new(&q, shape)?, DeviceTensor::new(&q, shape)?, DeviceTensor::new(&q, shape)?,
///                &[0, 4], &[0, 4], &Default::default(), DeviceTensorMut::new(&mut out, shape)?, None)?;
/// assert_eq!(device.download(&out)?[0], bf16::from_f32(0.5));
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`crate::forward`]; [`Error::GpuUnsupported`] for f32 or for strides the kernel cannot
/// copy; [`Error::BufferTooSmall`] for an `lse` buffer shorter than `num_heads · total_q`;
/// [`Error::Gpu`] when the GPU fails.
#[allow(clippy::too_many_arguments)]
pub fn forward_device<T: Element>(
    device: &Device,
    q: DeviceTensor<T>,
    k: DeviceTensor<T>,
    v: DeviceTensor<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
    out: DeviceTensorMut<T>,
    lse: Option<&mut DeviceBuffer<f32>>,
) -> Result<(), Error> {
    let problem = Problem::new(q.shape, k.shape, v.shape, cu_seqlens_q, cu_seqlens_k, params)?;
    check_modifiers(&problem)?;
    check_outputs(&problem, &out, lse.as_deref())?;
    device.run(&problem, &q, &k, &v, out, lse)
}

/// [`forward_device`] with `cu_seqlens_q` and `cu_seqlens_k` in device memory (`batch + 1`
/// entries each): nothing is copied to or from the host, the call only queues work, and it
/// can be captured in a CUDA graph ([`Device::capture`]) and replayed with other cu_seqlens in
/// the same buffers.
///
/// The host checks what it can see: shapes, strides, head counts, parameters, and that both
/// buffers have the same length of at least 2. The cu_seqlens themselves are checked on the
/// GPU, by the small kernel that plans the tiles from them (start at 0, never decrease, end
/// at q's and k's token counts): cu_seqlens that break a rule make the call fill `out`
/// and `lse` with NaN (no block reads q, k or v) and raise the device's flag, which
/// [`Device::check_seqlens`] reports. The host cannot see the lengths: it picks the tile
/// shape as for `batch` sequences of equal length (a guess that only affects speed), sizes the
/// grid for the most tiles q's token count allows, and splits no sequence's keys across blocks.
///
/// ```no_run
/// use half::bf16;
/// use varlen_attn::gpu::{forward_device_seqlens, Device, DeviceTensor, DeviceTensorMut};
/// let device = Device::open(0)?;
/// let x = device.upload(&vec![bf16::from_f32(0.5); 6 * 2 * 64])?;
/// let cu = device.upload(&[0i32, 2, 6])?;
/// let mut out = device.zeros::<bf16>(6 * 2 * 64)?;
/// let t = |b| DeviceTensor::new(b, [6, 2, 64]);
/// forward_device_seqlens(&device, t(&x)?, t(&x)?, t(&x)?, &cu, &cu, &Default::default(),
///                        DeviceTensorMut::new(&mut out, [6, 2, 64])?, None)?;
/// device.check_seqlens()?;
/// assert_eq!(device.download(&out)?[0], bf16::from_f32(0.5));
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`forward_device`] for what the host checks; [`Error::CuSeqlensLength`] and
/// [`Error::CuSeqlensTooShort`] for the buffers' lengths. Bad cu_seqlens values are reported
/// later, by [`Device::check_seqlens`] ([`Error::DeviceCuSeqlens`]).
#[allow(clippy::too_many_arguments)]
pub fn forward_device_seqlens<T: Element>(
    device: &Device,
    q: DeviceTensor<T>,
    k: DeviceTensor<T>,
    v: DeviceTensor<T>,
    cu_seqlens_q: &DeviceBuffer<i32>,
    cu_seqlens_k: &DeviceBuffer<i32>,
    params: &Params,
    out: DeviceTensorMut<T>,
    lse: Option<&mut DeviceBuffer<f32>>,
) -> Result<(), Error> {
    let (q_len, k_len) = (cu_seqlens_q.len(), cu_seqlens_k.len());
    if q_len != k_len {
        return Err(Error::CuSeqlensLength { q_len, k_len });
    }
    if q_len < 2 {
        return Err(Error::CuSeqlensTooShort { arg: "cu_seqlens_q", len: q_len });
    }
    // The host validates the call as one sequence of all the tokens: shapes, heads, parameters.
    let tokens =
        |n: usize| i32::try_from(n).map_err(|_| Error::GpuUnsupported(format!("{n} tokens: cu_seqlens are i32")));
    let whole_q = [0, tokens(q.shape[0])?];
    let whole_k = [0, tokens(k.shape[0])?];
    let problem = Problem::new(q.shape, k.shape, v.shape, &whole_q, &whole_k, params)?;
    check_modifiers(&problem)?;
    check_outputs(&problem, &out, lse.as_deref())?;
    device.run_with_device_seqlens(&problem, [cu_seqlens_q, cu_seqlens_k], &q, &k, &v, out, lse)
}

/// A paged K/V cache in device memory, for [`forward_device_paged`]: the device twin of
/// [`crate::PagedKv`].
///
/// `k_cache` and `v_cache` are the caches `[num_blocks, block_size, num_kv_heads, head_dim]`
/// (and `head_dim_v`) seen as `num_blocks · block_size` token rows, as a contiguous cache
/// (or a layer's slice of one) is: token `t` of block `b` is row `b · block_size + t`.
/// `block_table [batch, max_blocks]` stays on the host, where it is checked, and travels to
/// the device with the call's other metadata (`batch · max_blocks` i32).
pub struct DevicePagedKv<'a, T> {
    /// Keys, `[num_blocks · block_size, num_kv_heads, head_dim]`.
    pub k_cache: DeviceTensor<'a, T>,
    /// Values, `[num_blocks · block_size, num_kv_heads, head_dim_v]`.
    pub v_cache: DeviceTensor<'a, T>,
    /// Tokens per block (at least 1; it divides the caches' rows).
    pub block_size: usize,
    /// `[batch, max_blocks]`: each sequence's blocks, in order.
    pub block_table: ArrayView2<'a, i32>,
}

/// [`forward_device`] with the keys and values in a paged cache in device memory, as
/// [`crate::forward_paged`] takes them on the host: key `j` of sequence `b` is slot
/// `j % block_size` of block `block_table[b, j / block_size]`, and `cu_seqlens_k` gives each
/// sequence's key count. Any block size; blocks may be shared between sequences.
///
/// ```no_run
/// use half::bf16;
/// use ndarray::Array2;
/// use varlen_attn::gpu::{forward_device_paged, Device, DevicePagedKv, DeviceTensor, DeviceTensorMut};
/// let device = Device::open(0)?;
/// // A cache of 4 blocks of 16 tokens; one sequence of 20 keys in blocks 3 and 1; 2 queries.
/// let cache = device.upload(&vec![bf16::from_f32(0.5); 4 * 16 * 2 * 64])?;
/// let q = device.upload(&vec![bf16::from_f32(0.5); 2 * 2 * 64])?;
/// let mut out = device.zeros::<bf16>(2 * 2 * 64)?;
/// let table = Array2::from_shape_vec((1, 2), vec![3, 1]).unwrap();
/// let kv = DevicePagedKv {
///     k_cache: DeviceTensor::new(&cache, [64, 2, 64])?,
///     v_cache: DeviceTensor::new(&cache, [64, 2, 64])?,
///     block_size: 16,
///     block_table: table.view(),
/// };
/// forward_device_paged(&device, DeviceTensor::new(&q, [2, 2, 64])?, &kv, &[0, 2], &[0, 20],
///                      &Default::default(), DeviceTensorMut::new(&mut out, [2, 2, 64])?, None)?;
/// assert_eq!(device.download(&out)?[0], bf16::from_f32(0.5));
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// As [`forward_device`] and [`crate::forward_paged`] (shapes named `k_cache`, `v_cache`,
/// `block_table`); [`Error::Param`] for a `block_size` of 0 or one that does not divide the
/// caches' rows.
#[allow(clippy::too_many_arguments)]
pub fn forward_device_paged<T: Element>(
    device: &Device,
    q: DeviceTensor<T>,
    kv: &DevicePagedKv<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
    out: DeviceTensorMut<T>,
    lse: Option<&mut DeviceBuffer<f32>>,
) -> Result<(), Error> {
    let block_size = kv.block_size;
    let rows = kv.k_cache.shape[0];
    if block_size == 0 || !rows.is_multiple_of(block_size) || kv.v_cache.shape[0] != rows {
        return Err(Error::Param {
            name: "block_size",
            value: block_size.to_string(),
            reason: "must be at least 1 and divide the rows of k_cache and v_cache, which must be as many",
        });
    }
    let cache = |t: &DeviceTensor<T>| [rows / block_size, block_size, t.shape[1], t.shape[2]];
    let problem = Problem::new_paged(
        q.shape,
        cache(&kv.k_cache),
        cache(&kv.v_cache),
        kv.block_table.view(),
        cu_seqlens_q,
        cu_seqlens_k,
        params,
    )?;
    check_modifiers(&problem)?;
    check_outputs(&problem, &out, lse.as_deref())?;
    device.run_paged(&problem, &q, kv, out, lse)
}

/// Room for ALiBi's coefficients and the attention sinks in the kernel's parameter block (so
/// that they need no copy, in CUDA graphs too). Must match `VA_INLINE_MODIFIERS`.
pub(crate) const MODIFIERS: usize = 256;

/// The kernel carries ALiBi slopes and sinks in its parameter block: at most [`MODIFIERS`] of
/// them together.
pub(crate) fn check_modifiers(problem: &Problem) -> Result<(), Error> {
    let (slopes, sinks) = problem.modifiers();
    let count = slopes.map_or(0, <[f32]>::len) + sinks.map_or(0, <[f32]>::len);
    if count > MODIFIERS {
        return Err(Error::GpuUnsupported(format!(
            "{count} ALiBi slopes and sinks together: the kernel's parameter block holds {} (Backend::Cpu or Auto runs them)",
            MODIFIERS
        )));
    }
    Ok(())
}

/// Checks that `out` has the problem's output shape and that `lse`, if given, holds
/// `num_heads · total_q` values.
fn check_outputs<T>(problem: &Problem, out: &DeviceTensorMut<T>, lse: Option<&DeviceBuffer<f32>>) -> Result<(), Error> {
    problem.check_output("out", &out.shape)?;
    let needed = problem.num_heads * problem.total_q;
    match lse {
        Some(lse) if lse.len() < needed => Err(Error::BufferTooSmall { arg: "lse", needed, len: lse.len() }),
        _ => Ok(()),
    }
}

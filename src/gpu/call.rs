//! `forward_device`: attention on tensors already in device memory.

use super::device::Device;
use super::tensor::{DeviceBuffer, DeviceTensor, DeviceTensorMut};
use crate::element::Element;
use crate::error::Error;
use crate::params::Params;
use crate::problem::Problem;

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

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
    problem.check_output("out", &out.shape)?;
    if let Some(lse) = &lse {
        let needed = problem.num_heads * problem.total_q;
        if lse.len() < needed {
            return Err(Error::BufferTooSmall { arg: "lse", needed, len: lse.len() });
        }
    }
    device.run(&problem, &q, &k, &v, out, lse)
}

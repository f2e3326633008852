//! Device memory and the tensors laid over it: what `forward_device` takes, with or without the
//! `gpu` feature (without it, no buffer can be made).

use super::memory::Raw;
use crate::error::Error;
use core::marker::PhantomData;

/// Device memory holding `len` values of `T`. It belongs to the [`Device`](super::Device) that
/// allocated it: calls on another `Device` (another queue, which would not wait for this one's
/// work) refuse it with [`Error::Gpu`].
// Without the `gpu` feature no value is ever made, so the fields are never read.
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub struct DeviceBuffer<T> {
    pub(super) raw: Raw,
    /// The id of the device that allocated it.
    pub(super) owner: u64,
    pub(super) len: usize,
    pub(super) _element: PhantomData<T>,
}

impl<T> DeviceBuffer<T> {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A `[tokens, heads, dims]` tensor in device memory: a buffer, a shape, and the element
/// strides of the token and head axes (the dims are contiguous).
// Without the `gpu` feature no value is ever made, so the fields are never read.
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub struct DeviceTensor<'a, T> {
    pub(super) buffer: &'a DeviceBuffer<T>,
    pub(super) shape: [usize; 3],
    pub(super) token_stride: usize,
    pub(super) head_stride: usize,
}

/// A mutable `[tokens, heads, dims]` tensor in device memory (the output).
// Without the `gpu` feature no value is ever made, so the fields are never read.
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub struct DeviceTensorMut<'a, T> {
    pub(super) buffer: &'a mut DeviceBuffer<T>,
    pub(super) shape: [usize; 3],
    pub(super) token_stride: usize,
    pub(super) head_stride: usize,
}

/// Checks that a strided `[tokens, heads, dims]` layout fits in `len` values, that heads do not
/// overlap, and that rows start on 16-byte boundaries (the kernel copies rows in 16-byte
/// pieces).
pub(crate) fn check_layout(
    arg: &'static str,
    len: usize,
    shape: [usize; 3],
    token_stride: usize,
    head_stride: usize,
    elem: usize,
) -> Result<(), Error> {
    let align = 16 / elem;
    if !token_stride.is_multiple_of(align) || !head_stride.is_multiple_of(align) {
        return Err(Error::GpuUnsupported(format!(
            "{arg}: strides ({token_stride}, {head_stride}) must be multiples of {align} elements (16 bytes)"
        )));
    }
    let [t, h, d] = shape;
    if t > 0 && h > 0 && d > 0 {
        if h > 1 && head_stride < d {
            return Err(Error::GpuUnsupported(format!(
                "{arg}: a head stride of {head_stride} overlaps heads of {d} elements"
            )));
        }
        let needed = (t - 1) * token_stride + (h - 1) * head_stride + d;
        if needed > len {
            return Err(Error::BufferTooSmall { arg, needed, len });
        }
    }
    Ok(())
}

impl<'a, T> DeviceTensor<'a, T> {
    /// A contiguous `[tokens, heads, dims]` tensor over `buffer`.
    ///
    /// ```no_run
    /// use half::bf16;
    /// use varlen_attn::gpu::{Device, DeviceTensor};
    /// let device = Device::open(0)?;
    /// let q = device.zeros::<bf16>(10 * 16 * 72)?;
    /// let tensor = DeviceTensor::new(&q, [10, 16, 72])?;
    /// # Ok::<(), varlen_attn::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`DeviceTensor::with_strides`].
    pub fn new(buffer: &'a DeviceBuffer<T>, shape: [usize; 3]) -> Result<Self, Error> {
        Self::with_strides(buffer, shape, shape[1] * shape[2], shape[2])
    }

    /// A strided tensor: element `(t, h, d)` at `t * token_stride + h * head_stride + d`.
    ///
    /// ```no_run
    /// use half::bf16;
    /// use varlen_attn::gpu::{Device, DeviceTensor};
    /// let device = Device::open(0)?;
    /// // q, k and v of 16 heads × 72 packed in one buffer, token by token.
    /// let qkv = device.zeros::<bf16>(10 * 3 * 16 * 72)?;
    /// let k = DeviceTensor::with_strides(&qkv, [10, 16, 72], 3 * 16 * 72, 72)?;
    /// # Ok::<(), varlen_attn::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] when the tensor does not fit in the buffer;
    /// [`Error::GpuUnsupported`] when a stride is not a multiple of 16 bytes or heads overlap.
    pub fn with_strides(
        buffer: &'a DeviceBuffer<T>,
        shape: [usize; 3],
        token_stride: usize,
        head_stride: usize,
    ) -> Result<Self, Error> {
        check_layout("device tensor", buffer.len, shape, token_stride, head_stride, core::mem::size_of::<T>())?;
        Ok(DeviceTensor { buffer, shape, token_stride, head_stride })
    }
}

impl<'a, T> DeviceTensorMut<'a, T> {
    /// A contiguous `[tokens, heads, dims]` output over `buffer`.
    ///
    /// ```no_run
    /// use half::bf16;
    /// use varlen_attn::gpu::{Device, DeviceTensorMut};
    /// let device = Device::open(0)?;
    /// let mut out = device.zeros::<bf16>(10 * 16 * 72)?;
    /// let tensor = DeviceTensorMut::new(&mut out, [10, 16, 72])?;
    /// # Ok::<(), varlen_attn::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`DeviceTensor::with_strides`].
    pub fn new(buffer: &'a mut DeviceBuffer<T>, shape: [usize; 3]) -> Result<Self, Error> {
        Self::with_strides(buffer, shape, shape[1] * shape[2], shape[2])
    }

    /// A strided output; see [`DeviceTensor::with_strides`].
    ///
    /// # Errors
    /// As [`DeviceTensor::with_strides`].
    pub fn with_strides(
        buffer: &'a mut DeviceBuffer<T>,
        shape: [usize; 3],
        token_stride: usize,
        head_stride: usize,
    ) -> Result<Self, Error> {
        check_layout("device output", buffer.len, shape, token_stride, head_stride, core::mem::size_of::<T>())?;
        Ok(DeviceTensorMut { buffer, shape, token_stride, head_stride })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_must_fit_their_buffer_and_be_16_byte_rows() {
        let fits = |len, shape, t, h| check_layout("x", len, shape, t, h, 2);
        assert_eq!(fits(4 * 2 * 64, [4, 2, 64], 128, 64), Ok(()));
        assert_eq!(
            fits(4 * 2 * 64 - 1, [4, 2, 64], 128, 64),
            Err(Error::BufferTooSmall { arg: "x", needed: 512, len: 511 })
        );
        assert!(matches!(fits(1 << 20, [4, 2, 64], 128, 12), Err(Error::GpuUnsupported(_))));
        assert!(matches!(fits(1 << 20, [4, 2, 64], 128, 32), Err(Error::GpuUnsupported(_))));
        // Empty tensors need no room.
        assert_eq!(fits(0, [0, 2, 64], 128, 64), Ok(()));
    }
}

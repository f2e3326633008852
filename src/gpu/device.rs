//! The public GPU API (devices, device buffers, device tensors, `forward_device`) and the path
//! that serves `forward` on host arrays. Without the `gpu` feature the types exist but cannot
//! be constructed, and every entry answers `Error::GpuNotCompiled`.

use crate::element::{DType, Element};
use crate::error::Error;
use crate::params::Params;
use crate::problem::Problem;
use core::marker::PhantomData;
#[cfg(feature = "gpu")]
use core::sync::atomic::{AtomicU64, Ordering};
use ndarray::{ArrayView3, ArrayViewMut2, ArrayViewMut3};

#[cfg(feature = "gpu")]
use super::{
    cuda::CudaDevice,
    plan::{Plan, Strides, Target},
};

/// One GPU and the stream the calls are queued on.
///
/// ```
/// // Without a GPU (or without the `gpu` feature) opening fails with a clear error.
/// match varlen_attn::gpu::Device::open(0) {
///     Ok(device) => println!("{}", device.name()),
///     Err(e) => println!("no GPU: {e}"),
/// }
/// ```
pub struct Device {
    #[cfg(feature = "gpu")]
    inner: Inner,
    /// Tells this device's buffers from any other's (unique per opened device).
    #[cfg(feature = "gpu")]
    id: u64,
    #[cfg(not(feature = "gpu"))]
    _never: core::convert::Infallible,
}

#[cfg(feature = "gpu")]
enum Inner {
    Cuda(CudaDevice),
    Hip(super::hip::HipDevice),
}

/// Device memory holding `len` values of `T`. It belongs to the [`Device`] that allocated it:
/// calls on another `Device` (another queue, which would not wait for this one's work) refuse
/// it with [`Error::Gpu`].
pub struct DeviceBuffer<T> {
    #[cfg(feature = "gpu")]
    raw: Raw,
    /// The id of the device that allocated it.
    #[cfg(feature = "gpu")]
    owner: u64,
    len: usize,
    _element: PhantomData<T>,
    #[cfg(not(feature = "gpu"))]
    _never: core::convert::Infallible,
}

#[cfg(feature = "gpu")]
enum Raw {
    Cuda(cudarc::driver::CudaSlice<u8>),
    Hip(super::hip::HipBuffer),
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

#[cfg(not(feature = "gpu"))]
impl Device {
    /// Opens GPU `ordinal`.
    ///
    /// # Errors
    /// [`Error::GpuNotCompiled`]: this build has no `gpu` feature.
    pub fn open(_ordinal: usize) -> Result<Device, Error> {
        Err(Error::GpuNotCompiled)
    }
    /// The GPU's name.
    pub fn name(&self) -> String {
        match self._never {}
    }
    /// Copies host values to a new device buffer.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn upload<T: bytemuck::Pod>(&self, _host: &[T]) -> Result<DeviceBuffer<T>, Error> {
        match self._never {}
    }
    /// A device buffer of `len` zeros.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn zeros<T: bytemuck::Pod>(&self, _len: usize) -> Result<DeviceBuffer<T>, Error> {
        match self._never {}
    }
    /// Copies a device buffer back to the host (after the queued work).
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn download<T: bytemuck::Pod>(&self, _buffer: &DeviceBuffer<T>) -> Result<Vec<T>, Error> {
        match self._never {}
    }
    /// Waits for the queued work.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn synchronize(&self) -> Result<(), Error> {
        match self._never {}
    }
    /// GPU milliseconds of the work `f` queues.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn time_ms(&self, _f: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error> {
        match self._never {}
    }
}

#[cfg(feature = "gpu")]
impl Device {
    /// Opens GPU `ordinal`: an NVIDIA GPU through the CUDA driver and NVRTC, else an AMD GPU
    /// through HIP and hipRTC, all loaded at run time.
    ///
    /// # Errors
    /// [`Error::NoDevice`] naming what is missing (driver, runtime compiler, device).
    pub fn open(ordinal: usize) -> Result<Device, Error> {
        static OPENED: AtomicU64 = AtomicU64::new(0);
        let id = OPENED.fetch_add(1, Ordering::Relaxed);
        match CudaDevice::open(ordinal) {
            Ok(d) => Ok(Device { inner: Inner::Cuda(d), id }),
            Err(cuda) => match super::hip::HipDevice::open(ordinal) {
                Ok(d) => Ok(Device { inner: Inner::Hip(d), id }),
                Err(hip) => Err(Error::NoDevice(format!("{}; {}", no_device_text(cuda), no_device_text(hip)))),
            },
        }
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        match &self.inner {
            Inner::Cuda(d) => d.name().to_string(),
            Inner::Hip(d) => d.name().to_string(),
        }
    }

    fn multiprocessors(&self) -> usize {
        match &self.inner {
            Inner::Cuda(d) => d.multiprocessors(),
            Inner::Hip(d) => d.multiprocessors(),
        }
    }

    fn target(&self) -> Target {
        match &self.inner {
            Inner::Cuda(d) => d.target(),
            Inner::Hip(_) => Target::Mfma,
        }
    }

    /// Copies host values to a new device buffer.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the allocation or the copy fails.
    pub fn upload<T: bytemuck::Pod>(&self, host: &[T]) -> Result<DeviceBuffer<T>, Error> {
        let bytes: &[u8] = bytemuck::cast_slice(host);
        let raw = match &self.inner {
            Inner::Cuda(d) => Raw::Cuda(d.upload(bytes)?),
            Inner::Hip(d) => Raw::Hip(d.upload(bytes)?),
        };
        Ok(DeviceBuffer { raw, owner: self.id, len: host.len(), _element: PhantomData })
    }

    /// A device buffer of `len` zeros.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the allocation fails.
    pub fn zeros<T: bytemuck::Pod>(&self, len: usize) -> Result<DeviceBuffer<T>, Error> {
        self.upload(&vec![T::zeroed(); len])
    }

    /// Copies a device buffer back to the host (after the work queued before it).
    ///
    /// # Errors
    /// [`Error::Gpu`] when the copy fails.
    pub fn download<T: bytemuck::Pod>(&self, buffer: &DeviceBuffer<T>) -> Result<Vec<T>, Error> {
        self.check_owner(buffer)?;
        let mut host = vec![T::zeroed(); buffer.len];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut host);
        match (&self.inner, &buffer.raw) {
            (Inner::Cuda(d), Raw::Cuda(b)) => d.download(b, bytes)?,
            (Inner::Hip(d), Raw::Hip(b)) => d.download(b, bytes)?,
            _ => return Err(Error::Gpu("the buffer belongs to another kind of device".into())),
        }
        Ok(host)
    }

    /// Waits for the queued work.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the GPU reports a failure.
    pub fn synchronize(&self) -> Result<(), Error> {
        match &self.inner {
            Inner::Cuda(d) => d.synchronize(),
            Inner::Hip(d) => d.synchronize(),
        }
    }

    /// GPU milliseconds (device events) of the work `f` queues on this device.
    ///
    /// # Errors
    /// What `f` returns, or [`Error::Gpu`] from the events.
    pub fn time_ms(&self, f: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error> {
        match &self.inner {
            Inner::Cuda(d) => d.time(f),
            Inner::Hip(d) => d.time(f),
        }
    }

    /// Buffers are used on the device (and stream) that allocated them only: another
    /// device's queue would not wait for the work queued on theirs.
    fn check_owner<T>(&self, buffer: &DeviceBuffer<T>) -> Result<(), Error> {
        if buffer.owner == self.id {
            Ok(())
        } else {
            Err(Error::Gpu(
                "a buffer of another `Device` was passed: use the buffers of the device that runs the call".into(),
            ))
        }
    }

    fn address<T>(&self, buffer: &DeviceBuffer<T>) -> Result<u64, Error> {
        self.check_owner(buffer)?;
        match (&self.inner, &buffer.raw) {
            (Inner::Cuda(d), Raw::Cuda(b)) => Ok(d.address(b)),
            (Inner::Hip(_), Raw::Hip(b)) => Ok(b.address()),
            _ => Err(Error::Gpu("the buffer belongs to another kind of device".into())),
        }
    }

    fn launch(&self, plan: &Plan) -> Result<(), Error> {
        match &self.inner {
            Inner::Cuda(d) => d.launch(plan),
            Inner::Hip(d) => d.launch(plan),
        }
    }
}

#[cfg(feature = "gpu")]
fn no_device_text(e: Error) -> String {
    match e {
        Error::NoDevice(text) => text,
        other => other.to_string(),
    }
}

/// A `[tokens, heads, dims]` tensor in device memory: a buffer, a shape, and the element
/// strides of the token and head axes (the dims are contiguous).
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub struct DeviceTensor<'a, T> {
    buffer: &'a DeviceBuffer<T>,
    shape: [usize; 3],
    token_stride: usize,
    head_stride: usize,
}

/// A mutable `[tokens, heads, dims]` tensor in device memory (the output).
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub struct DeviceTensorMut<'a, T> {
    buffer: &'a mut DeviceBuffer<T>,
    shape: [usize; 3],
    token_stride: usize,
    head_stride: usize,
}

/// Checks that a strided `[tokens, heads, dims]` layout fits in `len` values and that rows start
/// on 16-byte boundaries (the kernel copies rows in 16-byte pieces).
fn check_layout(
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
        let last = (t - 1) * token_stride + (h - 1) * head_stride + d;
        if last > len || (h > 1 && head_stride < d) {
            return Err(Error::Shape { arg, axis: 0, expected: len, got: last });
        }
    }
    Ok(())
}

impl<'a, T> DeviceTensor<'a, T> {
    /// A contiguous `[tokens, heads, dims]` tensor over `buffer`.
    ///
    /// # Errors
    /// As [`DeviceTensor::with_strides`].
    pub fn new(buffer: &'a DeviceBuffer<T>, shape: [usize; 3]) -> Result<Self, Error> {
        Self::with_strides(buffer, shape, shape[1] * shape[2], shape[2])
    }

    /// A strided tensor: element `(t, h, d)` at `t * token_stride + h * head_stride + d`.
    ///
    /// # Errors
    /// [`Error::Shape`] when the tensor does not fit in the buffer;
    /// [`Error::GpuUnsupported`] when a stride is not a multiple of 16 bytes.
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

/// Attention on tensors already in device memory, queued on `device`'s stream (it returns
/// before the GPU finishes; [`Device::download`] and [`Device::synchronize`] wait). Same
/// semantics and validation as [`crate::forward`]; `cu_seqlens` come from the host, where they
/// are checked (and, for batches of over 64 sequences, copied: a few bytes). `lse`, if given,
/// receives `[num_heads, total_q]`.
///
/// One difference: with a causal or windowed mask, a NaN or infinity in `v` can reach rows of
/// the same 64-key tile that do not see its key (0 · inf is NaN in the tensor cores), because
/// the values are not inspected on the device. The host-array call checks for this and
/// refuses the GPU ([`Error::GpuUnsupported`]), so `Backend::Auto` computes such inputs exactly
/// on the CPU. Likewise the magnitudes are not read: inputs beyond the edge of f32
/// ([`crate::F32_EDGE`]), which the host-array call refuses with [`Error::BeyondF32`], may give
/// inf or NaN here.
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
/// copy; [`Error::Gpu`] when the GPU fails.
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
        if lse.len < problem.num_heads * problem.total_q {
            return Err(Error::Shape {
                arg: "lse",
                axis: 1,
                expected: problem.num_heads * problem.total_q,
                got: lse.len,
            });
        }
    }
    run_on_device(device, &problem, &q, &k, &v, out, lse)
}

#[cfg(not(feature = "gpu"))]
fn run_on_device<T: Element>(
    device: &Device,
    _problem: &Problem,
    _q: &DeviceTensor<T>,
    _k: &DeviceTensor<T>,
    _v: &DeviceTensor<T>,
    _out: DeviceTensorMut<T>,
    _lse: Option<&mut DeviceBuffer<f32>>,
) -> Result<(), Error> {
    match device._never {}
}

#[cfg(feature = "gpu")]
fn run_on_device<T: Element>(
    device: &Device,
    problem: &Problem,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    out: DeviceTensorMut<T>,
    lse: Option<&mut DeviceBuffer<f32>>,
) -> Result<(), Error> {
    let f16 = match T::DTYPE {
        DType::BF16 => false,
        DType::F16 => true,
        DType::F32 => return Err(f32_unsupported()),
    };
    if !out.token_stride.is_multiple_of(2) || !out.head_stride.is_multiple_of(2) {
        return Err(Error::GpuUnsupported("the output's strides must be even (pairs are stored together)".into()));
    }
    let strides = |t: usize, h: usize| Strides { token: t, head: h };
    let mut plan = Plan::new(
        problem,
        f16,
        device.target(),
        device.multiprocessors(),
        strides(q.token_stride, q.head_stride),
        strides(k.token_stride, k.head_stride),
        strides(v.token_stride, v.head_stride),
        strides(out.token_stride, out.head_stride),
    );
    plan.params.q = device.address(q.buffer)?;
    plan.params.k = device.address(k.buffer)?;
    plan.params.v = device.address(v.buffer)?;
    plan.params.out = device.address(out.buffer)?;
    plan.params.lse = match lse {
        Some(l) => device.address(l)?,
        None => 0,
    };
    device.launch(&plan)
}

#[cfg(feature = "gpu")]
fn f32_unsupported() -> Error {
    Error::GpuUnsupported(
        "f32 input (the tensor cores take bf16 or f16): use Backend::Cpu or Backend::Auto for f32".into(),
    )
}

/// The device `Backend::Auto` and `Backend::Gpu` use: GPU 0, opened once.
#[cfg(feature = "gpu")]
fn default_device() -> Result<&'static Device, Error> {
    static DEVICE: std::sync::OnceLock<Result<Device, Error>> = std::sync::OnceLock::new();
    DEVICE.get_or_init(|| Device::open(0)).as_ref().map_err(Clone::clone)
}

/// Whether `Backend::Auto` should try the GPU for this element type.
pub(crate) fn is_usable(dtype: DType) -> bool {
    #[cfg(feature = "gpu")]
    {
        if dtype == DType::F32 {
            return false;
        }
        match default_device() {
            Ok(_) => true,
            Err(e) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| log::info!("varlen-attn: Backend::Auto runs on the CPU: {e}"));
                false
            }
        }
    }
    #[cfg(not(feature = "gpu"))]
    {
        let _ = dtype;
        false
    }
}

/// Runs a validated problem on host arrays through the default GPU: packs q, k and v into
/// 16-byte-aligned rows, copies them over, runs, copies the result back into `out` (and `lse`).
pub(crate) fn forward<T: Element>(
    problem: &Problem,
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    mut out: ArrayViewMut3<T>,
    lse: Option<ArrayViewMut2<f32>>,
) -> Result<(), Error> {
    #[cfg(not(feature = "gpu"))]
    {
        let _ = (problem, q, k, v, &mut out, lse);
        Err(Error::GpuNotCompiled)
    }
    #[cfg(feature = "gpu")]
    {
        if T::DTYPE == DType::F32 {
            return Err(f32_unsupported());
        }
        // With a mask, a tile's keys are seen by some rows and not others, and 0 · inf would
        // reach rows that must not see a non-finite value: the CPU path handles that exactly.
        if !problem.mask.is_full() && v.iter().any(|x| !x.to_f32().is_finite()) {
            return Err(Error::GpuUnsupported(
                "non-finite values in v with a causal or windowed mask (the CPU path keeps them out of rows that do not see them)".into(),
            ));
        }
        let device = default_device()?;
        let pad = |d: usize| d.next_multiple_of(8);
        // Contiguous tensors whose rows are whole 16-byte pieces go over as they are; others are
        // first packed into such rows.
        let upload = |a: &ArrayView3<T>| -> Result<(DeviceBuffer<T>, [usize; 3], usize), Error> {
            let (t, h, d) = a.dim();
            if let (Some(slice), true) = (a.as_slice(), d % 8 == 0) {
                return Ok((device.upload(slice)?, [t, h, d], d));
            }
            let row = pad(d);
            let mut host = vec![T::default(); t * h * row];
            for ((ti, hi, di), &x) in a.indexed_iter() {
                host[(ti * h + hi) * row + di] = x;
            }
            Ok((device.upload(&host)?, [t, h, d], row))
        };
        let ((qb, q_shape, q_row), (kb, k_shape, k_row), (vb, v_shape, v_row)) =
            (upload(&q)?, upload(&k)?, upload(&v)?);
        let [t, h, dv] = problem.out_shape();
        let out_row = pad(dv);
        let mut ob = device.zeros::<T>((t * h * out_row).max(1))?;
        let mut lb = match &lse {
            Some(_) => Some(device.zeros::<f32>((h * t).max(1))?),
            None => None,
        };
        let tensor = |b, shape: [usize; 3], row: usize| DeviceTensor::with_strides(b, shape, shape[1] * row, row);
        run_on_device(
            device,
            problem,
            &tensor(&qb, q_shape, q_row)?,
            &tensor(&kb, k_shape, k_row)?,
            &tensor(&vb, v_shape, v_row)?,
            DeviceTensorMut::with_strides(&mut ob, [t, h, dv], h * out_row, out_row)?,
            lb.as_mut(),
        )?;
        let result = device.download(&ob)?;
        match out.as_slice_mut() {
            Some(slice) if out_row == dv => slice.copy_from_slice(&result[..slice.len()]),
            _ => {
                for ((ti, hi, di), o) in out.indexed_iter_mut() {
                    *o = result[(ti * h + hi) * out_row + di];
                }
            }
        }
        if let (Some(mut lse), Some(lb)) = (lse, lb) {
            let values = device.download(&lb)?;
            for ((hi, ti), l) in lse.indexed_iter_mut() {
                *l = values[hi * t + ti];
            }
        }
        Ok(())
    }
}

//! A GPU of either vendor behind one `Device`, and the device-resident run of a validated
//! problem: the tensors' addresses into a plan, the plan through the vendor's runtime.

use super::call::DevicePagedKv;
use super::cuda::CudaDevice;
use super::hip::HipDevice;
use super::memory::{self, buffer_of, upload_to, Raw};
use super::plan::{Gpu, Operand, Operands, Paging, Plan};
use super::runtime::{self, Runtime};
use super::tensor::{DeviceBuffer, DeviceTensor, DeviceTensorMut};
use super::tuning::Tuning;
use crate::element::{DType, Element};
use crate::error::Error;
use crate::problem::Problem;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicU64, Ordering};
use cudarc::driver::CudaGraph;

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
    runtime: Vendor,
    /// Tells this device's buffers from any other's (unique per opened device).
    id: u64,
    /// The host-array call's device buffers (q, k, v, out, lse), kept between calls and
    /// grown to the largest call's sizes (`Device::release_staging` frees them).
    staged: std::sync::Mutex<[Option<Raw>; STAGED_BUFFERS]>,
}

/// Device buffers the host-array call keeps: q, k, v, out, lse.
const STAGED_BUFFERS: usize = 5;

/// The vendor's runtime of a [`Device`].
enum Vendor {
    Cuda(CudaDevice),
    Hip(HipDevice),
}

/// Runs `$body` with `$runtime` bound to the device's runtime, whichever vendor's it is.
macro_rules! on_runtime {
    ($device:expr, $runtime:ident => $body:expr) => {
        match &$device.runtime {
            Vendor::Cuda($runtime) => $body,
            Vendor::Hip($runtime) => $body,
        }
    };
}

impl Device {
    /// Opens GPU `ordinal`: an NVIDIA GPU through the CUDA driver and NVRTC, else an AMD GPU
    /// through HIP and hipRTC, all loaded at run time.
    ///
    /// # Errors
    /// [`Error::NoDevice`] naming what is missing (driver, runtime compiler, device).
    pub fn open(ordinal: usize) -> Result<Device, Error> {
        let id = next_id();
        let text = |e: Error| match e {
            Error::NoDevice(text) => text,
            other => other.to_string(),
        };
        match CudaDevice::open(ordinal) {
            Ok(d) => Ok(Device { runtime: Vendor::Cuda(d), id, staged: Default::default() }),
            Err(cuda) => match HipDevice::open(ordinal) {
                Ok(d) => Ok(Device { runtime: Vendor::Hip(d), id, staged: Default::default() }),
                Err(hip) => Err(Error::NoDevice(format!("{}; {}", text(cuda), text(hip)))),
            },
        }
    }

    /// A device whose calls queue on another library's CUDA stream (candle's), leaving its
    /// context's settings as they are.
    #[cfg(feature = "candle-cuda")]
    pub(crate) fn on_cuda_stream(stream: std::sync::Arc<cudarc::driver::CudaStream>) -> Result<Device, Error> {
        Ok(Device { runtime: Vendor::Cuda(CudaDevice::on_stream(stream)?), id: next_id(), staged: Default::default() })
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        on_runtime!(self, r => r.name().to_string())
    }

    /// Copies host values to a new device buffer.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the allocation or the copy fails.
    pub fn upload<T: bytemuck::Pod>(&self, host: &[T]) -> Result<DeviceBuffer<T>, Error> {
        let bytes: &[u8] = bytemuck::cast_slice(host);
        let raw = on_runtime!(self, r => upload_to(r, bytes)?);
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
        on_runtime!(self, r => r.download(buffer_of(r, &buffer.raw)?, bytes))?;
        Ok(host)
    }

    /// Waits for the queued work.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the GPU reports a failure.
    pub fn synchronize(&self) -> Result<(), Error> {
        on_runtime!(self, r => r.synchronize())
    }

    /// GPU milliseconds (device events) of the work `f` queues on this device.
    ///
    /// # Errors
    /// What `f` returns, or [`Error::Gpu`] from the events.
    pub fn time_ms(&self, f: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error> {
        on_runtime!(self, r => r.time(f))
    }

    /// Buffers are used on the device (and stream) that allocated them only: another
    /// device's queue would not wait for the work queued on theirs.
    /// Host-array staging: device buffer `slot` (0 to 4: q, k, v, out, lse) of at least `len`
    /// elements, kept from an earlier call when large enough; give it back with
    /// [`Device::keep_staged`].
    pub(super) fn staged_buffer<T>(&self, slot: usize, len: usize) -> Result<DeviceBuffer<T>, Error> {
        let bytes = (len * core::mem::size_of::<T>()).max(1);
        let mut staged =
            self.staged.lock().map_err(|_| Error::Gpu("the staging lock was poisoned by a panic".into()))?;
        let kept = staged[slot].take().filter(|raw| self.raw_len(raw) >= bytes);
        drop(staged);
        let raw = match kept {
            Some(raw) => raw,
            None => on_runtime!(self, r => r.alloc(bytes).map(|b| memory::wrap(r, b))?),
        };
        Ok(DeviceBuffer { raw, owner: self.id, len, _element: PhantomData })
    }

    /// Keeps a buffer of [`Device::staged`] for the next host-array call.
    pub(super) fn keep_staged<T>(&self, slot: usize, buffer: DeviceBuffer<T>) {
        if let Ok(mut staged) = self.staged.lock() {
            staged[slot] = Some(buffer.raw);
        }
    }

    fn raw_len(&self, raw: &Raw) -> usize {
        on_runtime!(self, r => buffer_of(r, raw).map_or(0, |b| memory::byte_len(r, b)))
    }

    /// Overwrites `buffer` with the elements `fill(range, chunk)` writes for each range of its
    /// first `len` elements (through page-locked staging where the runtime has it).
    pub(super) fn stage_in<T: bytemuck::Pod>(
        &self,
        buffer: &mut DeviceBuffer<T>,
        len: usize,
        fill: &mut dyn FnMut(core::ops::Range<usize>, &mut [T]),
    ) -> Result<(), Error> {
        self.check_owner(buffer)?;
        let size = core::mem::size_of::<T>();
        let mut bytes = |range: core::ops::Range<usize>, chunk: &mut [u8]| {
            fill(range.start / size..range.end / size, bytemuck::cast_slice_mut(chunk))
        };
        match (&self.runtime, &mut buffer.raw) {
            (Vendor::Cuda(r), Raw::Cuda(b)) => r.stage_in(b, len * size, &mut bytes),
            (Vendor::Hip(r), Raw::Hip(b)) => r.stage_in(b, len * size, &mut bytes),
            _ => Err(Error::Gpu("the buffer belongs to another kind of device".into())),
        }
    }

    /// The first `len` elements of `buffer` after the queued work, handed to
    /// `drain(range, chunk)` range by range, in order.
    pub(super) fn stage_out<T: bytemuck::Pod>(
        &self,
        buffer: &DeviceBuffer<T>,
        len: usize,
        drain: &mut dyn FnMut(core::ops::Range<usize>, &[T]),
    ) -> Result<(), Error> {
        self.check_owner(buffer)?;
        let size = core::mem::size_of::<T>();
        let mut bytes = |range: core::ops::Range<usize>, chunk: &[u8]| {
            drain(range.start / size..range.end / size, bytemuck::cast_slice(chunk))
        };
        on_runtime!(self, r => r.stage_out(buffer_of(r, &buffer.raw)?, len * size, &mut bytes))
    }

    /// Frees the host-array call's device buffers and page-locked memory ([`release_staging`]).
    fn release_staging(&self) {
        if let Ok(mut staged) = self.staged.lock() {
            *staged = Default::default();
        }
        on_runtime!(self, r => r.release_staging());
    }

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
        on_runtime!(self, r => Ok(r.address(buffer_of(r, &buffer.raw)?)))
    }

    fn operand<T>(&self, buffer: &DeviceBuffer<T>, token_stride: usize, head_stride: usize) -> Result<Operand, Error> {
        Ok(Operand { address: self.address(buffer)?, token_stride, head_stride })
    }

    /// Queues a validated problem on tensors of this device.
    pub(super) fn run<T: Element>(
        &self,
        problem: &Problem,
        q: &DeviceTensor<T>,
        k: &DeviceTensor<T>,
        v: &DeviceTensor<T>,
        out: DeviceTensorMut<T>,
        lse: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<(), Error> {
        self.queue(problem, None, None, q, k, v, out, lse)
    }

    /// [`Device::run`] with the keys and values in a paged cache (`problem` validated against
    /// `kv`'s shapes and block table).
    pub(super) fn run_paged<T: Element>(
        &self,
        problem: &Problem,
        q: &DeviceTensor<T>,
        kv: &DevicePagedKv<T>,
        out: DeviceTensorMut<T>,
        lse: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<(), Error> {
        let (k, v) = (&kv.k_cache, &kv.v_cache);
        let paging = Paging {
            block_size: kv.block_size,
            k_block_stride: kv.block_size * k.token_stride,
            v_block_stride: kv.block_size * v.token_stride,
        };
        let table: Vec<i32> = kv.block_table.iter().copied().collect();
        self.queue(problem, None, Some((paging, &table, kv.block_table.ncols())), q, k, v, out, lse)
    }

    /// Queues a problem whose cu_seqlens are on this device (`problem`: the call as one
    /// sequence of all the tokens, validated).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_with_device_seqlens<T: Element>(
        &self,
        problem: &Problem,
        cu_seqlens: [&DeviceBuffer<i32>; 2],
        q: &DeviceTensor<T>,
        k: &DeviceTensor<T>,
        v: &DeviceTensor<T>,
        out: DeviceTensorMut<T>,
        lse: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<(), Error> {
        let batch = cu_seqlens[0].len() - 1;
        let addresses = [self.address(cu_seqlens[0])?, self.address(cu_seqlens[1])?];
        self.queue(problem, Some((batch, addresses)), None, q, k, v, out, lse)
    }

    #[allow(clippy::too_many_arguments)]
    fn queue<T: Element>(
        &self,
        problem: &Problem,
        device_seqlens: Option<(usize, [u64; 2])>,
        paged: Option<(Paging, &[i32], usize)>,
        q: &DeviceTensor<T>,
        k: &DeviceTensor<T>,
        v: &DeviceTensor<T>,
        out: DeviceTensorMut<T>,
        lse: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<(), Error> {
        let operands = Operands {
            q: self.operand(q.buffer, q.token_stride, q.head_stride)?,
            k: self.operand(k.buffer, k.token_stride, k.head_stride)?,
            v: self.operand(v.buffer, v.token_stride, v.head_stride)?,
            out: self.operand(out.buffer, out.token_stride, out.head_stride)?,
            lse: lse.map(|l| self.address(l)).transpose()?.unwrap_or(0),
        };
        // SAFETY: every operand is a live buffer of this device (checked by `address`),
        // holding the shape and strides its tensor was checked against; the problem was
        // validated against those shapes (device cu_seqlens: their buffers hold batch + 1
        // entries each; a paged cache: its tensors hold `num_blocks` whole blocks, and the
        // block table names only those). `out` and `lse` are borrowed mutably for the call, and the buffers
        // free stream-ordered, after the kernels.
        unsafe { self.queue_operands(problem, device_seqlens, paged, T::DTYPE, operands) }
    }

    /// Queues a validated problem on device addresses.
    ///
    /// # Safety
    /// Each operand must address device memory of this device's context that holds its
    /// tensor's shape (the problem's) at its strides, stays allocated until the queued work
    /// ends, and, for `out` and `lse`, is not used by other work meanwhile; device cu_seqlens
    /// must address `batch + 1` i32 each; with `paged`, `k` and `v` must hold every block the
    /// table names (checked by `Problem::new_paged`) at the paging's block strides.
    pub(crate) unsafe fn queue_operands(
        &self,
        problem: &Problem,
        device_seqlens: Option<(usize, [u64; 2])>,
        paged: Option<(Paging, &[i32], usize)>,
        dtype: DType,
        operands: Operands,
    ) -> Result<(), Error> {
        let f16 = match dtype {
            DType::BF16 => false,
            DType::F16 => true,
            DType::F32 => return Err(f32_unsupported()),
        };
        let out = operands.out;
        if !out.token_stride.is_multiple_of(2) || !out.head_stride.is_multiple_of(2) {
            return Err(Error::GpuUnsupported("the output's strides must be even (pairs are stored together)".into()));
        }
        on_runtime!(self, r => {
            let gpu = Gpu { target: r.target(), multiprocessors: r.multiprocessors() };
            let plan = match (device_seqlens, paged) {
                (None, None) => Plan::new(problem, f16, gpu, Tuning::get(), operands),
                (None, Some((paging, table, columns))) => {
                    Plan::new(problem, f16, gpu, Tuning::get(), operands).with_block_table(paging, table, columns)
                }
                (Some((batch, cu)), None) => {
                    Plan::with_device_seqlens(problem, batch, cu, f16, gpu, Tuning::get(), operands)
                }
                (Some(_), Some(_)) => {
                    return Err(Error::GpuUnsupported("a paged cache with cu_seqlens on the device".into()))
                }
            };
            // SAFETY: the caller vouches for the operands (this function's contract); the
            // kernel checks device cu_seqlens' values before any block reads a tensor.
            unsafe { runtime::launch(r, &plan) }
        })
    }

    /// Waits for the queued work and reports whether a call's cu_seqlens on the device
    /// ([`forward_device_seqlens`](super::forward_device_seqlens)) broke a rule since the last
    /// check; the flag is lowered.
    ///
    /// # Errors
    /// [`Error::DeviceCuSeqlens`] when one did (those calls wrote NaN); [`Error::Gpu`] when
    /// the GPU fails.
    pub fn check_seqlens(&self) -> Result<(), Error> {
        if on_runtime!(self, r => runtime::take_status(r))? {
            Err(Error::DeviceCuSeqlens)
        } else {
            Ok(())
        }
    }

    /// Overwrites the start of `buffer` with `host`, in the order of the queued work (for
    /// cu_seqlens that a captured graph reads, say).
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] when `host` is longer than the buffer; [`Error::Gpu`] when the
    /// copy fails or the buffer is another device's.
    pub fn write<T: bytemuck::Pod>(&self, buffer: &mut DeviceBuffer<T>, host: &[T]) -> Result<(), Error> {
        self.check_owner(buffer)?;
        if host.len() > buffer.len {
            return Err(Error::BufferTooSmall { arg: "write", needed: host.len(), len: buffer.len });
        }
        let bytes: &[u8] = bytemuck::cast_slice(host);
        match (&self.runtime, &mut buffer.raw) {
            (Vendor::Cuda(r), Raw::Cuda(b)) => r.write(b, bytes),
            (Vendor::Hip(r), Raw::Hip(b)) => r.write(b, bytes),
            _ => Err(Error::Gpu("the buffer belongs to another kind of device".into())),
        }
    }

    /// Captures the work that `work` queues on this device into a [`Graph`] instead of running
    /// it (NVIDIA only). Replays read the buffers' contents of then: rewrite cu_seqlens with
    /// [`Device::write`] between replays. Make one call of the same variant before capturing
    /// (it compiles the kernel and sizes the workspace and the status flag, which must not
    /// happen inside a capture), and capture only calls that copy nothing from the host:
    /// [`forward_device_seqlens`](super::forward_device_seqlens).
    ///
    /// # Errors
    /// What `work` returns; [`Error::GpuUnsupported`] on AMD GPUs; [`Error::Gpu`] when the
    /// capture fails.
    pub fn capture(&self, work: &mut dyn FnMut() -> Result<(), Error>) -> Result<Graph, Error> {
        match &self.runtime {
            Vendor::Cuda(r) => Ok(Graph { graph: r.capture(work)? }),
            Vendor::Hip(_) => Err(Error::GpuUnsupported("graph capture on AMD GPUs".into())),
        }
    }
}

/// Work captured on a device's stream ([`Device::capture`]), replayed as one launch.
pub struct Graph {
    graph: CudaGraph,
}

impl Graph {
    /// Queues the captured work again, on the device's stream.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the launch fails.
    pub fn replay(&self) -> Result<(), Error> {
        self.graph.launch().map_err(|e| Error::Gpu(format!("replaying a graph: {e}")))
    }
}

/// A new id for an opened device (tells its buffers from every other device's).
fn next_id() -> u64 {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    OPENED.fetch_add(1, Ordering::Relaxed)
}

pub(super) fn f32_unsupported() -> Error {
    Error::GpuUnsupported(
        "f32 input (the tensor cores take bf16 or f16): use Backend::Cpu or Backend::Auto for f32".into(),
    )
}

/// The device `Backend::Auto` and `Backend::Gpu` use: GPU 0, opened once.
static DEFAULT_DEVICE: std::sync::OnceLock<Result<Device, Error>> = std::sync::OnceLock::new();

pub(super) fn default_device() -> Result<&'static Device, Error> {
    DEFAULT_DEVICE.get_or_init(|| Device::open(0)).as_ref().map_err(Clone::clone)
}

/// Calls `f` on the default device if it was opened.
fn static_device_if_open(f: impl FnOnce(&Device)) {
    if let Some(Ok(device)) = DEFAULT_DEVICE.get() {
        f(device);
    }
}

/// Whether `Backend::Auto` should try the GPU for this element type.
/// Frees what `forward` on host arrays with the GPU keeps between calls: the device buffers
/// of its largest call (q, k, v, the output and the LSE) and, on NVIDIA, its 48 MiB of
/// page-locked host memory. The next such call allocates them again. Does nothing where no
/// host-array call has opened the GPU.
///
/// ```
/// varlen_attn::gpu::release_staging();
/// ```
pub fn release_staging() {
    static_device_if_open(|device| device.release_staging());
}

pub(crate) fn is_usable(dtype: DType) -> bool {
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

//! The NVIDIA runtime: the CUDA driver and NVRTC, both opened at run time through cudarc (so the
//! crate builds with no CUDA toolkit), kernels compiled per variant and cached.

use super::pinned::PinnedRing;
use super::plan::{KernelParams, Target, Variant};
use super::runtime::{Dims, Entry, KernelCache, Runtime, StatusFlag};
use super::source;
use super::tensor_map::{TensorMap, TensorMapShape};
use super::tuning::Tuning;
use super::workspace::Workspace;
use crate::error::Error;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use std::ops::Range;
use std::sync::{Arc, Mutex};

// SAFETY: `KernelParams` is `#[repr(C)]` plain data (integers and floats) matching the kernel's
// parameter struct, so its bytes are a valid kernel argument.
unsafe impl DeviceRepr for KernelParams {}
// SAFETY: `TensorMap` is the driver's 128 opaque bytes, 64-byte aligned like the kernel's
// `VaTensorMap` parameter.
unsafe impl DeviceRepr for TensorMap {}

/// The driver's encoding of `shape` (16-bit elements, 128-byte swizzle, zeros out of bounds),
/// or `None` where TMA cannot address it or the driver refuses: the kernel then copies by
/// cp.async, as it does on other GPUs.
fn encode_tensor_map(shape: &TensorMapShape, f16: bool) -> Option<TensorMap> {
    use cudarc::driver::sys;
    let arguments = shape.arguments()?;
    let data_type = if f16 {
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    } else {
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    };
    let element_strides = [1u32; 3];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every array holds the rank (3) entries the call reads (2 for the strides); `map`
    // is written by the driver and read only on success; the address is only recorded.
    let result = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            3,
            shape.address as *mut core::ffi::c_void,
            arguments.global_dims.as_ptr(),
            arguments.global_strides.as_ptr(),
            arguments.box_dims.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if result != sys::CUresult::CUDA_SUCCESS {
        log::debug!("varlen-attn: no tensor map for {shape:?} ({result:?}); copying by cp.async");
        return None;
    }
    Some(TensorMap(map.opaque))
}

/// Whether the dynamic loader opens `library` (`cuda`, `nvrtc`) under one of the names the
/// driver and CUDA 13's NVRTC go by. cudarc's own check exists only where it loads libraries at
/// run time; where another crate turns on its `dynamic-linking` (candle's `cuda`), the
/// libraries are linked, and found here too.
pub(crate) fn library_present(library: &str) -> bool {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let names = [
        format!("{DLL_PREFIX}{library}{DLL_SUFFIX}"),
        format!("{DLL_PREFIX}{library}{DLL_SUFFIX}.1"),
        format!("{DLL_PREFIX}{library}{DLL_SUFFIX}.13"),
        format!("{DLL_PREFIX}nv{library}{DLL_SUFFIX}"),
        format!("{DLL_PREFIX}{library}64_130_0{DLL_SUFFIX}"),
    ];
    names.iter().any(|name| {
        // SAFETY: opens a system library (running its initialisers, as cudarc's loading does)
        // and closes it again; nothing of it is called.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

/// The two entry points of one compiled variant.
pub(crate) struct Kernels {
    attention: CudaFunction,
    merge: CudaFunction,
    plan_tiles: CudaFunction,
}

/// One NVIDIA GPU with its stream and compiled kernels.
pub(crate) struct CudaDevice {
    stream: Arc<CudaStream>,
    name: String,
    capability: (i32, i32),
    /// The kernel this GPU runs, chosen once when it is opened.
    target: Target,
    multiprocessors: usize,
    kernels: KernelCache<Kernels>,
    /// The workspace, kept between calls.
    workspace: Workspace<CudaSlice<u8>>,
    /// The key splits' counters, zeroed when allocated, kept between calls.
    split_counters: Workspace<CudaSlice<u8>>,
    status: StatusFlag<CudaSlice<u8>>,
    /// The host-array call's page-locked staging, allocated on first use.
    pinned: Mutex<Option<PinnedRing>>,
}

fn gpu_error(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| {
        let text = e.to_string();
        if text.contains("OUT_OF_MEMORY") {
            Error::Gpu(format!("{what}: out of device memory ({text})"))
        } else {
            Error::Gpu(format!("{what}: {text}"))
        }
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`, or says why there is none.
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        if !library_present("cuda") {
            return Err(Error::NoDevice("the NVIDIA driver library (libcuda.so) was not found".into()));
        }
        if !library_present("nvrtc") {
            return Err(Error::NoDevice(
                "NVRTC (libnvrtc.so.13) was not found: install the CUDA 13 runtime compiler, e.g. `pip install nvidia-cuda-nvrtc`, and put it on the library path".into(),
            ));
        }
        let count =
            CudaContext::device_count().map_err(|e| Error::NoDevice(format!("the CUDA driver answered: {e}")))?;
        if count <= ordinal as i32 {
            return Err(Error::NoDevice(format!("GPU {ordinal} was asked for but the driver sees {count}")));
        }
        let context = CudaContext::new(ordinal).map_err(gpu_error("creating a context"))?;
        // cudarc would otherwise record and wait on events around every use of every buffer
        // (several driver calls per buffer per call: most of a small call's host time).
        // SAFETY: this device's buffers are allocated, used and freed on its one stream only
        // (`gpu::Device` refuses buffers of another device), so the stream's order alone
        // orders every use.
        unsafe { context.disable_event_tracking() };
        let stream = context.new_stream().map_err(gpu_error("creating a stream"))?;
        Self::on_stream(stream)
    }

    /// The GPU of `stream`, whose calls are queued on it: a stream of this crate's own
    /// context, or another library's (candle's), whose context settings are left as they are.
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Self, Error> {
        let context = stream.context();
        let ordinal = context.ordinal();
        let capability = context.compute_capability().map_err(gpu_error("reading the compute capability"))?;
        if capability.0 < 8 {
            return Err(Error::NoDevice(format!(
                "GPU {ordinal} has compute capability {}.{}; the kernel needs 8.0 or newer (bf16 tensor cores)",
                capability.0, capability.1
            )));
        }
        let multiprocessors = context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(gpu_error("reading the multiprocessor count"))? as usize;
        let name = context.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        Ok(CudaDevice {
            stream,
            name,
            capability,
            target: Target::nvidia(capability.0, capability.1, Tuning::get()),
            multiprocessors,
            kernels: KernelCache::new(),
            workspace: Workspace::new(),
            split_counters: Workspace::new(),
            status: StatusFlag::new(),
            pinned: Mutex::new(None),
        })
    }

    /// Compiles `variant` with NVRTC and loads its kernels.
    fn compile(&self, variant: Variant) -> Result<Kernels, Error> {
        let (major, minor) = self.capability;
        let options = cudarc::nvrtc::CompileOptions {
            options: source::nvrtc_options(&variant, major, minor),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source::kernel_source(), options)
            .map_err(|e| Error::Gpu(format!("NVRTC could not compile the kernel for {variant:?}: {e}")))?;
        if let Some(folder) = &Tuning::get().dump_ptx {
            let path = folder.join(format!(
                "attention_{:?}_d{}_dv{}_n{}_{}.ptx",
                variant.target,
                variant.head_dim_pad,
                variant.head_dim_v_pad,
                variant.block_n,
                if variant.f16 { "f16" } else { "bf16" }
            ));
            if let Err(e) = std::fs::write(&path, ptx.to_src()) {
                log::warn!("varlen-attn: could not write {}: {e}", path.display());
            }
        }
        let module = self.stream.context().load_module(ptx).map_err(gpu_error("loading the compiled kernel"))?;
        let load = |entry: Entry| module.load_function(entry.name()).map_err(gpu_error("finding a kernel"));
        let (attention, merge, plan_tiles) = (load(Entry::Attention)?, load(Entry::Merge)?, load(Entry::PlanTiles)?);
        attention
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                variant.shared_bytes() as i32,
            )
            .map_err(gpu_error("raising the kernel's shared-memory limit"))?;
        Ok(Kernels { attention, merge, plan_tiles })
    }
}

impl CudaDevice {
    /// The page-locked staging ring, locked, allocated on first use.
    fn pinned_ring(&self) -> Result<std::sync::MutexGuard<'_, Option<PinnedRing>>, Error> {
        let mut ring = self.pinned.lock().map_err(|_| Error::Gpu("the staging lock was poisoned by a panic".into()))?;
        if ring.is_none() {
            *ring = Some(PinnedRing::new(&self.stream)?);
        }
        Ok(ring)
    }

    /// Captures the work `work` queues on the stream into an instantiated graph.
    pub fn capture(&self, work: &mut dyn FnMut() -> Result<(), Error>) -> Result<cudarc::driver::CudaGraph, Error> {
        use cudarc::driver::sys;
        // Relaxed: a kernel compiled on first use (module loads) does not break the capture.
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(gpu_error("starting a graph capture"))?;
        let queued = work();
        let graph =
            self.stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(gpu_error("ending a graph capture"));
        queued?;
        graph?.ok_or_else(|| Error::Gpu("the capture recorded no work".into()))
    }
}

impl Runtime for CudaDevice {
    type Buffer = CudaSlice<u8>;
    type Kernels = Kernels;

    fn name(&self) -> &str {
        &self.name
    }

    fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// Warpgroup MMAs on Hopper, `mma.sync` elsewhere.
    fn target(&self) -> Target {
        self.target
    }

    fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>, Error> {
        // SAFETY: u8 has no invalid bit patterns; every reader of the buffer writes it first or
        // reads bytes the caller uploaded.
        unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.map_err(gpu_error("allocating device memory"))
    }

    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, Error> {
        self.stream.clone_htod(bytes).map_err(gpu_error("copying to the device"))
    }

    fn download(&self, buffer: &CudaSlice<u8>, bytes: &mut [u8]) -> Result<(), Error> {
        self.stream.memcpy_dtoh(&buffer.slice(0..bytes.len()), bytes).map_err(gpu_error("copying from the device"))
    }

    fn write(&self, buffer: &mut CudaSlice<u8>, bytes: &[u8]) -> Result<(), Error> {
        self.stream
            .memcpy_htod(bytes, &mut buffer.slice_mut(0..bytes.len()))
            .map_err(gpu_error("copying to the device"))
    }

    fn address(&self, buffer: &CudaSlice<u8>) -> u64 {
        buffer.device_ptr(&self.stream).0
    }

    fn stage_in(
        &self,
        buffer: &mut CudaSlice<u8>,
        len: usize,
        fill: &mut dyn FnMut(Range<usize>, &mut [u8]),
    ) -> Result<(), Error> {
        assert!(len <= buffer.len(), "staging past the buffer");
        let mut ring = self.pinned_ring()?;
        let dst = self.address(buffer);
        // SAFETY: `buffer` holds at least `len` bytes (asserted) and is borrowed mutably for the
        // call; it is freed stream-ordered, after the copies.
        unsafe { ring.as_mut().expect("allocated by pinned_ring").copy_in(&self.stream, dst, len, fill) }
    }

    fn stage_out(
        &self,
        buffer: &CudaSlice<u8>,
        len: usize,
        drain: &mut dyn FnMut(Range<usize>, &[u8]),
    ) -> Result<(), Error> {
        assert!(len <= buffer.len(), "staging past the buffer");
        let mut ring = self.pinned_ring()?;
        let src = self.address(buffer);
        // SAFETY: `buffer` holds at least `len` bytes (asserted) and outlives this call, which
        // waits for every copy.
        unsafe { ring.as_mut().expect("allocated by pinned_ring").copy_out(&self.stream, src, len, drain) }
    }

    fn release_staging(&self) {
        if let Ok(mut ring) = self.pinned.lock() {
            *ring = None;
        }
    }

    fn synchronize(&self) -> Result<(), Error> {
        self.stream.synchronize().map_err(gpu_error("waiting for the GPU"))
    }

    fn time(&self, work: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error> {
        let context = self.stream.context();
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = context.new_event(timing).map_err(gpu_error("creating an event"))?;
        let end = context.new_event(timing).map_err(gpu_error("creating an event"))?;
        start.record(&self.stream).map_err(gpu_error("recording an event"))?;
        work()?;
        end.record(&self.stream).map_err(gpu_error("recording an event"))?;
        end.synchronize().map_err(gpu_error("waiting for an event"))?;
        start.elapsed_ms(&end).map_err(gpu_error("reading an event"))
    }

    fn kernels(&self, variant: Variant) -> Result<Arc<Kernels>, Error> {
        self.kernels.get_or_compile(variant, || self.compile(variant))
    }

    fn workspace(&self) -> &Workspace<CudaSlice<u8>> {
        &self.workspace
    }

    fn split_counters(&self) -> &Workspace<CudaSlice<u8>> {
        &self.split_counters
    }

    fn status(&self) -> &StatusFlag<CudaSlice<u8>> {
        &self.status
    }

    fn tensor_maps(&self, shapes: [TensorMapShape; 2], f16: bool) -> Option<[TensorMap; 2]> {
        if Tuning::get().no_tma {
            return None;
        }
        Some([encode_tensor_map(&shapes[0], f16)?, encode_tensor_map(&shapes[1], f16)?])
    }

    unsafe fn launch(
        &self,
        kernels: &Kernels,
        entry: Entry,
        dims: Dims,
        params: &KernelParams,
        maps: Option<(&[TensorMap; 2], i32)>,
    ) -> Result<(), Error> {
        let function = match entry {
            Entry::Attention => &kernels.attention,
            Entry::Merge => &kernels.merge,
            Entry::PlanTiles => &kernels.plan_tiles,
        };
        let config =
            LaunchConfig { grid_dim: dims.grid, block_dim: (dims.threads, 1, 1), shared_mem_bytes: dims.shared_bytes };
        let mut launch = self.stream.launch_builder(function);
        launch.arg(params);
        if let Some((maps, tma)) = &maps {
            launch.arg(&maps[0]).arg(&maps[1]).arg(tma);
        }
        // SAFETY: the arguments match the kernel's parameters (the block, then on Hopper the
        // two maps and the flag); the caller guarantees the addresses in the block.
        unsafe { launch.launch(config) }.map_err(gpu_error(match entry {
            Entry::Attention => "launching the attention kernel",
            Entry::Merge => "launching the merge kernel",
            Entry::PlanTiles => "launching the tile-planning kernel",
        }))?;
        Ok(())
    }
}

//! The NVIDIA runtime: the CUDA driver and NVRTC, both opened at run time through cudarc (so the
//! crate builds with no CUDA toolkit), kernels compiled per variant and cached.

use super::plan::{KernelParams, Plan, Target, Variant};
use super::source;
use super::tensor_map::{TensorMap, TensorMapShape};
use super::workspace::Workspace;
use crate::error::Error;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use std::collections::HashMap;
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

/// The two entry points of one compiled variant.
struct Kernels {
    attention: CudaFunction,
    merge: CudaFunction,
}

/// One NVIDIA GPU with its stream and compiled kernels.
pub(crate) struct CudaDevice {
    stream: Arc<CudaStream>,
    name: String,
    capability: (i32, i32),
    /// The kernel this GPU runs, chosen once when it is opened.
    target: Target,
    multiprocessors: usize,
    /// Whether Hopper's kernel may copy whole key tiles by TMA (`VARLEN_ATTN_GPU_TMA=0` turns it
    /// off, for comparisons; it then copies by cp.async only).
    tma: bool,
    kernels: Mutex<HashMap<Variant, Arc<Kernels>>>,
    /// The key-split workspace, kept between calls.
    workspace: Workspace<CudaSlice<u8>>,
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
        // SAFETY: asks the dynamic loader whether the library can be opened; nothing else.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoDevice("the NVIDIA driver library (libcuda.so) was not found".into()));
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
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
        let stream = context.new_stream().map_err(gpu_error("creating a stream"))?;
        Ok(CudaDevice {
            stream,
            name,
            capability,
            target: Target::nvidia(capability.0, capability.1),
            multiprocessors,
            tma: std::env::var("VARLEN_ATTN_GPU_TMA").map_or(true, |v| v != "0"),
            kernels: Mutex::new(HashMap::new()),
            workspace: Workspace::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// The kernel this GPU runs: warpgroup MMAs on Hopper, `mma.sync` elsewhere.
    pub fn target(&self) -> Target {
        self.target
    }

    /// The kernels of `variant`, compiled on first use.
    fn kernels(&self, variant: Variant) -> Result<Arc<Kernels>, Error> {
        let mut cache =
            self.kernels.lock().map_err(|_| Error::Gpu("the kernel cache was poisoned by a panic".into()))?;
        if let Some(k) = cache.get(&variant) {
            return Ok(k.clone());
        }
        let (major, minor) = self.capability;
        let mut options = source::nvrtc_options(&variant, major, minor);
        // For tuning: VARLEN_ATTN_GPU_DEFINES="-DVA_X=1 ..." adds definitions to every variant.
        if let Ok(extra) = std::env::var("VARLEN_ATTN_GPU_DEFINES") {
            options.extend(extra.split_whitespace().map(String::from));
        }
        let options = cudarc::nvrtc::CompileOptions { options, ..Default::default() };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source::kernel_source(), options)
            .map_err(|e| Error::Gpu(format!("NVRTC could not compile the kernel for {variant:?}: {e}")))?;
        // For tuning: VARLEN_ATTN_DUMP_PTX=folder keeps each variant's PTX (for `ptxas -v`).
        if let Some(folder) = std::env::var_os("VARLEN_ATTN_DUMP_PTX") {
            let path = std::path::Path::new(&folder).join(format!(
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
        let attention =
            module.load_function("va_attention_forward").map_err(gpu_error("finding va_attention_forward"))?;
        let merge = module.load_function("va_attention_merge").map_err(gpu_error("finding va_attention_merge"))?;
        attention
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                variant.shared_bytes() as i32,
            )
            .map_err(gpu_error("raising the kernel's shared-memory limit"))?;
        let kernels = Arc::new(Kernels { attention, merge });
        cache.insert(variant, kernels.clone());
        Ok(kernels)
    }

    /// Device memory of `bytes` bytes (contents unspecified).
    pub fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>, Error> {
        // SAFETY: u8 has no invalid bit patterns; every reader of the buffer writes it first or
        // reads bytes the caller uploaded.
        unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.map_err(gpu_error("allocating device memory"))
    }

    pub fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, Error> {
        self.stream.clone_htod(bytes).map_err(gpu_error("copying to the device"))
    }

    pub fn download(&self, buffer: &CudaSlice<u8>, bytes: &mut [u8]) -> Result<(), Error> {
        self.stream.memcpy_dtoh(&buffer.slice(0..bytes.len()), bytes).map_err(gpu_error("copying from the device"))
    }

    pub fn address(&self, buffer: &CudaSlice<u8>) -> u64 {
        buffer.device_ptr(&self.stream).0
    }

    pub fn synchronize(&self) -> Result<(), Error> {
        self.stream.synchronize().map_err(gpu_error("waiting for the GPU"))
    }

    /// Enqueues `plan` (whose tensor pointers are filled in) on the stream, copying its
    /// metadata over first unless it travels in the parameter block.
    pub fn launch(&self, plan: &Plan) -> Result<(), Error> {
        let kernels = self.kernels(plan.variant)?;
        let metadata = plan.metadata_to_copy().map(|m| self.upload(bytemuck::cast_slice(m))).transpose()?;
        let workspace = self.workspace.at_least(plan.workspace_bytes(), |bytes| self.alloc(bytes))?;
        let params =
            plan.params_at(metadata.as_ref().map(|m| self.address(m)), workspace.buffer().map(|w| self.address(w)));
        if plan.tiles > 0 {
            let config = LaunchConfig {
                grid_dim: plan.grid(),
                block_dim: (plan.variant.threads() as u32, 1, 1),
                shared_mem_bytes: plan.variant.shared_bytes() as u32,
            };
            let mut launch = self.stream.launch_builder(&kernels.attention);
            launch.arg(&params);
            // Hopper's kernel also takes the tensor maps of K and V, and whether both encoded.
            let (maps, tma);
            if plan.variant.target == Target::Wgmma {
                let encoded = plan.key_value_shapes().map(|shape| {
                    if self.tma {
                        encode_tensor_map(&shape, plan.variant.f16)
                    } else {
                        None
                    }
                });
                tma = i32::from(encoded.iter().all(Option::is_some));
                maps = encoded.map(Option::unwrap_or_default);
                launch.arg(&maps[0]).arg(&maps[1]).arg(&tma);
            }
            // SAFETY: the parameter block matches the kernel's struct; every pointer in it is a
            // live device allocation of the size the kernel indexes (validated shapes, strides
            // and cu_seqlens; the workspace sized by the plan), and the kernel stays in bounds
            // of them. The temporaries are freed stream-ordered, after the kernels.
            unsafe { launch.launch(config) }.map_err(gpu_error("launching the attention kernel"))?;
            if plan.splits > 1 {
                let (blocks, threads) = plan.merge_grid();
                let config =
                    LaunchConfig { grid_dim: (blocks.max(1), 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
                let mut launch = self.stream.launch_builder(&kernels.merge);
                launch.arg(&params);
                // SAFETY: as above; the merge reads the workspace the first kernel wrote.
                unsafe { launch.launch(config) }.map_err(gpu_error("launching the merge kernel"))?;
            }
        }
        drop(metadata);
        Ok(())
    }

    /// Milliseconds of GPU time that `work` enqueues on the stream (device events).
    pub fn time(&self, work: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error> {
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
}

//! GPU offload behind the `gpu` cargo feature: the same `forward` call with `Backend::Gpu` (or
//! `Auto` when a device answers), and a device-resident API for data already on the GPU.
//!
//! One HIP C++ kernel (`kernel/attention.hip`) is compiled at run time: by NVRTC on NVIDIA GPUs
//! (behind our portability header, `kernel/portability.h`) and by hipRTC on AMD GPUs. Drivers and
//! compilers are opened at run time, so the crate builds on machines with no GPU toolkit; without
//! a device every call returns [`Error::NoDevice`](crate::Error::NoDevice) and `Backend::Auto` runs on the CPU.
//!
//! Without the `gpu` feature this module keeps the same API (`stub.rs`), and every entry
//! answers [`Error::GpuNotCompiled`](crate::Error::GpuNotCompiled).
//!
//! The element types are bf16 and f16; f32 input runs on the CPU (`Backend::Auto`) or is refused
//! (`Backend::Gpu`): the tensor cores take 16-bit operands, and rounding f32 inputs would not
//! be the f32 attention the caller asked for.
//!
//! Files, one concern each:
//!
//! | file | owns |
//! |---|---|
//! | `call.rs` | `forward_device` and `forward_device_seqlens`: validation, then the device's run |
//! | `tensor.rs` | device buffers and the tensors laid over them |
//! | `memory.rs` | a buffer's memory as either vendor's runtime allocated it |
//! | `device.rs` | `Device`: either vendor's runtime behind one type; a problem's run |
//! | `staging.rs` | `forward` on host arrays: copies in, run, copies out |
//! | `stub.rs` | the same API in builds without the `gpu` feature |
//! | `plan/` | the kernel variant, the tile and split rules, the parameter block, the plan of a call |
//! | `runtime.rs` | what a vendor's runtime provides, and the one launch sequence |
//! | `cuda.rs`, `hip.rs` | the NVIDIA (CUDA driver, NVRTC) and AMD (HIP, hipRTC) runtimes |
//! | `tuning.rs` | the switches benchmarks use, read once |
//! | `source.rs` | the kernel source with its headers inlined, and compiler options |
//! | `tensor_map.rs` | Hopper's tensor-memory-copy descriptors of K and V |
//! | `workspace.rs` | the key-split workspace kept between calls |
//! | `kernel/` | the kernel: `attention.hip` (entry points) and one header per concern |

mod call;
#[cfg(feature = "gpu")]
mod cuda;
#[cfg(feature = "gpu")]
mod device;
#[cfg(feature = "gpu")]
mod hip;
#[cfg(feature = "gpu")]
mod memory;
#[cfg(feature = "gpu")]
mod pinned;
#[cfg(feature = "gpu")]
pub(crate) mod plan;
#[cfg(feature = "gpu")]
mod runtime;
#[cfg(feature = "gpu")]
pub(crate) mod source;
#[cfg(feature = "gpu")]
mod staging;
#[cfg(not(feature = "gpu"))]
mod stub;
mod tensor;
#[cfg(feature = "gpu")]
mod tensor_map;
#[cfg(feature = "gpu")]
pub(crate) mod tuning;
#[cfg(feature = "gpu")]
mod workspace;

#[cfg(not(feature = "gpu"))]
use stub as device;
#[cfg(not(feature = "gpu"))]
use stub as memory;

pub(crate) use call::check_modifiers;
pub use call::{forward_device, forward_device_paged, forward_device_seqlens, DevicePagedKv};
pub use device::{release_staging, Device, Graph};
#[cfg(feature = "candle-cuda")]
pub(crate) use tensor::check_layout;
pub use tensor::{DeviceBuffer, DeviceTensor, DeviceTensorMut};

#[cfg(feature = "gpu")]
pub(crate) use cuda::library_present as cuda_library_present;
pub(crate) use device::is_usable;
#[cfg(feature = "gpu")]
pub(crate) use staging::forward;
#[cfg(not(feature = "gpu"))]
pub(crate) use stub::forward;

//! GPU offload behind the `gpu` cargo feature: the same `forward` call with `Backend::Gpu` (or
//! `Auto` when a device answers), and a device-resident API for data already on the GPU.
//!
//! One HIP C++ kernel (`kernel/attention.hip`) is compiled at run time: by NVRTC on NVIDIA GPUs
//! (behind our portability header, `kernel/portability.h`) and by hipRTC on AMD GPUs. Drivers and
//! compilers are opened at run time, so the crate builds on machines with no GPU toolkit; without
//! a device every call returns [`Error::NoDevice`](crate::Error::NoDevice) and `Backend::Auto` runs on the CPU.
//!
//! Without the `gpu` feature this module keeps the same API, and every entry answers
//! [`Error::GpuNotCompiled`](crate::Error::GpuNotCompiled).
//!
//! The element types are bf16 and f16; f32 input runs on the CPU (`Backend::Auto`) or is refused
//! (`Backend::Gpu`): the tensor cores take 16-bit operands, and rounding f32 inputs would not
//! be the f32 attention the caller asked for.

#[cfg(feature = "gpu")]
mod cuda;
mod device;
#[cfg(feature = "gpu")]
mod hip;
#[cfg(feature = "gpu")]
mod plan;
#[cfg(feature = "gpu")]
mod source;
#[cfg(feature = "gpu")]
mod tensor_map;
#[cfg(feature = "gpu")]
mod workspace;

pub use device::{forward_device, Device, DeviceBuffer, DeviceTensor, DeviceTensorMut};
#[cfg(feature = "gpu")]
pub use source::{compile_check_nvidia, hipcc_check_arguments};

pub(crate) use device::{forward, is_usable};

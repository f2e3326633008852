//! The memory of a device buffer as its vendor's runtime allocated it (`Raw`), and how each
//! runtime's buffers go in and out of it. Below both `tensor.rs` (buffers and tensors) and
//! `device.rs` (the `Device` that allocates them).

use super::cuda::CudaDevice;
use super::hip::{HipBuffer, HipDevice};
use super::runtime::Runtime;
use crate::error::Error;
use cudarc::driver::CudaSlice;

/// The memory of a [`DeviceBuffer`](super::DeviceBuffer), as its vendor's runtime allocated it.
pub(crate) enum Raw {
    Cuda(CudaSlice<u8>),
    Hip(HipBuffer),
}

/// A vendor's runtime, and how its buffers sit in a [`Raw`].
pub(super) trait VendorRuntime: Runtime {
    fn wrap(buffer: Self::Buffer) -> Raw;
    fn unwrap(raw: &Raw) -> Option<&Self::Buffer>;
    fn byte_len(buffer: &Self::Buffer) -> usize;
}

impl VendorRuntime for CudaDevice {
    fn wrap(buffer: CudaSlice<u8>) -> Raw {
        Raw::Cuda(buffer)
    }
    fn unwrap(raw: &Raw) -> Option<&CudaSlice<u8>> {
        match raw {
            Raw::Cuda(b) => Some(b),
            Raw::Hip(_) => None,
        }
    }
    fn byte_len(buffer: &CudaSlice<u8>) -> usize {
        buffer.len()
    }
}

impl VendorRuntime for HipDevice {
    fn wrap(buffer: HipBuffer) -> Raw {
        Raw::Hip(buffer)
    }
    fn unwrap(raw: &Raw) -> Option<&HipBuffer> {
        match raw {
            Raw::Hip(b) => Some(b),
            Raw::Cuda(_) => None,
        }
    }
    fn byte_len(buffer: &HipBuffer) -> usize {
        buffer.len()
    }
}

/// `raw` as `runtime`'s buffer, or an error for another vendor's.
pub(super) fn buffer_of<'a, R: VendorRuntime>(_runtime: &R, raw: &'a Raw) -> Result<&'a R::Buffer, Error> {
    R::unwrap(raw).ok_or_else(|| Error::Gpu("the buffer belongs to another kind of device".into()))
}

/// A new buffer of `runtime` holding `bytes`.
pub(super) fn upload_to<R: VendorRuntime>(runtime: &R, bytes: &[u8]) -> Result<Raw, Error> {
    runtime.upload(bytes).map(R::wrap)
}

pub(super) fn wrap<R: VendorRuntime>(_runtime: &R, buffer: R::Buffer) -> Raw {
    R::wrap(buffer)
}

pub(super) fn byte_len<R: VendorRuntime>(_runtime: &R, buffer: &R::Buffer) -> usize {
    R::byte_len(buffer)
}

//! The GPU API of a build without the `gpu` feature: the same types and calls, none of which
//! can be reached with a device (`Device::open` answers [`Error::GpuNotCompiled`]). The twin of
//! `device.rs` and `staging.rs`, as candle keeps its `dummy_cuda_backend.rs`.

use super::call::DevicePagedKv;
use super::tensor::{DeviceBuffer, DeviceTensor, DeviceTensorMut};
use crate::element::{DType, Element};
use crate::error::Error;
use crate::problem::{KeysValues, Problem};
use core::convert::Infallible;
use ndarray::{ArrayView3, ArrayViewMut2, ArrayViewMut3};

/// One GPU and the stream the calls are queued on (none in this build).
///
/// ```
/// // Without a GPU (or without the `gpu` feature) opening fails with a clear error.
/// match varlen_attn::gpu::Device::open(0) {
///     Ok(device) => println!("{}", device.name()),
///     Err(e) => println!("no GPU: {e}"),
/// }
/// ```
pub struct Device {
    never: Infallible,
}

/// A device buffer's memory: none in this build.
pub(crate) struct Raw(#[allow(dead_code)] Infallible);

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
        match self.never {}
    }
    /// Copies host values to a new device buffer.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn upload<T: bytemuck::Pod>(&self, _host: &[T]) -> Result<DeviceBuffer<T>, Error> {
        match self.never {}
    }
    /// A device buffer of `len` zeros.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn zeros<T: bytemuck::Pod>(&self, _len: usize) -> Result<DeviceBuffer<T>, Error> {
        match self.never {}
    }
    /// Copies a device buffer back to the host (after the queued work).
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn download<T: bytemuck::Pod>(&self, _buffer: &DeviceBuffer<T>) -> Result<Vec<T>, Error> {
        match self.never {}
    }
    /// Waits for the queued work.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn synchronize(&self) -> Result<(), Error> {
        match self.never {}
    }
    /// GPU milliseconds of the work `f` queues.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn time_ms(&self, _f: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error> {
        match self.never {}
    }

    /// Waits for the queued work and reports refused device cu_seqlens.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn check_seqlens(&self) -> Result<(), Error> {
        match self.never {}
    }
    /// Overwrites the start of `buffer` with `host`.
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn write<T: bytemuck::Pod>(&self, _buffer: &mut DeviceBuffer<T>, _host: &[T]) -> Result<(), Error> {
        match self.never {}
    }
    /// Captures the work `work` queues into a [`Graph`].
    ///
    /// # Errors
    /// Never returns: no `Device` exists without the `gpu` feature.
    pub fn capture(&self, _work: &mut dyn FnMut() -> Result<(), Error>) -> Result<Graph, Error> {
        match self.never {}
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_with_device_seqlens<T: Element>(
        &self,
        _problem: &Problem,
        _cu_seqlens: [&DeviceBuffer<i32>; 2],
        _q: &DeviceTensor<T>,
        _k: &DeviceTensor<T>,
        _v: &DeviceTensor<T>,
        _out: DeviceTensorMut<T>,
        _lse: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<(), Error> {
        match self.never {}
    }

    pub(super) fn run_paged<T: Element>(
        &self,
        _problem: &Problem,
        _q: &DeviceTensor<T>,
        _kv: &DevicePagedKv<T>,
        _out: DeviceTensorMut<T>,
        _lse: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<(), Error> {
        match self.never {}
    }

    pub(super) fn run<T: Element>(
        &self,
        _problem: &Problem,
        _q: &DeviceTensor<T>,
        _k: &DeviceTensor<T>,
        _v: &DeviceTensor<T>,
        _out: DeviceTensorMut<T>,
        _lse: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<(), Error> {
        match self.never {}
    }
}

/// Work captured on a device's stream (none in this build).
pub struct Graph {
    never: Infallible,
}

impl Graph {
    /// Queues the captured work again.
    ///
    /// # Errors
    /// Never returns: no `Graph` exists without the `gpu` feature.
    pub fn replay(&self) -> Result<(), Error> {
        match self.never {}
    }
}

/// `Backend::Auto` never tries the GPU in this build.
/// Frees what host-array calls on the GPU keep between calls: nothing without the `gpu`
/// feature.
///
/// ```
/// varlen_attn::gpu::release_staging();
/// ```
pub fn release_staging() {}

pub(crate) fn is_usable(_dtype: DType) -> bool {
    false
}

/// `Backend::Gpu` in this build: [`Error::GpuNotCompiled`].
pub(crate) fn forward<T: Element>(
    _problem: &Problem,
    _q: ArrayView3<T>,
    _kv: &KeysValues<T>,
    _out: ArrayViewMut3<T>,
    _lse: Option<ArrayViewMut2<f32>>,
) -> Result<(), Error> {
    Err(Error::GpuNotCompiled)
}

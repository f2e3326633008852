//! The GPU backend seam. Without the `gpu` feature every entry answers
//! [`Error::GpuNotCompiled`], so `Backend::Gpu` fails clearly and `Backend::Auto` runs on the
//! CPU.

use crate::element::Element;
use crate::error::Error;
use crate::problem::Problem;
use ndarray::{ArrayView3, ArrayViewMut2, ArrayViewMut3};

/// Whether `Backend::Auto` should try the GPU for this element type.
pub(crate) fn is_usable(_dtype: crate::DType) -> bool {
    false
}

/// Runs a validated problem on the GPU.
pub(crate) fn forward<T: Element>(
    _problem: &Problem,
    _q: ArrayView3<T>,
    _k: ArrayView3<T>,
    _v: ArrayView3<T>,
    _out: ArrayViewMut3<T>,
    _lse: Option<ArrayViewMut2<f32>>,
) -> Result<(), Error> {
    Err(Error::GpuNotCompiled)
}

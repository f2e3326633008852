//! `forward` on host arrays through the default GPU: the inputs staged into 16-byte-aligned
//! rows, copied over, run, and the result copied back.

use super::device::{default_device, f32_unsupported};
use super::tensor::{DeviceBuffer, DeviceTensor, DeviceTensorMut};
use crate::element::{DType, Element};
use crate::error::Error;
use crate::problem::Problem;
use ndarray::{ArrayView3, ArrayViewMut2, ArrayViewMut3};

/// Runs a validated problem on host arrays through the default GPU.
pub(crate) fn forward<T: Element>(
    problem: &Problem,
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    mut out: ArrayViewMut3<T>,
    lse: Option<ArrayViewMut2<f32>>,
) -> Result<(), Error> {
    if T::DTYPE == DType::F32 {
        return Err(f32_unsupported());
    }
    super::call::check_modifiers(problem)?;
    problem.check_values_for_tiled_kernels(v.view())?;
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
    let ((qb, q_shape, q_row), (kb, k_shape, k_row), (vb, v_shape, v_row)) = (upload(&q)?, upload(&k)?, upload(&v)?);
    let [t, h, dv] = problem.out_shape();
    let out_row = pad(dv);
    let mut ob = device.zeros::<T>((t * h * out_row).max(1))?;
    let mut lb = match &lse {
        Some(_) => Some(device.zeros::<f32>((h * t).max(1))?),
        None => None,
    };
    let tensor = |b, shape: [usize; 3], row: usize| DeviceTensor::with_strides(b, shape, shape[1] * row, row);
    device.run(
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

//! `forward` on host arrays through the default GPU. Each input (q, then packed K and V or a
//! paged cache's blocks) is packed into 16-byte-aligned rows on the way into device buffers
//! kept between calls, through the runtime's page-locked staging in chunks (the host's
//! packing of one chunk overlapping the bus's copy of the last); the output comes back the
//! same way, chunk by chunk, straight into the caller's array.

use super::call::DevicePagedKv;
use super::device::{default_device, f32_unsupported, Device};
use super::tensor::{DeviceBuffer, DeviceTensor, DeviceTensorMut};
use crate::element::{DType, Element};
use crate::error::Error;
use crate::problem::{KeysValues, Problem};
use ndarray::{ArrayView3, ArrayViewMut2, ArrayViewMut3, CowArray, Ix4};
use rayon::prelude::*;
use std::ops::Range;

/// The device buffers a host-array call keeps (`Device::staged_buffer`'s slots).
const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const OUT: usize = 3;
const LSE: usize = 4;

/// Elements each thread copies at a time.
const PIECE: usize = 1 << 15;

/// Runs a validated problem on host arrays through the default GPU.
pub(crate) fn forward<T: Element>(
    problem: &Problem,
    q: ArrayView3<T>,
    kv: &KeysValues<T>,
    out: ArrayViewMut3<T>,
    lse: Option<ArrayViewMut2<f32>>,
) -> Result<(), Error> {
    if T::DTYPE == DType::F32 {
        return Err(f32_unsupported());
    }
    super::call::check_modifiers(problem)?;
    problem.check_values_for_tiled_kernels(kv)?;
    let device = default_device()?;
    // A paged cache's blocks go over whole, as token rows: [num_blocks · block_size, H_kv, D].
    let caches = match kv {
        KeysValues::Packed(..) => None,
        KeysValues::Paged(k, v, _) => Some((k.as_standard_layout(), v.as_standard_layout())),
    };
    let (k, v) = match (kv, &caches) {
        (KeysValues::Packed(k, v), _) => (k.view(), v.view()),
        (_, Some((k, v))) => (token_rows(k), token_rows(v)),
        _ => unreachable!("paged inputs have caches"),
    };
    let staged = [stage(device, Q, &q)?, stage(device, K, &k)?, stage(device, V, &v)?];
    let [(qb, q_row), (kb, k_row), (vb, v_row)] = &staged;
    let [t, h, dv] = problem.out_shape();
    let out_row = dv.next_multiple_of(8);
    let mut ob = device.staged_buffer::<T>(OUT, t * h * out_row)?;
    let mut lb = lse.as_ref().map(|_| device.staged_buffer::<f32>(LSE, h * t)).transpose()?;
    let tensor = |b, a: &ArrayView3<T>, row: usize| {
        let (t, h, d) = a.dim();
        DeviceTensor::with_strides(b, [t, h, d], h * row, row)
    };
    let (q_tensor, k_tensor, v_tensor) = (tensor(qb, &q, *q_row)?, tensor(kb, &k, *k_row)?, tensor(vb, &v, *v_row)?);
    let out_tensor = DeviceTensorMut::with_strides(&mut ob, [t, h, dv], h * out_row, out_row)?;
    match kv {
        KeysValues::Packed(..) => device.run(problem, &q_tensor, &k_tensor, &v_tensor, out_tensor, lb.as_mut())?,
        KeysValues::Paged(k, _, table) => {
            let kv = DevicePagedKv {
                k_cache: k_tensor,
                v_cache: v_tensor,
                block_size: k.dim().1,
                block_table: table.view(),
            };
            device.run_paged(problem, &q_tensor, &kv, out_tensor, lb.as_mut())?
        }
    }
    unstage(device, &ob, out, out_row)?;
    if let (Some(mut lse), Some(lb)) = (lse, &lb) {
        match lse.as_slice_mut() {
            Some(slice) => device.stage_out(lb, h * t, &mut |range, chunk| copy(&mut slice[range], chunk))?,
            None => device.stage_out(lb, h * t, &mut |range, chunk| {
                for (i, &x) in range.zip(chunk) {
                    lse[[i / t, i % t]] = x;
                }
            })?,
        }
    }
    let [(qb, _), (kb, _), (vb, _)] = staged;
    for (slot, buffer) in [(Q, qb), (K, kb), (V, vb), (OUT, ob)] {
        device.keep_staged(slot, buffer);
    }
    if let Some(lb) = lb {
        device.keep_staged(LSE, lb);
    }
    Ok(())
}

/// A standard-layout cache `[blocks, block_size, h, d]` as `[blocks · block_size, h, d]`.
fn token_rows<'a, T>(cache: &'a CowArray<'_, T, Ix4>) -> ArrayView3<'a, T> {
    let (blocks, block_size, h, d) = cache.dim();
    cache.view().into_shape_with_order((blocks * block_size, h, d)).expect("a standard layout")
}

/// `a [t, h, d]` into device buffer `slot` as rows of `d` rounded up to 8 elements (16 bytes),
/// zero-padded: the buffer and the row length.
fn stage<T: Element>(device: &Device, slot: usize, a: &ArrayView3<T>) -> Result<(DeviceBuffer<T>, usize), Error> {
    let (t, h, d) = a.dim();
    let row = d.next_multiple_of(8);
    let len = t * h * row;
    let mut buffer = device.staged_buffer::<T>(slot, len)?;
    match a.as_slice() {
        Some(slice) if row == d => device.stage_in(&mut buffer, len, &mut |range, chunk| copy(chunk, &slice[range]))?,
        _ => device.stage_in(&mut buffer, len, &mut |range: Range<usize>, chunk: &mut [T]| {
            let start = range.start;
            chunk.par_chunks_mut(PIECE).enumerate().for_each(|(p, piece)| {
                for (i, x) in (start + p * PIECE..).zip(piece.iter_mut()) {
                    let (token, head, col) = (i / (h * row), i / row % h, i % row);
                    *x = if col < d { a[[token, head, col]] } else { T::default() };
                }
            })
        })?,
    }
    Ok((buffer, row))
}

/// The device output (rows of `row` elements) into `out`, chunk by chunk as it arrives.
fn unstage<T: Element>(
    device: &Device,
    ob: &DeviceBuffer<T>,
    mut out: ArrayViewMut3<T>,
    row: usize,
) -> Result<(), Error> {
    let (t, h, d) = out.dim();
    let len = t * h * row;
    match out.as_slice_mut() {
        Some(slice) if row == d => device.stage_out(ob, len, &mut |range, chunk| copy(&mut slice[range], chunk)),
        _ => device.stage_out(ob, len, &mut |range, chunk| {
            for (i, &x) in range.zip(chunk) {
                let (token, head, col) = (i / (h * row), i / row % h, i % row);
                if col < d {
                    out[[token, head, col]] = x;
                }
            }
        }),
    }
}

/// `dst.copy_from_slice(src)`, split across the thread pool.
fn copy<T: Copy + Send + Sync>(dst: &mut [T], src: &[T]) {
    dst.par_chunks_mut(PIECE).zip(src.par_chunks(PIECE)).for_each(|(d, s)| d.copy_from_slice(s));
}

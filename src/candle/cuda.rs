//! CUDA tensors (the `candle-cuda` feature): the GPU kernel reads candle's device memory in
//! place (each layout's offset and strides) and writes new tensors that candle allocates, on
//! the stream of the tensors' candle device. cu_seqlens are read on the device (the path of
//! [`crate::gpu::forward_device_seqlens`]), so the call only queues work: cu_seqlens that break
//! a rule fill the output with NaN.

use super::{check_like_q, error, Result};
use crate::gpu::check_layout;
use crate::gpu::plan::{Operand, Operands, Paging};
use crate::gpu::Device as Gpu;
use crate::problem::Problem;
use crate::Params;
use candle_core::cuda::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Layout, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The kernel's runtime on each candle CUDA device's stream, made on first use and kept with
/// its compiled kernels and workspace.
fn gpu_of(device: &CudaDevice) -> Result<Arc<Gpu>> {
    static DEVICES: OnceLock<Mutex<HashMap<candle_core::cuda::DeviceId, Arc<Gpu>>>> = OnceLock::new();
    let mut devices = DEVICES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gpu) = devices.get(&device.id()) {
        return Ok(gpu.clone());
    }
    let gpu = Arc::new(Gpu::on_cuda_stream(device.cuda_stream()).map_err(error)?);
    devices.insert(device.id(), gpu.clone());
    Ok(gpu)
}

/// Attention on CUDA tensors; `seqlens_q`/`seqlens_k` are cumulative (`batch + 1` entries, u32
/// or i32) on the same device.
pub(super) fn run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let Device::Cuda(device) = q.device() else { candle_core::bail!("varlen-attn: q is not a CUDA tensor") };
    check_like_q(q, &[("k", k), ("v", v)])?;
    match q.dtype() {
        DType::BF16 => typed::<half::bf16>(device, q, k, v, seqlens_q, seqlens_k, params, with_lse),
        DType::F16 => typed::<half::f16>(device, q, k, v, seqlens_q, seqlens_k, params, with_lse),
        other => Err(unsupported_dtype(other)),
    }
}

#[allow(clippy::too_many_arguments)]
fn typed<T: crate::Element + CudaDType + DeviceRepr>(
    device: &CudaDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let dims = |arg: &'static str, t: &Tensor| -> Result<[usize; 3]> {
        match *t.dims() {
            [a, b, c] => Ok([a, b, c]),
            _ => Err(error(crate::Error::Rank { arg, expected: 3, got: t.rank(), layout: crate::layout_of(arg) })),
        }
    };
    let (q_shape, k_shape, v_shape) = (dims("q", q)?, dims("k", k)?, dims("v", v)?);
    let batch = seqlens(q.device(), seqlens_q, seqlens_k)?;
    // The host checks what it sees (shapes, heads, parameters) on the call as one sequence of
    // all the tokens; the kernel checks the cu_seqlens themselves.
    let tokens = |arg, n: usize| {
        i32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("varlen-attn: {arg} has {n} tokens, past i32")))
    };
    let whole_q = [0, tokens("q", q_shape[0])?];
    let whole_k = [0, tokens("k", k_shape[0])?];
    let problem = Problem::new(q_shape, k_shape, v_shape, &whole_q, &whole_k, params).map_err(error)?;
    crate::gpu::check_modifiers(&problem).map_err(error)?;

    let (total_q, heads, dv) = (q_shape[0], q_shape[1], v_shape[2]);
    if total_q * heads * dv == 0 {
        // Nothing to compute, and the driver allocates no empty buffers: candle's own empties.
        let out = Tensor::zeros((total_q, heads, dv), q.dtype(), q.device())?;
        let lse = with_lse.then(|| Tensor::zeros((heads, total_q), DType::F32, q.device())).transpose()?;
        return Ok((out, lse));
    }
    let gpu = gpu_of(device)?;
    let stream = device.cuda_stream();
    // SAFETY: every element is written by the kernel before it is read (the whole output: each
    // row of each sequence, or NaN over all of it where the cu_seqlens break a rule).
    let mut out = unsafe { device.alloc::<T>(total_q * heads * dv) }?;
    let mut lse = if with_lse { Some(device.alloc_zeros::<f32>(heads * total_q)?) } else { None };

    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = k.storage_and_layout();
    let (v_storage, v_layout) = v.storage_and_layout();
    let (cq_storage, cq_layout) = seqlens_q.storage_and_layout();
    let (ck_storage, ck_layout) = seqlens_k.storage_and_layout();
    let (q_op, _q_read) = operand::<T>("q", &q_storage, q_layout, &stream)?;
    let (k_op, _k_read) = operand::<T>("k", &k_storage, k_layout, &stream)?;
    let (v_op, _v_read) = operand::<T>("v", &v_storage, v_layout, &stream)?;
    let (cu_q, _cq_read) = seqlens_address("seqlens_q", &cq_storage, cq_layout, &stream)?;
    let (cu_k, _ck_read) = seqlens_address("seqlens_k", &ck_storage, ck_layout, &stream)?;
    let (out_address, out_write) = out.device_ptr_mut(&stream);
    let out_op = Operand { address: out_address, token_stride: heads * dv, head_stride: dv };
    let (lse_address, lse_write) = match lse.as_mut() {
        Some(l) => {
            let (address, write) = l.device_ptr_mut(&stream);
            (address, Some(write))
        }
        None => (0, None),
    };
    let operands = Operands { q: q_op, k: k_op, v: v_op, out: out_op, lse: lse_address };
    // SAFETY: q, k and v address candle's live storage of their layouts (checked by `operand`
    // to hold the problem's shapes at their strides), the cu_seqlens `batch + 1` i32 each
    // (`seqlens_address`); `out` and `lse` are new allocations of the problem's sizes. All are
    // memory of this stream's context, and the read and write guards order the queued work
    // with candle's other uses of the buffers (where candle tracks them with events).
    unsafe { gpu.queue_operands(&problem, Some((batch, [cu_q, cu_k])), None, T::DTYPE, operands) }.map_err(error)?;
    drop((out_write, lse_write));

    let out = tensor(CudaStorage::wrap_cuda_slice(out, device.clone()), (total_q, heads, dv));
    let lse = lse.map(|l| tensor(CudaStorage::wrap_cuda_slice(l, device.clone()), (heads, total_q)));
    Ok((out, lse))
}

/// The error for CUDA tensors of a dtype the tensor cores do not take.
fn unsupported_dtype(dtype: DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "varlen-attn: CUDA tensors must be bf16 or f16 (the tensor cores' operands), got {dtype:?}; f32 runs on CPU tensors"
    ))
}

/// The paged call on CUDA tensors: `k_cache` and `v_cache` read in place; the block table and
/// cu_seqlens come from the host (checked there by `Problem::new_paged`).
pub(super) fn run_paged(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    table: ndarray::ArrayView2<i32>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
) -> Result<Tensor> {
    let Device::Cuda(device) = q.device() else { candle_core::bail!("varlen-attn: q is not a CUDA tensor") };
    check_like_q(q, &[("k_cache", k_cache), ("v_cache", v_cache)])?;
    match q.dtype() {
        DType::BF16 => paged_typed::<half::bf16>(device, q, k_cache, v_cache, table, cu_q, cu_k, params),
        DType::F16 => paged_typed::<half::f16>(device, q, k_cache, v_cache, table, cu_q, cu_k, params),
        other => Err(unsupported_dtype(other)),
    }
}

#[allow(clippy::too_many_arguments)]
fn paged_typed<T: crate::Element + CudaDType + DeviceRepr>(
    device: &CudaDevice,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    table: ndarray::ArrayView2<i32>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
) -> Result<Tensor> {
    let q_shape = match *q.dims() {
        [a, b, c] => [a, b, c],
        _ => {
            return Err(error(crate::Error::Rank {
                arg: "q",
                expected: 3,
                got: q.rank(),
                layout: crate::layout_of("q"),
            }))
        }
    };
    let cache_shape = |arg: &'static str, t: &Tensor| -> Result<[usize; 4]> {
        match *t.dims() {
            [a, b, c, d] => Ok([a, b, c, d]),
            _ => Err(error(crate::Error::Rank { arg, expected: 4, got: t.rank(), layout: crate::layout_of(arg) })),
        }
    };
    let (k_shape, v_shape) = (cache_shape("k_cache", k_cache)?, cache_shape("v_cache", v_cache)?);
    let problem = Problem::new_paged(q_shape, k_shape, v_shape, table, cu_q, cu_k, params).map_err(error)?;
    crate::gpu::check_modifiers(&problem).map_err(error)?;
    let (total_q, heads, dv) = (q_shape[0], q_shape[1], v_shape[3]);
    if total_q * heads * dv == 0 {
        return Tensor::zeros((total_q, heads, dv), q.dtype(), q.device());
    }
    let gpu = gpu_of(device)?;
    let stream = device.cuda_stream();
    // SAFETY: every element is written by the kernel before it is read (each row of each
    // sequence; cu_seqlens from the host were checked).
    let mut out = unsafe { device.alloc::<T>(total_q * heads * dv) }?;
    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = k_cache.storage_and_layout();
    let (v_storage, v_layout) = v_cache.storage_and_layout();
    let (q_op, _q_read) = operand::<T>("q", &q_storage, q_layout, &stream)?;
    let (k_op, k_block_stride, _k_read) = cache_operand::<T>("k_cache", &k_storage, k_layout, &stream)?;
    let (v_op, v_block_stride, _v_read) = cache_operand::<T>("v_cache", &v_storage, v_layout, &stream)?;
    let (out_address, out_write) = out.device_ptr_mut(&stream);
    let out_op = Operand { address: out_address, token_stride: heads * dv, head_stride: dv };
    let operands = Operands { q: q_op, k: k_op, v: v_op, out: out_op, lse: 0 };
    let paging = Paging { block_size: k_shape[1], k_block_stride, v_block_stride };
    let flat: Vec<i32> = table.iter().copied().collect();
    // SAFETY: q addresses candle's live storage of its layout (`operand`), the caches theirs,
    // every block of their shapes at their strides (`cache_operand`); the block table names
    // only those blocks (`Problem::new_paged`); `out` is a new allocation of the problem's
    // size. All are memory of this stream's context, ordered by the read and write guards.
    unsafe { gpu.queue_operands(&problem, None, Some((paging, &flat, table.ncols())), T::DTYPE, operands) }
        .map_err(error)?;
    drop(out_write);
    Ok(tensor(CudaStorage::wrap_cuda_slice(out, device.clone()), (total_q, heads, dv)))
}

/// A paged cache `[num_blocks, block_size, heads, dims]` as an operand (one block's
/// `[block_size, heads, dims]` strides) and its block stride, checked to lie in its storage.
fn cache_operand<'a, T: CudaDType + 'a>(
    arg: &'static str,
    storage: &'a Storage,
    layout: &Layout,
    stream: &'a CudaStream,
) -> Result<(Operand, usize, SyncOnDrop<'a>)> {
    let Storage::Cuda(cuda) = storage else { candle_core::bail!("varlen-attn: {arg} is not a CUDA tensor") };
    let (dims, strides) = (layout.dims(), layout.stride());
    let [blocks, block_size, heads, d] = [dims[0], dims[1], dims[2], dims[3]];
    if strides[3] != 1 && d > 1 {
        candle_core::bail!("varlen-attn: {arg}'s last dimension must be contiguous, got strides {strides:?}");
    }
    let align = 16 / size_of::<T>();
    let (block_stride, start) = (strides[0], layout.start_offset());
    if !start.is_multiple_of(align) || !block_stride.is_multiple_of(align) {
        candle_core::bail!(
            "varlen-attn: {arg}'s offset {start} and block stride {block_stride} must be multiples of {align} elements (16 bytes) on the GPU"
        );
    }
    let slice = T::as_cuda_slice(cuda)?;
    // The last block's rows must fit after the others' starts.
    let last_block = blocks.saturating_sub(1) * block_stride;
    let after_last = slice.len().saturating_sub(start).saturating_sub(last_block);
    if blocks > 0 && last_block + start > slice.len() {
        candle_core::bail!("varlen-attn: {arg}'s layout reaches past its storage");
    }
    check_layout(arg, after_last, [block_size, heads, d], strides[1], strides[2], size_of::<T>()).map_err(error)?;
    let (address, read) = slice_address(slice, start, 0, arg, stream)?;
    Ok((Operand { address, token_stride: strides[1], head_stride: strides[2] }, block_stride, read))
}

fn tensor<S: Into<candle_core::Shape>>(storage: CudaStorage, shape: S) -> Tensor {
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// Checks the cu_seqlens tensors (on `device`, rank 1, u32 or i32, `batch + 1` entries each
/// with batch >= 1) and returns the batch.
fn seqlens(device: &Device, seqlens_q: &Tensor, seqlens_k: &Tensor) -> Result<usize> {
    for (arg, t) in [("seqlens_q", seqlens_q), ("seqlens_k", seqlens_k)] {
        if !t.device().same_device(device) {
            candle_core::bail!(
                "varlen-attn: {arg} is on {:?} but q is on {device:?}: they must share a device",
                t.device()
            );
        }
        if t.rank() != 1 || !matches!(t.dtype(), DType::U32 | DType::I32) {
            candle_core::bail!(
                "varlen-attn: {arg} on a CUDA device must be u32 or i32 of rank 1 (batch + 1 cumulative lengths), got {:?} {:?}",
                t.dtype(),
                t.dims()
            );
        }
        if t.dims1()? < 2 {
            return Err(error(crate::Error::CuSeqlensTooShort { arg, len: t.dims1()? }));
        }
    }
    let (q_len, k_len) = (seqlens_q.dims1()?, seqlens_k.dims1()?);
    if q_len != k_len {
        return Err(error(crate::Error::CuSeqlensLength { q_len, k_len }));
    }
    Ok(q_len - 1)
}

/// The device address of a rank-1 u32 or i32 tensor's first entry (contiguous; u32 entries
/// below 2^31 read as the same i32, larger ones as negative values, which the kernel refuses).
fn seqlens_address<'a>(
    arg: &str,
    storage: &'a Storage,
    layout: &Layout,
    stream: &'a CudaStream,
) -> Result<(u64, SyncOnDrop<'a>)> {
    let Storage::Cuda(cuda) = storage else { candle_core::bail!("varlen-attn: {arg} is not a CUDA tensor") };
    if layout.stride()[0] != 1 && layout.dims()[0] > 1 {
        candle_core::bail!("varlen-attn: {arg} must be contiguous, got stride {:?}", layout.stride());
    }
    let (start, len) = (layout.start_offset(), layout.dims()[0]);
    let (address, read) = match candle_core::backend::BackendStorage::dtype(cuda) {
        DType::U32 => slice_address(cuda.as_cuda_slice::<u32>()?, start, len, arg, stream)?,
        _ => slice_address(cuda.as_cuda_slice::<i32>()?, start, len, arg, stream)?,
    };
    Ok((address, read))
}

/// The address of entry `start` of `slice`, checking that `len` entries follow it.
fn slice_address<'a, T>(
    slice: &'a CudaSlice<T>,
    start: usize,
    len: usize,
    arg: &str,
    stream: &'a CudaStream,
) -> Result<(u64, SyncOnDrop<'a>)> {
    if start.checked_add(len).is_none_or(|end| end > slice.len()) {
        candle_core::bail!("varlen-attn: {arg}'s layout reaches past its storage");
    }
    let (base, read) = slice.device_ptr(stream);
    Ok((base + (start * size_of::<T>()) as u64, read))
}

/// The kernel's view of a rank-3 CUDA tensor: its address at the layout's offset and its token
/// and head strides, checked as [`crate::gpu::DeviceTensor::with_strides`] checks a buffer
/// (16-byte strides, inside the storage, heads not overlapping), plus contiguous dims and a
/// 16-byte start.
fn operand<'a, T: CudaDType + 'a>(
    arg: &'static str,
    storage: &'a Storage,
    layout: &Layout,
    stream: &'a CudaStream,
) -> Result<(Operand, SyncOnDrop<'a>)> {
    let Storage::Cuda(cuda) = storage else { candle_core::bail!("varlen-attn: {arg} is not a CUDA tensor") };
    let (dims, strides) = (layout.dims(), layout.stride());
    let [tokens, heads, d] = [dims[0], dims[1], dims[2]];
    if strides[2] != 1 && d > 1 {
        candle_core::bail!("varlen-attn: {arg}'s last dimension must be contiguous, got strides {strides:?}");
    }
    let (token_stride, head_stride) = (strides[0], strides[1]);
    let align = 16 / size_of::<T>();
    let start = layout.start_offset();
    if !start.is_multiple_of(align) {
        candle_core::bail!(
            "varlen-attn: {arg}'s offset {start} must be a multiple of {align} elements (16 bytes) on the GPU"
        );
    }
    let slice = T::as_cuda_slice(cuda)?;
    let after_start = slice.len().saturating_sub(start);
    check_layout(arg, after_start, [tokens, heads, d], token_stride, head_stride, size_of::<T>()).map_err(error)?;
    let (address, read) = slice_address(slice, start, 0, arg, stream)?;
    Ok((Operand { address, token_stride, head_stride }, read))
}

//! CPU tensors: read in place through ndarray views of candle's storage (its layout's offset
//! and strides), the output a new CPU tensor written once by [`crate::forward_into`]'s CPU path.

use super::{check_like_q, error, Result};
use crate::element::Element;
use crate::{PagedKv, Params};
use candle_core::{DType, Device, Storage, Tensor};
use ndarray::{ArrayView, ArrayViewMut2, ArrayViewMut3, Ix3, Ix4, IxDyn, ShapeBuilder};

/// The paged call on CPU tensors of one dtype.
pub(super) fn run_paged(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    table: ndarray::ArrayView2<i32>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
) -> Result<Tensor> {
    check_like_q(q, &[("k_cache", k_cache), ("v_cache", v_cache)])?;
    match q.dtype() {
        DType::BF16 => paged_typed::<half::bf16>(q, k_cache, v_cache, table, cu_q, cu_k, params),
        DType::F16 => paged_typed::<half::f16>(q, k_cache, v_cache, table, cu_q, cu_k, params),
        DType::F32 => paged_typed::<f32>(q, k_cache, v_cache, table, cu_q, cu_k, params),
        other => candle_core::bail!("varlen-attn: q, k_cache and v_cache must be bf16, f16 or f32, got {other:?}"),
    }
}

/// The paged call on CPU tensors of element type `T`, read in place.
fn paged_typed<T: Element + candle_core::WithDType>(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    table: ndarray::ArrayView2<i32>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
) -> Result<Tensor> {
    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = k_cache.storage_and_layout();
    let (v_storage, v_layout) = v_cache.storage_and_layout();
    let qv = view::<T, Ix3>("q", &q_storage, q_layout)?;
    let kv = PagedKv {
        k_cache: view::<T, Ix4>("k_cache", &k_storage, k_layout)?,
        v_cache: view::<T, Ix4>("v_cache", &v_storage, v_layout)?,
        block_table: table,
    };
    let (total_q, heads) = (qv.dim().0, qv.dim().1);
    let dv = kv.v_cache.dim().3;
    let mut out = vec![T::default(); total_q * heads * dv];
    let out_view = ArrayViewMut3::from_shape((total_q, heads, dv), &mut out[..]).expect("sized above");
    crate::forward_paged_into(qv, &kv, cu_q, cu_k, params, out_view).map_err(error)?;
    Tensor::from_vec(out, (total_q, heads, dv), &Device::Cpu)
}

/// Runs the call on CPU tensors of one dtype.
pub(super) fn run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    check_like_q(q, &[("k", k), ("v", v)])?;
    match q.dtype() {
        DType::BF16 => run_typed::<half::bf16>(q, k, v, cu_q, cu_k, params, with_lse),
        DType::F16 => run_typed::<half::f16>(q, k, v, cu_q, cu_k, params, with_lse),
        DType::F32 => run_typed::<f32>(q, k, v, cu_q, cu_k, params, with_lse),
        other => candle_core::bail!("varlen-attn: q, k and v must be bf16, f16 or f32, got {other:?}"),
    }
}

/// A view of a CPU tensor's storage of rank `D`, in place (its layout's offset and strides).
fn view<'a, T: Element + candle_core::WithDType, D: ndarray::Dimension>(
    arg: &'static str,
    storage: &'a Storage,
    layout: &candle_core::Layout,
) -> Result<ArrayView<'a, T, D>> {
    let (rank, expected) = (layout.dims().len(), D::NDIM.expect("a fixed rank"));
    if rank != expected {
        return Err(error(crate::Error::Rank { arg, expected, got: rank, layout: crate::layout_of(arg) }));
    }
    let Storage::Cpu(cpu) = storage else {
        candle_core::bail!("varlen-attn: {arg} is not on the CPU");
    };
    let all = cpu.as_slice::<T>()?;
    let data = all.get(layout.start_offset()..).unwrap_or(&[]);
    let view = ArrayView::from_shape(IxDyn(layout.dims()).strides(IxDyn(layout.stride())), data)
        .map_err(|e| candle_core::Error::Msg(format!("varlen-attn: {arg}'s layout cannot be viewed in place ({e})")))?;
    Ok(view.into_dimensionality::<D>().expect("rank checked above"))
}

#[allow(clippy::too_many_arguments)]
fn run_typed<T: Element + candle_core::WithDType>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = k.storage_and_layout();
    let (v_storage, v_layout) = v.storage_and_layout();
    let qv = view::<T, Ix3>("q", &q_storage, q_layout)?;
    let kv = view::<T, Ix3>("k", &k_storage, k_layout)?;
    let vv = view::<T, Ix3>("v", &v_storage, v_layout)?;
    let (total_q, heads) = (qv.dim().0, qv.dim().1);
    let dv = vv.dim().2;
    let mut out = vec![T::default(); total_q * heads * dv];
    let out_view = ArrayViewMut3::from_shape((total_q, heads, dv), &mut out[..]).expect("sized above");
    let lse = if with_lse {
        let mut lse = vec![0f32; heads * total_q];
        let lse_view = ArrayViewMut2::from_shape((heads, total_q), &mut lse[..]).expect("sized above");
        crate::forward_with_lse_into(qv, kv, vv, cu_q, cu_k, params, out_view, lse_view).map_err(error)?;
        Some(Tensor::from_vec(lse, (heads, total_q), &Device::Cpu)?)
    } else {
        crate::forward_into(qv, kv, vv, cu_q, cu_k, params, out_view).map_err(error)?;
        None
    };
    Ok((Tensor::from_vec(out, (total_q, heads, dv), &Device::Cpu)?, lse))
}

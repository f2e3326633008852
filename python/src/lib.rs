//! The Python extension `varlen_attn._native`: one entry point that reads torch tensors and
//! numpy arrays in place through DLPack, checks them, and runs varlen-attn's forward pass
//! with the GIL released. `varlen_attn/__init__.py` builds FlashAttention-2's
//! `flash_attn_varlen_func` on it.

mod dlpack;

use dlpack::{Dtype, Tensor};
use half::{bf16, f16};
use ndarray::{Ix2, Ix3, Ix4};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use varlen_attn::{Element, Error, PagedKv, Params};

/// A `varlen_attn::Error` as the Python exception its kind calls for: `RuntimeError` for a
/// device or instruction-set failure, `ValueError` for everything the caller passed.
fn to_py(error: Error) -> PyErr {
    match error {
        Error::Gpu(_) | Error::NoDevice(_) | Error::GpuNotCompiled | Error::IsaUnavailable { .. } => {
            PyRuntimeError::new_err(error.to_string())
        }
        _ => PyValueError::new_err(error.to_string()),
    }
}

/// A 1-D (or, for ALiBi, 2-D) f32 parameter tensor or a sequence of floats, as a list.
fn f32_values(name: &'static str, obj: &Bound<PyAny>) -> PyResult<Vec<f32>> {
    if obj.cast::<pyo3::types::PyCapsule>().is_err() && !obj.hasattr("__dlpack__")? {
        return obj
            .extract::<Vec<f32>>()
            .map_err(|_| PyTypeError::new_err(format!("{name} must be a float32 tensor or a sequence of floats")));
    }
    let t = Tensor::borrow(name, obj)?;
    t.expect_dtype(Dtype::F32, "as FlashAttention takes it")?;
    match t.shape.len() {
        1 => Ok(t.to_vec::<f32>()),
        2 => Ok(t.view::<f32, Ix2>().iter().copied().collect()),
        _ => Err(PyValueError::new_err(format!("{name} must have 1 or 2 dimensions, got shape {:?}", t.shape))),
    }
}

/// A `cu_seqlens` tensor: int32, one dimension, any stride (copied: batch + 1 entries).
fn cu_seqlens(name: &'static str, obj: &Bound<PyAny>) -> PyResult<Vec<i32>> {
    let t = Tensor::borrow(name, obj)?;
    t.expect_dtype(Dtype::I32, "prefix sums")?;
    t.expect_ndim(1, "[batch + 1]")?;
    Ok(t.to_vec::<i32>())
}

/// The attention forward pass on tensors lent through DLPack (the arguments of
/// `flash_attn_varlen_func`, already mapped to varlen-attn's parameters). Writes `out` and,
/// if given, `lse` in place.
#[pyfunction]
#[pyo3(signature = (q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse=None, softmax_scale=None, causal=false,
    window_left=None, window_right=None, softcap=None, alibi_slopes=None, sinks=None, block_table=None))]
#[allow(clippy::too_many_arguments)]
fn forward(
    py: Python<'_>,
    q: &Bound<PyAny>,
    k: &Bound<PyAny>,
    v: &Bound<PyAny>,
    cu_seqlens_q: &Bound<PyAny>,
    cu_seqlens_k: &Bound<PyAny>,
    out: &Bound<PyAny>,
    lse: Option<&Bound<PyAny>>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: Option<usize>,
    window_right: Option<usize>,
    softcap: Option<f32>,
    alibi_slopes: Option<&Bound<PyAny>>,
    sinks: Option<&Bound<PyAny>>,
    block_table: Option<&Bound<PyAny>>,
) -> PyResult<()> {
    let params = Params {
        softmax_scale,
        causal,
        window_left,
        window_right,
        softcap,
        alibi_slopes: alibi_slopes.map(|s| f32_values("alibi_slopes", s)).transpose()?,
        sinks: sinks.map(|s| f32_values("sinks", s)).transpose()?,
        backend: varlen_attn::Backend::Cpu,
        ..Params::default()
    };
    let cu_q = cu_seqlens("cu_seqlens_q", cu_seqlens_q)?;
    let cu_k = cu_seqlens("cu_seqlens_k", cu_seqlens_k)?;
    let q = Tensor::borrow("q", q)?;
    let k = Tensor::borrow("k", k)?;
    let v = Tensor::borrow("v", v)?;
    let mut out = Tensor::borrow("out", out)?;
    let mut lse = lse.map(|l| Tensor::borrow("lse", l)).transpose()?;
    let table = block_table.map(|t| Tensor::borrow("block_table", t)).transpose()?;

    let paged = table.is_some();
    let kv_layout =
        if paged { "[num_blocks, block_size, num_kv_heads, head_dim]" } else { "[total_k, num_kv_heads, head_dim]" };
    q.expect_ndim(3, "[total_q, num_heads, head_dim]")?;
    k.expect_ndim(if paged { 4 } else { 3 }, kv_layout)?;
    v.expect_ndim(if paged { 4 } else { 3 }, kv_layout)?;
    out.expect_ndim(3, "[total_q, num_heads, head_dim_v]")?;
    if !matches!(q.dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32) {
        return Err(PyTypeError::new_err(format!("q must be bfloat16, float16 or float32, got {}", q.dtype)));
    }
    for t in [&k, &v, &out] {
        if t.dtype != q.dtype {
            return Err(PyTypeError::new_err(format!(
                "{} is {} but q is {}: they must match",
                t.name, t.dtype, q.dtype
            )));
        }
    }
    if let Some(l) = &lse {
        l.expect_dtype(Dtype::F32, "the log-sum-exp")?;
        l.expect_ndim(2, "[num_heads, total_q]")?;
    }
    if let Some(t) = &table {
        t.expect_dtype(Dtype::I32, "block indices")?;
        t.expect_ndim(2, "[batch, max_blocks]")?;
    }
    // The outputs are written while the inputs are read: no memory may be shared.
    for written in std::iter::once(&out).chain(lse.as_ref()) {
        for read in [&q, &k, &v] {
            if written.overlaps(read) {
                return Err(PyValueError::new_err(format!("{} shares memory with {}", written.name, read.name)));
            }
        }
    }
    if let Some(l) = &lse {
        if l.overlaps(&out) {
            return Err(PyValueError::new_err("lse shares memory with out"));
        }
    }

    match q.dtype {
        Dtype::Bf16 => run::<bf16>(py, &q, &k, &v, &cu_q, &cu_k, &params, &mut out, lse.as_mut(), table.as_ref()),
        Dtype::F16 => run::<f16>(py, &q, &k, &v, &cu_q, &cu_k, &params, &mut out, lse.as_mut(), table.as_ref()),
        Dtype::F32 => run::<f32>(py, &q, &k, &v, &cu_q, &cu_k, &params, &mut out, lse.as_mut(), table.as_ref()),
        other => Err(PyTypeError::new_err(format!("q must be bfloat16, float16 or float32, got {other}"))),
    }
}

/// The call for element type `T`, with the GIL released while it computes.
#[allow(clippy::too_many_arguments)]
fn run<T: Element>(
    py: Python<'_>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
    out: &mut Tensor,
    lse: Option<&mut Tensor>,
    table: Option<&Tensor>,
) -> PyResult<()> {
    let qv = q.view::<T, Ix3>();
    let out = out.view_mut::<T, Ix3>()?;
    let lse = lse.map(|l| l.view_mut::<f32, Ix2>()).transpose()?;
    let result = match table {
        None => {
            let (kv, vv) = (k.view::<T, Ix3>(), v.view::<T, Ix3>());
            py.detach(|| match lse {
                None => varlen_attn::forward_into(qv, kv, vv, cu_q, cu_k, params, out),
                Some(lse) => varlen_attn::forward_with_lse_into(qv, kv, vv, cu_q, cu_k, params, out, lse),
            })
        }
        Some(table) => {
            let cache = PagedKv {
                k_cache: k.view::<T, Ix4>(),
                v_cache: v.view::<T, Ix4>(),
                block_table: table.view::<i32, Ix2>(),
            };
            py.detach(|| match lse {
                None => varlen_attn::forward_paged_into(qv, &cache, cu_q, cu_k, params, out),
                Some(lse) => varlen_attn::forward_paged_with_lse_into(qv, &cache, cu_q, cu_k, params, out, lse),
            })
        }
    };
    result.map_err(to_py)
}

/// The CPU instruction set bf16 calls run on here (e.g. `"amx"`), for benchmark labels.
#[pyfunction]
fn cpu_isa() -> &'static str {
    varlen_attn::cpu_isa_for::<bf16>(&Params::default()).name()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_isa, m)?)?;
    Ok(())
}

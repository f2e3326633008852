//! Reading attention inputs from, and writing outputs to, safetensors files, with messages that
//! name the tensor and what was expected.

use crate::Failure;
use half::{bf16, f16};
use ndarray::{Array2, Array3, ArrayD, IxDyn};
use safetensors::{tensor::TensorView, Dtype, SafeTensors};
use std::io::Write;
use std::path::Path;
use varlen_attn::Element;

/// An element type as safetensors names it.
pub trait FileElement: Element + bytemuck::Pod {
    const FILE_DTYPE: Dtype;
}

impl FileElement for bf16 {
    const FILE_DTYPE: Dtype = Dtype::BF16;
}
impl FileElement for f16 {
    const FILE_DTYPE: Dtype = Dtype::F16;
}
impl FileElement for f32 {
    const FILE_DTYPE: Dtype = Dtype::F32;
}

/// The inputs of one attention call.
pub struct Inputs<T> {
    pub q: Array3<T>,
    pub k: Array3<T>,
    pub v: Array3<T>,
    pub cu_seqlens_q: Vec<i32>,
    pub cu_seqlens_k: Vec<i32>,
    /// The optional `alibi_slopes` tensor (f32 `[num_heads]` or `[batch, num_heads]`), flattened.
    pub alibi_slopes: Option<Vec<f32>>,
    /// The optional `sinks` tensor (f32 `[num_heads]`).
    pub sinks: Option<Vec<f32>>,
}

/// Inputs of whichever element type the file holds.
pub enum AnyInputs {
    Bf16(Inputs<bf16>),
    F16(Inputs<f16>),
    F32(Inputs<f32>),
}

const LAYOUTS: [(&str, &str); 7] = [
    ("q", "bf16, f16 or f32 [total_q, num_heads, head_dim]"),
    ("k", "the dtype of q, [total_k, num_kv_heads, head_dim]"),
    ("v", "the dtype of q, [total_k, num_kv_heads, head_dim_v]"),
    ("cu_seqlens_q", "i32 [batch + 1]"),
    ("cu_seqlens_k", "i32 [batch + 1]"),
    ("alibi_slopes", "optional, f32 [num_heads] or [batch, num_heads]"),
    ("sinks", "optional, f32 [num_heads]"),
];

/// Reads `q`, `k`, `v`, `cu_seqlens_q` and `cu_seqlens_k` (and `alibi_slopes` and `sinks`
/// where present) from a safetensors file.
pub fn read_inputs(path: &Path) -> Result<AnyInputs, Failure> {
    let bytes = std::fs::read(path).map_err(|e| Failure::input(format!("cannot read {}: {e}", path.display())))?;
    parse_inputs(&bytes, &path.display().to_string())
}

/// [`read_inputs`] on a file's bytes; `file_name` is used in messages.
pub fn parse_inputs(bytes: &[u8], file_name: &str) -> Result<AnyInputs, Failure> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| {
        Failure::input(format!(
            "{file_name} is not a valid safetensors file ({e}); is it truncated or of another format?"
        ))
    })?;
    let tensor = |name: &str| {
        file.tensor(name).map_err(|_| {
            let expected = LAYOUTS.iter().find(|(n, _)| *n == name).map_or("", |(_, l)| l);
            Failure::input(format!("{file_name}: tensor `{name}` is missing (expected {expected})"))
        })
    };
    let q = tensor("q")?;
    let (k, v) = (tensor("k")?, tensor("v")?);
    let cu_seqlens_q = read_cu_seqlens("cu_seqlens_q", &tensor("cu_seqlens_q")?)?;
    let cu_seqlens_k = read_cu_seqlens("cu_seqlens_k", &tensor("cu_seqlens_k")?)?;
    let optional = |name: &'static str, ranks: &[usize]| -> Result<Option<Vec<f32>>, Failure> {
        let Ok(t) = file.tensor(name) else { return Ok(None) };
        let expected = LAYOUTS.iter().find(|(n, _)| *n == name).map_or("", |(_, l)| l);
        if t.dtype() != Dtype::F32 || !ranks.contains(&t.shape().len()) {
            return Err(Failure::input(format!(
                "tensor `{name}` has dtype {:?} and shape {:?}; expected {expected}",
                t.dtype(),
                t.shape()
            )));
        }
        Ok(Some(bytemuck::pod_collect_to_vec(t.data())))
    };
    let modifiers = (optional("alibi_slopes", &[1, 2])?, optional("sinks", &[1])?);
    for (name, t) in [("k", &k), ("v", &v)] {
        if t.dtype() != q.dtype() {
            return Err(Failure::input(format!(
                "tensor `{name}` has dtype {:?} but `q` has {:?}: q, k and v must share one dtype",
                t.dtype(),
                q.dtype()
            )));
        }
    }
    fn typed<T: FileElement>(
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        cu_q: Vec<i32>,
        cu_k: Vec<i32>,
        (alibi_slopes, sinks): (Option<Vec<f32>>, Option<Vec<f32>>),
    ) -> Result<Inputs<T>, Failure> {
        Ok(Inputs {
            q: array3("q", q)?,
            k: array3("k", k)?,
            v: array3("v", v)?,
            cu_seqlens_q: cu_q,
            cu_seqlens_k: cu_k,
            alibi_slopes,
            sinks,
        })
    }
    match q.dtype() {
        Dtype::BF16 => Ok(AnyInputs::Bf16(typed(&q, &k, &v, cu_seqlens_q, cu_seqlens_k, modifiers)?)),
        Dtype::F16 => Ok(AnyInputs::F16(typed(&q, &k, &v, cu_seqlens_q, cu_seqlens_k, modifiers)?)),
        Dtype::F32 => Ok(AnyInputs::F32(typed(&q, &k, &v, cu_seqlens_q, cu_seqlens_k, modifiers)?)),
        other => Err(Failure::input(format!("tensor `q` has dtype {other:?}; expected BF16, F16 or F32"))),
    }
}

fn array3<T: FileElement>(name: &'static str, t: &TensorView) -> Result<Array3<T>, Failure> {
    let values: Vec<T> = bytemuck::pod_collect_to_vec(t.data());
    let array = ArrayD::from_shape_vec(IxDyn(t.shape()), values)
        .map_err(|e| Failure::input(format!("tensor `{name}`: {e}")))?;
    let view = varlen_attn::view3(name, array.view()).map_err(|e| Failure::input(format!("tensor {e}")))?;
    Ok(view.to_owned())
}

fn read_cu_seqlens(name: &str, t: &TensorView) -> Result<Vec<i32>, Failure> {
    if t.dtype() != Dtype::I32 {
        return Err(Failure::input(format!("tensor `{name}` has dtype {:?}; expected I32 (torch.int32)", t.dtype())));
    }
    if t.shape().len() != 1 {
        return Err(Failure::input(format!("tensor `{name}` has rank {}; expected 1 ([batch + 1])", t.shape().len())));
    }
    Ok(bytemuck::pod_collect_to_vec(t.data()))
}

/// Writes `out` (and `lse`, if given) to `path` through a temporary file in the same folder,
/// renamed into place only once complete: a failure leaves no partial file behind.
pub fn write_outputs<T: FileElement>(path: &Path, out: &Array3<T>, lse: Option<&Array2<f32>>) -> Result<(), Failure> {
    let out_bytes: Vec<u8> =
        bytemuck::cast_slice(out.as_standard_layout().as_slice().expect("standard layout")).to_vec();
    let mut views = vec![("out".to_string(), view(T::FILE_DTYPE, out.shape(), &out_bytes)?)];
    let lse_bytes: Vec<u8>;
    if let Some(lse) = lse {
        lse_bytes = bytemuck::cast_slice(lse.as_standard_layout().as_slice().expect("standard layout")).to_vec();
        views.push(("lse".to_string(), view(Dtype::F32, lse.shape(), &lse_bytes)?));
    }
    let bytes =
        safetensors::serialize(views, None).map_err(|e| Failure::runtime(format!("cannot encode the output: {e}")))?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let fail = |e: std::io::Error| Failure::runtime(format!("cannot write {}: {e}", path.display()));
    let mut temporary = tempfile::NamedTempFile::new_in(folder).map_err(fail)?;
    temporary.write_all(&bytes).map_err(fail)?;
    temporary.as_file().sync_all().map_err(fail)?;
    temporary.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

fn view<'a>(dtype: Dtype, shape: &[usize], bytes: &'a [u8]) -> Result<TensorView<'a>, Failure> {
    TensorView::new(dtype, shape.to_vec(), bytes)
        .map_err(|e| Failure::runtime(format!("cannot encode the output: {e}")))
}

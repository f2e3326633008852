//! Tensors read in place through DLPack: any object with `__dlpack__` (torch tensors, numpy
//! arrays) lends its memory for the call, described by the DLPack C structs below (the ABI of
//! `dlpack.h` v0.8, the legacy `"dltensor"` capsule every producer offers).

use core::ffi::c_void;
use ndarray::{ArrayView, ArrayViewMut, Dimension, IxDyn, ShapeBuilder};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;

/// The element types a tensor may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Bf16,
    F16,
    F32,
    I32,
    Other(u8, u8, u16),
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::Other(_, bits, lanes) => (bits as usize * lanes as usize).div_ceil(8),
        }
    }
}

impl core::fmt::Display for Dtype {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Dtype::Bf16 => f.write_str("bfloat16"),
            Dtype::F16 => f.write_str("float16"),
            Dtype::F32 => f.write_str("float32"),
            Dtype::I32 => f.write_str("int32"),
            Dtype::Other(code, bits, 1) if *code <= 2 || *code == 4 => {
                let kind = ["int", "uint", "float", "", "bfloat"][*code as usize];
                write!(f, "{kind}{bits}")
            }
            Dtype::Other(code, bits, lanes) => write!(f, "DLPack type (code {code}, {bits} bits, {lanes} lanes)"),
        }
    }
}

/// A tensor lent through DLPack: its capsule (which owns the producer's description and is
/// kept alive as long as this value) and that description, checked.
pub struct Tensor<'py> {
    pub name: &'static str,
    _capsule: Bound<'py, PyCapsule>,
    /// The first element's address (`data + byte_offset`).
    ptr: *mut u8,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// In elements, as DLPack gives them.
    pub strides: Vec<isize>,
}

impl<'py> Tensor<'py> {
    /// Borrows `obj`'s memory through `obj.__dlpack__()`. CPU memory only.
    pub fn borrow(name: &'static str, obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        // A DLPack capsule itself (`torch.utils.dlpack.to_dlpack`, the wrapper's fast path), or
        // an object that makes one.
        let capsule = match obj.cast::<PyCapsule>() {
            Ok(capsule) => capsule.clone(),
            Err(_) => {
                if !obj.hasattr("__dlpack__")? {
                    return Err(PyTypeError::new_err(format!(
                        "{name} must be a tensor that supports DLPack (a torch tensor or a numpy array), got {}",
                        obj.get_type().name()?
                    )));
                }
                obj.call_method0("__dlpack__")?
                    .cast_into::<PyCapsule>()
                    .map_err(|_| PyTypeError::new_err(format!("{name}.__dlpack__() did not return a capsule")))?
            }
        };
        // SAFETY: a capsule named "dltensor" holds a `DLManagedTensor*` that stays valid while
        // the capsule lives and is not consumed (we keep the capsule, never rename it: its
        // producer's destructor frees the tensor when it is dropped). A wrong name returns null
        // with a Python error set.
        let managed = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) };
        if managed.is_null() {
            // Clear the capsule's own error: ours names the argument.
            let _ = PyErr::take(obj.py());
            return Err(PyValueError::new_err(format!(
                "{name} is a capsule that is not an unconsumed DLPack tensor (\"dltensor\")"
            )));
        }
        // SAFETY: as above; we only read the description.
        let dl = unsafe { &(*(managed as *const DlManagedTensor)).dl_tensor };
        match dl.device.device_type {
            DL_CPU | DL_CUDA_HOST => {}
            DL_CUDA => {
                return Err(PyValueError::new_err(format!(
                    "{name} is on CUDA device {}: this build of varlen_attn runs on the CPU only (move the tensors with .cpu())",
                    dl.device.device_id
                )))
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "{name} lives on DLPack device type {other}: varlen_attn reads CPU memory only"
                )))
            }
        }
        if !(0..=8).contains(&dl.ndim) {
            return Err(PyValueError::new_err(format!("{name} has {} dimensions", dl.ndim)));
        }
        let ndim = dl.ndim as usize;
        // SAFETY: DLPack gives `ndim` shape entries and, unless null, `ndim` strides.
        let (shape, strides) = unsafe {
            let shape = if ndim == 0 { &[][..] } else { core::slice::from_raw_parts(dl.shape, ndim) };
            let strides = if dl.strides.is_null() || ndim == 0 {
                None
            } else {
                Some(core::slice::from_raw_parts(dl.strides, ndim))
            };
            (shape.to_vec(), strides.map(<[i64]>::to_vec))
        };
        if shape.iter().any(|&n| n < 0) {
            return Err(PyValueError::new_err(format!("{name} has a negative dimension: {shape:?}")));
        }
        let shape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
        let strides: Vec<isize> = match strides {
            Some(s) => s.iter().map(|&x| x as isize).collect(),
            None => {
                // Null strides: compact row-major.
                let mut s = vec![1isize; ndim];
                for i in (0..ndim.saturating_sub(1)).rev() {
                    s[i] = s[i + 1] * shape[i + 1].max(1) as isize;
                }
                s
            }
        };
        let dtype = match (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) {
            (4, 16, 1) => Dtype::Bf16,
            (2, 16, 1) => Dtype::F16,
            (2, 32, 1) => Dtype::F32,
            (0, 32, 1) => Dtype::I32,
            (code, bits, lanes) => Dtype::Other(code, bits, lanes),
        };
        let empty = shape.contains(&0);
        let ptr = (dl.data as *mut u8).wrapping_add(dl.byte_offset as usize);
        if !empty && (dl.data.is_null() || !(ptr as usize).is_multiple_of(dtype.size().max(1))) {
            return Err(PyValueError::new_err(format!(
                "{name}'s data pointer is null or not aligned to its {dtype} elements"
            )));
        }
        Ok(Tensor { name, _capsule: capsule, ptr, dtype, shape, strides })
    }

    /// Requires the element type `dtype`.
    pub fn expect_dtype(&self, dtype: Dtype, what: &str) -> PyResult<()> {
        if self.dtype != dtype {
            return Err(PyTypeError::new_err(format!("{} must be {dtype} ({what}), got {}", self.name, self.dtype)));
        }
        Ok(())
    }

    /// Requires `n` dimensions, named in `layout` for the message.
    pub fn expect_ndim(&self, n: usize, layout: &str) -> PyResult<()> {
        if self.shape.len() != n {
            return Err(PyValueError::new_err(format!(
                "{} must have {n} dimensions {layout}, got shape {:?}",
                self.name, self.shape
            )));
        }
        Ok(())
    }

    /// The byte range `[lo, hi)` the tensor's elements occupy (empty for empty tensors).
    pub fn span(&self) -> (usize, usize) {
        if self.shape.contains(&0) {
            return (0, 0);
        }
        let size = self.dtype.size() as isize;
        let (mut lo, mut hi) = (0isize, 0isize);
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (n as isize - 1) * s * size;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        let base = self.ptr as isize;
        ((base + lo) as usize, (base + hi + size) as usize)
    }

    /// Whether two tensors' memory overlaps.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        let (a, b) = (self.span(), other.span());
        a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
    }

    /// The lowest address and positive strides of the view, and the axes to flip back.
    fn layout(&self) -> (*mut u8, Vec<usize>, Vec<usize>) {
        let size = self.dtype.size() as isize;
        let mut ptr = self.ptr;
        let mut flipped = Vec::new();
        let strides = self
            .strides
            .iter()
            .zip(&self.shape)
            .enumerate()
            .map(|(axis, (&s, &n))| {
                if s < 0 && n > 0 {
                    ptr = ptr.wrapping_offset((n as isize - 1) * s * size);
                    flipped.push(axis);
                }
                s.unsigned_abs()
            })
            .collect();
        (ptr, strides, flipped)
    }

    /// A read-only view of `T` elements (the dtype checked by the caller).
    pub fn view<T, D: Dimension>(&self) -> ArrayView<'_, T, D> {
        debug_assert_eq!(core::mem::size_of::<T>(), self.dtype.size());
        if self.shape.contains(&0) {
            // No element: producers may give any pointer (null included), which a view must
            // not hold.
            let view = ArrayView::from_shape(IxDyn(&self.shape), &[][..]).expect("zero elements");
            return view.into_dimensionality::<D>().expect("rank checked by the caller");
        }
        let (ptr, strides, flipped) = self.layout();
        let shape = IxDyn(&self.shape);
        let strides = IxDyn(&strides);
        // SAFETY: DLPack's producer lends `shape`/`strides` elements of this type (checked by
        // the caller) from `data + byte_offset`, aligned (checked in `borrow`), alive while the
        // capsule we hold is; the lowest address and positive strides describe the same
        // elements, and the flipped axes restore the order.
        let mut view = unsafe { ArrayView::from_shape_ptr(shape.strides(strides), ptr as *const T) };
        for axis in flipped {
            view.invert_axis(ndarray::Axis(axis));
        }
        view.into_dimensionality::<D>().expect("rank checked by the caller")
    }

    /// A writable view. Errors where two indices share an element (a zero stride), which a
    /// mutable view must not have.
    pub fn view_mut<T, D: Dimension>(&mut self) -> PyResult<ArrayViewMut<'_, T, D>> {
        debug_assert_eq!(core::mem::size_of::<T>(), self.dtype.size());
        if has_self_overlap(&self.shape, &self.strides) {
            return Err(PyValueError::new_err(format!(
                "{} has elements that share memory (strides {:?}): it cannot be written",
                self.name, self.strides
            )));
        }
        if self.shape.contains(&0) {
            let view = ArrayViewMut::from_shape(IxDyn(&self.shape), &mut [][..]).expect("zero elements");
            return Ok(view.into_dimensionality::<D>().expect("rank checked by the caller"));
        }
        let (ptr, strides, flipped) = self.layout();
        let shape = IxDyn(&self.shape);
        let strides = IxDyn(&strides);
        // SAFETY: as in `view`; the strides map distinct indices to distinct elements (checked
        // above), and the caller has checked that no input overlaps this tensor.
        let mut view = unsafe { ArrayViewMut::from_shape_ptr(shape.strides(strides), ptr as *mut T) };
        for axis in flipped {
            view.invert_axis(ndarray::Axis(axis));
        }
        Ok(view.into_dimensionality::<D>().expect("rank checked by the caller"))
    }

    /// The elements of a 1-D tensor of `T`, copied (any stride).
    pub fn to_vec<T: Copy>(&self) -> Vec<T> {
        self.view::<T, ndarray::Ix1>().to_vec()
    }
}

/// Whether a layout maps two indices to one element: sorted by stride, each axis must step over
/// the whole extent of the smaller ones (the test ndarray itself applies to mutable views).
fn has_self_overlap(shape: &[usize], strides: &[isize]) -> bool {
    if shape.contains(&0) {
        return false;
    }
    let mut axes: Vec<(usize, usize)> =
        shape.iter().zip(strides).filter(|(&n, _)| n > 1).map(|(&n, &s)| (s.unsigned_abs(), n)).collect();
    axes.sort_unstable();
    let mut extent = 1usize;
    for (stride, n) in axes {
        if stride < extent {
            return true;
        }
        extent += stride * (n - 1);
    }
    false
}

//! Attention over a paged K/V cache, as serving engines keep keys and values: fixed-size blocks
//! of tokens, and a block table per sequence naming its blocks in order (FlashAttention-2's
//! `block_table`, vLLM's paged cache).

use crate::element::Element;
use crate::error::Error;
use crate::params::Params;
use crate::problem::{KeysValues, Problem};
use ndarray::{Array2, Array3, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut2, ArrayViewMut3, Axis};

/// A paged K/V cache in FlashAttention-2's layout.
///
/// - `k_cache`: `[num_blocks, block_size, num_kv_heads, head_dim]`; `v_cache`:
///   `[num_blocks, block_size, num_kv_heads, head_dim_v]`. Any block size from 1, any strides.
/// - `block_table`: `[batch, max_blocks]`. Key `j` of sequence `b` is slot `j % block_size` of
///   block `block_table[b, j / block_size]`; a sequence's key count comes from `cu_seqlens_k`,
///   as in FlashAttention-2's varlen call. The entries its keys reach must name blocks of the
///   cache; later entries are not read. Sequences may share blocks (prefix caching).
#[derive(Clone, Debug)]
pub struct PagedKv<'a, T> {
    /// Keys, `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub k_cache: ArrayView4<'a, T>,
    /// Values, `[num_blocks, block_size, num_kv_heads, head_dim_v]`.
    pub v_cache: ArrayView4<'a, T>,
    /// `[batch, max_blocks]`: each sequence's blocks, in order.
    pub block_table: ArrayView2<'a, i32>,
}

impl<'a, T: Element> PagedKv<'a, T> {
    fn problem<'p>(
        &self,
        q: &ArrayView3<T>,
        cu_seqlens_q: &'p [i32],
        cu_seqlens_k: &'p [i32],
        params: &'p Params,
    ) -> Result<Problem<'p>, Error> {
        let dims4 = |x: &ArrayView4<T>| {
            let (a, b, c, d) = x.dim();
            [a, b, c, d]
        };
        let (t, h, d) = q.dim();
        Problem::new_paged(
            [t, h, d],
            dims4(&self.k_cache),
            dims4(&self.v_cache),
            self.block_table.view(),
            cu_seqlens_q,
            cu_seqlens_k,
            params,
        )
    }

    fn keys_values(&self) -> KeysValues<'_, T> {
        KeysValues::Paged(self.k_cache.view(), self.v_cache.view(), self.block_table.view())
    }
}

/// [`forward`](crate::forward) with the keys and values in a paged cache: returns
/// `out [total_q, num_heads, head_dim_v]`. `cu_seqlens_k` gives each sequence's key count
/// (its last entry is the total of the keys, not a tensor's size). Runs where
/// [`forward`](crate::forward) runs: on the CPU (every instruction set), or on the GPU
/// (bf16 and f16; the cache's blocks are copied over whole, and the kernel reads them through
/// the block table; [`crate::gpu::forward_device_paged`] takes a cache already there).
///
/// ```
/// use ndarray::{Array2, Array3, Array4, Axis};
/// use varlen_attn::{forward, forward_paged, PagedKv, Params};
/// // Two sequences of 5 and 3 keys in blocks of 2 tokens, the second sequence's blocks
/// // stored first; 2 query tokens each.
/// let (k, v) = (Array3::from_shape_fn((8, 1, 4), |(t, _, d)| (t * d) as f32 / 10.0),
///               Array3::from_shape_fn((8, 1, 4), |(t, _, d)| (t + d) as f32));
/// let q = Array3::from_shape_fn((4, 1, 4), |(t, _, d)| (t + 2 * d) as f32 / 10.0);
/// let mut k_cache = Array4::<f32>::zeros((5, 2, 1, 4));
/// let mut v_cache = k_cache.clone();
/// let blocks: [[usize; 3]; 2] = [[2, 3, 4], [0, 1, 0]];
/// for (b, (first, len)) in [(0, 5), (5, 3)].into_iter().enumerate() {
///     for j in 0..len {
///         k_cache.index_axis_mut(Axis(0), blocks[b][j / 2]).index_axis_mut(Axis(0), j % 2).assign(&k.index_axis(Axis(0), first + j));
///         v_cache.index_axis_mut(Axis(0), blocks[b][j / 2]).index_axis_mut(Axis(0), j % 2).assign(&v.index_axis(Axis(0), first + j));
///     }
/// }
/// let block_table = Array2::from_shape_fn((2, 3), |(b, e)| blocks[b][e] as i32);
/// let kv = PagedKv { k_cache: k_cache.view(), v_cache: v_cache.view(), block_table: block_table.view() };
/// let (cu_q, cu_k) = ([0, 2, 4], [0, 5, 8]);
/// let paged = forward_paged(q.view(), &kv, &cu_q, &cu_k, &Params::default())?;
/// let packed = forward(q.view(), k.view(), v.view(), &cu_q, &cu_k, &Params::default())?;
/// assert_eq!(paged, packed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`forward`](crate::forward), with the cache's shapes named `k_cache` and `v_cache`;
/// [`Error::BlockTable`] for an entry a sequence reads that names no block,
/// [`Error::BlockTableTooShort`] for a sequence with more keys than its row has blocks for.
pub fn forward_paged<T: Element>(
    q: ArrayView3<T>,
    kv: &PagedKv<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<Array3<T>, Error> {
    let problem = kv.problem(&q, cu_seqlens_q, cu_seqlens_k, params)?;
    let mut out = Array3::from_elem(problem.out_shape(), T::default());
    crate::execute(&problem, q, kv.keys_values(), params, out.view_mut(), None)?;
    Ok(out)
}

/// [`forward_paged`] that also returns the log-sum-exp `[num_heads, total_q]`, as
/// [`forward_with_lse`](crate::forward_with_lse).
///
/// ```
/// use ndarray::{Array2, Array3, Array4};
/// use varlen_attn::{forward_paged_with_lse, PagedKv, Params};
/// // Three keys of score 0 in blocks of 1, the table listing block 1 twice.
/// let cache = Array4::<f32>::zeros((2, 1, 1, 8));
/// let table = Array2::from_shape_vec((1, 3), vec![1, 0, 1])?;
/// let kv = PagedKv { k_cache: cache.view(), v_cache: cache.view(), block_table: table.view() };
/// let q = Array3::<f32>::ones((1, 1, 8));
/// let (_, lse) = forward_paged_with_lse(q.view(), &kv, &[0, 1], &[0, 3], &Params::default())?;
/// assert!((lse[[0, 0]] - 3f32.ln()).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`forward_paged`].
pub fn forward_paged_with_lse<T: Element>(
    q: ArrayView3<T>,
    kv: &PagedKv<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<(Array3<T>, Array2<f32>), Error> {
    let problem = kv.problem(&q, cu_seqlens_q, cu_seqlens_k, params)?;
    let mut out = Array3::from_elem(problem.out_shape(), T::default());
    let mut lse = Array2::from_elem((problem.num_heads, problem.total_q), f32::NEG_INFINITY);
    crate::execute(&problem, q, kv.keys_values(), params, out.view_mut(), Some(lse.view_mut()))?;
    Ok((out, lse))
}

/// [`forward_paged`] into an output the caller owns, `[total_q, num_heads, head_dim_v]`, any
/// strides, as [`forward_into`](crate::forward_into).
///
/// # Errors
/// As [`forward_paged`], and [`Error::Shape`] with `arg: "out"` for a wrongly shaped output.
pub fn forward_paged_into<T: Element>(
    q: ArrayView3<T>,
    kv: &PagedKv<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
    out: ArrayViewMut3<T>,
) -> Result<(), Error> {
    let problem = kv.problem(&q, cu_seqlens_q, cu_seqlens_k, params)?;
    problem.check_output("out", out.shape())?;
    crate::execute(&problem, q, kv.keys_values(), params, out, None)
}

/// [`forward_paged_into`] that also writes the log-sum-exp into `lse [num_heads, total_q]`.
///
/// # Errors
/// As [`forward_paged_into`], and [`Error::Shape`] with `arg: "lse"` for a wrongly shaped LSE.
#[allow(clippy::too_many_arguments)]
pub fn forward_paged_with_lse_into<T: Element>(
    q: ArrayView3<T>,
    kv: &PagedKv<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
    out: ArrayViewMut3<T>,
    lse: ArrayViewMut2<f32>,
) -> Result<(), Error> {
    let problem = kv.problem(&q, cu_seqlens_q, cu_seqlens_k, params)?;
    problem.check_output("out", out.shape())?;
    problem.check_output("lse", lse.shape())?;
    crate::execute(&problem, q, kv.keys_values(), params, out, Some(lse))
}

/// The keys and values of `kv`'s sequences gathered into packed `[total_k, H_kv, D]` tensors
/// along `cu_seqlens_k` (validated first), for the oracle.
pub(crate) fn gather<T: Element>(
    q: &ArrayView3<T>,
    kv: &PagedKv<T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    params: &Params,
) -> Result<(Array3<T>, Array3<T>), Error> {
    let problem = kv.problem(q, cu_seqlens_q, cu_seqlens_k, params)?;
    let block_size = kv.k_cache.dim().1;
    let total_k = *cu_seqlens_k.last().expect("validated") as usize;
    let gather_one = |cache: &ArrayView4<T>| {
        let (_, _, heads, dims) = cache.dim();
        let mut packed = Array3::from_elem((total_k, heads, dims), T::default());
        for b in 0..problem.batch() {
            let sequence = problem.sequence(b);
            for j in 0..sequence.k_len {
                let block = kv.block_table[[b, j / block_size]] as usize;
                packed
                    .index_axis_mut(Axis(0), sequence.k_start + j)
                    .assign(&cache.index_axis(Axis(0), block).index_axis(Axis(0), j % block_size));
            }
        }
        packed
    };
    Ok((gather_one(&kv.k_cache), gather_one(&kv.v_cache)))
}

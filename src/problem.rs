//! Validation at the boundary: every shape, `cu_seqlens` and parameter check lives here, once.
//! Backends receive a [`Problem`] and never re-check.

use crate::element::Element;
use crate::error::{CuSeqlensRule, Error};
use crate::mask::Mask;
use crate::params::Params;
use ndarray::{s, ArrayView2, ArrayView3, ArrayView4};

/// The largest head dimension (of q/k and of v) the kernels support.
pub const MAX_HEAD_DIM: usize = 256;

/// One packed sequence: its rows in q and in k/v.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sequence {
    /// Its place in the batch.
    pub index: usize,
    pub q_start: usize,
    pub q_len: usize,
    pub k_start: usize,
    pub k_len: usize,
}

/// A validated attention problem: the shapes, the sequences and the resolved parameters,
/// without the data.
#[derive(Clone, Debug)]
pub(crate) struct Problem<'a> {
    pub total_q: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    cu_seqlens_q: &'a [i32],
    cu_seqlens_k: &'a [i32],
    /// The resolved softmax scale (`1/sqrt(head_dim)` when not given), rounded to f32 for the
    /// fast paths.
    pub scale: f32,
    /// The same scale exactly as the oracle uses it: a given `softmax_scale` is the exact value
    /// it is; the default `1/sqrt(head_dim)` is computed in f64.
    pub scale_exact: f64,
    pub softcap: Option<f32>,
    pub mask: Mask,
    /// ALiBi slopes: `num_heads` or `batch · num_heads` (validated).
    alibi_slopes: Option<&'a [f32]>,
    /// Attention sinks, one per query head (validated).
    sinks: Option<&'a [f32]>,
    /// Tokens per block of a paged K/V cache (`None`: K and V packed along `cu_seqlens_k`).
    pub block_size: Option<usize>,
}

impl<'a> Problem<'a> {
    /// Checks the shapes `q [total_q, H, D]`, `k [total_k, H_kv, D]`, `v [total_k, H_kv, D_v]`,
    /// both `cu_seqlens` and the parameters.
    pub fn new(
        q: [usize; 3],
        k: [usize; 3],
        v: [usize; 3],
        cu_seqlens_q: &'a [i32],
        cu_seqlens_k: &'a [i32],
        params: &'a Params,
    ) -> Result<Self, Error> {
        if k[2] != q[2] {
            return Err(Error::Shape { arg: "k", axis: 2, expected: q[2], got: k[2] });
        }
        for axis in 0..2 {
            if v[axis] != k[axis] {
                return Err(Error::Shape { arg: "v", axis, expected: k[axis], got: v[axis] });
            }
        }
        let problem = Self::build(q, k[1], v[2], cu_seqlens_q, cu_seqlens_k, params)?;
        check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k[0])?;
        Ok(problem)
    }

    /// Checks a call on a paged cache: `k_cache [num_blocks, block_size, H_kv, D]`,
    /// `v_cache [num_blocks, block_size, H_kv, D_v]`, and `block_table [batch, max_blocks]`,
    /// whose entries each sequence's keys reach (`ceil(k_len / block_size)` of its row) must
    /// name blocks of the cache. Blocks may be shared; entries past a sequence's keys are not
    /// read.
    pub fn new_paged(
        q: [usize; 3],
        k_cache: [usize; 4],
        v_cache: [usize; 4],
        block_table: ArrayView2<i32>,
        cu_seqlens_q: &'a [i32],
        cu_seqlens_k: &'a [i32],
        params: &'a Params,
    ) -> Result<Self, Error> {
        if k_cache[3] != q[2] {
            return Err(Error::Shape { arg: "k_cache", axis: 3, expected: q[2], got: k_cache[3] });
        }
        for axis in 0..3 {
            if v_cache[axis] != k_cache[axis] {
                return Err(Error::Shape { arg: "v_cache", axis, expected: k_cache[axis], got: v_cache[axis] });
            }
        }
        let [num_blocks, block_size, num_kv_heads, _] = k_cache;
        if block_size == 0 {
            return Err(Error::Shape { arg: "k_cache", axis: 1, expected: 1, got: 0 });
        }
        let mut problem = Self::build(q, num_kv_heads, v_cache[3], cu_seqlens_q, cu_seqlens_k, params)?;
        check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, cu_seqlens_k.last().map_or(0, |&c| c.max(0) as usize))?;
        let batch = problem.batch();
        if block_table.dim().0 != batch {
            return Err(Error::Shape { arg: "block_table", axis: 0, expected: batch, got: block_table.dim().0 });
        }
        let columns = block_table.dim().1;
        for sequence in 0..batch {
            let keys = problem.sequence(sequence).k_len;
            let needed = keys.div_ceil(block_size);
            if needed > columns {
                return Err(Error::BlockTableTooShort { sequence, keys, block_size, columns });
            }
            for entry in 0..needed {
                let value = block_table[[sequence, entry]];
                if value < 0 || value as usize >= num_blocks {
                    return Err(Error::BlockTable { sequence, entry, value, num_blocks });
                }
            }
        }
        problem.block_size = Some(block_size);
        Ok(problem)
    }

    /// The checks common to packed and paged K/V: heads, head dims, `cu_seqlens_q` (and
    /// `cu_seqlens_k`'s length), the parameters.
    fn build(
        q: [usize; 3],
        num_kv_heads: usize,
        head_dim_v: usize,
        cu_seqlens_q: &'a [i32],
        cu_seqlens_k: &'a [i32],
        params: &'a Params,
    ) -> Result<Self, Error> {
        let [total_q, num_heads, head_dim] = q;
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::Heads { num_heads, num_kv_heads });
        }
        for (arg, got) in [("q", head_dim), ("v", head_dim_v)] {
            if got == 0 || got > MAX_HEAD_DIM {
                return Err(Error::HeadDim { arg, got, max: MAX_HEAD_DIM });
            }
        }
        check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q)?;
        if cu_seqlens_k.len() < 2 {
            return Err(Error::CuSeqlensTooShort { arg: "cu_seqlens_k", len: cu_seqlens_k.len() });
        }
        if cu_seqlens_q.len() != cu_seqlens_k.len() {
            return Err(Error::CuSeqlensLength { q_len: cu_seqlens_q.len(), k_len: cu_seqlens_k.len() });
        }

        let scale_exact = match params.softmax_scale {
            Some(s) => positive_finite("softmax_scale", s)? as f64,
            None => 1.0 / (head_dim as f64).sqrt(),
        };
        let softcap = params.softcap.map(|c| positive_finite("softcap", c)).transpose()?;
        let batch = cu_seqlens_q.len() - 1;
        let alibi_slopes = params.alibi_slopes.as_deref();
        if let Some(slopes) = alibi_slopes {
            if slopes.len() != num_heads && slopes.len() != batch * num_heads {
                return Err(Error::Param {
                    name: "alibi_slopes",
                    value: format!("{} slopes (num_heads {num_heads}, batch {batch})", slopes.len()),
                    reason: "needs num_heads slopes, or batch · num_heads (one row per sequence)",
                });
            }
            finite("alibi_slopes", slopes)?;
        }
        let sinks = params.sinks.as_deref();
        if let Some(sinks) = sinks {
            if sinks.len() != num_heads {
                return Err(Error::Param {
                    name: "sinks",
                    value: format!("{} sinks (num_heads {num_heads})", sinks.len()),
                    reason: "needs one sink per query head",
                });
            }
            finite("sinks", sinks)?;
        }
        let right = if params.causal {
            match params.window_right {
                None | Some(0) => Some(0),
                Some(r) => {
                    return Err(Error::Param {
                        name: "window_right",
                        value: r.to_string(),
                        reason: "causal attention already fixes the right window at 0",
                    })
                }
            }
        } else {
            params.window_right
        };
        Ok(Problem {
            total_q,
            num_heads,
            num_kv_heads,
            head_dim,
            head_dim_v,
            cu_seqlens_q,
            cu_seqlens_k,
            scale: scale_exact as f32,
            scale_exact,
            softcap,
            mask: Mask { left: params.window_left, right },
            alibi_slopes,
            sinks,
            block_size: None,
        })
    }

    /// The same tensors and parameters cut into other sequences: `cu_seqlens_q` and
    /// `cu_seqlens_k` must be valid for the same token counts (checked in debug builds).
    #[cfg(feature = "gpu")]
    pub fn with_cu_seqlens<'b>(&self, cu_seqlens_q: &'b [i32], cu_seqlens_k: &'b [i32]) -> Problem<'b>
    where
        'a: 'b,
    {
        debug_assert!(check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, self.total_q).is_ok());
        debug_assert!(check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, self.total_k()).is_ok());
        debug_assert_eq!(cu_seqlens_q.len(), cu_seqlens_k.len());
        Problem {
            total_q: self.total_q,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
            cu_seqlens_q,
            cu_seqlens_k,
            scale: self.scale,
            scale_exact: self.scale_exact,
            softcap: self.softcap,
            mask: self.mask,
            alibi_slopes: self.alibi_slopes,
            sinks: self.sinks,
            block_size: self.block_size,
        }
    }

    /// The ALiBi slope of sequence `b`, query head `head` (`None` without slopes).
    #[inline]
    pub fn alibi_slope(&self, b: usize, head: usize) -> Option<f32> {
        self.alibi_slopes.map(|s| if s.len() == self.num_heads { s[head] } else { s[b * self.num_heads + head] })
    }

    /// The attention sink of query head `head` (`None` without sinks).
    #[inline]
    pub fn sink(&self, head: usize) -> Option<f32> {
        self.sinks.map(|s| s[head])
    }

    /// The validated ALiBi slopes (`num_heads` or `batch · num_heads`) and sinks (`num_heads`).
    pub fn modifiers(&self) -> (Option<&'a [f32]>, Option<&'a [f32]>) {
        (self.alibi_slopes, self.sinks)
    }

    /// The shape of the output, `[total_q, num_heads, head_dim_v]`.
    pub fn out_shape(&self) -> [usize; 3] {
        [self.total_q, self.num_heads, self.head_dim_v]
    }

    /// Checks a caller-provided output (`"out"`) or LSE (`"lse"`) shape.
    pub fn check_output(&self, arg: &'static str, got: &[usize]) -> Result<(), Error> {
        let expected: &[usize] = match arg {
            "lse" => &[self.num_heads, self.total_q],
            _ => &self.out_shape(),
        };
        for (axis, (&e, &g)) in expected.iter().zip(got).enumerate() {
            if e != g {
                return Err(Error::Shape { arg, axis, expected: e, got: g });
            }
        }
        Ok(())
    }

    /// The validated `cu_seqlens_q` and `cu_seqlens_k`.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub fn cu_seqlens(&self) -> (&'a [i32], &'a [i32]) {
        (self.cu_seqlens_q, self.cu_seqlens_k)
    }

    /// Key tokens of all the sequences (k's and v's first dimension).
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub fn total_k(&self) -> usize {
        self.cu_seqlens_k[self.batch()] as usize
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len() - 1
    }

    /// Sequence `b`'s rows.
    #[inline]
    pub fn sequence(&self, b: usize) -> Sequence {
        // Validated: entries are non-negative and non-decreasing.
        let q_start = self.cu_seqlens_q[b] as usize;
        let k_start = self.cu_seqlens_k[b] as usize;
        Sequence {
            index: b,
            q_start,
            q_len: self.cu_seqlens_q[b + 1] as usize - q_start,
            k_start,
            k_len: self.cu_seqlens_k[b + 1] as usize - k_start,
        }
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Checks that the finite inputs stay inside f32's range in the fast paths' arithmetic
    /// (see [`F32_EDGE`]); non-finite values are left to their own semantics. Returns what the
    /// scan found out about the bf16 matrix instructions (see [`Magnitudes`]).
    ///
    /// With `streamed` (a CPU kernel that reads every key and value once in f32, `cpu/decode.rs`),
    /// only q is scanned here: the kernel finds K's and V's maxima as it streams them, and
    /// [`Problem::check_streamed`] applies the same bounds to them afterwards.
    pub fn check_magnitudes<T: Element>(
        &self,
        q: ArrayView3<T>,
        kv: &KeysValues<T>,
        streamed: bool,
    ) -> Result<Magnitudes, Error> {
        // The factors applied to every score: scale · log2(e) to base-2 logits, or
        // scale / softcap inside the tanh.
        let scale = 2.0 * self.scale_exact;
        if scale >= F32_EDGE {
            return Err(Error::BeyondF32 { quantity: "2·scale", value: scale });
        }
        if let Some(cap) = self.softcap {
            let ratio = self.scale_exact / cap as f64;
            if ratio >= F32_EDGE {
                return Err(Error::BeyondF32 { quantity: "scale / softcap", value: ratio });
            }
        }
        let longest_keys = self.longest_keys();
        if let Some(slopes) = self.alibi_slopes {
            // |i + Lk - Lq - j| < Lq + Lk: the largest bias any score gets.
            let longest_queries = (0..self.batch()).map(|b| self.sequence(b).q_len).max().unwrap_or(0) as f64;
            let bias = slopes.iter().fold(0f64, |m, &s| m.max((s as f64).abs())) * (longest_queries + longest_keys);
            if bias >= F32_EDGE {
                return Err(Error::BeyondF32 { quantity: "max|alibi slope| · (Lq + Lk)", value: bias });
            }
        }
        if let Some(sinks) = self.sinks {
            let sink = sinks.iter().fold(0f64, |m, &s| m.max((s as f64).abs()));
            if sink >= F32_EDGE {
                return Err(Error::BeyondF32 { quantity: "max|sink|", value: sink });
            }
        }
        let score_factor = self.score_factor();
        // The element type's largest finite value bounds every magnitude: when even that stays
        // inside the edge (f16 with moderate scales), the inputs need not be read. Only bf16
        // input reaches the bf16 matrix instructions, so only bf16 needs the flush question.
        let type_max = T::DTYPE.max_finite();
        let bf16 = T::DTYPE == crate::DType::BF16;
        if !bf16 && score_factor * type_max * type_max < F32_EDGE && longest_keys * type_max < F32_EDGE {
            return Ok(Magnitudes { bf16_products_exact: true, streamed_edge: None });
        }
        let max_q = scan(q, 0.0).max;
        if streamed {
            // The streaming kernel computes in f32: no flush question.
            return Ok(Magnitudes { bf16_products_exact: true, streamed_edge: Some(max_q) });
        }
        let max_k = kv.scan(self, Half::Keys, 0.0).max;
        self.check_scores(max_q, max_k)?;
        let floor = if bf16 { BF16_PRODUCTS_V_FLOOR } else { 0.0 };
        let values = kv.scan(self, Half::Values, floor);
        self.check_sums(values.max)?;
        // Every flushed term of a score is below 2^-126 times the larger of 1, |q_d| and |k_d|
        // (a product, a partial sum, or a subnormal input times its partner).
        let score_flush = self.scale_exact * self.head_dim as f64 * (2.0 + max_q + max_k) * F32_MIN_NORMAL;
        Ok(Magnitudes {
            bf16_products_exact: !values.below_floor && score_flush <= BF16_PRODUCTS_SCORE_FLUSH,
            streamed_edge: None,
        })
    }

    /// The bounds of [`Problem::check_magnitudes`] on K's and V's largest finite magnitudes,
    /// found by a kernel that streamed them (`max_q` is what the earlier scan found of q).
    pub fn check_streamed(&self, max_q: f64, max_k: f64, max_v: f64) -> Result<(), Error> {
        self.check_scores(max_q, max_k)?;
        self.check_sums(max_v)
    }

    /// `head_dim · max(1, 2·scale)`: what `max|q| · max|k|` is multiplied by to bound every raw
    /// score and base-2 logit.
    fn score_factor(&self) -> f64 {
        self.head_dim as f64 * (2.0 * self.scale_exact).max(1.0)
    }

    /// The longest key sequence, as the bound on `P·V`'s sums counts it.
    fn longest_keys(&self) -> f64 {
        (0..self.batch()).map(|b| self.sequence(b).k_len).max().unwrap_or(0) as f64
    }

    /// The bound on every raw score and base-2 logit.
    fn check_scores(&self, max_q: f64, max_k: f64) -> Result<(), Error> {
        let scores = self.score_factor() * max_q * max_k;
        if scores >= F32_EDGE {
            return Err(Error::BeyondF32 {
                quantity: "head_dim · max|q| · max|k| · max(1, 2·scale)", value: scores
            });
        }
        Ok(())
    }

    /// The bound on every f32 accumulator of `P·V`.
    fn check_sums(&self, max_v: f64) -> Result<(), Error> {
        let sums = self.longest_keys() * max_v;
        if sums >= F32_EDGE {
            return Err(Error::BeyondF32 { quantity: "max|v| · the longest key sequence", value: sums });
        }
        Ok(())
    }

    /// Checks that a kernel which multiplies whole key tiles (the GPU's) computes this problem
    /// exactly. Masked keys get probability 0, and `0 · inf` is NaN: with a causal or windowed
    /// mask, a non-finite value in `v` would reach the rows of its tile that do not see its
    /// key, where the semantics say it must not. The CPU path skips such keys row by row;
    /// tiled kernels are refused ([`Error::GpuUnsupported`]), so `Backend::Auto` runs these
    /// inputs on the CPU.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub fn check_values_for_tiled_kernels<T: Element>(&self, kv: &KeysValues<T>) -> Result<(), Error> {
        if !self.mask.is_full() && kv.values_read(self).any(|x| !x.to_f32().is_finite()) {
            return Err(Error::GpuUnsupported(
                "non-finite values in v with a causal or windowed mask (the CPU path keeps them out of rows that do not see them)".into(),
            ));
        }
        Ok(())
    }
}

/// The edge of f32 for the fast paths, `2^126` (a quarter of f32's largest finite value): the
/// bounds `head_dim · max|q| · max|k| · max(1, 2·scale)` on every raw score and base-2 logit,
/// `max|v| · Lk` on every f32 accumulator of `P·V`, and the factors `2·scale` and
/// `scale / softcap` must stay below it. Inputs beyond it get [`Error::BeyondF32`]; the oracle,
/// in f64, computes them.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{forward, oracle, Error, Params, F32_EDGE};
/// assert_eq!(F32_EDGE, 2f64.powi(126));
/// // f32 inputs of 1e19 at head_dim 64: scores near 6.4e39 overflow f32.
/// let x = Array3::from_elem((2, 1, 64), 1e19f32);
/// let p = Params::default();
/// let err = forward(x.view(), x.view(), x.view(), &[0, 2], &[0, 2], &p).unwrap_err();
/// assert!(matches!(err, Error::BeyondF32 { .. }));
/// assert_eq!(oracle::forward(x.view(), x.view(), x.view(), &[0, 2], &[0, 2], &p)?[[1, 0, 5]], 1e19);
/// # Ok::<(), Error>(())
/// ```
pub const F32_EDGE: f64 = 8.507_059_173_023_462e37;

const _: () = assert!(F32_EDGE == (1u128 << 126) as f64);

/// What [`Problem::check_magnitudes`] learnt besides the edge.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Magnitudes {
    /// Whether hardware bf16 products (AVX-512 BF16's `vdpbf16ps`, AMX's `tdpbf16ps`) compute
    /// this problem within the oracle's bound. They treat subnormal inputs as zero and flush
    /// subnormal results whatever MXCSR says, so values of `v` below
    /// [`BF16_PRODUCTS_V_FLOOR`], or scores whose flushed terms a huge scale (or a huge partner
    /// of a subnormal input) magnifies past [`BF16_PRODUCTS_SCORE_FLUSH`], go to the f32 path.
    pub bf16_products_exact: bool,
    /// `Some(max|q|)` where K's and V's bounds are left to the streaming kernel
    /// ([`Problem::check_streamed`]).
    pub streamed_edge: Option<f64>,
}

/// Nonzero `|v|` below this (`2^-96`) may lose products to the flush: a row's flushed
/// products and partial sums total below `2n · 2^-126`, which stays under `2^-29 · n · max|v|`
/// (far inside the bound's `3n · 2^-24 · max|v|`) only while every nonzero `|v|` reaches it.
pub(crate) const BF16_PRODUCTS_V_FLOOR: f64 = 1.0 / (1u128 << 96) as f64;

/// The largest logit error (natural units) the flushed terms of a score may cause on the bf16
/// products, `2^-32`: far inside the bound's `(32 + 3n) · 2^-24`.
const BF16_PRODUCTS_SCORE_FLUSH: f64 = 1.0 / (1u64 << 32) as f64;

/// f32's smallest normal number, `2^-126`.
const F32_MIN_NORMAL: f64 = f32::MIN_POSITIVE as f64;

/// What one pass over a tensor finds.
#[derive(Clone, Copy)]
struct Scan {
    /// The largest finite `|x|` (0 when there is none).
    max: f64,
    /// Whether some finite `|x|` lies in `(0, floor)`.
    below_floor: bool,
}

impl Scan {
    const EMPTY: Scan = Scan { max: 0.0, below_floor: false };

    /// What the scans of two parts of a tensor find together.
    fn join(self, other: Scan) -> Scan {
        Scan { max: self.max.max(other.max), below_floor: self.below_floor || other.below_floor }
    }
}

/// The keys and values of a call, as its caller holds them.
pub(crate) enum KeysValues<'a, T> {
    /// `k [total_k, H_kv, D]`, `v [total_k, H_kv, D_v]`, packed along `cu_seqlens_k`.
    Packed(ArrayView3<'a, T>, ArrayView3<'a, T>),
    /// Caches `[num_blocks, block_size, H_kv, D]` (and `D_v`) with their block table.
    Paged(ArrayView4<'a, T>, ArrayView4<'a, T>, ArrayView2<'a, i32>),
}

/// Which half of [`KeysValues`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Half {
    Keys,
    Values,
}

impl<'a, T: Element> KeysValues<'a, T> {
    /// Scans the parts of K (or V) that the call reads, each once: the whole tensor when
    /// packed; when paged, every block the sequences reach, up to the last slot any sequence
    /// reads (slots past a sequence's keys may hold anything, and are not read).
    fn scan(&self, problem: &Problem, half: Half, floor: f64) -> Scan {
        match self {
            KeysValues::Packed(k, v) => scan(if half == Half::Keys { k.view() } else { v.view() }, floor),
            KeysValues::Paged(k, v, table) => {
                let cache = if half == Half::Keys { k } else { v };
                use rayon::prelude::*;
                let part = |(block, n): (usize, usize)| scan(cache.slice(s![block, ..n, .., ..]), floor);
                let slots = read_slots(problem, cache.dim().1, cache.dim().0, table);
                let parts = slots.into_par_iter().enumerate().with_min_len(64).filter(|&(_, n)| n > 0);
                parts.map(part).reduce(|| Scan::EMPTY, Scan::join)
            }
        }
    }

    /// Every value of V the call reads (packed: all of V; paged: the slots `scan` reads).
    fn values_read<'s>(&'s self, problem: &Problem) -> Box<dyn Iterator<Item = &'s T> + 's> {
        match self {
            KeysValues::Packed(_, v) => Box::new(v.iter()),
            KeysValues::Paged(_, v, table) => {
                let slots = read_slots(problem, v.dim().1, v.dim().0, table);
                Box::new(
                    slots
                        .into_iter()
                        .enumerate()
                        .flat_map(move |(block, n)| v.slice(s![block, ..n, .., ..]).into_iter()),
                )
            }
        }
    }
}

/// Slots of each of a paged cache's `num_blocks` blocks that the call reads: the most any
/// sequence reads of it.
fn read_slots(problem: &Problem, block_size: usize, num_blocks: usize, table: &ArrayView2<i32>) -> Vec<usize> {
    let mut slots = vec![0usize; num_blocks];
    for b in 0..problem.batch() {
        let keys = problem.sequence(b).k_len;
        for entry in 0..keys.div_ceil(block_size) {
            let block = table[[b, entry]] as usize;
            slots[block] = slots[block].max((keys - entry * block_size).min(block_size));
        }
    }
    slots
}

/// Elements from which a contiguous scan is split across the thread pool (a scan is bound by
/// memory bandwidth, which one core does not reach).
const PARALLEL_SCAN: usize = 1 << 22;

/// The largest finite `|x|` and whether some nonzero finite `|x|` lies below `floor`: one pass,
/// split across threads for large contiguous tensors.
fn scan<T: Element>(x: ArrayView3<T>, floor: f64) -> Scan {
    match x.as_slice_memory_order() {
        Some(s) if s.len() >= PARALLEL_SCAN => {
            use rayon::prelude::*;
            s.par_chunks(PARALLEL_SCAN / 8).map(|c| scan_slice(c, floor)).reduce(|| Scan::EMPTY, Scan::join)
        }
        Some(s) => scan_slice(s, floor),
        None => x.rows().into_iter().fold(Scan::EMPTY, |acc, row| {
            let part = match row.as_slice() {
                Some(s) => scan_slice(s, floor),
                None => scan_slice(&row.to_vec(), floor),
            };
            acc.join(part)
        }),
    }
}

/// [`scan`] of a slice.
///
/// Magnitudes compare as their bit patterns with the sign cleared; those with an exponent of
/// all ones (infinity, NaN) are left out. The smallest nonzero magnitude is tracked as the
/// minimum of `magnitude - 1` (zero wraps to the largest pattern). Lane-wise integer maxima and
/// minima over fixed chunks, which vectorise.
fn scan_slice<T: Element>(s: &[T], floor: f64) -> Scan {
    macro_rules! scan_bits {
        ($bits:ty, $magnitude:expr, $all_ones:expr) => {{
            let (magnitude, all_ones): ($bits, $bits) = ($magnitude, $all_ones);
            let finite = |b: $bits| if b & magnitude < all_ones { b & magnitude } else { 0 };
            let s = bytemuck::cast_slice::<T, $bits>(s);
            let mut largest = [0 as $bits; 32];
            let mut smallest = [<$bits>::MAX; 32];
            let mut chunks = s.chunks_exact(32);
            for chunk in &mut chunks {
                for i in 0..32 {
                    let m = finite(chunk[i]);
                    largest[i] = largest[i].max(m);
                    smallest[i] = smallest[i].min(m.wrapping_sub(1));
                }
            }
            let init = (largest.into_iter().max().unwrap_or(0), smallest.into_iter().min().unwrap_or(<$bits>::MAX));
            let (largest, smallest_less_one) =
                chunks.remainder().iter().fold(init, |(l, s), &b| (l.max(finite(b)), s.min(finite(b).wrapping_sub(1))));
            (largest, smallest_less_one.checked_add(1))
        }};
    }
    // The smallest nonzero finite magnitude, as f64 (None when there is none).
    let (max, smallest) = match T::DTYPE {
        crate::DType::BF16 => {
            let (l, s) = scan_bits!(u16, 0x7fff, 0x7f80);
            (half::bf16::from_bits(l).to_f64(), s.map(|s| half::bf16::from_bits(s).to_f64()))
        }
        crate::DType::F16 => {
            let (l, s) = scan_bits!(u16, 0x7fff, 0x7c00);
            (half::f16::from_bits(l).to_f64(), s.map(|s| half::f16::from_bits(s).to_f64()))
        }
        crate::DType::F32 => {
            let (l, s) = scan_bits!(u32, 0x7fff_ffff, 0x7f80_0000);
            (f32::from_bits(l) as f64, s.map(|s| f32::from_bits(s) as f64))
        }
    };
    Scan { max, below_floor: smallest.is_some_and(|s| s < floor) }
}

fn finite(name: &'static str, values: &[f32]) -> Result<(), Error> {
    match values.iter().find(|x| !x.is_finite()) {
        Some(x) => Err(Error::Param { name, value: x.to_string(), reason: "every value must be finite" }),
        None => Ok(()),
    }
}

fn positive_finite(name: &'static str, value: f32) -> Result<f32, Error> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(Error::Param { name, value: value.to_string(), reason: "must be finite and positive" })
    }
}

fn check_cu_seqlens(arg: &'static str, cu: &[i32], total: usize) -> Result<(), Error> {
    let fail = |index: usize, reason| Err(Error::CuSeqlens { arg, index, value: cu[index] as i64, reason });
    if cu.len() < 2 {
        return Err(Error::CuSeqlensTooShort { arg, len: cu.len() });
    }
    if cu[0] != 0 {
        return fail(0, CuSeqlensRule::FirstNotZero);
    }
    for index in 1..cu.len() {
        if cu[index] < 0 {
            return fail(index, CuSeqlensRule::Negative);
        }
        if cu[index] < cu[index - 1] {
            return fail(index, CuSeqlensRule::Decreasing);
        }
    }
    let last = cu.len() - 1;
    if cu[last] as usize != total {
        return fail(last, CuSeqlensRule::LastNotTotal { total });
    }
    Ok(())
}

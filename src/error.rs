//! The crate's one error type.

/// Everything that can go wrong in a call, with the offending argument, shape or index.
///
/// Bad input is reported here, before any work starts: the kernels only ever see a validated
/// problem.
///
/// ```
/// use ndarray::Array3;
/// use varlen_attn::{forward, Error, Params};
///
/// let q = Array3::<f32>::zeros((4, 2, 8));
/// let k = Array3::<f32>::zeros((4, 2, 16)); // head_dim differs from q's
/// let err = forward(q.view(), k.view(), k.view(), &[0, 4], &[0, 4], &Params::default())
///     .unwrap_err();
/// assert!(matches!(err, Error::Shape { arg: "k", axis: 2, expected: 8, got: 16 }));
/// assert_eq!(
///     err.to_string(),
///     "k has 16 on axis 2 (head_dim), expected 8 to match q"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor has the wrong number of axes (only where ranks are not fixed by the type, such
    /// as tensors read from a file).
    #[error("{arg} has rank {got}, expected {expected} ({layout})")]
    Rank {
        /// The argument's name.
        arg: &'static str,
        /// The rank required.
        expected: usize,
        /// The rank given.
        got: usize,
        /// The layout the argument must have, e.g. `[total_q, num_heads, head_dim]`.
        layout: &'static str,
    },

    /// One axis of a tensor disagrees with the others.
    #[error("{arg} has {got} on axis {axis} ({}), expected {expected} to match {}",
        axis_name(arg, *axis), reference_of(arg, *axis))]
    Shape {
        /// The argument's name (`"k"`, `"v"`, `"out"`, `"lse"`).
        arg: &'static str,
        /// The axis index.
        axis: usize,
        /// The size the other arguments require.
        expected: usize,
        /// The size given.
        got: usize,
    },

    /// A head count of zero, or query heads that are not a multiple of key/value heads.
    #[error(
        "num_heads {num_heads} must be a positive multiple of num_kv_heads {num_kv_heads} (grouped-query attention)"
    )]
    Heads {
        /// Query heads (q's axis 1).
        num_heads: usize,
        /// Key/value heads (k's and v's axis 1).
        num_kv_heads: usize,
    },

    /// A head dimension of zero or above what the kernels support.
    #[error("{arg} head_dim {got} is not supported: it must be between 1 and {max}")]
    HeadDim {
        /// `"q"` (head_dim of q and k) or `"v"` (head_dim of v).
        arg: &'static str,
        /// The head dimension given.
        got: usize,
        /// The largest supported.
        max: usize,
    },

    /// A `cu_seqlens` with fewer than 2 entries: at least one sequence is required.
    #[error("{arg} has {len} entries: it needs batch + 1 >= 2 (a prefix sum starting at 0)")]
    CuSeqlensTooShort {
        /// `"cu_seqlens_q"` or `"cu_seqlens_k"`.
        arg: &'static str,
        /// Its number of entries.
        len: usize,
    },

    /// `cu_seqlens_q` and `cu_seqlens_k` describe different batch sizes.
    #[error("cu_seqlens_q has {q_len} entries but cu_seqlens_k has {k_len}: both need batch + 1")]
    CuSeqlensLength {
        /// Entries in `cu_seqlens_q`.
        q_len: usize,
        /// Entries in `cu_seqlens_k`.
        k_len: usize,
    },

    /// A `cu_seqlens` entry breaks the prefix-sum rules.
    #[error("{arg}[{index}] = {value}: {reason}")]
    CuSeqlens {
        /// `"cu_seqlens_q"` or `"cu_seqlens_k"`.
        arg: &'static str,
        /// The index of the offending entry.
        index: usize,
        /// The entry's value.
        value: i64,
        /// What rule it breaks.
        reason: CuSeqlensRule,
    },

    /// A block table entry that a sequence's keys reach names no block of the paged cache.
    #[error("block_table[{sequence}, {entry}] = {value}: sequence {sequence} reads this entry, which must name a block of the cache, 0 to {num_blocks} - 1")]
    BlockTable {
        /// The sequence (the block table's row).
        sequence: usize,
        /// The entry (the block table's column).
        entry: usize,
        /// The entry's value.
        value: i32,
        /// Blocks in the cache (`k_cache`'s axis 0).
        num_blocks: usize,
    },

    /// A sequence has more keys than its row of the block table has blocks for.
    #[error("sequence {sequence} has {keys} keys, which need {} blocks of {block_size}, but block_table has {columns} columns", keys.div_ceil(*block_size))]
    BlockTableTooShort {
        /// The sequence (the block table's row).
        sequence: usize,
        /// Its key count, from `cu_seqlens_k`.
        keys: usize,
        /// Tokens per block (`k_cache`'s axis 1).
        block_size: usize,
        /// Entries per row of the block table.
        columns: usize,
    },

    /// A parameter out of its domain (a non-finite or non-positive scale or softcap, a causal
    /// mask combined with a right window).
    #[error("parameter {name} = {value}: {reason}")]
    Param {
        /// The field of [`Params`](crate::Params).
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },

    /// Finite inputs so large that the fast paths' f32 arithmetic could overflow: a bound on
    /// the scores (or base-2 logits) or on the `P·V` sums, or one of the factors `2·scale` and
    /// `scale / softcap`, reaches [`F32_EDGE`](crate::F32_EDGE) (`2^126`), e.g. f32 inputs near
    /// `1e19` at head_dim 64. The oracle computes such inputs in f64. (Decode-shaped calls on
    /// the CPU find K's and V's magnitudes while they stream them, and report this after
    /// writing the output, whose values are then unspecified.)
    #[error(
        "inputs beyond f32's range: {quantity} = {value:e} reaches 2^126, where f32 scores or sums could overflow"
    )]
    BeyondF32 {
        /// The bound that is exceeded.
        quantity: &'static str,
        /// Its value for these inputs.
        value: f64,
    },

    /// The caller forced a CPU instruction set this CPU lacks.
    #[error("CPU instruction set {isa} was requested but this CPU does not support it")]
    IsaUnavailable {
        /// The instruction set's name.
        isa: &'static str,
    },

    /// `Backend::Gpu` was asked for but the crate was built without the `gpu` feature.
    #[error("Backend::Gpu needs the crate's `gpu` cargo feature, which this build does not have")]
    GpuNotCompiled,

    /// No usable GPU: no driver, no runtime compiler, or no device.
    #[error("no GPU available: {0}")]
    NoDevice(String),

    /// The GPU path does not handle this request (it says what to do instead).
    #[error("the GPU path does not support {0}")]
    GpuUnsupported(String),

    /// A GPU call failed (compile, allocation, launch, copy).
    #[error("GPU error: {0}")]
    Gpu(String),

    /// `cu_seqlens` on the device (`gpu::forward_device_seqlens`) broke a rule in a call queued
    /// since the last check: they must start at 0, never decrease, and end at the token counts
    /// of q and k. Those calls read no input and filled their outputs with NaN.
    #[error("cu_seqlens on the device broke a rule (start at 0, never decrease, end at the token counts) in a call since the last check; those calls filled their outputs with NaN")]
    DeviceCuSeqlens,

    /// A device buffer is shorter than the tensor laid over it needs.
    #[error("{arg} needs {needed} elements but its device buffer holds {len}")]
    BufferTooSmall {
        /// The argument's name (`"device tensor"`, `"device output"`, `"lse"`).
        arg: &'static str,
        /// Elements the shape and strides reach.
        needed: usize,
        /// Elements the buffer holds.
        len: usize,
    },
}

/// The rule a `cu_seqlens` entry breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CuSeqlensRule {
    /// The first entry is not 0.
    FirstNotZero,
    /// The entry is negative.
    Negative,
    /// The entry is smaller than the one before it.
    Decreasing,
    /// The last entry is not the tensor's token count (the value it should be is given).
    LastNotTotal {
        /// The token count of q (for `cu_seqlens_q`) or of k and v (for `cu_seqlens_k`).
        total: usize,
    },
}

impl core::fmt::Display for CuSeqlensRule {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CuSeqlensRule::FirstNotZero => f.write_str("the first entry must be 0"),
            CuSeqlensRule::Negative => f.write_str("entries must not be negative"),
            CuSeqlensRule::Decreasing => f.write_str("entries must not decrease"),
            CuSeqlensRule::LastNotTotal { total } => {
                write!(f, "the last entry must equal the token count {total}")
            }
        }
    }
}

fn axis_name(arg: &str, axis: usize) -> &'static str {
    match (arg, axis) {
        ("k_cache" | "v_cache", 0) => "num_blocks",
        ("k_cache" | "v_cache", 1) => "block_size",
        ("k_cache" | "v_cache", 2) => "heads",
        ("v_cache", _) => "head_dim_v",
        ("block_table", 0) => "batch",
        ("block_table", _) => "max_blocks",
        ("lse", 0) => "num_heads",
        ("lse", _) => "total_q",
        (_, 0) => "tokens",
        (_, 1) => "heads",
        ("v" | "out", _) => "head_dim_v",
        _ => "head_dim",
    }
}

fn reference_of(arg: &str, axis: usize) -> &'static str {
    match (arg, axis) {
        ("v", 0 | 1) => "k",
        ("v_cache", 0..=2) => "k_cache",
        ("k_cache", 1) => "a block of at least one token",
        ("block_table", _) => "cu_seqlens",
        ("out" | "lse", _) => "the inputs",
        _ => "q",
    }
}

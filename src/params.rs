//! The knobs of one attention call.

/// Where a call runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// The GPU when the crate has the `gpu` feature and a device answers; the CPU otherwise
    /// (the fallback is reported through `log`).
    #[default]
    Auto,
    /// The CPU kernel.
    Cpu,
    /// The GPU kernel; an error when there is none.
    Gpu,
}

impl Backend {
    /// Every backend, in the order of [`Backend::name`]'s table.
    pub const ALL: [Backend; 3] = [Backend::Auto, Backend::Cpu, Backend::Gpu];

    /// A short name for messages and command lines.
    ///
    /// ```
    /// assert_eq!(varlen_attn::Backend::Gpu.name(), "gpu");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Cpu => "cpu",
            Backend::Gpu => "gpu",
        }
    }
}

impl core::str::FromStr for Backend {
    type Err = String;

    /// The backend [`Backend::name`] names.
    ///
    /// ```
    /// assert_eq!("cpu".parse::<varlen_attn::Backend>(), Ok(varlen_attn::Backend::Cpu));
    /// assert!("tpu".parse::<varlen_attn::Backend>().is_err());
    /// ```
    fn from_str(name: &str) -> Result<Self, String> {
        from_name(&Backend::ALL, name, Backend::name)
    }
}

/// Which CPU instruction set the CPU kernel uses.
///
/// `Auto` picks the best the CPU has; the others force one path (for tests and comparisons) and
/// fail with [`Error::IsaUnavailable`](crate::Error::IsaUnavailable) where the CPU lacks it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpuIsa {
    /// The fastest available: for bf16 input AMX tiles, else AVX-512 BF16 dot products; otherwise
    /// AVX-512, AVX2+FMA, NEON or scalar f32 code.
    #[default]
    Auto,
    /// Portable scalar code.
    Scalar,
    /// x86-64 AVX2 with FMA, f32 arithmetic.
    Avx2,
    /// x86-64 AVX-512 (F, BW, DQ, VL, CD), f32 arithmetic.
    Avx512,
    /// x86-64 AVX-512 with the bf16 dot product (`vdpbf16ps`); bf16 input only.
    Avx512Bf16,
    /// x86-64 AMX tile matrix unit (`tdpbf16ps`) with AVX-512 for the softmax; bf16 input only.
    Amx,
    /// AArch64 NEON, f32 arithmetic.
    Neon,
}

impl CpuIsa {
    /// Every instruction-set choice, in the order of [`CpuIsa::name`]'s table.
    pub const ALL: [CpuIsa; 7] =
        [CpuIsa::Auto, CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx, CpuIsa::Neon];

    /// A short name for messages and tables.
    ///
    /// ```
    /// assert_eq!(varlen_attn::CpuIsa::Avx512Bf16.name(), "avx512-bf16");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            CpuIsa::Auto => "auto",
            CpuIsa::Scalar => "scalar",
            CpuIsa::Avx2 => "avx2",
            CpuIsa::Avx512 => "avx512",
            CpuIsa::Avx512Bf16 => "avx512-bf16",
            CpuIsa::Amx => "amx",
            CpuIsa::Neon => "neon",
        }
    }
}

impl core::str::FromStr for CpuIsa {
    type Err = String;

    /// The instruction set [`CpuIsa::name`] names.
    ///
    /// ```
    /// use varlen_attn::CpuIsa;
    /// assert_eq!("avx512-bf16".parse::<CpuIsa>(), Ok(CpuIsa::Avx512Bf16));
    /// assert!("sse2".parse::<CpuIsa>().unwrap_err().contains("avx2"));
    /// ```
    fn from_str(name: &str) -> Result<Self, String> {
        from_name(&CpuIsa::ALL, name, CpuIsa::name)
    }
}

/// The value of `all` whose name is `name`, or a message listing the names.
fn from_name<T: Copy>(all: &[T], name: &str, name_of: fn(T) -> &'static str) -> Result<T, String> {
    all.iter().copied().find(|&x| name_of(x) == name).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|&x| name_of(x)).collect();
        format!("`{name}` is not one of {}", names.join(", "))
    })
}

/// Parameters of an attention call. Every field is public; start from the default.
///
/// ```
/// use varlen_attn::Params;
/// let p = Params { causal: true, softcap: Some(30.0), ..Params::default() };
/// assert_eq!(p.softmax_scale, None); // 1/sqrt(head_dim)
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    /// Multiplies `q·k` before the softmax; `None` means `1/sqrt(head_dim)`. Must be finite and
    /// positive.
    pub softmax_scale: Option<f32>,
    /// Causal mask, aligned to the bottom-right corner when a sequence has more keys than
    /// queries (FlashAttention's convention): query row `i` of a sequence with `Lq` queries and
    /// `Lk` keys sees key `j` iff `j <= i + Lk - Lq`. Same as `window_right = Some(0)`.
    pub causal: bool,
    /// Sliding window to the left: row `i` sees key `j` only if `j >= i + Lk - Lq - left`.
    /// `None` is unbounded.
    pub window_left: Option<usize>,
    /// Sliding window to the right: row `i` sees key `j` only if `j <= i + Lk - Lq + right`.
    /// `None` is unbounded. Must be `None` or `Some(0)` when `causal` is set.
    pub window_right: Option<usize>,
    /// Soft capping: scaled scores `s` become `softcap * tanh(s / softcap)` before the softmax
    /// (Gemma 2's logit soft-capping). Must be finite and positive.
    pub softcap: Option<f32>,
    /// ALiBi slopes, as FlashAttention-2 takes them: `num_heads` values, or `batch · num_heads`
    /// (sequence by sequence, then head). The score of query row `i` and key `j` of a sequence
    /// gets `-slope · |i + Lk - Lq - j|` (bottom-right aligned), after the scale and the
    /// soft-cap; the LSE is that of the biased scores. Must be finite. `Backend::Gpu` computes
    /// it on the GPU (up to 256 slopes and sinks together); `Backend::Auto` on the CPU.
    ///
    /// ```
    /// use ndarray::Array3;
    /// use varlen_attn::{forward, Params};
    /// // One query and two keys of equal scores: the nearer key weighs e times the farther.
    /// let q = Array3::<f32>::zeros((1, 1, 4));
    /// let k = Array3::<f32>::zeros((2, 1, 4));
    /// let v = Array3::from_shape_vec((2, 1, 1), vec![0.0f32, 1.0])?;
    /// let p = Params { alibi_slopes: Some(vec![1.0]), ..Params::default() };
    /// let out = forward(q.view(), k.view(), v.view(), &[0, 1], &[0, 2], &p)?;
    /// let e = std::f32::consts::E;
    /// assert!((out[[0, 0, 0]] - e / (1.0 + e)).abs() < 1e-6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub alibi_slopes: Option<Vec<f32>>,
    /// Attention sinks: one logit per query head (`num_heads` values) that joins every row's
    /// softmax denominator and carries no value (gpt-oss's sinks, FlashAttention-3's
    /// `learnable_sink`): `out = Σ exp(s_j) v_j / (exp(sink) + Σ exp(s_j))`, and the LSE includes
    /// it. Must be finite. Where it runs: as `alibi_slopes`.
    pub sinks: Option<Vec<f32>>,
    /// Where the call runs.
    pub backend: Backend,
    /// Which CPU code path runs (when the call runs on the CPU).
    pub cpu_isa: CpuIsa,
}

/// Default parameters that outlive the problems borrowing them, for the crate's unit tests.
#[cfg(test)]
pub(crate) fn default_params() -> &'static Params {
    static PARAMS: std::sync::OnceLock<Params> = std::sync::OnceLock::new();
    PARAMS.get_or_init(Params::default)
}

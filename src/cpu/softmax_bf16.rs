//! The online softmax for the bf16 kernels (AMX and AVX-512 BF16), fused: each row's scores are
//! read once into registers, and the probabilities leave as bf16 pairs ready for the second
//! product. Same arithmetic as `softmax.rs` (f32 throughout, `exp2` from the same polynomial,
//! the denominator summed from the unrounded f32 probabilities); only the store differs.

use super::math::EXP2_POLY;
use super::score::{ScoreMap, SoftCap};
use super::softmax::RowState;
use core::arch::x86_64::*;
use core::ops::Range;

/// The softmax step of the bf16 kernels: soft-capping (if any, through pulp), then [`update`]
/// with the scores turned into base-2 logits.
///
/// # Safety
/// AVX-512F/BF16 present (`simd` proves AVX-512; the kernels check BF16 when constructed); `s`
/// holds `rows × stride` f32 and `p` `rows × stride / 2` u32.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn step(
    simd: pulp::x86::V4,
    s: &mut [f32],
    stride: usize,
    p: &mut [u32],
    rows: usize,
    keys: usize,
    map: ScoreMap,
    visible: &dyn Fn(usize) -> Option<Range<usize>>,
    state: &mut RowState<'_>,
) {
    pulp::Simd::vectorize(simd, SoftCap { scores: s, stride, rows, keys, map });
    // ALiBi's bias joins the logits inside the softmax's own pass, in base-2 units: row r's
    // key j is |key0 + j - diagonal0 - r| from its diagonal.
    let alibi = map
        .alibi
        .map(|a| Bias { slope: a.slope * core::f32::consts::LOG2_E, distance0: (a.key0 - a.diagonal0) as f32 });
    // SAFETY: the caller's guarantee.
    unsafe { update(s, stride, p, rows, keys, map.log2_factor_before_bias(), alibi, visible, state) };
}

/// The `softmax` and `probability` methods of a `TileKernel` whose probabilities are bf16
/// pairs (`Packed = u32`) at row stride `$key_block` bf16: the AMX and AVX-512 BF16 kernels'.
/// Rows of `p` from `rows` up to `$padded(rows)` feed the second product and are zeroed first.
/// The kernel must hold `simd: pulp::x86::V4` and exist only where AVX-512F and BF16 do.
macro_rules! bf16_pair_softmax {
    ($key_block:expr, $padded:expr) => {
        fn softmax(
            &self,
            s: &mut [f32],
            p: &mut [u32],
            rows: usize,
            keys: usize,
            map: ScoreMap,
            visible: &dyn Fn(usize) -> Option<Range<usize>>,
            state: &mut RowState<'_>,
        ) {
            let padded: usize = $padded(rows);
            p[rows * $key_block / 2..padded * $key_block / 2].fill(0);
            // SAFETY: the kernel exists only after `available()` found AVX-512F and BF16
            // (`self.simd` proves AVX-512); s holds QUERY_BLOCK × KEY_BLOCK f32 and p
            // QUERY_BLOCK × KEY_BLOCK / 2 u32 (the driver's workspace, sized by p_len), checked
            // again inside.
            unsafe { softmax_bf16::step(self.simd, s, $key_block, p, rows, keys, map, visible, state) };
        }

        fn probability(&self, _s: &[f32], p: &[u32], r: usize, j: usize) -> f32 {
            softmax_bf16::probability(p, $key_block, r, j)
        }
    };
}
pub(crate) use bf16_pair_softmax;

/// The probability of row `r`, key `j` in bf16 pairs with `stride` bf16 per row.
pub(crate) fn probability(p: &[u32], stride: usize, r: usize, j: usize) -> f32 {
    let pair = p[r * (stride / 2) + j / 2];
    f32::from_bits(((pair >> (16 * (j % 2))) & 0xffff) << 16)
}

/// Rows and keys of a block, added up, that the bias table of `rows_update` covers.
const BIAS_TABLE: usize = 512;

/// ALiBi's bias in base-2 units: row `r`'s key `j` gets `-slope · |distance0 - r + j|`.
#[derive(Clone, Copy)]
pub(crate) struct Bias {
    slope: f32,
    distance0: f32,
}

/// Probabilities of `rows` rows of `keys` scores (row stride `stride` f32, `keys` a multiple of
/// 16 up to `stride`, at most 128) into `p` as bf16 (row stride `stride` bf16), updating the
/// running max and sum and setting `alpha` as `softmax::update` does. `factor` turns scores
/// into base-2 logits (any soft-cap is already applied); `bias` is ALiBi's, added to them.
///
/// # Safety
/// AVX-512F/BF16 present; `s` holds `rows × stride` f32 and `p` `rows × stride / 2` u32.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn update(
    s: &mut [f32],
    stride: usize,
    p: &mut [u32],
    rows: usize,
    keys: usize,
    factor: f32,
    bias: Option<Bias>,
    visible: &dyn Fn(usize) -> Option<Range<usize>>,
    state: &mut RowState<'_>,
) {
    assert!(keys.is_multiple_of(16) && keys <= stride && keys <= 128);
    assert!(s.len() >= rows * stride && p.len() >= rows * stride / 2);
    for r in 0..rows {
        if let Some(seen) = visible(r) {
            mask_outside(&mut s[r * stride..r * stride + keys], seen);
        }
    }
    macro_rules! dispatch {
        ($($n:literal),*) => {
            match keys / 16 {
                // SAFETY: features as above; s holds rows × stride f32 with 16·$n <= stride,
                // p rows × stride / 2 u32 (asserted).
                $($n => unsafe { rows_update::<$n>(s, stride, p, rows, factor, bias, state) },)*
                _ => unreachable!(),
            }
        };
    }
    dispatch!(1, 2, 3, 4, 5, 6, 7, 8);
}

/// All rows of `16 N` scores, with the constants of the loop held in registers.
///
/// # Safety
/// AVX-512F/BF16 present; `s` holds `rows × stride` f32 and `p` `rows × stride / 2` u32, with
/// `16 N <= stride` and `8 N` rounded up to 16 at most `stride / 2`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows_update<const N: usize>(
    s: &[f32],
    stride: usize,
    p: &mut [u32],
    rows: usize,
    factor: f32,
    bias: Option<Bias>,
    state: &mut RowState<'_>,
) {
    assert!(s.len() >= rows * stride && p.len() >= rows * stride / 2 && 16 * N <= stride);
    assert!((8 * N).next_multiple_of(16) <= stride / 2);
    let f = _mm512_set1_ps(factor);
    // ALiBi's bias depends on j - r alone: row r's keys read `biases` from rows - 1 - r on
    // (`slope · |distance0 - (rows - 1) + t|` at t), one load and one subtraction a vector.
    let mut biases = [0f32; BIAS_TABLE];
    if let Some(b) = bias.filter(|_| rows > 0) {
        assert!(rows + 16 * N <= BIAS_TABLE);
        let first = b.distance0 - (rows - 1) as f32;
        for (t, x) in biases[..rows - 1 + 16 * N].iter_mut().enumerate() {
            *x = b.slope * (first + t as f32).abs();
        }
    }
    for r in 0..rows {
        let row = s[r * stride..].as_ptr();
        // The base-2 logits, rounded before the max is subtracted (see `softmax::update`:
        // a fused multiply-subtract would keep the max's rounding error, which overflows
        // `exp2` for large finite scores).
        // SAFETY: n < N: 16 N <= stride, inside row r (asserted).
        let mut x: [__m512; N] =
            core::array::from_fn(|n| unsafe { _mm512_mul_ps(_mm512_loadu_ps(row.add(16 * n)), f) });
        if bias.is_some() {
            // Masked keys stay -inf: -inf minus a finite bias.
            let from = biases[rows - 1 - r..].as_ptr();
            for (n, x) in x.iter_mut().enumerate() {
                // SAFETY: rows - 1 - r + 16 n + 16 <= rows - 1 + 16 N <= BIAS_TABLE (asserted).
                *x = _mm512_sub_ps(*x, unsafe { _mm512_loadu_ps(from.add(16 * n)) });
            }
        }
        let old_max = state.max[r];
        // After the first blocks the running max rarely moves: one compare per vector finds
        // out, and saves the max reduction, the rescale and the dependency between them. (Not
        // FlashAttention-4's lazy rescaling, which lets the reference lag the max: that rounds
        // the largest probability to bf16 too, and costs measurable accuracy.)
        let keep = old_max != f32::NEG_INFINITY && {
            let limit = _mm512_set1_ps(old_max);
            x.iter().fold(0, |any, &v| any | _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, limit)) == 0
        };
        let new_max = if keep {
            old_max
        } else {
            let block_max =
                _mm512_cvtss_f32(all_lanes(tree(x, |a, b| _mm512_max_ps(a, b)), |a, b| _mm512_max_ps(a, b)));
            old_max.max(block_max)
        };
        // As in softmax.rs: a row that has seen only masked keys subtracts 0, not -inf.
        let shift = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
        let alpha = if keep { 1.0 } else { _mm512_cvtss_f32(exp2(_mm512_set1_ps(old_max - shift))) };

        let shift_v = _mm512_set1_ps(shift);
        let probabilities: [__m512; N] = core::array::from_fn(|n| exp2(_mm512_sub_ps(x[n], shift_v)));
        let out = p[r * stride / 2..].as_mut_ptr();
        for pair in 0..N.div_ceil(2) {
            let lo = probabilities[2 * pair];
            let hi = if 2 * pair + 1 < N { probabilities[2 * pair + 1] } else { _mm512_setzero_ps() };
            // SAFETY: 16 u32 at 16·pair < stride / 2: inside row r of p (asserted); __m512bh
            // and __m512 are both 512-bit vectors with no invalid bit patterns.
            unsafe {
                let packed = core::mem::transmute::<__m512bh, __m512>(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_ps(out.add(16 * pair).cast(), packed)
            };
        }
        let block_sum =
            _mm512_cvtss_f32(all_lanes(tree(probabilities, |a, b| _mm512_add_ps(a, b)), |a, b| _mm512_add_ps(a, b)));
        state.sum[r] = state.sum[r] * alpha + block_sum;
        state.max[r] = new_max;
        state.alpha[r] = alpha;
    }
}

/// Combines the 16 lanes of `v` with `op` in four shuffle steps; every lane holds the result.
#[inline]
#[target_feature(enable = "avx512f")]
fn all_lanes(v: __m512, op: impl Fn(__m512, __m512) -> __m512) -> __m512 {
    let v = op(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
    let v = op(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
    let v = op(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    op(v, _mm512_permute_ps::<0b10_11_00_01>(v))
}

/// Combines `N` vectors with `op` in two interleaved chains (half the latency of one), with
/// loops the compiler unrolls (`N` is a constant) so that nothing leaves the registers.
#[inline(always)]
fn tree<const N: usize>(v: [__m512; N], op: impl Fn(__m512, __m512) -> __m512) -> __m512 {
    if N == 1 {
        return v[0];
    }
    let (mut a, mut b) = (v[0], v[1]);
    for n in (2..N).step_by(2) {
        a = op(a, v[n]);
        if n + 1 < N {
            b = op(b, v[n + 1]);
        }
    }
    op(a, b)
}

/// `2^x` lane by lane, as `math::exp2` (same polynomial) with AVX-512's `vscalefps` applying
/// the integer part; NaN stays NaN, and below -126 the result is exactly 0 (so masked keys,
/// whose logits are -inf, get no weight at all). Results that would be subnormal are 0 rather
/// than computed: producing subnormals takes microcode assists, which made steep ALiBi slopes
/// (far keys' probabilities far below 2^-126) 2.5 times slower. Each such weight is below
/// 2^-126 of the row's largest, far inside the oracle's bound.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp2(x: __m512) -> __m512 {
    // max(-126, x) keeps NaN: vmaxps returns its second operand when either is NaN.
    let floor = _mm512_set1_ps(-126.0);
    let normal = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, floor);
    let x = _mm512_max_ps(floor, x);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(EXP2_POLY[6]);
    for &c in EXP2_POLY[..6].iter().rev() {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n))
}

/// Sets the scores outside `seen` to `-inf`, so that they get probability 0.
#[inline(always)]
fn mask_outside(row: &mut [f32], seen: Range<usize>) {
    row[..seen.start].fill(f32::NEG_INFINITY);
    row[seen.end..].fill(f32::NEG_INFINITY);
}

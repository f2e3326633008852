//! The online softmax for the bf16 kernels (AMX and AVX-512 BF16), fused: each row's scores are
//! read once into registers, and the probabilities leave as bf16 pairs ready for the second
//! product. Same arithmetic as `softmax.rs` (f32 throughout, `exp2` from the same polynomial,
//! the denominator summed from the unrounded f32 probabilities); only the store differs.

use super::math::EXP2_POLY;
use super::softmax::RowState;
use core::arch::x86_64::*;
use core::ops::Range;

/// Probabilities of `rows` rows of `keys` scores (row stride `stride` f32, `keys` a multiple of
/// 16 up to `stride`, at most 128) into `p` as bf16 (row stride `stride` bf16), updating the
/// running max and sum and setting `alpha` as `softmax::update` does. `factor` turns scores
/// into base-2 logits (any soft-cap is already applied).
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
    visible: &dyn Fn(usize) -> Option<Range<usize>>,
    state: &mut RowState<'_>,
) {
    assert!(keys.is_multiple_of(16) && keys <= stride && keys <= 128);
    assert!(s.len() >= rows * stride && p.len() >= rows * stride / 2);
    for r in 0..rows {
        let row = &mut s[r * stride..r * stride + keys];
        if let Some(seen) = visible(r) {
            row[..seen.start].fill(f32::NEG_INFINITY);
            row[seen.end..].fill(f32::NEG_INFINITY);
        }
        let out = &mut p[r * stride / 2..(r + 1) * stride / 2];
        let (old_max, old_sum) = (state.max[r], state.sum[r]);
        macro_rules! dispatch {
            ($($n:literal),*) => {
                match keys / 16 {
                    // SAFETY: features as above; row holds $n × 16 scores, out $n × 8 (rounded
                    // up to whole 16s) u32 within the row stride.
                    $($n => unsafe { row_update::<$n>(row, out, factor, old_max, old_sum) },)*
                    _ => unreachable!(),
                }
            };
        }
        let (max, sum, alpha) = dispatch!(1, 2, 3, 4, 5, 6, 7, 8);
        state.max[r] = max;
        state.sum[r] = sum;
        state.alpha[r] = alpha;
    }
}

/// One row of `16 N` scores: returns the new max, the new sum and alpha.
///
/// # Safety
/// AVX-512F/BF16 present; `row` holds `16 N` f32 and `out` at least `8 N` u32 rounded up to 16.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn row_update<const N: usize>(
    row: &[f32],
    out: &mut [u32],
    factor: f32,
    old_max: f32,
    old_sum: f32,
) -> (f32, f32, f32) {
    assert!(row.len() >= 16 * N && out.len() >= (8 * N).next_multiple_of(16));
    // SAFETY: n < N: inside row (asserted).
    let x: [__m512; N] = core::array::from_fn(|n| unsafe { _mm512_loadu_ps(row.as_ptr().add(16 * n)) });
    let mut m = x[0];
    for v in &x[1..] {
        m = _mm512_max_ps(m, *v);
    }
    let block_max = _mm512_reduce_max_ps(m) * factor;
    let new_max = old_max.max(block_max);
    // As in softmax.rs: a row that has seen only masked keys subtracts 0, not -inf.
    let shift = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
    let alpha = (old_max - shift).exp2();

    let (f, neg_shift) = (_mm512_set1_ps(factor), _mm512_set1_ps(-shift));
    let mut sum = _mm512_setzero_ps();
    let probabilities: [__m512; N] = core::array::from_fn(|n| {
        let p = exp2(_mm512_fmadd_ps(x[n], f, neg_shift));
        sum = _mm512_add_ps(sum, p);
        p
    });
    for pair in 0..N.div_ceil(2) {
        let lo = probabilities[2 * pair];
        let hi = if 2 * pair + 1 < N { probabilities[2 * pair + 1] } else { _mm512_setzero_ps() };
        let packed = _mm512_cvtne2ps_pbh(hi, lo);
        // SAFETY: 16 u32 at 16·pair < out.len() (asserted).
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr().add(16 * pair).cast(), core::mem::transmute::<__m512bh, __m512>(packed))
        };
    }
    (new_max, old_sum * alpha + _mm512_reduce_add_ps(sum), alpha)
}

/// `2^x` lane by lane, as `math::exp2` (same polynomial) with AVX-512's `vscalefps` applying
/// the integer part; NaN stays NaN, and below -150 the result is exactly 0 (so masked keys,
/// whose logits are -inf, get no weight at all).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp2(x: __m512) -> __m512 {
    // max(-200, x) keeps NaN: vmaxps returns its second operand when either is NaN. 2^-200
    // underflows to 0.
    let x = _mm512_max_ps(_mm512_set1_ps(-200.0), x);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(EXP2_POLY[6]);
    for &c in EXP2_POLY[..6].iter().rev() {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

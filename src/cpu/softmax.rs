//! The online softmax over one block of scores (FlashAttention's running max and sum), in f32,
//! written once against `pulp::Simd`.
//!
//! Scores are tracked in base-2 units: `x = s · scale · log2(e)`, so `p = exp2(x - m)`, the
//! logit rounded before the max is subtracted (see [`exponentiate`] for why not one fused
//! multiply-add).

use super::math::{exp2_nonpositive, tanh};
use core::ops::Range;
use pulp::{Simd, WithSimd};

/// How raw dot products become base-2 logits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScoreMap {
    /// Multiplies the raw dot product before the soft-cap.
    pub scale: f32,
    pub softcap: Option<f32>,
}

impl ScoreMap {
    /// The factor from (possibly soft-capped) scores to base-2 logits.
    pub fn log2_factor(&self) -> f32 {
        match self.softcap {
            Some(_) => core::f32::consts::LOG2_E,
            None => self.scale * core::f32::consts::LOG2_E,
        }
    }
}

/// Running state of the rows of one query block.
pub(crate) struct RowState<'a> {
    /// Running max of the logits, base-2 units (`-inf` before the first visible key).
    pub max: &'a mut [f32],
    /// Running denominator, relative to `2^max`.
    pub sum: &'a mut [f32],
    /// Per row, the factor the accumulator must be rescaled by for this block.
    pub alpha: &'a mut [f32],
}

/// Turns the raw scores of `rows` rows and `keys` columns (row stride `stride`) into
/// probabilities in place, updating the running max and sum and setting `alpha`.
///
/// `visible(r)` gives the columns row `r` may see, or `None` when all `keys` are visible;
/// other columns get probability 0.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn update<S: Simd>(
    simd: S,
    scores: &mut [f32],
    stride: usize,
    rows: usize,
    keys: usize,
    map: ScoreMap,
    visible: &dyn Fn(usize) -> Option<Range<usize>>,
    state: &mut RowState<'_>,
) {
    assert!(rows <= MAX_ROWS && state.alpha.len() >= rows && state.sum.len() >= rows);
    let factor = map.log2_factor();
    let mut block_sums = [0f32; MAX_ROWS];
    SoftCap { scores: &mut *scores, stride, rows, keys, map }.with_simd(simd);
    for r in 0..rows {
        let row = &mut scores[r * stride..r * stride + keys];
        if let Some(seen) = visible(r) {
            mask_outside(row, seen);
        }
        // Rounding is monotonic and the factor positive: the max of the rounded logits is the
        // rounded logit of the max score.
        let block_max = row_max(simd, row) * factor;
        let old_max = state.max[r];
        let new_max = old_max.max(block_max);
        // A row that has seen only masked keys keeps max -inf; subtracting 0 then keeps every
        // probability at exp2(-inf) = 0 instead of exp2(-inf + inf) = NaN.
        let shift = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
        block_sums[r] = exponentiate(simd, row, factor, shift);
        state.max[r] = new_max;
        // For now the exponent of alpha (at most 0); all rows' alphas are taken at once below.
        state.alpha[r] = old_max - shift;
    }
    // alpha = 2^(old max - new max) for every row in vectors (one libm call per row was 2% of
    // the time), and the sums rescaled by it.
    let (alpha, alpha_tail) = S::as_mut_simd_f32s(&mut state.alpha[..rows]);
    let (sum, sum_tail) = S::as_mut_simd_f32s(&mut state.sum[..rows]);
    let (block, block_tail) = S::as_simd_f32s(&block_sums[..rows]);
    for ((a, s), &b) in alpha.iter_mut().zip(sum.iter_mut()).zip(block) {
        *a = exp2_nonpositive(simd, *a);
        *s = simd.mul_add_f32s(*s, *a, b);
    }
    for ((a, s), &b) in alpha_tail.iter_mut().zip(sum_tail.iter_mut()).zip(block_tail) {
        *a = exp2_nonpositive(pulp::Scalar::new(), *a);
        *s = s.mul_add(*a, b);
    }
}

/// The most rows one call of [`update`] takes.
pub(crate) const MAX_ROWS: usize = 128;

/// Sets the scores outside `seen` to `-inf`, so that they get probability 0.
#[inline(always)]
pub(crate) fn mask_outside(row: &mut [f32], seen: Range<usize>) {
    row[..seen.start].fill(f32::NEG_INFINITY);
    row[seen.end..].fill(f32::NEG_INFINITY);
}

/// Soft-caps `rows` rows of `keys` scores (row stride `stride`) in place (when `map` has a
/// cap), as an operation to run under pulp's dispatch.
pub(crate) struct SoftCap<'a> {
    pub scores: &'a mut [f32],
    pub stride: usize,
    pub rows: usize,
    pub keys: usize,
    pub map: ScoreMap,
}

impl WithSimd for SoftCap<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        if let Some(cap) = self.map.softcap {
            for r in 0..self.rows {
                let row = &mut self.scores[r * self.stride..r * self.stride + self.keys];
                soft_cap(simd, row, self.map.scale / cap, cap);
            }
        }
    }
}

/// `row[j] = cap · tanh(row[j] · scale_over_cap)`.
#[inline(always)]
fn soft_cap<S: Simd>(simd: S, row: &mut [f32], scale_over_cap: f32, cap: f32) {
    let (k, c) = (simd.splat_f32s(scale_over_cap), simd.splat_f32s(cap));
    let (head, tail) = S::as_mut_simd_f32s(row);
    for x in head {
        *x = simd.mul_f32s(c, tanh(simd, simd.mul_f32s(*x, k)));
    }
    for x in tail {
        *x = cap * tanh(pulp::Scalar::new(), *x * scale_over_cap);
    }
}

/// The largest entry of `row` (`-inf` for an empty row).
#[inline(always)]
fn row_max<S: Simd>(simd: S, row: &[f32]) -> f32 {
    let (head, tail) = S::as_simd_f32s(row);
    let mut acc = simd.splat_f32s(f32::NEG_INFINITY);
    for &x in head {
        acc = simd.max_f32s(acc, x);
    }
    tail.iter().fold(simd.reduce_max_f32s(acc), |m, &x| m.max(x))
}

/// `row[j] = exp2(round(row[j] · factor) - shift)`, with `shift` the largest rounded logit
/// (or 0); returns the sum.
///
/// The logit is rounded before the shift is subtracted, a multiply and then a subtract, not
/// one fused multiply-add: at the max the argument is then exactly 0, however large the
/// logits, whereas `fma(x, factor, -shift)` keeps the max's rounding error, up to half an ulp
/// of the logit (`2^100` for a logit of `2^124`), and `exp2` of that overflows.
#[inline(always)]
fn exponentiate<S: Simd>(simd: S, row: &mut [f32], factor: f32, shift: f32) -> f32 {
    let (f, shift_v) = (simd.splat_f32s(factor), simd.splat_f32s(shift));
    let (head, tail) = S::as_mut_simd_f32s(row);
    let mut sum = simd.splat_f32s(0.0);
    for x in head {
        let p = exp2_nonpositive(simd, simd.sub_f32s(simd.mul_f32s(*x, f), shift_v));
        *x = p;
        sum = simd.add_f32s(sum, p);
    }
    let mut total = simd.reduce_sum_f32s(sum);
    for x in tail {
        let p = exp2_nonpositive(pulp::Scalar::new(), *x * factor - shift);
        *x = p;
        total += p;
    }
    total
}

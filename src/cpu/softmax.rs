//! The online softmax over one block of scores (FlashAttention's running max and sum), in f32,
//! written once against `pulp::Simd`.
//!
//! Scores are tracked in base-2 units: `x = s · scale · log2(e)`, so `p = exp2(x - m)` with the
//! scale folded into one fused multiply-add.

use super::math::{exp2, tanh};
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
    let factor = map.log2_factor();
    SoftCap { scores: &mut *scores, stride, rows, keys, map }.with_simd(simd);
    for r in 0..rows {
        let row = &mut scores[r * stride..r * stride + keys];
        if let Some(seen) = visible(r) {
            mask_outside(row, seen);
        }
        let block_max = to_logits(simd, row, factor);
        let old_max = state.max[r];
        let new_max = old_max.max(block_max);
        // A row that has seen only masked keys keeps max -inf; subtracting 0 then keeps every
        // probability at exp2(-inf) = 0 instead of exp2(-inf + inf) = NaN.
        let shift = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
        let alpha = (old_max - shift).exp2();
        let block_sum = exponentiate(simd, row, shift);
        state.sum[r] = state.sum[r] * alpha + block_sum;
        state.max[r] = new_max;
        state.alpha[r] = alpha;
    }
}

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

/// `row[j] = row[j] · factor`, rounded: the base-2 logits. Returns their max (`-inf` for an
/// empty row).
///
/// Rounding the logits before the max is subtracted is what keeps large finite scores finite:
/// `exp2(logit - max)` is then exactly 1 at the max and at most 1 elsewhere, whereas a fused
/// `score · factor - max` keeps the max's rounding error, up to half an ulp of the logit
/// (`2^100` for a logit of `2^124`), and `exp2` of that overflows.
#[inline(always)]
fn to_logits<S: Simd>(simd: S, row: &mut [f32], factor: f32) -> f32 {
    let f = simd.splat_f32s(factor);
    let (head, tail) = S::as_mut_simd_f32s(row);
    let mut acc = simd.splat_f32s(f32::NEG_INFINITY);
    for x in head {
        *x = simd.mul_f32s(*x, f);
        acc = simd.max_f32s(acc, *x);
    }
    tail.iter_mut().fold(simd.reduce_max_f32s(acc), |m, x| {
        *x *= factor;
        m.max(*x)
    })
}

/// `row[j] = exp2(row[j] - shift)` (every logit at most `shift`); returns the sum.
#[inline(always)]
fn exponentiate<S: Simd>(simd: S, row: &mut [f32], shift: f32) -> f32 {
    let shift_v = simd.splat_f32s(shift);
    let (head, tail) = S::as_mut_simd_f32s(row);
    let mut sum = simd.splat_f32s(0.0);
    for x in head {
        let p = exp2(simd, simd.sub_f32s(*x, shift_v));
        *x = p;
        sum = simd.add_f32s(sum, p);
    }
    let mut total = simd.reduce_sum_f32s(sum);
    for x in tail {
        let p = exp2(pulp::Scalar::new(), *x - shift);
        *x = p;
        total += p;
    }
    total
}

//! The online softmax over one block of scores (FlashAttention's running max and sum), in f32,
//! written once against `pulp::Simd`.
//!
//! Scores are tracked in base-2 units: `x = s · scale · log2(e)`, so `p = exp2(x - m)`, the
//! logit rounded before the max is subtracted (see [`update`] for why not one fused
//! multiply-add).

use super::math::exp2_nonpositive;
use super::score::{AlibiPanels, ScoreMap, SoftCap};
use super::vector::{load, store};
use core::ops::Range;
use pulp::{Simd, WithSimd};

/// Running state of the rows of one query block.
pub(crate) struct RowState<'a> {
    /// Running max of the logits, base-2 units (`-inf` before the first visible key).
    pub max: &'a mut [f32],
    /// Running denominator, relative to `2^max`.
    pub sum: &'a mut [f32],
    /// Per row, the factor the accumulator must be rescaled by for this block.
    pub alpha: &'a mut [f32],
}

/// Turns the raw scores of `rows` query rows and `keys` keys into probabilities in place,
/// updating the running max and sum and setting `alpha` (the factor each row's accumulator
/// must be rescaled by).
///
/// The scores are stored in panels of `group` query rows, each key-major (`[row group][key]
/// [group]`, `key_block` keys per panel: the portable kernel's layout), so that every step
/// works on vectors of `W` rows at once, with no horizontal reduction. `group` is a whole
/// number of vector pairs; the rows past `rows` up to a whole group are computed like the
/// others (the kernel's products cover them) and ignored by the driver; `state` holds every row
/// of the last group.
///
/// `visible(r)` gives the keys row `r` may see, or `None` when it sees all `keys`; the others
/// get probability 0.
///
/// The probability is `exp2(round(s · factor) - shift)`: the logit is rounded before the shift
/// (the largest rounded logit, or 0) is subtracted, a multiply and then a subtract, not one
/// fused multiply-add: at the max the argument is then exactly 0, however large the logits,
/// whereas `fma(s, factor, -shift)` keeps the max's rounding error, up to half an ulp of the
/// logit (`2^100` for a logit of `2^124`), and `exp2` of that overflows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn update<S: Simd>(
    simd: S,
    scores: &mut [f32],
    key_block: usize,
    rows: usize,
    group: usize,
    keys: usize,
    map: ScoreMap,
    visible: &dyn Fn(usize) -> Option<Range<usize>>,
    state: &mut RowState<'_>,
) {
    let w = S::F32_LANES;
    let padded = rows.next_multiple_of(group);
    assert!(group.is_multiple_of(2 * w) && keys <= key_block && scores.len() >= padded * key_block);
    assert!(state.max.len() >= padded && state.sum.len() >= padded && state.alpha.len() >= padded);
    let index = |r: usize, j: usize| (r / group) * key_block * group + j * group + r % group;
    // The soft-cap is lane by lane: each panel's first `keys · group` scores, as rows of a
    // matrix with row stride `key_block · group`.
    let panels = padded / group;
    SoftCap { scores: &mut *scores, stride: key_block * group, rows: panels, keys: keys * group, map }.with_simd(simd);
    AlibiPanels { scores: &mut *scores, key_block, group, rows, keys, map }.with_simd(simd);
    for r in 0..rows {
        if let Some(seen) = visible(r) {
            for j in (0..seen.start).chain(seen.end..keys) {
                scores[index(r, j)] = f32::NEG_INFINITY;
            }
        }
    }
    let factor = simd.splat_f32s(map.log2_factor());
    let (zero, neg_inf) = (simd.splat_f32s(0.0), simd.splat_f32s(f32::NEG_INFINITY));
    let (scores, max, sum, alpha) =
        (scores.as_mut_ptr(), state.max.as_mut_ptr(), state.sum.as_mut_ptr(), state.alpha.as_mut_ptr());
    // Two vectors of rows per pass (a cache line on AVX2): two independent chains.
    for first in (0..padded).step_by(2 * w) {
        let column = |j: usize, n: usize| index(first, j) + n * w;
        let mut block_max = [neg_inf; 2];
        for j in 0..keys {
            for (n, m) in block_max.iter_mut().enumerate() {
                // SAFETY: rows first + n·W.. + W <= padded (in one group: W divides it), key j <
                // keys <= key_block: inside scores (asserted).
                *m = simd.max_f32s(*m, unsafe { load::<S>(scores.add(column(j, n))) });
            }
        }
        let mut shift = [zero; 2];
        let mut old_max = [zero; 2];
        for n in 0..2 {
            // SAFETY: first + n·W + W <= padded: inside the state (asserted).
            old_max[n] = unsafe { load::<S>(max.add(first + n * w)) };
            // Rounding is monotonic and the factor positive: the max of the rounded logits is
            // the rounded logit of the max score.
            let new_max = simd.max_f32s(old_max[n], simd.mul_f32s(block_max[n], factor));
            // SAFETY: as above.
            unsafe { store::<S>(max.add(first + n * w), new_max) };
            // A row that has seen only masked keys keeps max -inf; subtracting 0 then keeps
            // every probability at exp2(-inf) = 0 instead of exp2(-inf + inf) = NaN.
            shift[n] = simd.select_f32s(simd.equal_f32s(new_max, neg_inf), zero, new_max);
        }
        let mut block_sum = [zero; 2];
        for j in 0..keys {
            for n in 0..2 {
                // SAFETY: as for the max above.
                let x = unsafe { load::<S>(scores.add(column(j, n))) };
                // The rounded logit, then the shift (see above).
                let p = exp2_nonpositive(simd, simd.sub_f32s(simd.mul_f32s(x, factor), shift[n]));
                // SAFETY: as above.
                unsafe { store::<S>(scores.add(column(j, n)), p) };
                block_sum[n] = simd.add_f32s(block_sum[n], p);
            }
        }
        for n in 0..2 {
            let a = exp2_nonpositive(simd, simd.sub_f32s(old_max[n], shift[n]));
            // SAFETY: inside the state, as above.
            unsafe {
                store::<S>(alpha.add(first + n * w), a);
                store::<S>(
                    sum.add(first + n * w),
                    simd.mul_add_f32s(load::<S>(sum.add(first + n * w)), a, block_sum[n]),
                );
            }
        }
    }
}

//! Where a raw score `q·k` becomes the softmax's base-2 logit, for every CPU path: the scale,
//! or the soft-cap `cap · tanh(s · scale / cap)` (then `log2(e)`). Score modifiers (ALiBi,
//! sinks) belong here, beside them.

use super::math::tanh;
use pulp::{Simd, WithSimd};

/// How raw dot products become base-2 logits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScoreMap {
    /// Multiplies the raw dot product before the soft-cap.
    pub scale: f32,
    pub softcap: Option<f32>,
    /// ALiBi's bias on this block of scores.
    pub alibi: Option<AlibiBlock>,
}

/// ALiBi on one block of scores: row `r` of the block has its diagonal (its query position
/// plus `Lk - Lq`) at `diagonal0 + r`, key `j` is key `key0 + j` of the sequence, and the score
/// gets `-slope · |diagonal - key|`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AlibiBlock {
    pub slope: f32,
    pub diagonal0: i64,
    pub key0: i64,
}

impl ScoreMap {
    /// Whether the scores become natural-unit logits in place before the softmax (the soft-cap,
    /// or the scale ahead of ALiBi's bias), which then only turns them into base 2.
    fn in_place(&self) -> bool {
        self.softcap.is_some() || self.alibi.is_some()
    }

    /// The factor from the scores, as `SoftCap` and `add_alibi` leave them, to base-2 logits.
    pub fn log2_factor(&self) -> f32 {
        if self.in_place() {
            core::f32::consts::LOG2_E
        } else {
            self.scale * core::f32::consts::LOG2_E
        }
    }
}

/// Adds ALiBi's bias (when `map` has one) to the scores of `rows` rows and `keys` keys, row `r`'s
/// key `j` at `index(r, j)`: a product and a sum in f32 each, the oracle's `2u` per bias.
#[inline(always)]
pub(crate) fn add_alibi(
    scores: &mut [f32],
    rows: usize,
    keys: usize,
    index: impl Fn(usize, usize) -> usize,
    map: ScoreMap,
) {
    let Some(a) = map.alibi else { return };
    for r in 0..rows {
        let diagonal = a.diagonal0 + r as i64;
        for j in 0..keys {
            let distance = (diagonal - (a.key0 + j as i64)).unsigned_abs() as f32;
            scores[index(r, j)] -= a.slope * distance;
        }
    }
}

/// Turns `rows` rows of `keys` raw scores (row stride `stride`) into natural-unit logits in
/// place where `map` says so: the soft-cap, or the scale alone ahead of ALiBi's bias; as an
/// operation to run under pulp's dispatch.
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
        } else if self.map.alibi.is_some() {
            let k = simd.splat_f32s(self.map.scale);
            for r in 0..self.rows {
                let (head, tail) = S::as_mut_simd_f32s(&mut self.scores[r * self.stride..r * self.stride + self.keys]);
                head.iter_mut().for_each(|x| *x = simd.mul_f32s(*x, k));
                tail.iter_mut().for_each(|x| *x *= self.map.scale);
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

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

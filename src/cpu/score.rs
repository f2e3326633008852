//! Where a raw score `q·k` becomes the softmax's base-2 logit, for every CPU path: the scale,
//! or the soft-cap `cap · tanh(s · scale / cap)`, then ALiBi's bias `-slope · |i + Lk - Lq - j|`,
//! then `log2(e)`. (Attention sinks join the softmax's max and sum at the end of a row, in
//! `driver.rs`.)

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
    /// What raw scores are multiplied by to reach natural-unit logits: the scale, or 1 where
    /// the soft-cap (`SoftCap`) has turned them into natural units already.
    fn natural_scale(&self) -> f32 {
        if self.softcap.is_some() {
            1.0
        } else {
            self.scale
        }
    }

    /// The factor from the scores, as `SoftCap` leaves them, to base-2 logits, for a softmax
    /// that adds ALiBi's bias itself (the bf16 kernels').
    pub fn log2_factor_before_bias(&self) -> f32 {
        self.natural_scale() * core::f32::consts::LOG2_E
    }

    /// The factor from the scores, as `SoftCap` and `AlibiPanels` leave them (the latter in
    /// natural units), to base-2 logits.
    pub fn log2_factor(&self) -> f32 {
        if self.alibi.is_some() {
            core::f32::consts::LOG2_E
        } else {
            self.log2_factor_before_bias()
        }
    }
}

/// 0, 1, 2, ...: the offsets along a run of consecutive scores, for loops that vectorise.
const IOTA: [f32; 512] = {
    let mut iota = [0f32; 512];
    let mut i = 0;
    while i < 512 {
        iota[i] = i as f32;
        i += 1;
    }
    iota
};

/// Subtracts `slope · |c + i|` from `run[i]`: one run of consecutive scores whose distances
/// from their diagonals are `c`, `c + 1`, ... (or their negatives). The distance is exact in
/// f32 below 2^24, one more rounding above; the product and the subtraction round once each.
/// The scores are first multiplied by `scale` (1 where the soft-cap already did it), in the
/// same pass.
#[inline(always)]
fn bias_run<S: Simd>(simd: S, run: &mut [f32], c: f32, slope: f32, scale: f32) {
    let n = run.len();
    let (head, tail) = S::as_mut_simd_f32s(run);
    let (iota, iota_tail) = S::as_simd_f32s(&IOTA[..n]);
    let (cv, sv, kv) = (simd.splat_f32s(c), simd.splat_f32s(slope), simd.splat_f32s(scale));
    for (x, &i) in head.iter_mut().zip(iota) {
        let distance = simd.abs_f32s(simd.add_f32s(cv, i));
        *x = simd.sub_f32s(simd.mul_f32s(*x, kv), simd.mul_f32s(sv, distance));
    }
    for (x, &i) in tail.iter_mut().zip(iota_tail) {
        *x = *x * scale - slope * (c + i).abs();
    }
}

/// Adds ALiBi's bias (when `map` has one) to a block of scores stored in panels of `group` rows,
/// key-major (`[panel][key][group]`, `key_block` keys a panel: the portable kernel's layout),
/// `rows` rows padded to whole panels (the padding rows get a bias too, and are ignored); an
/// operation for pulp's dispatch.
pub(crate) struct AlibiPanels<'a> {
    pub scores: &'a mut [f32],
    pub key_block: usize,
    pub group: usize,
    pub rows: usize,
    pub keys: usize,
    pub map: ScoreMap,
}

impl WithSimd for AlibiPanels<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Some(a) = self.map.alibi else { return };
        let (group, key_block) = (self.group, self.key_block);
        assert!(group <= IOTA.len());
        let scale = self.map.natural_scale();
        for panel in 0..self.rows.div_ceil(group) {
            for j in 0..self.keys {
                // Row r = panel · group + i's distance from key j: |diagonal0 + r - key0 - j|.
                let c = (a.diagonal0 + (panel * group) as i64 - a.key0 - j as i64) as f32;
                let start = panel * key_block * group + j * group;
                bias_run(simd, &mut self.scores[start..start + group], c, a.slope, scale);
            }
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

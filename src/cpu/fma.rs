//! The portable kernel: f32 fused multiply-adds, written once against `pulp::Simd` (AVX-512,
//! AVX2+FMA, NEON, scalar). Serves f16 and f32 input everywhere, and bf16 where the CPU has no
//! bf16 dot product. Inputs are widened to f32 exactly when packed.
//!
//! Query rows run across the vector lanes, everywhere: both products are then the same
//! register-blocked microkernel (as in `gemm` and `matrixmultiply`), `MR` broadcasts × [`NR`]
//! vectors of query rows, and the online softmax works on whole vectors of rows, with no
//! horizontal reductions and no per-row bookkeeping. `MR` is 6 where the instruction set has 16
//! registers (AVX2, scalar: 12 accumulators, 2 operands and a broadcast, 15 registers; 4 × 3
//! needs all 16 and LLVM then spills) and 12 where it has 32 (AVX-512, NEON: 24 accumulators).
//! `MR` divides 72, the seed's head_dim, so the value product has no narrow tail tile there.
//!
//! Layouts (`W` f32 lanes, `R = NR·W` query rows per register tile): whatever is per query row
//! is kept in panels of one register tile's rows, `[row tile][..][R]`, so that every product
//! and the softmax read and write consecutive memory:
//! - Qᵀ `[row tile][d][R]`, zero past the block's rows up to a whole tile;
//! - K `[key group][d][MR]`: `MR` keys broadcast per step of `d`;
//! - scores, then probabilities, Sᵀ `[row tile][key][R]` (`KEY_BLOCK` keys per tile);
//! - V `[column group][key][MR]`: `MR` output columns broadcast per key;
//! - the accumulator Oᵀ `[row tile][dv][R]`.

use super::score::ScoreMap;
use super::softmax::{self, RowState};
use super::tile::{round_up, TileKernel};
use super::vector::{load, store};
use crate::element::Element;
use crate::layout::{Rows, SequenceRows};
use crate::problem::MAX_HEAD_DIM;
use core::ops::Range;
use ndarray::ArrayView1;
use pulp::Simd;

/// Query rows per work item: a whole number of register tiles on every instruction set (16
/// rows on AVX2, 32 on AVX-512, 8 on NEON, 2 scalar).
const QUERY_BLOCK: usize = 96;
/// Keys per block: a whole number of key groups (6 or 12).
const KEY_BLOCK: usize = 96;
/// Vectors of query rows per register tile.
const NR: usize = 2;

/// Broadcasts per register tile (keys in the score product, output columns in the value
/// product) for an instruction set with `registers` vector registers (see the module docs).
const fn broadcasts_per_tile(registers: usize) -> usize {
    if registers >= 32 {
        MAX_MR
    } else {
        6
    }
}

/// The most broadcasts per register tile on any instruction set.
const MAX_MR: usize = 12;

const _: () =
    assert!(QUERY_BLOCK.is_multiple_of(NR * 16) && KEY_BLOCK.is_multiple_of(MAX_MR) && MAX_MR.is_multiple_of(6));

/// The portable kernel for the instruction set `S`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FmaKernel<S> {
    simd: S,
}

impl<S: Simd> FmaKernel<S> {
    pub fn new(simd: S) -> Self {
        FmaKernel { simd }
    }

    /// Broadcasts per register tile on this instruction set.
    const MR: usize = broadcasts_per_tile(S::REGISTER_COUNT);
    /// Query rows per register tile.
    const R: usize = NR * S::F32_LANES;
}

/// `dst = src` widened to f32, with the CPU's conversion instructions where it has them (F16C
/// for f16, found at run time by `half`). bf16 is the high half of an f32: a shift, which
/// vectorises (`half`'s conversion quiets NaNs one by one, a branch per element that cost
/// short sequences a fifth of their time; a NaN stays a NaN either way).
#[inline(always)]
fn widen_slice<T: Element>(src: &[T], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    match T::DTYPE {
        crate::DType::F16 => bytemuck::cast_slice::<T, half::f16>(src).convert_to_f32_slice(dst),
        crate::DType::BF16 => {
            let bits = bytemuck::cast_slice::<T, u16>(src);
            dst.iter_mut().zip(bits).for_each(|(d, &b)| *d = f32::from_bits(u32::from(b) << 16));
        }
        crate::DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
    }
}

/// `src` widened to f32 into `dst[..len]`, the row's length, which it returns.
#[inline(always)]
fn widen_row<T: Element>(src: ArrayView1<T>, dst: &mut [f32]) -> usize {
    let len = src.len();
    match src.as_slice() {
        Some(s) => widen_slice(s, &mut dst[..len]),
        None => dst.iter_mut().zip(src.iter()).for_each(|(d, x)| *d = x.to_f32()),
    }
    len
}

/// Where a panel layout `[row tile][n][R]` keeps row `r`, entry `j` (of `n`).
#[inline(always)]
fn panel_index<S: Simd>(n: usize, r: usize, j: usize) -> usize {
    index_in_panels(NR * S::F32_LANES, n, r, j)
}

/// Where panels of `width` rows, `[panel][n][width]`, keep row `r`, entry `j` (of `n`).
#[inline(always)]
fn index_in_panels(width: usize, n: usize, r: usize, j: usize) -> usize {
    (r / width) * n * width + j * width + r % width
}

/// Packs `count` rows of `d` values (`row_of(r)` the r-th), widened to f32, in panels of
/// `width` rows, `[panel][d][width]` (Qᵀ's row tiles, K's key groups), zero from the last row
/// to a whole panel.
#[inline(always)]
fn pack_panels<'a, T: Element + 'a>(
    row_of: impl Fn(usize) -> ArrayView1<'a, T>,
    count: usize,
    d: usize,
    width: usize,
    dst: &mut [f32],
) {
    dst[count / width * width * d..round_up(count, width) * d].fill(0.0);
    let mut row = [0f32; MAX_HEAD_DIM];
    for r in 0..count {
        widen_row(row_of(r), &mut row);
        // Row r's entries, `width` apart in its panel.
        let column = dst[index_in_panels(width, d, r, 0)..].iter_mut().step_by(width);
        column.zip(&row[..d]).for_each(|(y, &x)| *y = x);
    }
}

impl<S: Simd, T: Element> TileKernel<T> for FmaKernel<S> {
    type Packed = f32;
    const QUERY_BLOCK: usize = QUERY_BLOCK;
    const KEY_BLOCK: usize = KEY_BLOCK;
    const STRIP: usize = Self::MR;

    fn q_stride(d: usize) -> usize {
        d
    }
    fn k_len(d: usize) -> usize {
        KEY_BLOCK * d
    }
    fn v_len(dv: usize) -> usize {
        KEY_BLOCK * round_up(dv, Self::MR)
    }
    fn o_len(dv: usize) -> usize {
        dv * QUERY_BLOCK
    }
    fn o_index(dv: usize, r: usize, j: usize) -> usize {
        panel_index::<S>(dv, r, j)
    }
    fn p_len() -> usize {
        0
    }

    /// Qᵀ `[row tile][d][R]`, zero from the last row to a whole register tile.
    #[inline(always)]
    fn pack_q(&self, q: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [f32]) {
        let d = q.row(tokens.start, head).len();
        pack_panels(|r| q.row(tokens.start + r, head), tokens.len(), d, Self::R, dst);
    }

    /// K `[key group][d][MR]`, zero keys up to a whole group (they score 0 and are masked by
    /// the driver).
    #[inline(always)]
    fn pack_k(&self, k: &SequenceRows<T>, keys: Range<usize>, dst: &mut [f32]) {
        pack_panels(|j| k.row(keys.start + j), keys.len(), k.dims(), Self::MR, dst);
    }

    /// V `[column group][key][MR]`, zero past the last key and the last column.
    #[inline(always)]
    fn pack_v(&self, v: &SequenceRows<T>, keys: Range<usize>, dst: &mut [f32]) -> bool {
        let mr = Self::MR;
        let dv = v.dims();
        let (groups, first, keys) = (dv.div_ceil(mr), keys.start, keys.len());
        let width = round_up(keys, mr);
        // Zero columns past dv (the row buffer's tail, up to a whole group) and keys past the
        // last up to a whole group (the value product reads them; their probabilities are 0).
        let mut row = [0f32; MAX_HEAD_DIM + MAX_MR];
        for g in 0..groups {
            dst[g * KEY_BLOCK * mr + keys * mr..g * KEY_BLOCK * mr + width * mr].fill(0.0);
        }
        let mut finite = true;
        for j in 0..keys {
            widen_row(v.row(first + j), &mut row);
            // `&`, not `&&`: no branch, so that LLVM vectorises the check.
            finite &= row[..dv].iter().fold(true, |ok, x| ok & x.is_finite());
            for (g, chunk) in row[..groups * mr].chunks_exact(mr).enumerate() {
                dst[g * KEY_BLOCK * mr + j * mr..][..mr].copy_from_slice(chunk);
            }
        }
        finite
    }

    #[inline(always)]
    fn scores(&self, q: &[f32], k: &[f32], rows: usize, d: usize, keys: usize, s: &mut [f32]) {
        let (mr, tile_rows) = (Self::MR, Self::R);
        assert!(keys.is_multiple_of(mr) && keys <= KEY_BLOCK && rows <= QUERY_BLOCK);
        assert!(q.len() >= d * QUERY_BLOCK && k.len() >= keys * d && s.len() >= KEY_BLOCK * QUERY_BLOCK);
        // Row tile by row tile: the tile's panel of Qᵀ (d × R) stays in L1 while the block's
        // key groups stream past it.
        for r in (0..rows).step_by(tile_rows) {
            for g in 0..keys / mr {
                // SAFETY: the panel of Qᵀ from r · d (d × R; r + R <= QUERY_BLOCK, rows are
                // padded to a whole tile inside the block), key group g (d × MR, g·MR < keys)
                // and keys g·MR..g·MR + MR of the Sᵀ panel from r · KEY_BLOCK are inside the
                // slices (asserted above).
                unsafe {
                    let (q, k, s) = (
                        q[r * d..].as_ptr(),
                        k[g * d * mr..].as_ptr(),
                        s[r * KEY_BLOCK + g * mr * tile_rows..].as_mut_ptr(),
                    );
                    if mr == 6 {
                        score_tile::<S, 6>(self.simd, q, d, k, s)
                    } else {
                        score_tile::<S, 12>(self.simd, q, d, k, s)
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn softmax(
        &self,
        s: &mut [f32],
        _packed: &mut [f32],
        rows: usize,
        keys: usize,
        map: ScoreMap,
        visible: &dyn Fn(usize) -> Option<Range<usize>>,
        state: &mut RowState<'_>,
    ) {
        softmax::update(self.simd, s, KEY_BLOCK, rows, Self::R, keys, map, visible, state);
    }

    #[inline(always)]
    fn probability(&self, s: &[f32], _packed: &[f32], r: usize, j: usize) -> f32 {
        s[panel_index::<S>(KEY_BLOCK, r, j)]
    }

    #[inline(always)]
    fn accumulate(
        &self,
        p: &[f32],
        _packed: &[f32],
        v: &[f32],
        alpha: &[f32],
        rows: usize,
        keys: usize,
        dv: usize,
        o: &mut [f32],
    ) {
        let (mr, tile_rows) = (Self::MR, Self::R);
        assert!(rows <= QUERY_BLOCK && keys <= KEY_BLOCK);
        assert!(p.len() >= KEY_BLOCK * QUERY_BLOCK && v.len() >= round_up(dv, mr) * KEY_BLOCK);
        assert!(o.len() >= dv * QUERY_BLOCK && alpha.len() >= round_up(rows, tile_rows));
        // Row tile outer: its panel of Pᵀ (keys × R) stays in L1 while V streams past.
        for r in (0..rows).step_by(tile_rows) {
            for c in (0..dv).step_by(mr) {
                let m = (dv - c).min(mr);
                let (p, v, alpha) = (p[r * KEY_BLOCK..].as_ptr(), v[c * KEY_BLOCK..].as_ptr(), alpha[r..].as_ptr());
                let o = o[r * dv + c * tile_rows..].as_mut_ptr();
                // SAFETY: the panels of Pᵀ (keys × R) and Oᵀ (columns c..c + m, c + m <= dv)
                // of rows r..r + R (inside the padded block), those rows of alpha, and column
                // group c / MR of V (keys × MR) are inside the slices (asserted above).
                unsafe { value_tile_of::<S>(self.simd, m, p, v, alpha, keys, o) };
            }
        }
    }
}

/// One rank-1 update of an `M × N` register tile, the step of both microkernels:
/// `acc[m][n] += a[m] · b[n·W..(n+1)·W]`, with `N` vector loads and `M` broadcasts.
///
/// A function rather than a closure: a closure is a function of its own, compiled without the
/// instruction set's target features whenever LLVM declines to inline it (which made the
/// 12-row tile thirty times slower).
///
/// # Safety
/// `a` must hold `M` f32, `b` `N` vectors of `W` f32.
#[inline(always)]
unsafe fn fma_step<S: Simd, const M: usize, const N: usize>(
    simd: S,
    acc: &mut [[S::f32s; N]; M],
    a: *const f32,
    b: *const f32,
) {
    let w = S::F32_LANES;
    let mut bv = [simd.splat_f32s(0.0); N];
    for (n, x) in bv.iter_mut().enumerate() {
        // SAFETY: n < N: the caller's guarantee.
        *x = unsafe { load::<S>(b.add(n * w)) };
    }
    for (m, acc) in acc.iter_mut().enumerate() {
        // SAFETY: m < M: the caller's guarantee.
        let av = simd.splat_f32s(unsafe { *a.add(m) });
        for n in 0..N {
            acc[n] = simd.mul_add_f32s(av, bv[n], acc[n]);
        }
    }
}

/// The score microkernel: `sᵀ[m][0..R] = Σ_d k[d][m] · qᵀ[d][0..R]` for the `M` keys of one
/// group and `R = NR·W` query rows: `M × NR` accumulators, `NR` loads and `M` broadcasts per
/// step of `d`.
///
/// # Safety
/// `q` must hold `d` rows of `R` f32 at row stride `R`; `k` a key group of `d × M`
/// f32; `s` `M` rows of `R` f32 at row stride `R`.
#[inline(always)]
unsafe fn score_tile<S: Simd, const M: usize>(simd: S, q: *const f32, d: usize, k: *const f32, s: *mut f32) {
    let (w, r) = (S::F32_LANES, NR * S::F32_LANES);
    // Flat arrays and index loops: LLVM keeps these in registers without shuffling them.
    let mut acc = [[simd.splat_f32s(0.0); NR]; M];
    // Two steps of d per turn: half the loop overhead.
    for dd in (0..d & !1).step_by(2) {
        // SAFETY: dd + 1 < d: rows dd and dd + 1 of qᵀ and of the key group.
        unsafe {
            fma_step::<S, M, NR>(simd, &mut acc, k.add(dd * M), q.add(dd * r));
            fma_step::<S, M, NR>(simd, &mut acc, k.add((dd + 1) * M), q.add((dd + 1) * r));
        }
    }
    if d % 2 == 1 {
        // SAFETY: d - 1 < d, as above.
        unsafe { fma_step::<S, M, NR>(simd, &mut acc, k.add((d - 1) * M), q.add((d - 1) * r)) };
    }
    for (m, acc) in acc.iter().enumerate() {
        for (n, &x) in acc.iter().enumerate() {
            // SAFETY: row m < M, columns n·W..(n+1)·W < R: inside s.
            unsafe { store::<S>(s.add(m * r + n * w), x) };
        }
    }
}

/// [`value_tile`] for `m` output columns (at most `MR`), known at run time.
///
/// # Safety
/// As [`value_tile`].
#[inline(always)]
unsafe fn value_tile_of<S: Simd>(
    simd: S,
    m: usize,
    p: *const f32,
    v: *const f32,
    alpha: *const f32,
    keys: usize,
    o: *mut f32,
) {
    macro_rules! dispatch {
        ($($m:literal)*) => {
            match m {
                // SAFETY: the caller's guarantee.
                $($m => unsafe { value_tile::<S, $m>(simd, p, v, alpha, keys, o) },)*
                _ => unreachable!(),
            }
        };
    }
    if broadcasts_per_tile(S::REGISTER_COUNT) == 6 {
        dispatch!(1 2 3 4 5 6)
    } else {
        dispatch!(1 2 3 4 5 6 7 8 9 10 11 12)
    }
}

/// The value microkernel: `oᵀ[m][..] = alpha · oᵀ[m][..] + Σ_j v[j][m] · pᵀ[j][..]` for `M`
/// output columns and `R = NR·W` query rows: `M × NR` accumulators, `NR` loads and `M`
/// broadcasts per key.
///
/// # Safety
/// `p` must hold `keys` rows of `R` f32 (row stride `R`), `alpha` `R` f32, `v` `keys`
/// rows of at least `M` f32 (row stride `MR`), `o` `M` rows of `R` f32 (row stride
/// `R`).
#[inline(always)]
unsafe fn value_tile<S: Simd, const M: usize>(
    simd: S,
    p: *const f32,
    v: *const f32,
    alpha: *const f32,
    keys: usize,
    o: *mut f32,
) {
    let (w, r) = (S::F32_LANES, NR * S::F32_LANES);
    let mr = broadcasts_per_tile(S::REGISTER_COUNT);
    // The accumulator, rescaled by alpha (loops, not closures: see `fma_step`).
    let mut a = [simd.splat_f32s(0.0); NR];
    for (n, x) in a.iter_mut().enumerate() {
        // SAFETY: n < NR: inside alpha.
        *x = unsafe { load::<S>(alpha.add(n * w)) };
    }
    let mut acc = [[simd.splat_f32s(0.0); NR]; M];
    for (m, acc) in acc.iter_mut().enumerate() {
        for (n, x) in acc.iter_mut().enumerate() {
            // SAFETY: m < M, n < NR: inside o.
            *x = simd.mul_f32s(unsafe { load::<S>(o.add(m * r + n * w)) }, a[n]);
        }
    }
    let mut j = 0;
    // Two keys per turn: half the loop overhead.
    while j + 2 <= keys {
        // SAFETY: j + 1 < keys: rows j, j + 1 of pᵀ and of v.
        unsafe {
            fma_step::<S, M, NR>(simd, &mut acc, v.add(j * mr), p.add(j * r));
            fma_step::<S, M, NR>(simd, &mut acc, v.add((j + 1) * mr), p.add((j + 1) * r));
        }
        j += 2;
    }
    if j < keys {
        // SAFETY: j < keys, as above.
        unsafe { fma_step::<S, M, NR>(simd, &mut acc, v.add(j * mr), p.add(j * r)) };
    }
    for (m, acc) in acc.iter().enumerate() {
        for (n, &x) in acc.iter().enumerate() {
            // SAFETY: m < M, n < NR: inside o.
            unsafe { store::<S>(o.add(m * r + n * w), x) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bit pattern of `T` widened by `widen_slice`, against `half`'s conversion
    /// (`reference`); NaN for NaN.
    fn check_widening<T: Element>(reference: impl Fn(u16) -> f32) {
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let mut wide = vec![0f32; bits.len()];
        widen_slice::<T>(bytemuck::cast_slice(&bits), &mut wide);
        for (&b, &w) in bits.iter().zip(&wide) {
            let exact = reference(b);
            assert!(
                w.to_bits() == exact.to_bits() || (w.is_nan() && exact.is_nan()),
                "{:?} {b:#06x}: {w:e}, not {exact:e}",
                T::DTYPE
            );
        }
    }

    #[test]
    fn widening_is_exact_for_every_f16_and_bf16() {
        check_widening::<half::f16>(|b| half::f16::from_bits(b).to_f32());
        check_widening::<half::bf16>(|b| half::bf16::from_bits(b).to_f32());
    }
}

//! The portable kernel: f32 fused multiply-adds, written once against `pulp::Simd` (AVX-512,
//! AVX2+FMA, NEON, scalar). Serves f16 and f32 input everywhere, and bf16 where the CPU has no
//! bf16 dot product. Inputs are widened to f32 exactly when packed.
//!
//! Both products run on one register-blocked microkernel shape (as `gemm` and
//! `matrixmultiply` do): `MR` rows × [`NR`] vectors of accumulators, `NR` vector loads and `MR`
//! broadcasts per `MR × NR` fused multiply-adds, no bounds checks inside the loop. `MR` is 6
//! where the instruction set has 16 registers (AVX2, scalar: 12 accumulators, 2 operands and a
//! broadcast, 15 registers; 4 × 3 needs all 16 and LLVM then spills and shuffles them) and 12
//! where it has 32 (AVX-512, NEON: 24 accumulators).
//!
//! Layouts (`W` = f32 lanes, `P = NR·W` keys per panel): Q `[row tile][d][MR]`; K `[panel][d][P]` (keys
//! across lanes, so a score row is `P` keys wide per `d` step); V `[key][dv padded to W]`; the
//! accumulator `[row][dv padded to W]`.

use super::softmax::{self, RowState, ScoreMap};
use super::tile::{round_up, TileKernel};
use crate::element::Element;
use crate::layout::Rows;
use crate::problem::MAX_HEAD_DIM;
use core::ops::Range;
use pulp::Simd;

/// Query rows per work item: a whole number of register tiles (6 or 12 rows).
const QUERY_BLOCK: usize = 96;
/// Keys per block: a whole number of panels for every lane count (16 on AVX2, 32 on AVX-512,
/// 8 on NEON, 2 scalar).
const KEY_BLOCK: usize = 96;
/// Vectors per register tile: of keys in the score product, of output columns in the value
/// product.
const NR: usize = 2;

/// Rows per register tile for an instruction set with `registers` vector registers (see the
/// module docs).
const fn rows_per_tile(registers: usize) -> usize {
    if registers >= 32 {
        12
    } else {
        6
    }
}

const _: () = assert!(QUERY_BLOCK.is_multiple_of(24) && KEY_BLOCK.is_multiple_of(NR * 16) && NR == 2);

/// The portable kernel for the instruction set `S`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FmaKernel<S> {
    simd: S,
}

impl<S: Simd> FmaKernel<S> {
    pub fn new(simd: S) -> Self {
        FmaKernel { simd }
    }
}

/// Copies `src` widened to f32 into `dst` (which may be longer; the rest is left alone).
#[inline(always)]
fn widen<T: Element>(src: ndarray::ArrayView1<T>, dst: &mut [f32]) {
    match src.as_slice() {
        Some(s) => widen_slice(s, &mut dst[..s.len()]),
        None => dst.iter_mut().zip(src.iter()).for_each(|(d, x)| *d = x.to_f32()),
    }
}

/// `dst = src` widened to f32, with the CPU's conversion instructions where it has them (F16C
/// for f16, found at run time by `half`).
#[inline(always)]
fn widen_slice<T: Element>(src: &[T], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    match T::DTYPE {
        crate::DType::F16 => bytemuck::cast_slice::<T, half::f16>(src).convert_to_f32_slice(dst),
        crate::DType::BF16 => bytemuck::cast_slice::<T, half::bf16>(src).convert_to_f32_slice(dst),
        crate::DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
    }
}

/// Packs the rows `tokens` of `head` in groups of `width` rows, each group `[d][width]`
/// (row `j` of the group in column `j`), widened to f32: Q's row tiles and K's key panels.
#[inline(always)]
fn pack_in_groups<T: Element>(rows: &Rows<T>, tokens: Range<usize>, head: usize, width: usize, dst: &mut [f32]) {
    let d = rows.row(tokens.start, head).len();
    let mut row = [0f32; MAX_HEAD_DIM];
    for (j, token) in tokens.enumerate() {
        widen(rows.row(token, head), &mut row[..d]);
        let first = (j / width) * d * width + j % width;
        for (dd, &x) in row[..d].iter().enumerate() {
            dst[first + dd * width] = x;
        }
    }
}

/// One vector from `p` (no alignment needed).
///
/// # Safety
/// `p` must be valid for reading `S::F32_LANES` f32.
#[inline(always)]
unsafe fn load<S: Simd>(p: *const f32) -> S::f32s {
    // SAFETY: the caller's guarantee; `S::f32s` is plain data of exactly that many f32.
    unsafe { core::ptr::read_unaligned(p.cast::<S::f32s>()) }
}

/// Writes one vector to `p` (no alignment needed).
///
/// # Safety
/// `p` must be valid for writing `S::F32_LANES` f32.
#[inline(always)]
unsafe fn store<S: Simd>(p: *mut f32, x: S::f32s) {
    // SAFETY: the caller's guarantee.
    unsafe { core::ptr::write_unaligned(p.cast::<S::f32s>(), x) }
}

impl<S: Simd, T: Element> TileKernel<T> for FmaKernel<S> {
    type Packed = f32;
    const QUERY_BLOCK: usize = QUERY_BLOCK;
    const KEY_BLOCK: usize = KEY_BLOCK;
    const STRIP: usize = NR * S::F32_LANES;

    fn q_stride(d: usize) -> usize {
        d
    }
    fn k_len(d: usize) -> usize {
        KEY_BLOCK * d
    }
    fn v_len(dv: usize) -> usize {
        KEY_BLOCK * <Self as TileKernel<T>>::o_stride(dv)
    }
    fn o_stride(dv: usize) -> usize {
        round_up(dv, S::F32_LANES)
    }
    fn p_len() -> usize {
        0
    }

    #[inline(always)]
    fn pack_q(&self, q: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [f32]) {
        pack_in_groups(q, tokens, head, rows_per_tile(S::REGISTER_COUNT), dst);
    }

    #[inline(always)]
    fn pack_k(&self, k: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [f32]) {
        let panel = NR * S::F32_LANES;
        let d = k.row(tokens.start, head).len();
        // Zero keys up to a whole panel: they score 0 and are masked by the driver.
        dst[..round_up(tokens.len(), panel) * d].fill(0.0);
        pack_in_groups(k, tokens, head, panel, dst);
    }

    #[inline(always)]
    fn pack_v(&self, v: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [f32]) -> bool {
        let dv = v.row(tokens.start, head).len();
        let stride = <Self as TileKernel<T>>::o_stride(dv);
        let width = round_up(tokens.len(), NR * S::F32_LANES);
        dst[..width * stride].fill(0.0);
        for (j, token) in tokens.enumerate() {
            widen(v.row(token, head), &mut dst[j * stride..j * stride + dv]);
        }
        dst[..width * stride].iter().all(|x| x.is_finite())
    }

    #[inline(always)]
    fn scores(&self, q: &[f32], k: &[f32], rows: usize, d: usize, keys: usize, s: &mut [f32]) {
        let panel = NR * S::F32_LANES;
        let mr = rows_per_tile(S::REGISTER_COUNT);
        assert!(keys.is_multiple_of(panel) && keys <= KEY_BLOCK && rows <= QUERY_BLOCK);
        // A partial last row tile still spans a whole tile of Q (`[d][mr]`, `m` columns read).
        assert!(q.len() >= rows.next_multiple_of(mr) * d && k.len() >= keys * d && s.len() >= rows * KEY_BLOCK);
        // Row tile by row tile: the tile of Q (d × mr) stays in L1 while the block's key panels
        // stream past it.
        let mut r = 0;
        while r < rows {
            let m = (rows - r).min(mr);
            // Row tile r / mr of Q starts at r · d: tiles are mr rows × d, `[d][mr]`.
            let q = q[r * d..].as_ptr();
            for p in 0..keys / panel {
                let (k_panel, s) = (k[p * panel * d..].as_ptr(), s[r * KEY_BLOCK + p * panel..].as_mut_ptr());
                macro_rules! tile {
                    ($($m:literal)*) => {
                        match m {
                            // SAFETY: the row tile of q (d × mr from r · d, m rows used),
                            // rows r..r + m of s (a panel's P columns at row stride
                            // KEY_BLOCK) and the panel's d × P packed keys are inside the
                            // slices (asserted above: q holds every row tile whole).
                            $($m => unsafe { score_tile::<S, $m>(self.simd, q, mr, d, k_panel, s) },)*
                            _ => unreachable!(),
                        }
                    };
                }
                if mr == 6 {
                    tile!(1 2 3 4 5 6)
                } else {
                    tile!(1 2 3 4 5 6 7 8 9 10 11 12)
                }
            }
            r += m;
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
        softmax::update(self.simd, s, KEY_BLOCK, rows, keys, map, visible, state);
    }

    #[inline(always)]
    fn probability(&self, s: &[f32], _packed: &[f32], r: usize, j: usize) -> f32 {
        s[r * KEY_BLOCK + j]
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
        let w = S::F32_LANES;
        let mr = rows_per_tile(S::REGISTER_COUNT);
        let stride = <Self as TileKernel<T>>::o_stride(dv);
        let vectors = stride / w;
        assert!(rows <= QUERY_BLOCK && keys <= KEY_BLOCK);
        assert!(p.len() >= rows * KEY_BLOCK && v.len() >= keys * stride);
        assert!(o.len() >= rows * stride && alpha.len() >= rows);
        // One tile: rows r..r + m, vectors c..c + n. (A macro, not a closure: see `fma_step`.)
        macro_rules! tile {
            ($r:expr, $m:expr, $c:expr, $n:expr) => {{
                let (r, m, c, n) = ($r, $m, $c, $n);
                let (p, v, alpha) = (p[r * KEY_BLOCK..].as_ptr(), v[c * w..].as_ptr(), alpha[r..].as_ptr());
                let o = o[r * stride + c * w..].as_mut_ptr();
                // SAFETY: rows r..r + m of p (keys each, row stride KEY_BLOCK), of alpha and of
                // o (n vectors from column c·W, row stride `stride`), and keys rows of v (n
                // vectors from column c·W) are inside the slices (asserted above;
                // r + m <= rows, c + n <= stride / W).
                unsafe { value_tile_of(self.simd, m, n, p, v, alpha, keys, stride, o) };
            }};
        }
        // Whole groups of NR vectors: mr-row tiles.
        let grouped = vectors / NR * NR;
        for r in (0..rows).step_by(mr) {
            for c in (0..grouped).step_by(NR) {
                tile!(r, (rows - r).min(mr), c, NR);
            }
        }
        // A last single vector (head_dim_v 72 on AVX2: 9 vectors): 2·mr-row tiles, as many
        // accumulators as the grouped tiles, since it needs one operand register, not NR.
        if grouped < vectors {
            let mut r = 0;
            while r < rows {
                let m = if rows - r >= 2 * mr { 2 * mr } else { (rows - r).min(mr) };
                tile!(r, m, grouped, 1);
                r += m;
            }
        }
    }
}

/// One rank-1 update of an `M × N` register tile, the step of both microkernels:
/// `acc[m][n] += a[m · a_stride] · b[n·W..(n+1)·W]`, with `N` vector loads and `M` broadcasts.
///
/// A function rather than a closure: a closure is a function of its own, compiled without the
/// instruction set's target features whenever LLVM declines to inline it (which made the
/// 12-row tile thirty times slower).
///
/// # Safety
/// `a` must hold `M` f32 at stride `a_stride`, `b` `N` vectors of `w` f32.
#[inline(always)]
unsafe fn fma_step<S: Simd, const M: usize, const N: usize>(
    simd: S,
    acc: &mut [[S::f32s; N]; M],
    a: *const f32,
    a_stride: usize,
    b: *const f32,
    w: usize,
) {
    let mut bv = [simd.splat_f32s(0.0); N];
    for (n, x) in bv.iter_mut().enumerate() {
        // SAFETY: n < N: the caller's guarantee.
        *x = unsafe { load::<S>(b.add(n * w)) };
    }
    for (m, acc) in acc.iter_mut().enumerate() {
        // SAFETY: m < M: the caller's guarantee.
        let av = simd.splat_f32s(unsafe { *a.add(m * a_stride) });
        for n in 0..N {
            acc[n] = simd.mul_add_f32s(av, bv[n], acc[n]);
        }
    }
}

/// [`value_tile`] for `m` rows and `n` vectors, known at run time: `n` is 1 or [`NR`], `m` at
/// most the rows of a tile or (for `n = 1`) exactly twice that.
///
/// # Safety
/// As [`value_tile`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn value_tile_of<S: Simd>(
    simd: S,
    m: usize,
    n: usize,
    p: *const f32,
    v: *const f32,
    alpha: *const f32,
    keys: usize,
    stride: usize,
    o: *mut f32,
) {
    macro_rules! dispatch {
        ($($m:literal)*) => {
            match (m, n) {
                $(
                    // SAFETY: the caller's guarantee.
                    ($m, 2) => unsafe { value_tile::<S, $m, 2>(simd, p, v, alpha, keys, stride, o) },
                    // SAFETY: the caller's guarantee.
                    ($m, 1) => unsafe { value_tile::<S, $m, 1>(simd, p, v, alpha, keys, stride, o) },
                )*
                _ => unreachable!(),
            }
        };
    }
    let mr = rows_per_tile(S::REGISTER_COUNT);
    match (mr, m) {
        // SAFETY: the caller's guarantee.
        (6, 12) => unsafe { value_tile::<S, 12, 1>(simd, p, v, alpha, keys, stride, o) },
        // SAFETY: the caller's guarantee.
        (12, 24) => unsafe { value_tile::<S, 24, 1>(simd, p, v, alpha, keys, stride, o) },
        (6, _) => dispatch!(1 2 3 4 5 6),
        _ => dispatch!(1 2 3 4 5 6 7 8 9 10 11 12),
    }
}

/// The score microkernel: `s[m][0..P] = Σ_d q[d][m] · k[d][0..P]` for `M` rows and one panel
/// of `P = NR·W` keys: `M × NR` accumulators, `NR` loads and `M` broadcasts per step of `d`.
/// Q's row tile is stored `[d][mr]`, so that every broadcast is at a fixed offset from one
/// moving pointer.
///
/// # Safety
/// `q` must hold `d × mr` f32 (`M <= mr`); `k` a panel of `d × P` f32; `s` `M` rows of `P` f32
/// at row stride `KEY_BLOCK`.
#[inline(always)]
unsafe fn score_tile<S: Simd, const M: usize>(simd: S, q: *const f32, mr: usize, d: usize, k: *const f32, s: *mut f32) {
    let w = S::F32_LANES;
    // Flat arrays and index loops: LLVM keeps these in registers without shuffling them.
    let mut acc = [[simd.splat_f32s(0.0); NR]; M];
    // Two steps of d per turn: half the loop overhead.
    for dd in (0..d & !1).step_by(2) {
        // SAFETY: dd + 1 < d: rows dd and dd + 1 of q and of the panel.
        unsafe {
            fma_step::<S, M, NR>(simd, &mut acc, q.add(dd * mr), 1, k.add(dd * NR * w), w);
            fma_step::<S, M, NR>(simd, &mut acc, q.add((dd + 1) * mr), 1, k.add((dd + 1) * NR * w), w);
        }
    }
    if d % 2 == 1 {
        // SAFETY: d - 1 < d, as above.
        unsafe { fma_step::<S, M, NR>(simd, &mut acc, q.add((d - 1) * mr), 1, k.add((d - 1) * NR * w), w) };
    }
    for (m, acc) in acc.iter().enumerate() {
        for (n, &x) in acc.iter().enumerate() {
            // SAFETY: row m < M, columns n·W..(n+1)·W < P: inside s.
            unsafe { store::<S>(s.add(m * KEY_BLOCK + n * w), x) };
        }
    }
}

/// The value microkernel: `o[m][..] = alpha[m] · o[m][..] + Σ_j p[m][j] · v[j][..]` for `M`
/// rows and `N` vectors of columns: `M × N` accumulators, `N` loads and `M` broadcasts per key.
///
/// # Safety
/// `p` must hold `M` rows of `keys` f32 (row stride `KEY_BLOCK`), `alpha` `M` f32, `v` `keys`
/// rows of `N` vectors (row stride `stride`), `o` `M` rows of `N` vectors (row stride `stride`).
#[inline(always)]
unsafe fn value_tile<S: Simd, const M: usize, const N: usize>(
    simd: S,
    p: *const f32,
    v: *const f32,
    alpha: *const f32,
    keys: usize,
    stride: usize,
    o: *mut f32,
) {
    let w = S::F32_LANES;
    // The accumulator rows, rescaled by alpha (loops, not closures: see `fma_step`).
    let mut acc = [[simd.splat_f32s(0.0); N]; M];
    for (m, acc) in acc.iter_mut().enumerate() {
        // SAFETY: m < M: inside alpha.
        let a = simd.splat_f32s(unsafe { *alpha.add(m) });
        for (n, x) in acc.iter_mut().enumerate() {
            // SAFETY: m < M, n < N: inside o.
            *x = simd.mul_f32s(unsafe { load::<S>(o.add(m * stride + n * w)) }, a);
        }
    }
    // Two keys per turn: half the loop overhead (`keys` is a whole number of panels, even).
    debug_assert!(keys.is_multiple_of(2));
    for j in (0..keys).step_by(2) {
        // SAFETY: j + 1 < keys: columns j, j + 1 of p, rows j, j + 1 of v.
        unsafe {
            fma_step::<S, M, N>(simd, &mut acc, p.add(j), KEY_BLOCK, v.add(j * stride), w);
            fma_step::<S, M, N>(simd, &mut acc, p.add(j + 1), KEY_BLOCK, v.add((j + 1) * stride), w);
        }
    }
    for (m, acc) in acc.iter().enumerate() {
        for (n, &x) in acc.iter().enumerate() {
            // SAFETY: m < M, n < N: inside o.
            unsafe { store::<S>(o.add(m * stride + n * w), x) };
        }
    }
}
const _: () = assert!(QUERY_BLOCK <= softmax::MAX_ROWS);

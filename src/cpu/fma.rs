//! The portable kernel: f32 fused multiply-adds, written once against `pulp::Simd` (AVX-512,
//! AVX2+FMA, NEON, scalar). Serves f16 and f32 input everywhere, and bf16 where the CPU has no
//! bf16 dot product. Inputs are widened to f32 exactly when packed.
//!
//! Layouts (`W` = f32 lanes): Q `[row][d]`; K `[strip][d][W]` (keys across lanes, so a score
//! row is `W` keys wide per register); V `[key][dv padded to W]`; the accumulator
//! `[row][dv padded to W]`.

use super::softmax::{self, RowState, ScoreMap};
use super::tile::{round_up, TileKernel};
use crate::element::Element;
use crate::layout::Rows;
use core::ops::Range;
use pulp::Simd;

/// Query rows per work item.
const QUERY_BLOCK: usize = 64;
/// Keys per block.
const KEY_BLOCK: usize = 64;
/// Rows per register tile.
const MR: usize = 4;
/// Key strips (score products) or accumulator registers (value products) per register tile.
const NR: usize = 2;

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
        Some(s) => dst.iter_mut().zip(s).for_each(|(d, x)| *d = x.to_f32()),
        None => dst.iter_mut().zip(src.iter()).for_each(|(d, x)| *d = x.to_f32()),
    }
}

impl<S: Simd, T: Element> TileKernel<T> for FmaKernel<S> {
    type Packed = f32;
    const QUERY_BLOCK: usize = QUERY_BLOCK;
    const KEY_BLOCK: usize = KEY_BLOCK;
    const STRIP: usize = S::F32_LANES;

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
        let d = q.row(tokens.start, head).len();
        for (r, token) in tokens.enumerate() {
            widen(q.row(token, head), &mut dst[r * d..(r + 1) * d]);
        }
    }

    #[inline(always)]
    fn pack_k(&self, k: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [f32]) {
        let w = S::F32_LANES;
        let n = tokens.len();
        let d = k.row(tokens.start, head).len();
        let strips = n.div_ceil(w);
        dst[..strips * d * w].fill(0.0);
        for (j, token) in tokens.enumerate() {
            let (strip, lane) = (j / w, j % w);
            let panel = &mut dst[strip * d * w..(strip + 1) * d * w];
            for (dd, x) in k.row(token, head).iter().enumerate() {
                panel[dd * w + lane] = x.to_f32();
            }
        }
    }

    #[inline(always)]
    fn pack_v(&self, v: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [f32]) -> bool {
        let dv = v.row(tokens.start, head).len();
        let stride = <Self as TileKernel<T>>::o_stride(dv);
        let width = round_up(tokens.len(), S::F32_LANES);
        dst[..width * stride].fill(0.0);
        for (j, token) in tokens.enumerate() {
            widen(v.row(token, head), &mut dst[j * stride..j * stride + dv]);
        }
        dst[..width * stride].iter().all(|x| x.is_finite())
    }

    #[inline(always)]
    fn scores(&self, q: &[f32], k: &[f32], rows: usize, d: usize, keys: usize, s: &mut [f32]) {
        let w = S::F32_LANES;
        let strips = keys / w;
        let panel = d * w;
        assert!(
            q.len() >= rows * d && k.len() >= strips * panel && s.len() >= rows.saturating_sub(1) * KEY_BLOCK + keys
        );
        let mut r = 0;
        while r < rows {
            let mr = (rows - r).min(MR);
            let mut n = 0;
            while n < strips {
                let nr = (strips - n).min(NR);
                let (q, k) = (&q[r * d..], &k[n * panel..]);
                let s = &mut s[r * KEY_BLOCK + n * w..];
                macro_rules! tile {
                    ($($m:literal),*) => {
                        match (mr, nr) {
                            $(($m, 2) => score_tile::<S, $m, 2>(self.simd, q, k, d, s),
                              ($m, _) => score_tile::<S, $m, 1>(self.simd, q, k, d, s),)*
                            _ => unreachable!(),
                        }
                    };
                }
                tile!(1, 2, 3, 4);
                n += nr;
            }
            r += mr;
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
        let stride = <Self as TileKernel<T>>::o_stride(dv);
        let vectors = stride / w;
        assert!(p.len() >= rows.saturating_sub(1) * KEY_BLOCK + keys && v.len() >= keys * stride);
        assert!(o.len() >= rows * stride && alpha.len() >= rows);
        let mut r = 0;
        while r < rows {
            let mr = (rows - r).min(MR);
            let mut n = 0;
            while n < vectors {
                let nv = (vectors - n).min(NR);
                let (p, v, alpha) = (&p[r * KEY_BLOCK..], &v[n * w..], &alpha[r..]);
                let o = &mut o[r * stride + n * w..];
                macro_rules! tile {
                    ($($m:literal),*) => {
                        match (mr, nv) {
                            $(($m, 2) => value_tile::<S, $m, 2>(self.simd, p, v, alpha, keys, stride, o),
                              ($m, _) => value_tile::<S, $m, 1>(self.simd, p, v, alpha, keys, stride, o),)*
                            _ => unreachable!(),
                        }
                    };
                }
                tile!(1, 2, 3, 4);
                n += nv;
            }
            r += mr;
        }
    }
}

const _: () = assert!(QUERY_BLOCK.is_multiple_of(MR));

/// `s[r][n·W..] = Σ_d q[r][d] · k[n][d][..]` for an `M×N` register tile.
#[inline(always)]
fn score_tile<S: Simd, const M: usize, const N: usize>(simd: S, q: &[f32], k: &[f32], d: usize, s: &mut [f32]) {
    let w = S::F32_LANES;
    let (k_vectors, _) = S::as_simd_f32s(&k[..N * d * w]);
    let q = &q[..M * d];
    let mut acc = [[simd.splat_f32s(0.0); N]; M];
    for dd in 0..d {
        let kv: [S::f32s; N] = core::array::from_fn(|n| k_vectors[n * d + dd]);
        for (m, acc) in acc.iter_mut().enumerate() {
            let qv = simd.splat_f32s(q[m * d + dd]);
            for n in 0..N {
                acc[n] = simd.mul_add_f32s(qv, kv[n], acc[n]);
            }
        }
    }
    for (m, acc) in acc.iter().enumerate() {
        let (row, _) = S::as_mut_simd_f32s(&mut s[m * KEY_BLOCK..m * KEY_BLOCK + N * w]);
        row.copy_from_slice(acc);
    }
}

/// `o[r][..] = alpha[r] · o[r][..] + Σ_j p[r][j] · v[j][..]` for an `M×N` register tile.
#[inline(always)]
fn value_tile<S: Simd, const M: usize, const N: usize>(
    simd: S,
    p: &[f32],
    v: &[f32],
    alpha: &[f32],
    keys: usize,
    stride: usize,
    o: &mut [f32],
) {
    let w = S::F32_LANES;
    let mut acc: [[S::f32s; N]; M] = core::array::from_fn(|m| {
        let (row, _) = S::as_simd_f32s(&o[m * stride..m * stride + N * w]);
        let a = simd.splat_f32s(alpha[m]);
        core::array::from_fn(|n| simd.mul_f32s(row[n], a))
    });
    for j in 0..keys {
        let (vv, _) = S::as_simd_f32s(&v[j * stride..j * stride + N * w]);
        for (m, acc) in acc.iter_mut().enumerate() {
            let pv = simd.splat_f32s(p[m * KEY_BLOCK + j]);
            for n in 0..N {
                acc[n] = simd.mul_add_f32s(pv, vv[n], acc[n]);
            }
        }
    }
    for (m, acc) in acc.iter().enumerate() {
        let (row, _) = S::as_mut_simd_f32s(&mut o[m * stride..m * stride + N * w]);
        row.copy_from_slice(acc);
    }
}

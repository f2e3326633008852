//! The x86-64 kernel for bf16 input on CPUs with AVX-512 BF16: both products run on
//! `vdpbf16ps`, which multiplies pairs of bf16 exactly and adds them into f32 lanes.
//!
//! Layouts, with `u32` holding a pair of bf16 (the lower-index element in the low half):
//! - Q `[row][d/2]` pairs along head_dim, broadcast one pair at a time;
//! - K `[strip][d/2][16]`: 16 keys across the lanes, so one instruction advances 16 scores by
//!   two head_dim terms;
//! - P `[row][keys/2]` pairs along keys (the softmax output rounded to bf16, as FlashAttention
//!   does before its second product);
//! - V `[keys/2][dv padded to 16]`: two keys interleaved per lane;
//! - the accumulator `[row][dv padded to 16]` in f32.
//!
//! head_dim is only padded to an even count, so 72 costs exactly 36 pair steps.

use super::pack_bf16;
use super::score::ScoreMap;
use super::softmax::RowState;
use super::softmax_bf16;
use super::tile::{round_up, TileKernel};
use crate::element::{DType, Element};
use crate::layout::{Rows, SequenceRows};
use core::arch::x86_64::*;
use core::marker::PhantomData;
use core::ops::Range;

/// Query rows per work item.
const QUERY_BLOCK: usize = 64;
/// Keys per block.
const KEY_BLOCK: usize = 64;

/// The AVX-512 BF16 kernel; only constructed for bf16 input on a CPU that has the instructions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bf16DotKernel<T> {
    simd: pulp::x86::V4,
    _element: PhantomData<T>,
}

/// Whether this CPU runs the kernel.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512bf16")
}

impl<T: Element> Bf16DotKernel<T> {
    /// The kernel, if `T` is bf16 and the CPU has AVX-512 BF16.
    pub fn try_new() -> Option<Self> {
        let simd = pulp::x86::V4::try_new()?;
        (T::DTYPE == DType::BF16 && available()).then_some(Bf16DotKernel { simd, _element: PhantomData })
    }
}

impl<T: Element> TileKernel<T> for Bf16DotKernel<T> {
    type Packed = u32;
    const QUERY_BLOCK: usize = QUERY_BLOCK;
    const KEY_BLOCK: usize = KEY_BLOCK;
    const STRIP: usize = 16;

    fn q_stride(d: usize) -> usize {
        d.div_ceil(2)
    }
    fn k_len(d: usize) -> usize {
        KEY_BLOCK * d.div_ceil(2)
    }
    fn v_len(dv: usize) -> usize {
        KEY_BLOCK / 2 * round_up(dv, 16)
    }
    fn o_len(dv: usize) -> usize {
        QUERY_BLOCK * round_up(dv, 16)
    }
    fn o_index(dv: usize, r: usize, j: usize) -> usize {
        r * round_up(dv, 16) + j
    }
    fn p_len() -> usize {
        QUERY_BLOCK * KEY_BLOCK / 2
    }

    fn pack_q(&self, q: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [u32]) {
        let d = q.row(tokens.start, head).len();
        pack_bf16::pack_queries(q, tokens.clone(), head, round_up(d, 2), tokens.len(), dst);
    }

    fn pack_k(&self, k: &SequenceRows<T>, tokens: Range<usize>, dst: &mut [u32]) {
        let d = k.dims();
        // SAFETY: the CPU has AVX-512F/BW (this kernel exists only after `available()`).
        unsafe { pack_bf16::pack_keys(k, tokens.clone(), d.div_ceil(2), round_up(tokens.len(), 16), dst) };
    }

    fn pack_v(&self, v: &SequenceRows<T>, tokens: Range<usize>, dst: &mut [u32]) -> bool {
        let dv = v.dims();
        // SAFETY: as above.
        unsafe { pack_bf16::pack_values(v, tokens.clone(), round_up(dv, 16), round_up(tokens.len(), 16), dst) }
    }

    fn scores(&self, q: &[u32], k: &[u32], rows: usize, d: usize, keys: usize, s: &mut [f32]) {
        let pairs = d.div_ceil(2);
        let strips = keys / 16;
        assert!(rows <= QUERY_BLOCK && strips <= KEY_BLOCK / 16 && keys.is_multiple_of(16));
        assert!(q.len() >= rows * pairs && k.len() >= strips * pairs * 16 && s.len() >= rows * KEY_BLOCK);
        const M: usize = 6;
        let mut r = 0;
        while r < rows {
            let m = (rows - r).min(M);
            let (q, s) = (q[r * pairs..].as_ptr(), s[r * KEY_BLOCK..].as_mut_ptr());
            macro_rules! tile {
                ($(($mm:literal, $nn:literal)),*) => {
                    match (m, strips) {
                        // SAFETY: the CPU has the features (this kernel exists only after
                        // `available()`), and the asserts above show the tile reads `m` rows of
                        // `pairs` from q, `strips` panels from k and writes `m` rows of `keys`
                        // into s, all inside the slices.
                        $(($mm, $nn) => unsafe { score_tile::<$mm, $nn>(q, pairs, k.as_ptr(), s) },)*
                        _ => unreachable!(),
                    }
                };
            }
            tile!(
                (1, 1),
                (1, 2),
                (1, 3),
                (1, 4),
                (2, 1),
                (2, 2),
                (2, 3),
                (2, 4),
                (3, 1),
                (3, 2),
                (3, 3),
                (3, 4),
                (4, 1),
                (4, 2),
                (4, 3),
                (4, 4),
                (5, 1),
                (5, 2),
                (5, 3),
                (5, 4),
                (6, 1),
                (6, 2),
                (6, 3),
                (6, 4)
            );
            r += m;
        }
    }

    softmax_bf16::bf16_pair_softmax!(KEY_BLOCK, |rows: usize| rows);

    fn accumulate(
        &self,
        _s: &[f32],
        p: &[u32],
        v: &[u32],
        alpha: &[f32],
        rows: usize,
        keys: usize,
        dv: usize,
        o: &mut [f32],
    ) {
        let stride = round_up(dv, 16);
        let pairs = keys / 2;
        const P_STRIDE: usize = KEY_BLOCK / 2;
        assert!(rows <= QUERY_BLOCK && keys <= KEY_BLOCK && keys.is_multiple_of(16));
        assert!(
            p.len() >= rows * P_STRIDE && v.len() >= pairs * stride && o.len() >= rows * stride && alpha.len() >= rows
        );
        let vectors = stride / 16;
        let mut n = 0;
        while n < vectors {
            let left = vectors - n;
            let nv = if left <= 5 {
                left
            } else if left == 6 {
                3
            } else {
                4
            };
            let max_rows = if nv == 5 { 5 } else { 6 };
            let mut r = 0;
            while r < rows {
                let m = (rows - r).min(max_rows);
                let (pp, aa) = (p[r * P_STRIDE..].as_ptr(), alpha[r..].as_ptr());
                let (vv, oo) = (v[n * 16..].as_ptr(), o[r * stride + n * 16..].as_mut_ptr());
                macro_rules! tile {
                    ($(($mm:literal, $nn:literal)),*) => {
                        match (m, nv) {
                            // SAFETY: features as in `scores`; the asserts above show the tile
                            // reads `m` rows of `pairs` probability pairs, `pairs` rows of `nv`
                            // vectors of v, `m` alphas, and updates `m` rows of `nv` vectors of
                            // o, all inside the slices.
                            $(($mm, $nn) => unsafe { value_tile::<$mm, $nn>(pp, vv, stride, pairs, aa, oo) },)*
                            _ => unreachable!(),
                        }
                    };
                }
                tile!(
                    (1, 1),
                    (2, 1),
                    (3, 1),
                    (4, 1),
                    (5, 1),
                    (6, 1),
                    (1, 2),
                    (2, 2),
                    (3, 2),
                    (4, 2),
                    (5, 2),
                    (6, 2),
                    (1, 3),
                    (2, 3),
                    (3, 3),
                    (4, 3),
                    (5, 3),
                    (6, 3),
                    (1, 4),
                    (2, 4),
                    (3, 4),
                    (4, 4),
                    (5, 4),
                    (6, 4),
                    (1, 5),
                    (2, 5),
                    (3, 5),
                    (4, 5),
                    (5, 5)
                );
                r += m;
            }
            n += nv;
        }
    }
}

/// Reinterprets 32 bf16 bit patterns as the dot product's operand type.
#[inline(always)]
fn as_bf16(x: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit vectors with no invalid bit patterns.
    unsafe { core::mem::transmute::<__m512i, __m512bh>(x) }
}

/// `s[m][16n + l] = Σ_p dot(q[m][p], k[n][p][l])` for an `M×N` tile (`N` strips of 16 keys).
///
/// # Safety
/// AVX-512F/BF16 present; `q` holds `M` rows of `pairs`, `k` holds `N` panels of `pairs × 16`,
/// `s` holds `M` rows of stride [`KEY_BLOCK`] with `16 N` columns.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn score_tile<const M: usize, const N: usize>(q: *const u32, pairs: usize, k: *const u32, s: *mut f32) {
    let mut acc = [[_mm512_setzero_ps(); N]; M];
    for p in 0..pairs {
        // SAFETY: p < pairs, n < N: inside the panels the caller promised.
        let kv: [__m512bh; N] =
            core::array::from_fn(|n| unsafe { as_bf16(_mm512_loadu_si512(k.add(n * pairs * 16 + p * 16).cast())) });
        for (m, acc) in acc.iter_mut().enumerate() {
            // SAFETY: m < M, p < pairs: inside q.
            let pair = unsafe { q.add(m * pairs + p).read() };
            let qb = as_bf16(_mm512_set1_epi32(pair as i32));
            for n in 0..N {
                acc[n] = _mm512_dpbf16_ps(acc[n], kv[n], qb);
            }
        }
    }
    for (m, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: row m < M, columns 16n..16n+16 < 16N: inside s.
            unsafe { _mm512_storeu_ps(s.add(m * KEY_BLOCK + n * 16), a) };
        }
    }
}

/// `o[m][..] = alpha[m] · o[m][..] + Σ_t dot(p[m][t], v[t][..])` for `M` rows and `N` vectors
/// of 16 values.
///
/// # Safety
/// AVX-512F/BF16 present; `p` holds `M` rows (stride `KEY_BLOCK / 2`) of `pairs`; `v` holds
/// `pairs` rows (stride `v_stride`) of `16 N`; `alpha` holds `M`; `o` holds `M` rows (stride
/// `v_stride`) of `16 N`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn value_tile<const M: usize, const N: usize>(
    p: *const u32,
    v: *const u32,
    v_stride: usize,
    pairs: usize,
    alpha: *const f32,
    o: *mut f32,
) {
    let mut acc: [[__m512; N]; M] = core::array::from_fn(|m| {
        // SAFETY: m < M: inside alpha.
        let a = _mm512_set1_ps(unsafe { alpha.add(m).read() });
        // SAFETY: row m < M, vector n < N: inside o.
        core::array::from_fn(|n| _mm512_mul_ps(unsafe { _mm512_loadu_ps(o.add(m * v_stride + n * 16)) }, a))
    });
    for t in 0..pairs {
        // SAFETY: t < pairs, n < N: inside v.
        let vv: [__m512bh; N] =
            core::array::from_fn(|n| unsafe { as_bf16(_mm512_loadu_si512(v.add(t * v_stride + n * 16).cast())) });
        for (m, acc) in acc.iter_mut().enumerate() {
            // SAFETY: m < M, t < pairs: inside p.
            let pair = unsafe { p.add(m * (KEY_BLOCK / 2) + t).read() };
            let pb = as_bf16(_mm512_set1_epi32(pair as i32));
            for n in 0..N {
                acc[n] = _mm512_dpbf16_ps(acc[n], vv[n], pb);
            }
        }
    }
    for (m, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: row m < M, vector n < N: inside o.
            unsafe { _mm512_storeu_ps(o.add(m * v_stride + n * 16), a) };
        }
    }
}

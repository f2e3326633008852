//! Packing for the bf16 kernels (AMX and AVX-512 BF16), which share their layouts up to padding
//! (`u32` = a pair of bf16, the lower index in the low half):
//! - Q `[row][row_len]` bf16, zero-padded;
//! - K `[strip of 16 keys][pairs][16]` u32: pairs along head_dim, keys across (a 16×16
//!   transpose of 32-bit pairs);
//! - V `[key pair][stride]` u32: two keys interleaved per column.
//!
//! Contiguous rows go through AVX-512; strided ones through plain loops.

use crate::element::{DType, Element};
use crate::layout::{Rows, SequenceRows};
use core::arch::x86_64::*;
use core::ops::Range;

/// The bf16 bit pattern of `x` (exact: `T` is bf16, whose widening is a 16-bit shift).
#[inline(always)]
fn bits<T: Element>(x: T) -> u16 {
    (x.to_f32().to_bits() >> 16) as u16
}

/// Packs the query rows `tokens` of `head` as bf16 rows of `row_len` (zero-padded), and zeroes
/// the rows after them up to `padded_rows`.
pub(crate) fn pack_queries<T: Element>(
    q: &Rows<T>,
    tokens: Range<usize>,
    head: usize,
    row_len: usize,
    padded_rows: usize,
    dst: &mut [u32],
) {
    let dst: &mut [u16] = bytemuck::cast_slice_mut(&mut dst[..padded_rows * row_len / 2]);
    dst.fill(0);
    for (r, token) in tokens.enumerate() {
        let row = q.row(token, head);
        let out = &mut dst[r * row_len..r * row_len + row.len()];
        match row_bits(row.view()) {
            Some(b) => out.copy_from_slice(b),
            None => out.iter_mut().zip(row.iter()).for_each(|(o, &x)| *o = bits(x)),
        }
    }
}

/// Packs the sequence's keys `keys` as strips of 16 keys × `pairs`, zero-padded to `padded`
/// keys (a multiple of 16).
///
/// # Safety
/// AVX-512F/BW present.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_keys<T: Element>(
    k: &SequenceRows<T>,
    tokens: Range<usize>,
    pairs: usize,
    padded: usize,
    dst: &mut [u32],
) {
    let d = k.dims();
    let panel = pairs * 16;
    for strip in 0..padded / 16 {
        let first = tokens.start + strip * 16;
        let keys = first.min(tokens.end)..(first + 16).min(tokens.end);
        let out = &mut dst[strip * panel..(strip + 1) * panel];
        let mut rows: [&[u16]; 16] = [&[]; 16];
        let contiguous =
            keys.clone().zip(rows.iter_mut()).all(|(t, slot)| row_bits(k.row(t)).map(|b| *slot = b).is_some());
        if contiguous {
            // SAFETY: the caller guarantees the features.
            unsafe { transpose_key_strip(&rows[..keys.len()], d, pairs, out) };
        } else {
            let out: &mut [u16] = bytemuck::cast_slice_mut(out);
            out.fill(0);
            for (lane, token) in keys.enumerate() {
                for (i, &x) in k.row(token).iter().enumerate() {
                    out[(i / 2) * 32 + lane * 2 + i % 2] = bits(x);
                }
            }
        }
    }
}

/// Packs the sequence's values `tokens` as key pairs × `stride` (zero-padded), to `padded`
/// keys (even). Returns whether every value is finite.
///
/// # Safety
/// AVX-512F/BW present.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_values<T: Element>(
    v: &SequenceRows<T>,
    tokens: Range<usize>,
    stride: usize,
    padded: usize,
    dst: &mut [u32],
) -> bool {
    let dv = v.dims();
    let mut finite = true;
    for t in 0..padded / 2 {
        let out = &mut dst[t * stride..(t + 1) * stride];
        let (a, b) = (tokens.start + 2 * t, tokens.start + 2 * t + 1);
        let first = (a < tokens.end).then(|| v.row(a));
        let second = (b < tokens.end).then(|| v.row(b));
        let bits_a = first.as_ref().and_then(|r| row_bits(r.view()));
        let bits_b = second.as_ref().and_then(|r| row_bits(r.view()));
        match (bits_a, second.is_none() || bits_b.is_some()) {
            // SAFETY: the caller guarantees the features.
            (Some(x), true) => finite &= unsafe { interleave_value_pair(x, bits_b, dv, stride, out) },
            _ => {
                let out: &mut [u16] = bytemuck::cast_slice_mut(out);
                out.fill(0);
                for (half, row) in [first, second].into_iter().enumerate() {
                    for (i, &x) in row.iter().flat_map(|r| r.iter()).enumerate() {
                        let b = bits(x);
                        finite &= b & 0x7f80 != 0x7f80;
                        out[2 * i + half] = b;
                    }
                }
            }
        }
    }
    finite
}

/// The bf16 bit patterns of a contiguous bf16 row; `None` for strided rows (or other types).
pub(crate) fn row_bits<T: Element>(row: ndarray::ArrayView1<'_, T>) -> Option<&[u16]> {
    if T::DTYPE != DType::BF16 {
        return None;
    }
    row.to_slice().map(bytemuck::cast_slice)
}

/// Writes `rows` (at most 16 keys of `d` bf16 each) as `pairs` rows of 16 `u32`: `dst[p][j]`
/// is the pair `(rows[j][2p], rows[j][2p + 1])`, zero past `d` and for missing keys.
///
/// # Safety
/// AVX-512F/BW present.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn transpose_key_strip(rows: &[&[u16]], d: usize, pairs: usize, dst: &mut [u32]) {
    assert!(rows.len() <= 16 && rows.iter().all(|r| r.len() >= d) && dst.len() >= pairs * 16 && d <= 2 * pairs);
    for c in (0..pairs).step_by(16) {
        // Row j's pairs c..c+16, as 32 bf16 starting at 2c, zero past d.
        let valid = d.saturating_sub(2 * c).min(32);
        let mask: __mmask32 = if valid == 32 { u32::MAX } else { (1u32 << valid) - 1 };
        let r: [__m512i; 16] = core::array::from_fn(|j| match rows.get(j) {
            // SAFETY: the masked lanes are elements 2c..2c+valid <= d of the row (asserted).
            Some(row) if valid > 0 => unsafe { _mm512_maskz_loadu_epi16(mask, row.as_ptr().add(2 * c).cast()) },
            _ => _mm512_setzero_si512(),
        });
        let columns = transpose16(r);
        for (i, column) in columns.iter().enumerate().take(pairs - c) {
            // SAFETY: pair c + i < pairs: inside dst (asserted).
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add((c + i) * 16).cast(), *column) };
        }
    }
}

/// Transposes 16 vectors of 16 `u32` (`out[c]` lane `j` = `r[j]` lane `c`).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    // Pairs of rows interleaved within each 128-bit lane, then quadruples, then the lanes.
    let a: [__m512i; 16] = core::array::from_fn(|i| {
        let (x, y) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    // b[4g + k] lane L holds rows 4g..4g+4 of column 4L + k.
    let b: [__m512i; 16] = core::array::from_fn(|i| {
        let (g, k) = (i / 4, i % 4);
        let (x, y) = (a[4 * g + k / 2], a[4 * g + 2 + k / 2]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi64(x, y)
        } else {
            _mm512_unpackhi_epi64(x, y)
        }
    });
    core::array::from_fn(|column| {
        let (lane, k) = (column / 4, column % 4);
        let (even, odd) = if lane % 2 == 0 {
            (_mm512_shuffle_i32x4::<0x88>(b[k], b[4 + k]), _mm512_shuffle_i32x4::<0x88>(b[8 + k], b[12 + k]))
        } else {
            (_mm512_shuffle_i32x4::<0xDD>(b[k], b[4 + k]), _mm512_shuffle_i32x4::<0xDD>(b[8 + k], b[12 + k]))
        };
        if lane < 2 {
            _mm512_shuffle_i32x4::<0x88>(even, odd)
        } else {
            _mm512_shuffle_i32x4::<0xDD>(even, odd)
        }
    })
}

/// Interleaves two keys' values: `dst[i]` is the pair `(first[i], second[i])` for `i < dv`,
/// zero up to `width` (a multiple of 16). `second` may be absent (an odd last key). Returns
/// whether every value is finite.
///
/// # Safety
/// AVX-512F/BW present.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn interleave_value_pair(
    first: &[u16],
    second: Option<&[u16]>,
    dv: usize,
    width: usize,
    dst: &mut [u32],
) -> bool {
    assert!(
        first.len() >= dv
            && second.is_none_or(|s| s.len() >= dv)
            && dst.len() >= width
            && width.is_multiple_of(16)
            && dv <= width
    );
    // Index vectors for vpermt2w: output 2i takes a[i] (+16 for the upper half), 2i+1 takes b[i].
    let lo_index = _mm512_set_epi16(
        47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
        32, 0,
    );
    let hi_index = _mm512_add_epi16(lo_index, _mm512_set1_epi16(16));
    let exponent = _mm512_set1_epi16(0x7f80);
    let mut non_finite: __mmask32 = 0;
    for c in (0..width).step_by(32) {
        let valid = dv.saturating_sub(c).min(32);
        let mask: __mmask32 = if valid == 32 { u32::MAX } else { (1u32 << valid) - 1 };
        // SAFETY: the masked lanes are elements c..c+valid <= dv of each row (asserted).
        let (a, b) = unsafe {
            let a = _mm512_maskz_loadu_epi16(mask, first.as_ptr().add(c).cast());
            let b = match second {
                Some(s) => _mm512_maskz_loadu_epi16(mask, s.as_ptr().add(c).cast()),
                None => _mm512_setzero_si512(),
            };
            (a, b)
        };
        for x in [a, b] {
            non_finite |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(x, exponent), exponent);
        }
        // SAFETY: pairs c..c+16 (and c+16..c+32 when inside width) are inside dst (asserted).
        unsafe {
            _mm512_storeu_si512(dst.as_mut_ptr().add(c).cast(), _mm512_permutex2var_epi16(a, lo_index, b));
            if c + 16 < width {
                _mm512_storeu_si512(dst.as_mut_ptr().add(c + 16).cast(), _mm512_permutex2var_epi16(a, hi_index, b));
            }
        }
    }
    non_finite == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn available() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    }

    #[test]
    fn key_strips_match_the_definition() {
        if !available() {
            eprintln!("note: skipping: no AVX-512BW");
            return;
        }
        for (d, keys, pairs) in [(72, 16, 36), (72, 5, 48), (7, 16, 4), (128, 16, 64), (33, 9, 17)] {
            let data: Vec<Vec<u16>> = (0..keys).map(|j| (0..d).map(|i| (j * 1000 + i + 1) as u16).collect()).collect();
            let rows: Vec<&[u16]> = data.iter().map(|r| r.as_slice()).collect();
            let mut dst = vec![u32::MAX; pairs * 16];
            // SAFETY: features checked above.
            unsafe { transpose_key_strip(&rows, d, pairs, &mut dst) };
            for p in 0..pairs {
                for j in 0..16 {
                    let get = |i: usize| if j < keys && i < d { data[j][i] as u32 } else { 0 };
                    assert_eq!(dst[p * 16 + j], get(2 * p) | get(2 * p + 1) << 16, "d={d} p={p} j={j}");
                }
            }
        }
    }

    #[test]
    fn value_pairs_match_the_definition() {
        if !available() {
            eprintln!("note: skipping: no AVX-512BW");
            return;
        }
        for (dv, width) in [(72, 80), (16, 16), (128, 128), (5, 16), (200, 208)] {
            let a: Vec<u16> = (0..dv).map(|i| i as u16 + 1).collect();
            let b: Vec<u16> = (0..dv).map(|i| i as u16 + 5000).collect();
            for second in [Some(b.as_slice()), None] {
                let mut dst = vec![u32::MAX; width];
                // SAFETY: features checked above.
                let finite = unsafe { interleave_value_pair(&a, second, dv, width, &mut dst) };
                assert!(finite);
                for i in 0..width {
                    let lo = if i < dv { a[i] as u32 } else { 0 };
                    let hi = if i < dv { second.map_or(0, |s| s[i] as u32) } else { 0 };
                    assert_eq!(dst[i], lo | hi << 16, "dv={dv} i={i}");
                }
            }
            let mut bad = b.clone();
            bad[dv - 1] = 0x7fc0; // NaN
            let mut dst = vec![0; width];
            // SAFETY: features checked above.
            assert!(!unsafe { interleave_value_pair(&a, Some(&bad), dv, width, &mut dst) });
        }
    }
}

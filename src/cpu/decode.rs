//! Decode: a few query rows per sequence against long contexts (one token per sequence, or a
//! few under speculative decoding). Such a call reads every key and value once and does little
//! arithmetic per byte: its limit is memory bandwidth, so nothing is packed. Each work item
//! takes one sequence and a chunk of its keys, holds the query rows of every head (so a GQA
//! group reads its K and V once, not once per head, and a key's rows of all kv heads, adjacent
//! in memory, are read together), widens each key and value row to f32 as it streams past, and
//! leaves a partial result; long sequences are cut into chunks until every core has work
//! (FlashAttention's split-KV decoding), and a second pass combines each row's chunks by their
//! maxima.
//!
//! Scores are dot products with one horizontal sum each, mapped to natural-unit logits
//! (scale, soft-cap, ALiBi) row by row, then the online softmax of `softmax.rs` on panels of
//! rows, as the portable kernel uses it.

use super::math::exp2_nonpositive;
use super::score::ScoreMap;
use super::softmax::{self, RowState};
use super::workspace::Carver;
use super::{kv_cache, workspace, Io};
use crate::element::Element;
use crate::layout::{KvRows, SequenceRows};
use crate::problem::{Problem, Sequence};
use core::ops::Range;
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

/// The most query rows per kv head for the decode path: GQA group size times the longest
/// query sequence.
pub(crate) const MAX_ROWS_PER_KV_HEAD: usize = 16;
/// Keys per block of the online softmax.
const KEY_BLOCK: usize = 64;
/// The fewest keys worth a chunk of their own.
const MIN_CHUNK: usize = 256;

/// Whether the problem is decode-shaped: every (sequence, kv head) has at most
/// [`MAX_ROWS_PER_KV_HEAD`] query rows.
pub(crate) fn applies(problem: &Problem) -> bool {
    longest_queries(problem) * problem.group_size() <= MAX_ROWS_PER_KV_HEAD
}

fn longest_queries(problem: &Problem) -> usize {
    (0..problem.batch()).map(|b| problem.sequence(b).q_len).max().unwrap_or(0)
}

/// One work item: keys `keys` of `sequence`, every head.
struct Chunk {
    sequence: Sequence,
    keys: Range<usize>,
}

/// Rows of a panel: whole pairs of vectors (`softmax::update`'s layout), at least `rows`.
fn panel_rows<S: Simd>(rows: usize) -> usize {
    rows.max(1).next_multiple_of(2 * S::F32_LANES)
}

/// Runs a decode-shaped problem with the f32 vector unit `simd`; returns the largest finite
/// magnitudes of K and V it read (for `Problem::check_streamed`).
pub(crate) fn run<S: Simd, T: Element>(simd: S, problem: &Problem, io: &Io<T>) -> (f32, f32) {
    // Chunks: enough for every thread several times over, none under MIN_CHUNK keys.
    let threads = rayon::current_num_threads();
    let splits = (4 * threads).div_ceil(problem.batch().max(1));
    CHUNKS.with(|cell| {
        let mut chunks = cell.take();
        chunks.clear();
        plan(problem, splits, &mut chunks);
        let maxima = run_chunks(simd, problem, io, &chunks);
        cell.replace(chunks);
        maxima
    })
}

thread_local! {
    /// The chunk list, kept between calls so that a call allocates nothing once it has grown.
    static CHUNKS: core::cell::Cell<Vec<Chunk>> = const { core::cell::Cell::new(Vec::new()) };
}

/// Cuts every sequence into at most `splits` chunks of at least [`MIN_CHUNK`] keys.
fn plan(problem: &Problem, splits: usize, chunks: &mut Vec<Chunk>) {
    for b in 0..problem.batch() {
        let sequence = problem.sequence(b);
        if sequence.q_len == 0 {
            continue;
        }
        let size = sequence.k_len.div_ceil(splits).max(MIN_CHUNK);
        let mut start = 0;
        loop {
            let end = (start + size).min(sequence.k_len);
            chunks.push(Chunk { sequence, keys: start..end });
            if end == sequence.k_len {
                break;
            }
            start = end;
        }
    }
}

/// Runs the chunks, then combines each sequence's; returns K's and V's largest finite
/// magnitudes.
fn run_chunks<S: Simd, T: Element>(simd: S, problem: &Problem, io: &Io<T>, chunks: &[Chunk]) -> (f32, f32) {
    let (dv, threads) = (problem.head_dim_v, rayon::current_num_threads());
    let panel = panel_rows::<S>(problem.num_heads * longest_queries(problem));
    // Each chunk's partial rows: max and sum (base-2, relative to the max), then O unnormalised,
    // then the largest finite |k| and |v| it read.
    let stride = 2 * panel + panel * dv + 2;
    let lines = workspace_lines(panel, problem.head_dim, dv, problem.num_kv_heads);
    let parallel = threads > 1 && chunks.len() > 1;
    kv_cache::with_cache(|cache| {
        let (partials, _, _) = cache.buffers::<f32>(chunks.len() * stride, 0);
        let work = |(chunk, partial): (&Chunk, &mut [f32])| {
            workspace::with_workspace(lines, |carver| {
                simd.vectorize(Attend { problem, io, chunk, partial, carver, panel });
            })
        };
        if parallel {
            chunks.par_iter().zip(partials.par_chunks_mut(stride)).for_each(work);
        } else {
            chunks.iter().zip(partials.chunks_mut(stride)).for_each(work);
        }
        // Combine: the chunks of one sequence are consecutive.
        let mut first = 0;
        while first < chunks.len() {
            let mut last = first + 1;
            while last < chunks.len() && chunks[last].sequence.index == chunks[first].sequence.index {
                last += 1;
            }
            // SAFETY: each sequence writes its own rows.
            unsafe { combine(problem, io, &chunks[first], &partials[first * stride..last * stride], stride, panel) };
            first = last;
        }
        partials.chunks(stride).fold((0f32, 0f32), |(k, v), p| (k.max(p[stride - 2]), v.max(p[stride - 1])))
    })
}

/// Workspace of one chunk, in 64-byte lines: Q, a widened token (every kv head), the scores,
/// alpha, and each row's ALiBi slope and visible keys.
fn workspace_lines(panel: usize, d: usize, dv: usize, kv_heads: usize) -> usize {
    let floats = panel * d + kv_heads * d.max(dv) + KEY_BLOCK * panel + 2 * panel;
    (floats * 4).div_ceil(64) + (2 * panel * 8).div_ceil(64) + 8
}

/// One chunk inside the instruction set's `target_feature` context.
struct Attend<'a, 'p, 'io, 'w, T> {
    problem: &'a Problem<'p>,
    io: &'a Io<'io, T>,
    chunk: &'a Chunk,
    partial: &'a mut [f32],
    carver: &'a mut Carver<'w>,
    panel: usize,
}

impl<T: Element> WithSimd for Attend<'_, '_, '_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Attend { problem, io, chunk, partial, carver, panel } = self;
        let (d, dv) = (problem.head_dim, problem.head_dim_v);
        let seq = chunk.sequence;
        let (lq, lk) = (seq.q_len, seq.k_len);
        let (heads, kv_heads) = (problem.num_heads, problem.num_kv_heads);
        let rows = heads * lq;
        // Row r: query head r / lq, query row r % lq of the sequence; the rows of kv head g
        // are `group_rows · g..group_rows · (g + 1)`.
        let group_rows = problem.group_size() * lq;
        let (max, rest) = partial.split_at_mut(panel);
        let (sum, rest) = rest.split_at_mut(panel);
        let (o, maxima) = rest.split_at_mut(panel * dv);
        let (mut max_k, mut max_v) = (0u32, 0u32);
        max.fill(f32::NEG_INFINITY);
        sum.fill(0.0);
        o.fill(0.0);
        let q = carver.take::<f32>(panel * d);
        // One key's (or value's) rows of every kv head, widened.
        let row = carver.take::<f32>(kv_heads * d.max(dv));
        let scores = carver.take::<f32>(KEY_BLOCK * panel);
        let alpha = carver.take::<f32>(panel);
        let slopes = carver.take::<f32>(panel);
        let seen = carver.take::<[u32; 2]>(panel);
        // The panel's rows past `rows` are computed along and ignored: keep them finite.
        scores.fill(0.0);
        for r in 0..rows {
            let values = io.q.row(seq.q_start + r % lq, r / lq);
            for (x, v) in q[r * d..(r + 1) * d].iter_mut().zip(values.iter()) {
                *x = v.to_f32();
            }
            slopes[r] = problem.alibi_slope(seq.index, r / lq).unwrap_or(0.0);
            let v = problem.mask.visible_keys(r % lq, lq, lk);
            seen[r] = [v.start as u32, v.end as u32];
        }
        let sees = |r: usize, j: usize| (seen[r][0] as usize..seen[r][1] as usize).contains(&j);
        let (scale, softcap) = (problem.scale, problem.softcap);
        let alibi = slopes[..rows].iter().any(|&s| s != 0.0);
        let mut block = chunk.keys.start;
        while block < chunk.keys.end {
            let end = (block + KEY_BLOCK).min(chunk.keys.end);
            let width = end - block;
            // Scores, as natural-unit logits, in the panel layout [key][row]; a key's rows of
            // every kv head one after another (adjacent in memory).
            for j in 0..width {
                // This block's values, needed after its keys (a pipeline one block deep).
                prefetch_token(&io.v, seq, block + j);
                max_k = max_k.max(widen_token(&io.k, seq, block + j, kv_heads, d, row));
                for g in 0..kv_heads {
                    let key = &row[g * d..(g + 1) * d];
                    let rows = g * group_rows..(g + 1) * group_rows;
                    // Up to four rows at a time share each load of the key.
                    for first in rows.clone().step_by(4) {
                        let n = (rows.end - first).min(4);
                        let dots = dots(simd, &q[first * d..(first + n) * d], d, key);
                        for (i, &s) in dots[..n].iter().enumerate() {
                            let r = first + i;
                            let s = match softcap {
                                Some(cap) => cap * (s * (scale / cap)).tanh(),
                                None => s * scale,
                            };
                            scores[j * panel + r] = if alibi {
                                let distance = ((r % lq + lk) as i64 - lq as i64 - (block + j) as i64).unsigned_abs();
                                s - slopes[r] * distance as f32
                            } else {
                                s
                            };
                        }
                    }
                }
            }
            let visible = |r: usize| {
                let (first, last) = (seen[r][0] as usize, seen[r][1] as usize);
                (first > block || last < end).then(|| first.clamp(block, end) - block..last.clamp(block, end) - block)
            };
            let map = ScoreMap { scale: 1.0, softcap: None, alibi: None };
            let mut state = RowState { max: &mut *max, sum: &mut *sum, alpha: &mut *alpha };
            softmax::update(simd, scores, KEY_BLOCK, rows, panel, width, map, &visible, &mut state);
            for r in 0..rows {
                let a = alpha[r];
                if a != 1.0 {
                    o[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x *= a);
                }
            }
            // O += P V, each row over the keys it sees (a masked key's 0 · inf would be NaN).
            for j in 0..width {
                if end + j < chunk.keys.end {
                    prefetch_token(&io.k, seq, end + j);
                }
                max_v = max_v.max(widen_token(&io.v, seq, block + j, kv_heads, dv, row));
                for g in 0..kv_heads {
                    let value = &row[g * dv..(g + 1) * dv];
                    let rows = g * group_rows..(g + 1) * group_rows;
                    for first in rows.clone().step_by(4) {
                        let n = (rows.end - first).min(4);
                        let o = &mut o[first * dv..(first + n) * dv];
                        if (first..first + n).all(|r| sees(r, block + j)) {
                            // Each vector of the value loaded once for the rows.
                            let weights: [f32; 4] =
                                core::array::from_fn(|i| if i < n { scores[j * panel + first + i] } else { 0.0 });
                            axpys(simd, &weights[..n], value, o);
                        } else {
                            for (i, o) in o.chunks_exact_mut(dv).enumerate() {
                                if sees(first + i, block + j) {
                                    axpy(simd, scores[j * panel + first + i], value, o);
                                }
                            }
                        }
                    }
                }
            }
            block = end;
        }
        maxima[0] = f32::from_bits(max_k);
        maxima[1] = f32::from_bits(max_v);
    }
}

/// Key (or value) `j` of `seq`, all `heads` kv heads, widened to f32 into `dst` (`dims` per head):
/// one loop over a contiguous token (the usual layout), else head by head. Returns the largest
/// finite magnitude among them, as f32 bits (an integer maximum of the bits with the sign
/// cleared, infinities and NaNs left out, so that the loop vectorises).
#[inline(always)]
fn widen_token<T: Element>(kv: &KvRows<T>, seq: Sequence, j: usize, heads: usize, dims: usize, dst: &mut [f32]) -> u32 {
    let n = heads * dims;
    match kv.token(seq.index, seq.k_start, j).as_ref().and_then(|t| t.as_slice()) {
        Some(s) => dst[..n].iter_mut().zip(s).for_each(|(d, x)| *d = x.to_f32()),
        None => {
            for (g, dst) in dst.chunks_exact_mut(dims).take(heads).enumerate() {
                let row = SequenceRows::new(kv, seq.index, seq.k_start, g).row(j);
                dst.iter_mut().zip(row.iter()).for_each(|(d, x)| *d = x.to_f32());
            }
        }
    }
    max_finite_bits(&dst[..n])
}

/// Asks for key (or value) `j` of `seq`, every kv head, to be brought into the L2 cache ahead of
/// its use (a contiguous token; others are left to the hardware).
#[inline(always)]
fn prefetch_token<T: Element>(kv: &KvRows<T>, seq: Sequence, j: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(token) = kv.token(seq.index, seq.k_start, j).as_ref().and_then(|t| t.as_slice()) {
        let bytes = core::mem::size_of_val(token);
        let start = token.as_ptr().cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults; the address is inside the token.
            unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(start.add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kv, seq, j);
}

/// The largest finite `|x|` of `x` as f32 bits: lane-wise integer maxima of the bits with the
/// sign cleared over fixed chunks (infinities and NaNs count as 0), which vectorise.
#[inline(always)]
fn max_finite_bits(x: &[f32]) -> u32 {
    let finite = |v: f32| {
        let bits = v.to_bits() & 0x7fff_ffff;
        if bits < 0x7f80_0000 {
            bits
        } else {
            0
        }
    };
    let mut lanes = [0u32; 16];
    let mut chunks = x.chunks_exact(16);
    for chunk in &mut chunks {
        for i in 0..16 {
            lanes[i] = lanes[i].max(finite(chunk[i]));
        }
    }
    chunks.remainder().iter().fold(lanes.into_iter().max().unwrap_or(0), |m, &v| m.max(finite(v)))
}

/// The dot products of `key` with the rows of `q` (`d` values each, at most four rows), in f32.
#[inline(always)]
fn dots<S: Simd>(simd: S, q: &[f32], d: usize, key: &[f32]) -> [f32; 4] {
    match q.len() / d {
        4 => dots_n::<S, 4>(simd, q, d, key),
        3 => dots_n::<S, 3>(simd, q, d, key),
        2 => dots_n::<S, 2>(simd, q, d, key),
        _ => dots_n::<S, 1>(simd, q, d, key),
    }
}

/// [`dots`] for `N` rows: each vector of the key loaded once for all of them, two chains per row.
#[inline(always)]
fn dots_n<S: Simd, const N: usize>(simd: S, q: &[f32], d: usize, key: &[f32]) -> [f32; 4] {
    let (k_head, k_tail) = S::as_simd_f32s(key);
    let rows: [(&[S::f32s], &[f32]); N] = core::array::from_fn(|r| S::as_simd_f32s(&q[r * d..(r + 1) * d]));
    // Two named chains per row, stepping two vectors at a time: an index `i % 2` into the
    // chains would keep them in memory instead of registers.
    let (mut even, mut odd) = ([simd.splat_f32s(0.0); N], [simd.splat_f32s(0.0); N]);
    let pairs = k_head.len() / 2;
    for i in 0..pairs {
        let (k0, k1) = (k_head[2 * i], k_head[2 * i + 1]);
        for r in 0..N {
            even[r] = simd.mul_add_f32s(rows[r].0[2 * i], k0, even[r]);
            odd[r] = simd.mul_add_f32s(rows[r].0[2 * i + 1], k1, odd[r]);
        }
    }
    if k_head.len() % 2 == 1 {
        let last = k_head.len() - 1;
        for r in 0..N {
            even[r] = simd.mul_add_f32s(rows[r].0[last], k_head[last], even[r]);
        }
    }
    let mut out = [0f32; 4];
    for r in 0..N {
        let tail: f32 = rows[r].1.iter().zip(k_tail).map(|(x, y)| x * y).sum();
        out[r] = simd.reduce_sum_f32s(simd.add_f32s(even[r], odd[r])) + tail;
    }
    out
}

/// `y += a x` in f32.
#[inline(always)]
fn axpy<S: Simd>(simd: S, a: f32, x: &[f32], y: &mut [f32]) {
    let (x_head, x_tail) = S::as_simd_f32s(x);
    let (y_head, y_tail) = S::as_mut_simd_f32s(y);
    let av = simd.splat_f32s(a);
    for (yv, &xv) in y_head.iter_mut().zip(x_head) {
        *yv = simd.mul_add_f32s(av, xv, *yv);
    }
    for (yv, &xv) in y_tail.iter_mut().zip(x_tail) {
        *yv += a * xv;
    }
}

/// `y_r += a_r x` for the rows `y_r` of `y` (`x.len()` values each, at most four rows).
#[inline(always)]
fn axpys<S: Simd>(simd: S, a: &[f32], x: &[f32], y: &mut [f32]) {
    match a.len() {
        4 => axpys_n::<S, 4>(simd, a, x, y),
        3 => axpys_n::<S, 3>(simd, a, x, y),
        2 => axpys_n::<S, 2>(simd, a, x, y),
        _ => axpy(simd, a[0], x, y),
    }
}

/// [`axpys`] for `N` rows.
#[inline(always)]
fn axpys_n<S: Simd, const N: usize>(simd: S, a: &[f32], x: &[f32], y: &mut [f32]) {
    let n = x.len();
    let (x_head, x_tail) = S::as_simd_f32s(x);
    let av: [S::f32s; N] = core::array::from_fn(|r| simd.splat_f32s(a[r]));
    let rows: [&mut [f32]; N] = {
        let mut rest = y;
        core::array::from_fn(|_| {
            let (row, tail) = core::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            row
        })
    };
    let ys = rows.map(|row| S::as_mut_simd_f32s(row));
    for (i, &xv) in x_head.iter().enumerate() {
        for r in 0..N {
            ys[r].0[i] = simd.mul_add_f32s(av[r], xv, ys[r].0[i]);
        }
    }
    for r in 0..N {
        for (yv, &xv) in ys[r].1.iter_mut().zip(x_tail) {
            *yv += a[r] * xv;
        }
    }
}

/// Combines the partial rows of one sequence's chunks and writes its output rows (and LSE), a
/// sink joining each row's max and sum.
///
/// # Safety
/// No other thread may access the output rows (or LSE entries) of this sequence.
unsafe fn combine<T: Element>(
    problem: &Problem,
    io: &Io<T>,
    chunk: &Chunk,
    partials: &[f32],
    stride: usize,
    panel: usize,
) {
    let dv = problem.head_dim_v;
    let seq = chunk.sequence;
    let lq = seq.q_len;
    let parts = partials.len() / stride;
    let part = |c: usize| &partials[c * stride..(c + 1) * stride];
    let mut o = [0f32; crate::problem::MAX_HEAD_DIM];
    for r in 0..problem.num_heads * lq {
        let head = r / lq;
        let token = seq.q_start + r % lq;
        let mut m = (0..parts).map(|c| part(c)[r]).fold(f32::NEG_INFINITY, f32::max);
        if let Some(sink) = problem.sink(head) {
            let sink = sink * core::f32::consts::LOG2_E;
            if !m.is_nan() {
                m = m.max(sink);
            }
        }
        let shift = if m == f32::NEG_INFINITY { 0.0 } else { m };
        let mut l = 0f32;
        o[..dv].fill(0.0);
        for c in 0..parts {
            let p = part(c);
            let weight = exp2_scalar(p[r] - shift);
            l += p[panel + r] * weight;
            for (x, &y) in o[..dv].iter_mut().zip(&p[2 * panel + r * dv..2 * panel + (r + 1) * dv]) {
                *x += y * weight;
            }
        }
        if let Some(sink) = problem.sink(head) {
            l += exp2_scalar(sink * core::f32::consts::LOG2_E - shift);
        }
        let seen = l != 0.0;
        let inv = 1.0 / l;
        // SAFETY: per the caller, these rows are ours alone.
        unsafe { io.out.write_row(token, head, |j| T::from_f32(if seen { o[j] * inv } else { 0.0 })) };
        if let Some(lse) = &io.lse {
            let value = if seen { m * core::f32::consts::LN_2 + l.ln() } else { f32::NEG_INFINITY };
            // SAFETY: as above.
            unsafe { lse.write(head, token, value) };
        }
    }
}

/// `2^x` for `x <= 0` (or NaN), as the kernels compute it.
fn exp2_scalar(x: f32) -> f32 {
    let simd = pulp::Scalar::new();
    let v = exp2_nonpositive(simd, simd.splat_f32s(x));
    let out: [f32; 1] = bytemuck::cast(v);
    out[0]
}

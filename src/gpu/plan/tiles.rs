//! The tile and split choices, as pure functions of the problem and the GPU: which query and
//! key tile sizes Hopper takes, and which (query tile, head) pairs split their keys how many
//! ways. The measurements behind each rule are in BENCHMARKS.md ("GPU tuning rules").

use super::variant::{Target, Variant};
use crate::gpu::tuning::Tuning;
use crate::problem::Problem;

/// Most key splits of one query tile.
const MAX_SPLITS: usize = 16;

/// Scores (query rows × keys) a split must spare each split block before it pays for its
/// partial outputs and their combination: 1024 keys of a 64-row tile, 512 of a 128-row one.
const MIN_SPARED_SCORES: usize = 64 * 1024;

/// Query rows times keys, each rounded up to whole tiles of `block_m` rows and `block_n` keys:
/// the scores a call computes, the padding of each sequence's last tiles included.
fn padded_scores(problem: &Problem, block_m: usize, block_n: usize) -> usize {
    (0..problem.batch())
        .map(|b| {
            let s = problem.sequence(b);
            s.q_len.next_multiple_of(block_m) * s.k_len.next_multiple_of(block_n)
        })
        .sum()
}

/// Hopper's tiles for `problem`, then whatever the tuning switches force:
/// - 64-row tiles (one computing warpgroup) where 128-row ones would not fill half the
///   multiprocessors: twice the blocks, each half the fixed cost;
/// - 192-row tiles (three computing warpgroups) for heads up to 80 (K) and 72 (V) wide that
///   fill a wave or spare the 128-row tiles a second one, padding at most 13% more rows;
/// - 192-key tiles for other heads up to 96 wide where they pad at most 2% more keys (fewer
///   fixed costs per key tile);
/// - 64-key tiles where they pad at least 15% fewer keys (sequences of at most 320 keys).
///
/// With cu_seqlens on the device `problem`'s lengths are a guess (`Plan::with_device_seqlens`).
pub(super) fn hopper_tiles(base: Variant, problem: &Problem, multiprocessors: usize, tuning: &Tuning) -> Variant {
    debug_assert_eq!(base.target, Target::Wgmma);
    let mut variant = base;
    let query_tiles =
        |rows: usize| -> usize { (0..problem.batch()).map(|b| problem.sequence(b).q_len.div_ceil(rows)).sum() };
    let pairs = |rows: usize| query_tiles(rows) * problem.num_heads;
    let small = 2 * pairs(base.block_m()) <= multiprocessors;
    let tall_tiles_pay = !small
        && base.head_dim_pad <= 80
        && base.head_dim_v_pad <= 72
        && (pairs(192) >= multiprocessors || pairs(128) > multiprocessors)
        && 100 * padded_scores(problem, 192, base.block_n) <= 113 * padded_scores(problem, 128, base.block_n);
    match tuning.block_m {
        Some(64) => variant = variant.with_one_warpgroup(),
        Some(192) => variant = variant.with_three_warpgroups(),
        None if small => variant = variant.with_one_warpgroup(),
        None if tall_tiles_pay => variant = variant.with_three_warpgroups(),
        _ => {}
    }
    let widest = variant.head_dim_pad.max(variant.head_dim_v_pad);
    let wide_tiles_pay = widest <= 96
        && variant.warps == 8
        && 50 * padded_scores(problem, 1, 192) <= 51 * padded_scores(problem, 1, variant.block_n);
    let narrow_tiles_pay = variant.block_n == 128
        && 100 * padded_scores(problem, 1, 64) <= 85 * padded_scores(problem, 1, variant.block_n);
    let block_n = tuning.block_n.or(wide_tiles_pay.then_some(192)).or(narrow_tiles_pay.then_some(64));
    if let Some(block_n) = block_n.filter(|_| widest <= 128) {
        variant = Variant { block_n, ..variant }.with_hopper_stages();
    }
    if tuning.two_stages {
        variant.stages = 2;
    }
    if tuning.one_q_buffer {
        variant.q_buffers = 1;
    }
    variant
}

/// Waves of units a persistent grid's blocks may walk. Each block takes every `grid`-th unit,
/// so over many waves the blocks drift apart and the units running at once spread over more
/// sequences than the L2 holds, which then read their keys and values again; a block per
/// unit keeps the running ones together, as the hardware hands blocks out in order.
const PERSISTENT_MAX_WAVES: usize = 256;

/// Blocks of a persistent grid for `units` units of work on `slots` block slots, or `None` for
/// a block per unit (more than [`PERSISTENT_MAX_WAVES`] waves).
pub(super) fn persistent_blocks(units: usize, slots: usize) -> Option<usize> {
    (units <= slots * PERSISTENT_MAX_WAVES).then_some(slots.min(units))
}

/// L2 bytes one sequence's keys and values (every kv head) may take for the heads-inner order:
/// half the 50 MB L2 of an H100 or H200.
const HEADS_INNER_MAX_KV_BYTES: usize = 24 << 20;

/// Whether the units of work walk each query tile's heads one after another (`VA_HEADS_INNER`)
/// rather than each head's tiles: for batches of two or more sequences whose every sequence's
/// K and V (all kv heads) fit in half the L2. A wave then reads whole token rows of a few
/// sequences once; walking head by head across many sequences read K and V many times over
/// from memory, and long sequences keep one head's tiles together in a wave instead.
pub(super) fn heads_inner(problem: &Problem, tuning: &Tuning) -> bool {
    if let Some(forced) = tuning.heads_inner {
        return forced;
    }
    let longest = (0..problem.batch()).map(|b| problem.sequence(b).k_len).max().unwrap_or(0);
    let kv_bytes = longest * problem.num_kv_heads * (problem.head_dim + problem.head_dim_v) * 2;
    problem.batch() >= 2 && kv_bytes <= HEADS_INNER_MAX_KV_BYTES
}

/// Each sequence's query-tile count where two or more sequences all have as many (at least
/// one; a batch of same-sized images), else 0: the kernel then finds a tile's sequence by a
/// division instead of a search. A lone sequence keeps the search, one step there.
pub(super) fn tiles_per_sequence(problem: &Problem, block_m: usize) -> usize {
    let count = |b: usize| problem.sequence(b).q_len.div_ceil(block_m);
    let first = if problem.batch() > 1 { count(0) } else { 0 };
    if (0..problem.batch()).all(|b| count(b) == first) {
        first
    } else {
        0
    }
}

/// The key splits of a launch of `tiles` query tiles: `(splits, split_pairs)`, the pairs of a
/// partly filled last wave of blocks (the last pairs, `va_block_work`) each split `splits` ways,
/// or `(1, 0)`.
///
/// The other pairs run whole; the last wave's split as many ways as still fit in that one wave
/// (a second, mostly empty wave would double its time), each split keeping at least two key
/// tiles, and only where that spares the longest of those pairs' own sequences
/// [`MIN_SPARED_SCORES`] per block (not the batch's longest: a mixed batch's last pairs may be
/// a short image's).
pub(super) fn key_splits(
    problem: &Problem,
    variant: &Variant,
    tile_start: &[i32],
    tiles: usize,
    multiprocessors: usize,
    tuning: &Tuning,
) -> (usize, usize) {
    let pairs = tiles * problem.num_heads;
    let slots = multiprocessors * variant.min_blocks;
    let last_wave = pairs % slots;
    let key_tiles =
        split_pairs_longest_keys(problem, tile_start, tiles, last_wave, variant.heads_inner).div_ceil(variant.block_n);
    let max_splits = tuning.max_splits.unwrap_or(MAX_SPLITS).clamp(1, MAX_SPLITS);
    let splits =
        if last_wave > 0 && key_tiles >= 4 { (slots / last_wave).min(key_tiles / 2).clamp(1, max_splits) } else { 1 };
    let spared_scores = (key_tiles - key_tiles.div_ceil(splits)) * variant.block_n * variant.block_m();
    if splits > 1 && spared_scores >= MIN_SPARED_SCORES {
        (splits, last_wave)
    } else {
        (1, 0)
    }
}

/// The most keys of any sequence among the last `split_pairs` (query tile, head) pairs
/// (`va_block_work`): the last query tiles of the last head (pair i is tile i % tiles of head
/// i / tiles), or with `heads_inner` the last tiles' heads (pair i is tile i / heads), or
/// every tile when there are more pairs than that; `tile_start` holds each sequence's first
/// query tile (`batch + 1` entries).
fn split_pairs_longest_keys(
    problem: &Problem,
    tile_start: &[i32],
    tiles: usize,
    split_pairs: usize,
    heads_inner: bool,
) -> usize {
    let split_tiles = if heads_inner { split_pairs.div_ceil(problem.num_heads) } else { split_pairs };
    let first_split_tile = tiles - split_tiles.min(tiles);
    (0..problem.batch())
        .filter(|&b| tile_start[b + 1] as usize > first_split_tile.max(tile_start[b] as usize))
        .map(|b| problem.sequence(b).k_len)
        .max()
        .unwrap_or(0)
}

/// The cu_seqlens of `tokens` cut into `batch` sequences whose lengths differ by at most one.
pub(super) fn even_cu_seqlens(tokens: usize, batch: usize) -> Vec<i32> {
    (0..=batch).map(|b| (tokens as u64 * b as u64 / batch as u64) as i32).collect()
}

// Which work a block does: the (query tile, head) pair and key split of its index, the
// sequence of that query tile (the query tiles of all sequences are numbered one after another,
// `tile_start` holding each sequence's first), and the key tiles of its split.

#pragma once

// Calls whose cu_seqlens are on the device: one block turns them into `tile_start` (each
// sequence's first query tile, prefix sums of its tile counts) and `tile_sequence` (each query
// tile's sequence, -1 for the grid's blocks past the last tile) before the attention kernel
// runs, and checks them: cu_seqlens_q and cu_seqlens_k start at 0, never decrease, and end at
// the token counts of q and k. Cu_seqlens that break a rule raise `*p.status`, leave every
// `tile_sequence` entry -1, so that every attention block returns before reading anything else,
// and fill `out` (and `lse`) with NaN: a caller that does not read the flag cannot take an
// unwritten output for a result.
// The grid was sized for the most tiles the token count allows (tokens / BLOCK_M + batch).
#define VA_PLAN_THREADS 1024

// NaN over every element of `out` and `lse`, by the planning block's threads.
VA_DEVICE void va_fill_nan(const VaParams& p) {
#if defined(VA_IS_F16)
    const va_u16 nan = 0x7e00;
#else
    const va_u16 nan = 0x7fc0;
#endif
    const va_i64 rows = (va_i64)p.total_q * p.heads;
    for (va_i64 i = threadIdx.x; i < rows * p.head_dim_v; i += VA_PLAN_THREADS) {
        const va_i64 row = i / p.head_dim_v, token = row / p.heads;
        const int head = (int)(row % p.heads), d = (int)(i % p.head_dim_v);
        p.out[token * p.out_token_stride + head * p.out_head_stride + d] = nan;
    }
    if (p.lse != nullptr)
        for (va_i64 i = threadIdx.x; i < rows; i += VA_PLAN_THREADS) p.lse[i] = __int_as_float(0x7fc00000);
}
extern "C" __global__ void __launch_bounds__(VA_PLAN_THREADS) va_plan_tiles(VA_GRID_CONSTANT const VaParams p) {
    __shared__ int sums[VA_PLAN_THREADS];
    __shared__ int broken;
    const int t = threadIdx.x, n = p.batch;
    const int per = (n + VA_PLAN_THREADS - 1) / VA_PLAN_THREADS;
    const int lo = min(n, t * per), hi = min(n, lo + per);
    if (t == 0) broken = p.cu_seqlens_q[0] != 0 || p.cu_seqlens_k[0] != 0 || p.cu_seqlens_q[n] != p.total_q ||
                         p.cu_seqlens_k[n] != p.total_k;
    __syncthreads();
    int tiles = 0;
    bool bad = false;
    for (int b = lo; b < hi; ++b) {
        const int lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b], lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
        bad |= lq < 0 || lk < 0;
        tiles += lq > 0 ? (lq + VA_BLOCK_M - 1) / VA_BLOCK_M : 0;
    }
    if (bad) broken = 1;
    sums[t] = tiles;
    __syncthreads();
    // Inclusive scan of the threads' tile counts (Hillis-Steele).
    for (int offset = 1; offset < VA_PLAN_THREADS; offset <<= 1) {
        const int add = t >= offset ? sums[t - offset] : 0;
        __syncthreads();
        sums[t] += add;
        __syncthreads();
    }
    int start = sums[t] - tiles;
    int* tile_sequence = va_tile_sequence_table(p);
    for (int b = lo; b < hi; ++b) {
        p.tile_start[b] = start;
        const int lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
        const int count = lq > 0 ? (lq + VA_BLOCK_M - 1) / VA_BLOCK_M : 0;
        if (!broken)
            for (int i = 0; i < count; ++i) tile_sequence[start + i] = b;
        start += count;
    }
    const int total = broken ? 0 : sums[VA_PLAN_THREADS - 1];
    for (int i = total + t; i < va_device_grid_tiles(p); i += VA_PLAN_THREADS) tile_sequence[i] = -1;
    if (t == VA_PLAN_THREADS - 1) p.tile_start[n] = total;
    if (t == 0 && broken) *p.status = 1;
    if (broken) va_fill_nan(p);
}

// The sequence of query tile `tile_index`, or -1 when the grid's block has no tile (cu_seqlens
// on the device: the grid is an upper bound). One load where `va_plan_tiles` wrote the table,
// a division where every sequence has as many tiles (a batch of same-sized images), else a
// binary search over tile_start (in the parameter block for small batches): its dependent
// loads sit between a unit and its first copy (64 images × 256 tokens: six of them).
VA_DEVICE int va_tile_sequence(const VaParams& p, int tile_index) {
    if (p.status != nullptr) return va_tile_sequence_table(p)[tile_index];
    if (p.tiles_per_sequence > 0) return tile_index / p.tiles_per_sequence;
    // The last sequence whose first tile is <= this one (empty sequences have no tiles).
    int lo = 0, hi = p.batch;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (va_metadata(p, 2, mid) <= tile_index) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The work of one block: a (query tile, head) pair and which of its key splits.
struct VaWork {
    int tile_index, head;
    int split, splits; // this block's share of the pair's key tiles: split of splits
    int slot;          // split blocks: their index after the whole pairs' (partial outputs); else -1
};

// Block `block`'s work. The whole pairs come first and the split ones last, so that the blocks
// of a last, partly filled wave (launched last) are the split ones: a wave of 160 pairs on 132
// multiprocessors runs 132 of them whole, then the other 28 as 4 × 28 blocks of a quarter of
// the keys each, instead of 28 whole blocks on an otherwise idle GPU.
// Pair i is query tile i % tiles of head i / tiles (`va_unit_tiles`).
VA_DEVICE VaWork va_block_work(const VaParams& p, int tiles, int block) {
    VaWork work;
    const bool whole = block < p.whole_pairs;
    const int slot = block - p.whole_pairs;
    const int pair = whole ? block : p.whole_pairs + slot / p.splits;
#if VA_HEADS_INNER
    work.tile_index = pair / p.heads;
    work.head = pair % p.heads;
#else
    work.tile_index = pair % tiles;
    work.head = pair / tiles;
#endif
    work.split = whole ? 0 : slot % p.splits;
    work.splits = whole ? 1 : p.splits;
    work.slot = whole ? -1 : slot;
    return work;
}

// The tile of `work`, whose sequence is `b` (`va_tile_sequence`).
VA_DEVICE VaTile va_schedule_tile(const VaParams& p, int b, const VaWork& work) {
    const int tile_index = work.tile_index, head = work.head;
    VaTile tile;
    tile.q_start = va_metadata(p, 0, b);
    tile.lq = va_metadata(p, 0, b + 1) - tile.q_start;
    const int k_start = va_metadata(p, 1, b);
    tile.lk = va_metadata(p, 1, b + 1) - k_start;
    tile.m0 = (tile_index - va_metadata(p, 2, b)) * VA_BLOCK_M;
    tile.offset = tile.lk - tile.lq;
    tile.head = head;
    tile.slot = work.slot;
    tile.split = work.split;
    tile.splits = work.splits;

    // Keys seen by any row of this tile, then this split's share of their tiles.
    const int last_row = min(tile.m0 + VA_BLOCK_M, tile.lq) - 1;
    const int n_lo = va_visible_keys(p, tile, tile.m0).first, n_hi = va_visible_keys(p, tile, last_row).last + 1;
    const int first_block = n_lo / VA_BLOCK_N;
    const int blocks = n_hi > n_lo ? (n_hi + VA_BLOCK_N - 1) / VA_BLOCK_N - first_block : 0;
    const int per_split = (blocks + work.splits - 1) / work.splits;
    tile.j_begin = first_block + min(blocks, work.split * per_split);
    tile.j_end = first_block + min(blocks, (work.split + 1) * per_split);

    const int kv_head = head / p.group;
    tile.k_start = k_start;
    tile.kv_head = kv_head;
    tile.q = va_query_rows(p, tile.q_start, head);
    tile.k = va_key_value_rows(p, b, k_start, kv_head, false);
    tile.v = va_key_value_rows(p, b, k_start, kv_head, true);
    tile.alibi = va_alibi_coefficient(p, b, head);

    return tile;
}

// The query tiles the units of a persistent grid are numbered over: with cu_seqlens on the
// device, the ones `va_plan_tiles` counted rather than the grid's upper bound, so that no
// empty units sit among the real ones (each head's range would end in some, unevenly spread
// over the blocks: measured 8-12% slower on mixed batches).
VA_DEVICE int va_unit_tiles(const VaParams& p) { return p.status != nullptr ? p.tile_start[p.batch] : p.tiles; }

// Work units of the launch over `tiles` query tiles: one per whole pair, `splits` per split
// pair (cu_seqlens on the device: no splits, every pair whole).
VA_DEVICE int va_units(const VaParams& p, int tiles) {
    const int pairs = tiles * p.heads;
    return pairs <= p.whole_pairs ? pairs : p.whole_pairs + (pairs - p.whole_pairs) * p.splits;
}

// Calls `run(tile)` for each unit of this block that has a tile: units blockIdx.x,
// blockIdx.x + gridDim.x, ... (one where the grid has a block per unit; on Hopper the host may
// launch one block per multiprocessor, which then overlaps one tile's end with the next one's
// loads).
template <typename F> VA_DEVICE void va_for_each_tile(const VaParams& p, F run) {
    const int tiles = va_unit_tiles(p), units = va_units(p, tiles);
    for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
        const VaWork work = va_block_work(p, tiles, unit);
        const int sequence = va_tile_sequence(p, work.tile_index);
        if (sequence >= 0) run(va_schedule_tile(p, sequence, work));
    }
}

// Which work a block does: the sequence and query tile of its index (the query tiles of all
// sequences are numbered one after another, `tile_start` holding each sequence's first), and
// the key tiles of its split.

#pragma once

// The tile of block (tile_index, head, split).
VA_DEVICE VaTile va_schedule_tile(const VaParams& p, int tile_index, int head, int split) {
    // Which sequence and query tile: the last sequence whose first tile is <= this one (empty
    // sequences have no tiles and are skipped).
    int lo = 0, hi = p.batch;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (va_metadata(p, 2, mid) <= tile_index) lo = mid; else hi = mid - 1;
    }
    const int b = lo;
    VaTile tile;
    tile.q_start = va_metadata(p, 0, b);
    tile.lq = va_metadata(p, 0, b + 1) - tile.q_start;
    const int k_start = va_metadata(p, 1, b);
    tile.lk = va_metadata(p, 1, b + 1) - k_start;
    tile.m0 = (tile_index - va_metadata(p, 2, b)) * VA_BLOCK_M;
    tile.offset = tile.lk - tile.lq;
    tile.head = head;
    tile.split = split;

    // Keys seen by any row of this tile, then this split's share of their tiles.
    const int last_row = min(tile.m0 + VA_BLOCK_M, tile.lq) - 1;
    const int n_lo = va_visible_keys(p, tile, tile.m0).first, n_hi = va_visible_keys(p, tile, last_row).last + 1;
    const int first_block = n_lo / VA_BLOCK_N;
    const int blocks = n_hi > n_lo ? (n_hi + VA_BLOCK_N - 1) / VA_BLOCK_N - first_block : 0;
    const int per_split = (blocks + p.splits - 1) / p.splits;
    tile.j_begin = first_block + min(blocks, split * per_split);
    tile.j_end = first_block + min(blocks, (split + 1) * per_split);

    const int kv_head = head / p.group;
    tile.k_start = k_start;
    tile.kv_head = kv_head;
    tile.q = p.q + (va_i64)tile.q_start * p.q_token_stride + (va_i64)head * p.q_head_stride;
    tile.k = p.k + (va_i64)k_start * p.k_token_stride + (va_i64)kv_head * p.k_head_stride;
    tile.v = p.v + (va_i64)k_start * p.v_token_stride + (va_i64)kv_head * p.v_head_stride;

    return tile;
}

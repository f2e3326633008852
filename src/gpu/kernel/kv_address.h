// Where a tile's rows live in global memory: a head's rows of Q, K and V, row r of such a
// slice, and which token row holds key j of the sequence. The schedule (`tile.q`, `tile.k`,
// `tile.v`), the cp.async loaders (`rows.row(r)`) and Hopper's tensor-memory copies
// (`va_key_token`) ask here: packed keys and values are rows of a [tokens, heads, dims]
// tensor, paged ones (VA_PAGED) rows of a cache's blocks named by the block table.

#pragma once

// Sequence rows from `q_start` of query head `head`.
VA_DEVICE VaHeadRows va_query_rows(const VaParams& p, int q_start, int head) {
    return VaHeadRows{p.q + (va_i64)q_start * p.q_token_stride + (va_i64)head * p.q_head_stride, p.q_token_stride};
}

// The keys (`values` false) or values of sequence `b`, whose first key token is `k_start`, of
// kv head `kv_head`.
VA_DEVICE VaKeyRows va_key_value_rows(const VaParams& p, int b, int k_start, int kv_head, bool values) {
    const va_u16* tensor = values ? p.v : p.k;
    const va_i64 token_stride = values ? p.v_token_stride : p.k_token_stride;
    const va_i64 head_stride = values ? p.v_head_stride : p.k_head_stride;
#if VA_PAGED
    const va_i64 block_stride = values ? p.v_block_stride : p.k_block_stride;
    return VaPagedRows{tensor + (va_i64)kv_head * head_stride, token_stride, block_stride,
                       p.block_table + (va_i64)b * p.block_table_stride, p.block_size};
#else
    (void)b;
    return VaHeadRows{tensor + (va_i64)k_start * token_stride + (va_i64)kv_head * head_stride, token_stride};
#endif
}

// The token row of K and V (their tensor maps' row coordinate) that holds key `key` of the
// tile's sequence (packed keys only: paged calls copy by cp.async).
VA_DEVICE int va_key_token(const VaTile& tile, int key) { return tile.k_start + key; }

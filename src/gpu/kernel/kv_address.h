// Where a tile's rows live in global memory: a head's rows of Q, K and V from a sequence's
// first token, row r of such a slice, and which token row holds key j of the sequence. The
// schedule (`tile.q`, `tile.k`, `tile.v`), the cp.async loaders (`VA_ROW`) and Hopper's
// tensor-memory copies (`va_key_token`) ask here, so that another addressing of the keys (a
// paged cache's block table) is a change of this header.

#pragma once

// Sequence rows from `q_start` of query head `head`: the start of that head's [tokens, dims]
// slice of Q from there.
VA_DEVICE const va_u16* va_query_rows(const VaParams& p, int q_start, int head) {
    return p.q + (va_i64)q_start * p.q_token_stride + (va_i64)head * p.q_head_stride;
}

// The same for the keys and values of kv head `kv_head` from token `k_start`: key j of the
// sequence is `VA_ROW` j from there.
VA_DEVICE const va_u16* va_key_rows(const VaParams& p, int k_start, int kv_head) {
    return p.k + (va_i64)k_start * p.k_token_stride + (va_i64)kv_head * p.k_head_stride;
}
VA_DEVICE const va_u16* va_value_rows(const VaParams& p, int k_start, int kv_head) {
    return p.v + (va_i64)k_start * p.v_token_stride + (va_i64)kv_head * p.v_head_stride;
}

// Row `row` of a [tokens, dims] head slice that starts at `rows`, `token_stride` apart. A macro,
// not a function: it expands to the very expression the loaders had, so the generated code
// stays the same.
#define VA_ROW(rows, token_stride, row) ((rows) + (va_i64)(row) * (token_stride))

// The token row of K and V (their tensor maps' row coordinate) that holds key `key` of the
// tile's sequence.
VA_DEVICE int va_key_token(const VaTile& tile, int key) { return tile.k_start + key; }

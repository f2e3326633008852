// A head's rows in global memory, as the loaders copy them: row r of a packed [tokens, heads,
// dims] tensor, or key r of a sequence in a paged cache (VA_PAGED). `kv_address.h` builds
// them for a tile.

#pragma once

// A head's rows of a [tokens, heads, dims] tensor from a sequence's first token: row r at
// `base + r · token_stride`.
struct VaHeadRows {
    static constexpr bool PAGED = false;
    const va_u16* base;
    va_i64 token_stride;
    VA_DEVICE const va_u16* row(int r) const { return base + (va_i64)r * token_stride; }
};

#if VA_PAGED
// A head's keys (or values) of one sequence in a paged cache [blocks, block_size, heads, dims]:
// key r is slot r % block_size of block `blocks[r / block_size]`. `base` is the head's first
// row of block 0. Only rows of the sequence's keys are asked for, whose entries the host
// checked.
struct VaPagedRows {
    static constexpr bool PAGED = true;
    const va_u16* base;
    va_i64 token_stride, block_stride;
    const int* blocks; // the sequence's row of the block table
    int block_size;
    VA_DEVICE const va_u16* row(int r) const {
        return base + (va_i64)blocks[r / block_size] * block_stride + (va_i64)(r % block_size) * token_stride;
    }
};
using VaKeyRows = VaPagedRows;
#else
using VaKeyRows = VaHeadRows;
#endif

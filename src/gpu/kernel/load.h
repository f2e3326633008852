// Tile copies from global to shared memory, for every target (Hopper's tensor-memory copies
// are in tile_wgmma.h).

#pragma once

// Copies rows [row0, row0 + ROWS) of one head's rows (`VaHeadRows` or `VaPagedRows`) into shared
// memory (`stride` elements per row), zero-filling rows past `valid_rows` and columns past
// `dims`; rows past `valid_rows` are not addressed.
template <int DIM_PAD, int ROWS, typename R>
VA_DEVICE void va_load_tile(va_u16* smem, int stride, const R& rows, int row0, int valid_rows, int dims) {
    constexpr int CHUNKS = DIM_PAD / 8;
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += VA_THREADS) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const int row = row0 + r;
        int elems = dims - c;
        elems = row < valid_rows ? (elems < 0 ? 0 : (elems > 8 ? 8 : elems)) : 0;
        const va_u16* src = elems > 0 ? rows.row(row) + c : rows.base;
#if defined(VA_NVIDIA)
        va_copy16(smem + r * stride + c, src, elems * 2);
#else
        for (int e = 0; e < 8; ++e) smem[r * stride + c + e] = e < elems ? src[e] : (va_u16)0;
#endif
    }
}

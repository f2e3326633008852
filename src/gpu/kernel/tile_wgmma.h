// NVIDIA Hopper (sm_90a): one tile with warpgroup MMAs. The block is two warpgroups of four
// warps, each owning 64 query rows (16 per warp, in the same fragment layout as mma.sync, so the
// softmax and the write are shared with tile_mma.h). Q, K and V sit in shared memory in layouts
// the tensor cores read directly (64-column slabs with 128-byte swizzle, the rest of a head in
// core matrices): S = Q K^T takes both operands from there, O += P V takes P from registers (the
// score accumulators, rounded) and V from there, transposed by the instruction. No ldmatrix, and
// one K or V read serves 64 rows.

#pragma once

#include "wgmma.h"

// A [ROWS, WIDTH] tile in shared memory as the tensor cores read it: the first 64 · SLABS
// columns in slabs of 64, each slab a column of 1024-byte atoms (8 rows × 128 bytes, 128-byte
// swizzle: a row's 16-byte chunk c sits at chunk c XOR row % 8); the last TAIL_CHUNKS · 8
// columns (head dims that are not multiples of 64: 72's last 8) after the slabs in the
// no-swizzle core-matrix layout, groups of 8 rows each TAIL_CHUNKS core matrices long. Every
// part is a multiple of 1024 bytes, so every slab starts on an atom.
template <int ROWS, int WIDTH> struct VaCoreTile {
    static constexpr int SLABS = WIDTH / 64;
    static constexpr int TAIL_CHUNKS = (WIDTH % 64) / 8;
    static constexpr int SLAB = ROWS * 64;      // elements of one slab
    static constexpr int TAIL = SLABS * SLAB;   // where the tail starts
    static constexpr int ELEMS = ROWS * WIDTH;
};

// Calls copy(i) for i in [threadIdx.x, COUNT) in steps of the block: a fixed number of steps,
// unrolled into straight-line copies where the registers allow it (heads up to 128 wide; wider
// ones keep their registers for the output).
template <int COUNT, typename F> VA_DEVICE void va_for_each_copy(F copy) {
    // (The unroll count must be positive: one more than the steps is the same as all of them.)
#pragma unroll(VA_HEAD_DIM_V_PAD <= 128 ? COUNT / VA_THREADS + 1 : 1)
    for (int k = 0; k < COUNT / VA_THREADS; ++k) copy(threadIdx.x + k * VA_THREADS);
    if constexpr (COUNT % VA_THREADS != 0) {
        if (threadIdx.x < COUNT % VA_THREADS) copy(threadIdx.x + COUNT / VA_THREADS * VA_THREADS);
    }
}

// Rows [row0, row0 + ROWS) of one head's [tokens, dims] slice into a VaCoreTile; rows past
// `valid_rows` and columns past `dims` are zero-filled. In the slabs, eight consecutive
// threads copy one row's 128 contiguous bytes into one 128-byte atom row (full sectors from
// L2, distinct banks); in the tail, eight consecutive threads fill one core matrix.
template <int ROWS, int WIDTH>
VA_DEVICE void va_load_core_tile(va_u16* smem, const va_u16* base, va_i64 token_stride, int row0, int valid_rows, int dims) {
    using T = VaCoreTile<ROWS, WIDTH>;
    const auto copy = [&](va_u16* dst, int row, int col) {
        int elems = dims - col;
        elems = row0 + row < valid_rows ? (elems < 0 ? 0 : (elems > 8 ? 8 : elems)) : 0;
        const va_u16* src = elems > 0 ? base + (va_i64)(row0 + row) * token_stride + col : base;
        va_copy16(dst, src, elems * 2);
    };
    va_for_each_copy<ROWS * T::SLABS * 8>([&](int i) {
        const int chunk = i % 8, row = (i / 8) % ROWS, slab = i / (8 * ROWS);
        copy(smem + slab * T::SLAB + row * 64 + (chunk ^ (row % 8)) * 8, row, slab * 64 + chunk * 8);
    });
    va_for_each_copy<ROWS * T::TAIL_CHUNKS>([&](int i) {
        const int r8 = i % 8, c = (i / 8) % T::TAIL_CHUNKS, group = i / (8 * T::TAIL_CHUNKS);
        copy(smem + T::TAIL + ((group * T::TAIL_CHUNKS + c) * 8 + r8) * 8, group * 8 + r8, T::SLABS * 64 + c * 8);
    });
}

// The descriptor of k-step kk (16 columns) of the rows from `first_row` (a multiple of 8) of a
// K-major VaCoreTile: in a slab, the 32-byte step within its atoms; in the tail, two core
// matrices.
template <int ROWS, int WIDTH> VA_DEVICE va_u64 va_k_major_descriptor(const va_u16* tile, int first_row, int kk) {
    using T = VaCoreTile<ROWS, WIDTH>;
    if (kk < T::SLABS * 4) return va_wgmma_descriptor(tile + (kk / 4) * T::SLAB + first_row * 64 + (kk % 4) * 16, 16, 1024, 1);
    return va_wgmma_descriptor(tile + T::TAIL + first_row * T::TAIL_CHUNKS * 8 + (kk - T::SLABS * 4) * 128, 128, T::TAIL_CHUNKS * 128);
}

// O[:, N0 : N0 + REST) += P V for the 16-key step kk, one instruction per piece: up to 128
// columns at a time from the slabs (MN-major, 128-byte swizzle: atoms along N one slab apart,
// along K 1024 bytes apart), then 64, 32, 16 or 8 from the tail. head_dim_v 72 is 64 + 8, with
// no padded columns.
template <int N0, int REST>
VA_DEVICE void va_wgmma_pv(float (&o)[VA_HEAD_DIM_V_PAD / 8][4], const va_u32 (&a)[4], const va_u16* vs, int kk) {
    if constexpr (REST > 0) {
        using T = VaCoreTile<VA_BLOCK_N, VA_HEAD_DIM_V_PAD>;
        constexpr bool SLAB = N0 < T::SLABS * 64;
        constexpr int AVAILABLE = SLAB ? T::SLABS * 64 - N0 : REST;
        constexpr int P = AVAILABLE >= 128 ? 128 : AVAILABLE >= 64 ? 64 : AVAILABLE >= 32 ? 32 : AVAILABLE >= 16 ? 16 : 8;
        va_u64 b;
        if constexpr (SLAB) {
            b = va_wgmma_descriptor(vs + (N0 / 64) * T::SLAB + kk * 16 * 64, T::SLAB * 2, 1024, 1);
        } else {
            b = va_wgmma_descriptor(vs + T::TAIL + kk * 2 * T::TAIL_CHUNKS * 64 + ((N0 - T::SLABS * 64) / 8) * 64,
                                    T::TAIL_CHUNKS * 128, 128);
        }
        VaWgmma<P>::template rs<1>(*reinterpret_cast<float(*)[P / 2]>(&o[N0 / 8][0]), a, b, 1);
        va_wgmma_pv<N0 + P, REST - P>(o, a, vs, kk);
    }
}

VA_DEVICE void va_attention_tile_wgmma(const VaParams& p, const VaTile& tile, va_u16* smem) {
    constexpr int KQ = VA_HEAD_DIM_PAD / 16;  // k-steps of the score product
    constexpr int NS = VA_BLOCK_N / 8;        // 8-key chunks of a score row
    constexpr int NO = VA_HEAD_DIM_V_PAD / 8; // 8-column chunks of an output row
    constexpr int K_TILE = VaCoreTile<VA_BLOCK_N, VA_HEAD_DIM_PAD>::ELEMS;
    constexpr int V_TILE = VaCoreTile<VA_BLOCK_N, VA_HEAD_DIM_V_PAD>::ELEMS;
    // Swizzled atoms must start on 1024 bytes: the host allots 1 KiB more for the alignment.
    smem += ((1024 - (va_smem_addr(smem) & 1023)) & 1023) / 2;
    va_u16* q_smem = smem;                                  // [BLOCK_M * HEAD_DIM_PAD]
    va_u16* k_smem = q_smem + VA_BLOCK_M * VA_HEAD_DIM_PAD; // [2][K_TILE]
    va_u16* v_smem = k_smem + 2 * K_TILE;                   // [2][V_TILE]
    const int warp = threadIdx.x / VA_WARP, lane = threadIdx.x % VA_WARP;
    const int g = lane / 4, t = lane % 4;

    va_load_core_tile<VA_BLOCK_M, VA_HEAD_DIM_PAD>(q_smem, tile.q, p.q_token_stride, tile.m0, tile.lq, p.head_dim);
    if (tile.j_begin < tile.j_end) {
        va_load_core_tile<VA_BLOCK_N, VA_HEAD_DIM_PAD>(k_smem, tile.k, p.k_token_stride, tile.j_begin * VA_BLOCK_N, tile.lk, p.head_dim);
        va_load_core_tile<VA_BLOCK_N, VA_HEAD_DIM_V_PAD>(v_smem, tile.v, p.v_token_stride, tile.j_begin * VA_BLOCK_N, tile.lk,
                                                          p.head_dim_v);
    }
    va_copy_commit();
    va_copy_wait<0>();
    va_fence_proxy_async();
    va_syncthreads();

    // This warpgroup's 64 rows of Q.
    const int q_first = (warp / 4) * 64;
    const int warp_first = tile.m0 + warp * 16;
    const int warp_last = min(warp_first + 15, tile.lq - 1);
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float(&o_flat)[NO * 4] = reinterpret_cast<float(&)[NO * 4]>(o);
    VaRows rows = va_rows(warp_first, g);
    const float factor = p.softcap > 0.0f ? 1.0f : p.scale_log2;

    for (int j = tile.j_begin; j < tile.j_end; ++j) {
        const int buf = (j - tile.j_begin) & 1;
        const va_u16* ks = k_smem + buf * K_TILE;
        const va_u16* vs = v_smem + buf * V_TILE;

        // S = Q K^T: both operands K-major in shared memory.
        float s[NS][4];
        float(&s_flat)[NS * 4] = reinterpret_cast<float(&)[NS * 4]>(s);
        va_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
            VaWgmma<VA_BLOCK_N>::ss<0>(s_flat, va_k_major_descriptor<VA_BLOCK_M, VA_HEAD_DIM_PAD>(q_smem, q_first, kk),
                                       va_k_major_descriptor<VA_BLOCK_N, VA_HEAD_DIM_PAD>(ks, 0, kk), kk > 0);
        }
        va_wgmma_commit();
        // The next tile streams in while this one is computed, its copies issued while the
        // tensor cores work on the scores; its buffer was last read by the previous iteration,
        // which every thread has finished (the barrier at the loop's end).
        if (j + 1 < tile.j_end) {
            va_load_core_tile<VA_BLOCK_N, VA_HEAD_DIM_PAD>(k_smem + (buf ^ 1) * K_TILE, tile.k, p.k_token_stride, (j + 1) * VA_BLOCK_N,
                                                           tile.lk, p.head_dim);
            va_load_core_tile<VA_BLOCK_N, VA_HEAD_DIM_V_PAD>(v_smem + (buf ^ 1) * V_TILE, tile.v, p.v_token_stride, (j + 1) * VA_BLOCK_N,
                                                             tile.lk, p.head_dim_v);
            va_copy_commit();
        }
        va_wgmma_wait<0>();
        va_fence_registers(s_flat);

        const bool masked = va_tile_needs_mask(p, tile, j, warp_first, warp_last);
        va_softmax_fragment(p, tile, s, o, rows, j * VA_BLOCK_N + 2 * t, masked, factor);

        // O += P V: P from registers, V MN-major in shared memory.
        va_u32 pf[VA_BLOCK_N / 16][4];
#pragma unroll
        for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) va_probability_fragment(pf[kk], s, kk);
        va_fence_registers(o_flat);
        va_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) va_wgmma_pv<0, VA_HEAD_DIM_V_PAD>(o, pf[kk], vs, kk);
        va_wgmma_commit();
        va_wgmma_wait<0>();
        va_fence_registers(o_flat);

        if (j + 1 < tile.j_end) {
            va_copy_wait<0>();
            va_fence_proxy_async();
        }
        va_syncthreads();
    }

    va_store_fragment(p, tile, o, rows, factor, t);
}

// NVIDIA Hopper (sm_90a): one tile with warpgroup MMAs. The block is two warpgroups of four
// warps, each owning 64 query rows (16 per warp, in the same fragment layout as mma.sync, so the
// softmax and the write are shared with tile_mma.h). Q, K and V sit in shared memory in the
// no-swizzle core-matrix layout the tensor cores read directly: S = Q K^T takes both operands
// from there, O += P V takes P from registers (the score accumulators, rounded) and V from
// there, transposed by the instruction. No ldmatrix, and one K or V read serves 64 rows.

#pragma once

#include "wgmma.h"

// Rows [row0, row0 + ROWS) of one head's [tokens, dims] slice into shared memory in the
// core-matrix layout: groups of 8 rows, each group CHUNKS core matrices (8 rows × 8 elements,
// 128 contiguous bytes) one after another along the row. Eight consecutive threads fill one
// core matrix, so a warp's 16-byte copies land on distinct banks. Rows past `valid_rows` and
// columns past `dims` are zero-filled.
template <int CHUNKS, int ROWS>
VA_DEVICE void va_load_core_tile(va_u16* smem, const va_u16* base, va_i64 token_stride, int row0, int valid_rows, int dims) {
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += VA_THREADS) {
        const int r8 = i % 8, c = (i / 8) % CHUNKS, group = i / (8 * CHUNKS);
        const int row = row0 + group * 8 + r8;
        int elems = dims - c * 8;
        elems = row < valid_rows ? (elems < 0 ? 0 : (elems > 8 ? 8 : elems)) : 0;
        const va_u16* src = elems > 0 ? base + (va_i64)row * token_stride + c * 8 : base;
        va_copy16(smem + ((group * CHUNKS + c) * 8 + r8) * 8, src, elems * 2);
    }
}

// O[:, N0 : N0 + REST) += P V for one 16-key step (`v_keys`: its first 8-key group), in pieces
// of 128, 64, 32, 16 and 8 columns (one instruction each): head_dim_v 72 is 64 + 8, with no
// padded columns.
template <int N0, int REST>
VA_DEVICE void va_wgmma_pv(float (&o)[VA_HEAD_DIM_V_PAD / 8][4], const va_u32 (&a)[4], const va_u16* v_keys) {
    if constexpr (REST > 0) {
        constexpr int P = REST >= 128 ? 128 : REST >= 64 ? 64 : REST >= 32 ? 32 : REST >= 16 ? 16 : 8;
        constexpr int VC = VA_HEAD_DIM_V_PAD / 8;
        // Along K (keys) the next core matrix is the next 8-key group; along N, the next one.
        const va_u64 b = va_wgmma_descriptor(v_keys + (N0 / 8) * 64, VC * 128, 128);
        VaWgmma<P>::template rs<1>(*reinterpret_cast<float(*)[P / 2]>(&o[N0 / 8][0]), a, b, 1);
        va_wgmma_pv<N0 + P, REST - P>(o, a, v_keys);
    }
}

VA_DEVICE void va_attention_tile_wgmma(const VaParams& p, const VaTile& tile, va_u16* smem) {
    constexpr int QC = VA_HEAD_DIM_PAD / 8;   // core matrices along a row of Q and K
    constexpr int VC = VA_HEAD_DIM_V_PAD / 8; // ... of V
    constexpr int KQ = VA_HEAD_DIM_PAD / 16;  // k-steps of the score product
    constexpr int NS = VA_BLOCK_N / 8;        // 8-key chunks of a score row
    constexpr int NO = VA_HEAD_DIM_V_PAD / 8; // 8-column chunks of an output row
    constexpr int K_TILE = VA_BLOCK_N * VA_HEAD_DIM_PAD, V_TILE = VA_BLOCK_N * VA_HEAD_DIM_V_PAD;
    va_u16* q_smem = smem;                                  // [BLOCK_M * HEAD_DIM_PAD]
    va_u16* k_smem = q_smem + VA_BLOCK_M * VA_HEAD_DIM_PAD; // [2][K_TILE]
    va_u16* v_smem = k_smem + 2 * K_TILE;                   // [2][V_TILE]
    const int warp = threadIdx.x / VA_WARP, lane = threadIdx.x % VA_WARP;
    const int g = lane / 4, t = lane % 4;

    va_load_core_tile<QC, VA_BLOCK_M>(q_smem, tile.q, p.q_token_stride, tile.m0, tile.lq, p.head_dim);
    if (tile.j_begin < tile.j_end) {
        va_load_core_tile<QC, VA_BLOCK_N>(k_smem, tile.k, p.k_token_stride, tile.j_begin * VA_BLOCK_N, tile.lk, p.head_dim);
        va_load_core_tile<VC, VA_BLOCK_N>(v_smem, tile.v, p.v_token_stride, tile.j_begin * VA_BLOCK_N, tile.lk, p.head_dim_v);
    }
    va_copy_commit();
    va_copy_wait<0>();
    va_fence_proxy_async();
    va_syncthreads();

    // This warpgroup's 64 rows of Q (8 row groups); a k-step is two core matrices further on.
    const va_u16* q_group = q_smem + (warp / 4) * 64 * VA_HEAD_DIM_PAD;
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
        // The next tile streams in while this one is computed; its buffer was last read by the
        // previous iteration, which every thread has finished (the barrier at the loop's end).
        if (j + 1 < tile.j_end) {
            va_load_core_tile<QC, VA_BLOCK_N>(k_smem + (buf ^ 1) * K_TILE, tile.k, p.k_token_stride, (j + 1) * VA_BLOCK_N, tile.lk,
                                              p.head_dim);
            va_load_core_tile<VC, VA_BLOCK_N>(v_smem + (buf ^ 1) * V_TILE, tile.v, p.v_token_stride, (j + 1) * VA_BLOCK_N, tile.lk,
                                              p.head_dim_v);
            va_copy_commit();
        }
        const va_u16* ks = k_smem + buf * K_TILE;
        const va_u16* vs = v_smem + buf * V_TILE;

        // S = Q K^T: both operands K-major in shared memory.
        float s[NS][4];
        float(&s_flat)[NS * 4] = reinterpret_cast<float(&)[NS * 4]>(s);
        va_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
            VaWgmma<VA_BLOCK_N>::ss<0>(s_flat, va_wgmma_descriptor(q_group + kk * 128, 128, QC * 128),
                                       va_wgmma_descriptor(ks + kk * 128, 128, QC * 128), kk > 0);
        }
        va_wgmma_commit();
        va_wgmma_wait<0>();
        va_fence_registers(s_flat);

        const bool masked = va_tile_needs_mask(p, tile, j, warp_first, warp_last);
        va_softmax_fragment(p, tile, s, o, rows, j * VA_BLOCK_N + 2 * t, masked, factor);

        // O += P V: P from registers, V N-major in shared memory.
        va_u32 pf[VA_BLOCK_N / 16][4];
#pragma unroll
        for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) va_probability_fragment(pf[kk], s, kk);
        va_fence_registers(o_flat);
        va_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) va_wgmma_pv<0, VA_HEAD_DIM_V_PAD>(o, pf[kk], vs + kk * 2 * VC * 64);
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

// NVIDIA sm_80 and newer: one tile with m16n8k16 `mma.sync`. Each warp owns MT slices of 16
// rows; Q's fragments stay in registers (or are re-read per step for wide heads); K and V
// fragments come from padded shared-memory rows through ldmatrix. With MT = 2 every K and V
// fragment read from shared memory feeds two MMAs.

#pragma once

VA_DEVICE void va_attention_tile_mma(const VaParams& p, const VaTile& tile, va_u16* smem) {
    va_u16* q_smem = smem;                                   // [BLOCK_M][Q_STRIDE]
    va_u16* k_smem = q_smem + VA_BLOCK_M * VA_Q_STRIDE;      // [2][BLOCK_N][Q_STRIDE]
    va_u16* v_smem = k_smem + 2 * VA_BLOCK_N * VA_Q_STRIDE;  // [2][BLOCK_N][V_STRIDE]
    const int warp = threadIdx.x / VA_WARP, lane = threadIdx.x % VA_WARP;
    const int g = lane / 4, t = lane % 4;
    constexpr int MT = VA_ROWS_PER_WARP / 16;
    constexpr int KQ = VA_HEAD_DIM_PAD / 16;  // k-steps of the score product
    constexpr int NS = VA_BLOCK_N / 8;        // 8-key chunks of a score row
    constexpr int NO = VA_HEAD_DIM_V_PAD / 8; // 8-column chunks of an output row

    va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_M>(q_smem, VA_Q_STRIDE, tile.q, tile.m0, tile.lq, p.head_dim);
    va_copy_commit();
    if (tile.j_begin < tile.j_end) {
        va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_N>(k_smem, VA_Q_STRIDE, tile.k, tile.j_begin * VA_BLOCK_N, tile.lk,
                                                  p.head_dim);
        va_load_tile<VA_HEAD_DIM_V_PAD, VA_BLOCK_N>(v_smem, VA_V_STRIDE, tile.v, tile.j_begin * VA_BLOCK_N, tile.lk,
                                                    p.head_dim_v);
    }
    va_copy_commit();
    va_copy_wait<1>();
    va_syncthreads();

    const int warp_first = tile.m0 + warp * VA_ROWS_PER_WARP;
    const int warp_last = min(warp_first + VA_ROWS_PER_WARP - 1, tile.lq - 1);
    // This lane's ldmatrix row of Q, per 16-row slice.
    const va_u16* q_rows[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        q_rows[mt] = q_smem + (warp * VA_ROWS_PER_WARP + mt * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * VA_Q_STRIDE + 8 * (lane / 16);
#if VA_Q_IN_REGISTERS
    va_u32 qf[MT][KQ][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) va_ldmatrix_x4(qf[mt][kk], q_rows[mt] + kk * 16);
#endif

    float o[MT][NO][4];
    VaRows rows[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int n = 0; n < NO; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
        rows[mt] = va_rows(warp_first + mt * 16, g);
    }
    const float factor = va_score_factor(p);

    for (int j = tile.j_begin; j < tile.j_end; ++j) {
        const int buf = (j - tile.j_begin) & 1;
        if (j + 1 < tile.j_end) {
            const int nb = buf ^ 1;
            va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_N>(k_smem + nb * VA_BLOCK_N * VA_Q_STRIDE, VA_Q_STRIDE, tile.k,
                                                      (j + 1) * VA_BLOCK_N, tile.lk, p.head_dim);
            va_load_tile<VA_HEAD_DIM_V_PAD, VA_BLOCK_N>(v_smem + nb * VA_BLOCK_N * VA_V_STRIDE, VA_V_STRIDE, tile.v,
                                                        (j + 1) * VA_BLOCK_N, tile.lk, p.head_dim_v);
            va_copy_commit();
            va_copy_wait<1>();
        } else {
            va_copy_wait<0>();
        }
        va_syncthreads();
        const va_u16* ks = k_smem + buf * VA_BLOCK_N * VA_Q_STRIDE;
        const va_u16* vs = v_smem + buf * VA_BLOCK_N * VA_V_STRIDE;

        // S = Q K^T for this warp's rows and the tile's keys.
        float s[MT][NS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
#if VA_Q_IN_REGISTERS
#define VA_Q_FRAGMENT(mt) qf[mt][kk]
#else
            // Wide heads with two row slices per warp: Q fragments come from shared memory per
            // step, leaving the registers to the accumulators.
            va_u32 qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) va_ldmatrix_x4(qa[mt], q_rows[mt] + kk * 16);
#define VA_Q_FRAGMENT(mt) qa[mt]
#endif
#pragma unroll
            for (int nn = 0; nn < NS / 2; ++nn) {
                va_u32 kb[4];
                va_ldmatrix_x4(kb, ks + (nn * 16 + (lane % 8) + 8 * (lane / 16)) * VA_Q_STRIDE + kk * 16 + 8 * ((lane / 8) % 2));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    va_mma_16816(s[mt][2 * nn], VA_Q_FRAGMENT(mt), kb[0], kb[1]);
                    va_mma_16816(s[mt][2 * nn + 1], VA_Q_FRAGMENT(mt), kb[2], kb[3]);
                }
            }
#undef VA_Q_FRAGMENT
        }

        const bool masked = va_tile_needs_mask(p, tile, j, warp_first, warp_last);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float alpha[2];
            va_softmax_fragment(p, tile, s[mt], rows[mt], j * VA_BLOCK_N + 2 * t, j * VA_BLOCK_N, masked, factor, alpha);
            va_rescale_fragment(o[mt], alpha);
        }

        // O += P V.
#pragma unroll
        for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) {
            va_u32 pf[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) va_probability_fragment(pf[mt], s[mt], kk);
#pragma unroll
            for (int nn = 0; nn < NO / 2; ++nn) {
                va_u32 vb[4];
                va_ldmatrix_x4_trans(vb, vs + (kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * VA_V_STRIDE + nn * 16 + 8 * (lane / 16));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    va_mma_16816(o[mt][2 * nn], pf[mt], vb[0], vb[1]);
                    va_mma_16816(o[mt][2 * nn + 1], pf[mt], vb[2], vb[3]);
                }
            }
        }
        va_syncthreads(); // the buffer is refilled next iteration
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        va_total_rows(rows[mt]);
        va_store_fragment(p, tile, o[mt], rows[mt], factor, t);
    }
}

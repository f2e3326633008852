// AMD CDNA: one tile with 16x16x16 MFMA on wave64. Each wave owns 16 query rows. Lane l
// holds, of a 16x16 accumulator tile, rows 4 (l / 16) + i (i < 4) of column l % 16; A fragments
// are row l % 16, k = 4 (l / 16) + 0..3; B fragments are k = 4 (l / 16) + 0..3 of column l % 16.
// The probabilities go through shared memory (per wave) to become A fragments. K and V are
// loaded once per key tile (one buffer).

#pragma once

typedef short va_short4 __attribute__((ext_vector_type(4)));
typedef float va_float4 __attribute__((ext_vector_type(4)));
#if defined(VA_IS_F16)
typedef _Float16 va_half4 __attribute__((ext_vector_type(4)));
VA_DEVICE va_float4 va_mfma(va_short4 a, va_short4 b, va_float4 c) {
    return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(va_half4, a), __builtin_bit_cast(va_half4, b), c, 0, 0, 0);
}
#else
VA_DEVICE va_float4 va_mfma(va_short4 a, va_short4 b, va_float4 c) { return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0); }
#endif

VA_DEVICE va_short4 va_load4(const va_u16* p) {
    va_short4 r;
    r.x = (short)p[0];
    r.y = (short)p[1];
    r.z = (short)p[2];
    r.w = (short)p[3];
    return r;
}

VA_DEVICE void va_attention_tile_mfma(const VaParams& p, const VaTile& tile, va_u16* smem) {
    va_u16* q_smem = smem;                                   // [BLOCK_M][Q_STRIDE]
    va_u16* k_smem = q_smem + VA_BLOCK_M * VA_Q_STRIDE;      // [BLOCK_N][Q_STRIDE] (one of two buffers used)
    va_u16* v_smem = k_smem + 2 * VA_BLOCK_N * VA_Q_STRIDE;  // [BLOCK_N][V_STRIDE]
    va_u16* p_smem = v_smem + 2 * VA_BLOCK_N * VA_V_STRIDE;  // [waves][16][BLOCK_N]
    const int lq = tile.lq, lk = tile.lk, m0 = tile.m0;
    constexpr int KQ = VA_HEAD_DIM_PAD / 16, NS = VA_BLOCK_N / 16, NO = VA_HEAD_DIM_V_PAD / 16;
    const int wave = threadIdx.x / VA_WARP, lane = threadIdx.x % VA_WARP;
    const int col = lane % 16, quad = lane / 16;
    va_u16* pw = p_smem + wave * 16 * VA_BLOCK_N;

    va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_M>(q_smem, VA_Q_STRIDE, tile.q, m0, lq, p.head_dim);
    va_float4 o[NO];
    for (int n = 0; n < NO; ++n) o[n] = va_float4{0.0f, 0.0f, 0.0f, 0.0f};
    float row_max[4], row_sum[4];
    for (int i = 0; i < 4; ++i) row_max[i] = VA_NEG_INF, row_sum[i] = 0.0f;

    for (int j = tile.j_begin; j < tile.j_end; ++j) {
        va_syncthreads();
        va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_N>(k_smem, VA_Q_STRIDE, tile.k, j * VA_BLOCK_N, lk, p.head_dim);
        va_load_tile<VA_HEAD_DIM_V_PAD, VA_BLOCK_N>(v_smem, VA_V_STRIDE, tile.v, j * VA_BLOCK_N, lk, p.head_dim_v);
        va_syncthreads();

        va_float4 s[NS];
        for (int n = 0; n < NS; ++n) {
            s[n] = va_float4{0.0f, 0.0f, 0.0f, 0.0f};
            for (int kk = 0; kk < KQ; ++kk) {
                const va_short4 a = va_load4(q_smem + (wave * 16 + col) * VA_Q_STRIDE + kk * 16 + 4 * quad);
                const va_short4 b = va_load4(k_smem + (n * 16 + col) * VA_Q_STRIDE + kk * 16 + 4 * quad);
                s[n] = va_mfma(a, b, s[n]);
            }
        }
        float tile_max[4] = {VA_NEG_INF, VA_NEG_INF, VA_NEG_INF, VA_NEG_INF};
        for (int n = 0; n < NS; ++n) {
            for (int i = 0; i < 4; ++i) {
                float x = s[n][i];
                // Base-2 logits, rounded before the max is subtracted, so that the max's own term is
                // exactly 0 however large the scores (fragments.h: a fused multiply-subtract keeps
                // the max's rounding error; the NVIDIA tiles take this path only for huge logits).
                x = va_logit(p, x);
                const int row = m0 + wave * 16 + 4 * quad + i, key = j * VA_BLOCK_N + n * 16 + col;
#if VA_ALIBI
                // The coefficient is in score units: times the factor, base-2 units.
                if (tile.alibi != 0.0f) x -= tile.alibi * va_score_factor(p) * va_alibi_distance(tile, row, key);
#endif
                x = va_key_visible(p, tile, row, key) ? x : VA_NEG_INF;
                s[n][i] = x;
                tile_max[i] = fmaxf(tile_max[i], x);
            }
        }
        for (int i = 0; i < 4; ++i) {
            for (int m = 1; m < 16; m *= 2) tile_max[i] = fmaxf(tile_max[i], va_shfl_xor(tile_max[i], m));
            const float new_max = fmaxf(row_max[i], tile_max[i]);
            const float shift = new_max == VA_NEG_INF ? 0.0f : new_max;
            const float alpha = va_exp2(row_max[i] - shift);
            row_max[i] = new_max;
            row_sum[i] *= alpha;
            for (int n = 0; n < NO; ++n) o[n][i] *= alpha;
            for (int n = 0; n < NS; ++n) {
                const float pe = va_exp2(s[n][i] - shift);
                row_sum[i] += pe;
                pw[(4 * quad + i) * VA_BLOCK_N + n * 16 + col] = va_from_float(pe);
            }
        }
        va_syncthreads();
        for (int kc = 0; kc < NS; ++kc) {
            const va_short4 a = va_load4(pw + col * VA_BLOCK_N + kc * 16 + 4 * quad);
            for (int n = 0; n < NO; ++n) {
                const va_u16* vcol = v_smem + (kc * 16 + 4 * quad) * VA_V_STRIDE + n * 16 + col;
                va_short4 b;
                b.x = (short)vcol[0];
                b.y = (short)vcol[VA_V_STRIDE];
                b.z = (short)vcol[2 * VA_V_STRIDE];
                b.w = (short)vcol[3 * VA_V_STRIDE];
                o[n] = va_mfma(a, b, o[n]);
            }
        }
    }
    for (int i = 0; i < 4; ++i) {
        float sum = row_sum[i];
        for (int m = 1; m < 16; m *= 2) sum += va_shfl_xor(sum, m);
        const int row = m0 + wave * 16 + 4 * quad + i;
        if (row >= lq) continue;
        const int token = tile.q_start + row;
        const bool seen = sum != 0.0f;
        float lse = seen ? row_max[i] * VA_LN2 + logf(sum) : VA_NEG_INF;
        // A split's partial rows leave the sink to the merge kernel.
        const float keep = tile.slot < 0 ? va_join_sink(p, tile.head, lse) : 1.0f;
        for (int n = 0; n < NO; ++n) {
            const int c = n * 16 + col;
            const float value = seen ? o[n][i] / sum * keep : 0.0f;
            if (tile.slot < 0) {
                if (c < p.head_dim_v) p.out[(va_i64)token * p.out_token_stride + (va_i64)tile.head * p.out_head_stride + c] = va_from_float(value);
            } else {
                p.partial_out[va_partial_row(tile, row) * VA_HEAD_DIM_V_PAD + c] = value;
            }
        }
        if (col == 0) {
            if (tile.slot < 0) {
                if (p.lse) p.lse[(va_i64)tile.head * p.total_q + token] = lse;
            } else {
                p.partial_lse[va_partial_row(tile, row)] = lse;
            }
        }
    }
}

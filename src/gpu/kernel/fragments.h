// NVIDIA: the online softmax and the final write on accumulator fragments, shared by the
// mma.sync and the warpgroup-MMA tiles. Both hold a 16-row slice of scores and outputs per warp
// in the m16n8 accumulator layout: thread (g = lane / 4, t = lane % 4) holds, of each 8-column
// chunk, rows g and g + 8 (elements 0-1 and 2-3) of columns 2t and 2t + 1.

#pragma once

// Per-row running state of one 16-row fragment slice (this thread's rows g and g + 8).
struct VaRows {
    int row[2];       // rows within the sequence
    float max[2];     // running maximum of the scores, in score units
    float sum[2];     // running sum of exp2((s - max) · factor), this thread's columns only
};

VA_DEVICE VaRows va_rows(int first_row, int g) {
    return VaRows{{first_row + g, first_row + g + 8}, {VA_NEG_INF, VA_NEG_INF}, {0.0f, 0.0f}};
}

// One key tile of the online softmax: soft-cap (in base-2 units), ALiBi's bias, masked keys to
// -inf where
// `masked` (this thread's first column holds key `key0`; keys below `key_floor` repeat the tile
// before's, as in a last tile loaded flush with the sequence's end), the new row maxima, and
// then `s` becomes the probabilities exp2(s · factor - max · factor) (one FMA and one ex2 each)
// while the row sums are rescaled by the change of the maxima, which `alpha` returns for the
// output (`va_rescale_fragment`). Scores stay in `factor` units: factor is `va_score_factor`
// (score.h).
//
// Large finite scores: the fused fma(s, factor, -max · factor) keeps the rounding error of
// max · factor, up to half an ulp of the logit, which exp2 turns into inf or 0 for every score
// of the row once logits pass 2^31 (inf/NaN outputs from finite inputs). Where a row's logits
// reach 2^24 (never for ordinary inputs; the test is one vote per warp and tile) the scores are
// first rounded to logits, so that the max's own term is exactly 0, as on the CPU.
template <int NS>
VA_DEVICE void va_softmax_fragment(const VaParams& p, const VaTile& tile, float (&s)[NS][4], VaRows& r, int key0, int key_floor,
                                   bool masked, float factor, float (&alpha)[2]) {
    if (va_has_softcap(p)) {
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = va_softcap_score(p, s[n][e]);
    }
#if VA_ALIBI
    if (tile.alibi != 0.0f) {
        // ALiBi, in score units, before the mask (masked keys then become -inf whatever
        // their bias).
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] -= tile.alibi * va_alibi_distance(tile, r.row[e / 2], key0 + n * 8 + (e % 2));
    }
#endif
    if (masked) {
        // Each row's visible range once, then two compares and a select per score.
        VaVisible visible[2] = {va_visible_keys(p, tile, r.row[0]), va_visible_keys(p, tile, r.row[1])};
        visible[0].first = max(visible[0].first, key_floor);
        visible[1].first = max(visible[1].first, key_floor);
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + n * 8 + (e % 2);
                const VaVisible& v = visible[e / 2];
                s[n][e] = key >= v.first && key <= v.last ? s[n][e] : VA_NEG_INF;
            }
    }
    // Maxima and sums run as four interleaved chains per row, not one dependent chain of NS
    // steps: with two warps per scheduler, nothing else would hide those latencies.
    // Each chain starts from its first chunk, not from -inf (a maximum with -inf is not folded
    // away: one wasted instruction per chain). A row's maximum is the same either way, NaN
    // scores included: fmaxf drops a NaN beside a number, and `new_max` below takes the
    // running maximum beside a tile whose scores were all NaN.
    static_assert(NS % 4 == 0, "key tiles are multiples of 32 keys");
    float chain[2][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) {
        const float row0 = fmaxf(s[n][0], s[n][1]), row1 = fmaxf(s[n][2], s[n][3]);
        chain[0][n % 4] = n < 4 ? row0 : fmaxf(chain[0][n % 4], row0);
        chain[1][n % 4] = n < 4 ? row1 : fmaxf(chain[1][n % 4], row1);
    }
    float tile_max[2], shift[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        tile_max[i] = fmaxf(fmaxf(chain[i][0], chain[i][1]), fmaxf(chain[i][2], chain[i][3]));
        tile_max[i] = fmaxf(tile_max[i], va_shfl_xor(tile_max[i], 1));
        tile_max[i] = fmaxf(tile_max[i], va_shfl_xor(tile_max[i], 2));
        const float new_max = fmaxf(r.max[i], tile_max[i]);
        // A row that has seen only masked keys subtracts 0, not -inf (no NaN from inf - inf).
        shift[i] = new_max == VA_NEG_INF ? 0.0f : new_max * factor;
        // Both logits rounded (no contraction into an FMA): the exponent is at most 0.
        alpha[i] = va_exp2(__fmul_rn(r.max[i], factor) - shift[i]);
        r.max[i] = new_max;
    }
    float f = factor;
    if (va_any(fabsf(shift[0]) >= 0x1p24f || fabsf(shift[1]) >= 0x1p24f)) {
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = __fmul_rn(s[n][e], factor); // never fused with the subtraction
        f = 1.0f;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) chain[0][c] = chain[1][c] = 0.0f;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float pe = va_exp2(fmaf(s[n][e], f, -shift[e / 2]));
            s[n][e] = pe;
            chain[e / 2][n % 4] += pe;
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) r.sum[i] = fmaf(r.sum[i], alpha[i], (chain[i][0] + chain[i][1]) + (chain[i][2] + chain[i][3]));
}

// The output rows scaled by the change of their maxima. A warp none of whose rows changed its
// maximum (every alpha exactly 1: exp2 of exactly 0) skips the multiplications, which would
// leave O as it is: on long rows most key tiles raise no row's maximum, and the softmax is
// bound by instruction issue.
template <int NO> VA_DEVICE void va_rescale_fragment(float (&o)[NO][4], const float (&alpha)[2]) {
    if (!va_any(alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

// The probabilities of keys [16 kk, 16 kk + 16) as the A fragment of a 16-key MMA step: the
// accumulators of two adjacent 8-key chunks are exactly that fragment (FlashAttention-2's
// register reuse).
template <int NS> VA_DEVICE void va_probability_fragment(va_u32 (&a)[4], const float (&s)[NS][4], int kk) {
    a[0] = va_pack2(s[2 * kk][0], s[2 * kk][1]);
    a[1] = va_pack2(s[2 * kk][2], s[2 * kk][3]);
    a[2] = va_pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = va_pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// A row's log-sum-exp in natural-log units, from its total (`va_total_rows`): -inf where the
// row saw no key.
VA_DEVICE float va_row_lse(const VaRows& r, int i, float factor) {
    return r.sum[i] != 0.0f ? r.max[i] * factor * VA_LN2 + logf(r.sum[i]) : VA_NEG_INF;
}

// The row sums across the quad: each thread held its own columns' share; `va_store_fragment`
// divides by the totals. The Hopper tile calls this before it waits for its last value
// product, so that the four shuffles run under the tensor cores' work: after the first row's
// stores, the second row's queued behind them (Nsight on the H200, 64 images x 256: 6% of the
// computing warps' stall samples).
VA_DEVICE void va_total_rows(VaRows& r) {
    float a = r.sum[0], b = r.sum[1];
    a += va_shfl_xor(a, 1);
    b += va_shfl_xor(b, 1);
    a += va_shfl_xor(a, 2);
    b += va_shfl_xor(b, 2);
    r.sum[0] = a;
    r.sum[1] = b;
}

// A warp's write of its rows of O from `o` scaled per row by `scale` (bf16 or f16, rows past the
// sequence's end left alone). Stores read their registers late, when the memory pipe takes
// them, and the compiler reuses a register as soon as the store is issued: the next write to
// it waits for the store (Nsight on the H200, 64 images x 256: the LSE pointer, loaded into
// each row's address registers after its nine stores, waited for them in 9% of the computing
// warps' stall samples). So where every column of the padded width is the head's (head_dim_v
// 72 of 72: the usual case), both rows are packed into registers of their own first, with both
// addresses, and then stored row after row.
template <int NO>
VA_DEVICE void va_write_rows(const VaParams& p, const VaTile& tile, const float (&o)[NO][4], const float (&scale)[2], const VaRows& r,
                             const bool (&inside)[2], int t) {
    va_u16* dst[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
        dst[i] = p.out + (va_i64)(tile.q_start + r.row[i]) * p.out_token_stride + (va_i64)tile.head * p.out_head_stride;
    if (p.head_dim_v == NO * 8) {
        va_u32 packed[2][NO];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int n = 0; n < NO; ++n) packed[i][n] = va_pack2(o[n][2 * i] * scale[i], o[n][2 * i + 1] * scale[i]);
#pragma unroll
        for (int i = 0; i < 2; ++i)
            if (inside[i])
#pragma unroll
                for (int n = 0; n < NO; ++n) *(va_u32*)(dst[i] + n * 8 + 2 * t) = packed[i][n];
    } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (!inside[i]) continue;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                const int col = n * 8 + 2 * t;
                const float a = o[n][2 * i] * scale[i], c = o[n][2 * i + 1] * scale[i];
                if (col + 1 < p.head_dim_v) {
                    *(va_u32*)(dst[i] + col) = va_pack2(a, c);
                } else if (col < p.head_dim_v) {
                    dst[i][col] = va_from_float(a);
                }
            }
        }
    }
}

// Whether this warp's split block is the last of its pair to have written a 16-row group's
// partial rows (`group_row`: the group's first row in the sequence), which then combines
// every split's (`va_combine_splits`) in place of a second kernel: the last block to finish
// does the fix-up, as stream-K does, and no block waits for another. Each lane fences its
// partial rows, the warp counts itself in at the group's counter, and the last to arrive
// puts the counter back to 0 for the next launch and fences again before it reads the
// others' rows.
VA_DEVICE bool va_last_split(const VaParams& p, const VaTile& tile, int group_row) {
    int* counter = p.split_counters + (tile.slot / tile.splits) * (VA_BLOCK_M / 16) + (group_row - tile.m0) / 16;
    __threadfence();
    __syncwarp();
    int arrived = 0;
    if (threadIdx.x % VA_WARP == 0) arrived = atomicAdd(counter, 1);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != tile.splits - 1) return false;
    if (threadIdx.x % VA_WARP == 0) *counter = 0;
    __threadfence();
    return true;
}

// Every split's partial rows of this thread's fragment places, combined by their LSEs as the
// merge kernel does (combine.h): `o` gets the output rows' weighted sums, `scale` what
// normalizes them (as `va_total_rows` gives a whole tile's), and `lse` their log-sum-exps.
// One pass with a running maximum, this split's own rows (`own`, normalized, and `own_lse`)
// taken from registers and the others' loaded, so that no load waits for the one before and
// two splits' loads go out together. The splits are folded in their order, not with this
// block's first: whichever split finishes last, the sums and so the bits are the same on every
// run. The loads bypass L1 (.cg): other multiprocessors wrote those rows.
template <int NO>
VA_DEVICE void va_combine_splits(const VaParams& p, const VaTile& tile, const VaRows& r, const bool (&inside)[2], int t,
                                 const float (&own)[NO][4], const float (&own_lse)[2], float (&o)[NO][4], float (&scale)[2],
                                 float (&lse)[2]) {
    float top[2] = {VA_NEG_INF, VA_NEG_INF}, total[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll 2
    for (int s = 0; s < tile.splits; ++s) {
        const bool mine = s == tile.split;
        float split_lse[2];
        float2 split_rows[2][NO];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            // The splits' partial rows of one pair lie VA_BLOCK_M apart.
            const va_i64 row = va_partial_row(tile, r.row[i]) + (va_i64)(s - tile.split) * VA_BLOCK_M;
            const bool load = inside[i] && !mine;
            split_lse[i] = mine ? own_lse[i] : load ? __ldcg(p.partial_lse + row) : VA_NEG_INF;
            const float* src = p.partial_out + row * VA_HEAD_DIM_V_PAD + 2 * t;
#pragma unroll
            for (int n = 0; n < NO; ++n)
                split_rows[i][n] = mine   ? make_float2(own[n][2 * i], own[n][2 * i + 1])
                                   : load ? __ldcg(reinterpret_cast<const float2*>(src + n * 8))
                                          : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float m = fmaxf(top[i], split_lse[i]);
            if (m == VA_NEG_INF) continue; // no split so far has seen a key
            const float keep = exp2f((top[i] - m) * VA_LOG2E), w = exp2f((split_lse[i] - m) * VA_LOG2E);
            total[i] = total[i] * keep + w;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                o[n][2 * i] = o[n][2 * i] * keep + w * split_rows[i][n].x;
                o[n][2 * i + 1] = o[n][2 * i + 1] * keep + w * split_rows[i][n].y;
            }
            top[i] = m;
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const bool seen = total[i] > 0.0f;
        lse[i] = seen ? top[i] + logf(total[i]) : VA_NEG_INF;
        scale[i] = seen ? 1.0f / total[i] : 0.0f;
        scale[i] *= va_join_sink(p, tile.head, lse[i]);
    }
}

// The LSE of this thread's rows, `lse(i)` for row i (0: g, 1: g + 8), where the caller asked
// for it: one thread of each quad writes it.
template <typename F>
VA_DEVICE void va_write_lse(const VaParams& p, const VaTile& tile, const VaRows& r, const bool (&inside)[2], int t, F lse) {
    if (t != 0 || !p.lse) return;
#pragma unroll
    for (int i = 0; i < 2; ++i)
        if (inside[i]) p.lse[(va_i64)tile.head * p.total_q + tile.q_start + r.row[i]] = lse(i);
}

// One write of O (or of this split's partial O) and the LSE, from row totals (`va_total_rows`).
// The LSE follows the rows; its logarithm is taken only where someone reads it. A split
// block writes f32 partial rows; where the splits are combined in the kernel
// (`p.split_counters`), the last split to write a 16-row group then writes its O and LSE.
template <int NO>
VA_DEVICE void va_store_fragment(const VaParams& p, const VaTile& tile, const float (&o)[NO][4], const VaRows& r, float factor,
                                 int t) {
    float inv[2];
    bool inside[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        // No visible key (or only -inf scores): 0 and -inf. One division per row (an IEEE
        // division is a dozen instructions and a slow-path call; per element they were most of
        // the epilogue's code).
        inv[i] = r.sum[i] != 0.0f ? 1.0f / r.sum[i] : 0.0f;
        inside[i] = r.row[i] < tile.lq;
    }
    if (tile.slot >= 0) {
        float own[NO][4], own_lse[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            own_lse[i] = va_row_lse(r, i, factor);
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                own[n][2 * i] = o[n][2 * i] * inv[i];
                own[n][2 * i + 1] = o[n][2 * i + 1] * inv[i];
            }
            if (!inside[i]) continue;
            const va_i64 partial = va_partial_row(tile, r.row[i]);
            float* dst = p.partial_out + partial * VA_HEAD_DIM_V_PAD;
#pragma unroll
            for (int n = 0; n < NO; ++n)
                *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) = make_float2(own[n][2 * i], own[n][2 * i + 1]);
            if (t == 0) p.partial_lse[partial] = own_lse[i];
        }
        if (p.split_counters == nullptr || !va_last_split(p, tile, r.row[0] - (int)(threadIdx.x % VA_WARP) / 4)) return;
        float combined[NO][4], scale[2], lse[2];
        va_combine_splits(p, tile, r, inside, t, own, own_lse, combined, scale, lse);
        va_write_rows(p, tile, combined, scale, r, inside, t);
        va_write_lse(p, tile, r, inside, t, [&](int i) { return lse[i]; });
        return;
    }
    if (p.sinks_count != 0) {
        // The sink joins each row's denominator: the LSE first, then the output's factor.
        float lse[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            lse[i] = va_row_lse(r, i, factor);
            inv[i] *= va_join_sink(p, tile.head, lse[i]);
        }
        va_write_rows(p, tile, o, inv, r, inside, t);
        va_write_lse(p, tile, r, inside, t, [&](int i) { return lse[i]; });
        return;
    }
    va_write_rows(p, tile, o, inv, r, inside, t);
    va_write_lse(p, tile, r, inside, t, [&](int i) { return va_row_lse(r, i, factor); });
}

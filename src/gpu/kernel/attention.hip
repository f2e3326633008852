// Variable-length multi-head attention, forward pass: FlashAttention-2's structure.
//
// One block per (query tile of BLOCK_M rows, head, key split), the query tiles of all sequences
// numbered one after another (`tile_start`, the prefix sums of each sequence's tile count), so a
// batch of many short sequences is one launch with no idle blocks. Each warp owns 16 query rows:
// Q stays in registers; K/V tiles of BLOCK_N keys stream through shared memory, double-buffered
// with asynchronous copies; scores, the online softmax (base-2, scale folded in) and the output
// accumulate in f32 registers; O and the LSE are written once. With key splits (small problems
// that would leave the GPU idle), each split writes a partial result and `va_attention_merge`
// combines them by their LSE.
//
// Compile-time constants (-D): VA_HEAD_DIM_PAD (head_dim rounded up to 16, the MMA's K step),
// VA_HEAD_DIM_V_PAD (head_dim_v rounded up to 16), VA_BLOCK_N (keys per tile), VA_IS_F16
// (f16 instead of bf16), VA_ROWS_PER_WARP (16 or 32; BLOCK_M is VA_WARPS times that),
// VA_Q_IN_REGISTERS (0: Q fragments are re-read from shared memory, for wide heads).
//
// The tensor-core code (per warp: the score tile, the softmax on its fragments, the P·V update)
// is NVIDIA's m16n8k16 `mma.sync` here and AMD's 16x16x16 MFMA under VA_AMD.

#include "portability.h"

#ifndef VA_HEAD_DIM_PAD
#define VA_HEAD_DIM_PAD 64
#endif
#ifndef VA_HEAD_DIM_V_PAD
#define VA_HEAD_DIM_V_PAD 64
#endif
#ifndef VA_BLOCK_N
#define VA_BLOCK_N 64
#endif
#ifndef VA_ROWS_PER_WARP
#define VA_ROWS_PER_WARP 16
#endif
#ifndef VA_Q_IN_REGISTERS
#define VA_Q_IN_REGISTERS 1
#endif
#define VA_WARPS 4
#define VA_THREADS (VA_WARPS * VA_WARP)
#define VA_BLOCK_M (VA_WARPS * VA_ROWS_PER_WARP)
// Shared-memory rows are padded by 8 elements (16 bytes) so that the 8 rows of an ldmatrix
// land on distinct banks.
#define VA_Q_STRIDE (VA_HEAD_DIM_PAD + 8)
#define VA_V_STRIDE (VA_HEAD_DIM_V_PAD + 8)

// Must match `KernelParams` in src/gpu/plan.rs field by field.
#define VA_INLINE_METADATA 195
struct VaParams {
    const va_u16* q;
    const va_u16* k;
    const va_u16* v;
    va_u16* out;
    float* lse;              // [heads][total_q], or null
    float* partial_out;      // [splits][total_q][heads][VA_HEAD_DIM_V_PAD] with splits > 1
    float* partial_lse;      // [splits][heads][total_q] with splits > 1
    const int* cu_seqlens_q;
    const int* cu_seqlens_k;
    const int* tile_start;   // [batch + 1]: first query tile of each sequence
    va_i64 q_token_stride, q_head_stride;
    va_i64 k_token_stride, k_head_stride;
    va_i64 v_token_stride, v_head_stride;
    va_i64 out_token_stride, out_head_stride;
    int batch, heads, group, total_q;
    int head_dim, head_dim_v;
    int window_left, window_right; // -1: unbounded
    int splits;
    float scale_log2;        // softmax scale times log2(e) (no soft-cap)
    float softcap;           // 0: none
    float scale_over_softcap;
    // Small batches carry cu_seqlens_q, cu_seqlens_k and tile_start here, one after another
    // (batch + 1 each), so a call needs no copy to the device before its launch.
    int inline_metadata;
    int metadata[VA_INLINE_METADATA];
};

// Entry `i` of cu_seqlens_q (which = 0), cu_seqlens_k (1) or tile_start (2).
VA_DEVICE int va_metadata(const VaParams& p, int which, int i) {
    if (p.inline_metadata) return p.metadata[which * (p.batch + 1) + i];
    const int* a = which == 0 ? p.cu_seqlens_q : which == 1 ? p.cu_seqlens_k : p.tile_start;
    return a[i];
}

#define VA_LOG2E 1.4426950408889634f
#define VA_LN2 0.6931471805599453f
#define VA_NEG_INF (-__int_as_float(0x7f800000))

// Copies rows [row0, row0 + rows) of one head's [tokens, dims] slice into shared memory
// (`stride` elements per row), zero-filling rows past `valid_rows` and columns past `dims`.
template <int DIM_PAD, int ROWS>
VA_DEVICE void va_load_tile(va_u16* smem, int stride, const va_u16* base, va_i64 token_stride, int row0, int valid_rows,
                            int dims) {
    constexpr int CHUNKS = DIM_PAD / 8;
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += VA_THREADS) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const int row = row0 + r;
        int elems = dims - c;
        elems = row < valid_rows ? (elems < 0 ? 0 : (elems > 8 ? 8 : elems)) : 0;
        const va_u16* src = elems > 0 ? base + (va_i64)row * token_stride + c : base;
#if defined(VA_NVIDIA)
        va_copy16(smem + r * stride + c, src, elems * 2);
#else
        for (int e = 0; e < 8; ++e) smem[r * stride + c + e] = e < elems ? src[e] : (va_u16)0;
#endif
    }
}


#if defined(VA_AMD)
// ---- AMD: 16x16x16 MFMA on wave64. Each wave owns 16 query rows. Lane l holds, of a 16x16
// accumulator tile, rows 4 (l / 16) + i (i < 4) of column l % 16; A fragments are row l % 16,
// k = 4 (l / 16) + 0..3; B fragments are k = 4 (l / 16) + 0..3 of column l % 16. The
// probabilities go through shared memory (per wave) to become A fragments.
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

VA_DEVICE void va_attention_tile_amd(const VaParams& p, va_u16* q_smem, va_u16* k_smem, va_u16* v_smem, va_u16* p_smem,
                                     const va_u16* q_base, const va_u16* k_base, const va_u16* v_base, int q_start, int lq,
                                     int lk, int m0, int offset, int head, int split, int j_begin, int j_end) {
    constexpr int KQ = VA_HEAD_DIM_PAD / 16, NS = VA_BLOCK_N / 16, NO = VA_HEAD_DIM_V_PAD / 16;
    const int wave = threadIdx.x / VA_WARP, lane = threadIdx.x % VA_WARP;
    const int col = lane % 16, quad = lane / 16;
    va_u16* pw = p_smem + wave * 16 * VA_BLOCK_N;
    const float factor = p.softcap > 0.0f ? 1.0f : p.scale_log2;

    va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_M>(q_smem, VA_Q_STRIDE, q_base, p.q_token_stride, m0, lq, p.head_dim);
    va_float4 o[NO];
    for (int n = 0; n < NO; ++n) o[n] = va_float4{0.0f, 0.0f, 0.0f, 0.0f};
    float row_max[4], row_sum[4];
    for (int i = 0; i < 4; ++i) row_max[i] = VA_NEG_INF, row_sum[i] = 0.0f;

    for (int j = j_begin; j < j_end; ++j) {
        va_syncthreads();
        va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_N>(k_smem, VA_Q_STRIDE, k_base, p.k_token_stride, j * VA_BLOCK_N, lk, p.head_dim);
        va_load_tile<VA_HEAD_DIM_V_PAD, VA_BLOCK_N>(v_smem, VA_V_STRIDE, v_base, p.v_token_stride, j * VA_BLOCK_N, lk, p.head_dim_v);
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
                if (p.softcap > 0.0f) x = p.softcap * tanhf(x * p.scale_over_softcap) * VA_LOG2E;
                const int row = m0 + wave * 16 + 4 * quad + i, key = j * VA_BLOCK_N + n * 16 + col;
                const bool seen = key < lk && (p.window_left < 0 || key >= row + offset - p.window_left) &&
                                  (p.window_right < 0 || key <= row + offset + p.window_right);
                x = seen ? x : VA_NEG_INF;
                s[n][i] = x;
                tile_max[i] = fmaxf(tile_max[i], x);
            }
        }
        for (int i = 0; i < 4; ++i) {
            for (int m = 1; m < 16; m *= 2) tile_max[i] = fmaxf(tile_max[i], va_shfl_xor(tile_max[i], m));
            const float new_max = fmaxf(row_max[i], tile_max[i]);
            const float shift = new_max == VA_NEG_INF ? 0.0f : new_max * factor;
            const float alpha = va_exp2(row_max[i] * factor - shift);
            row_max[i] = new_max;
            row_sum[i] *= alpha;
            for (int n = 0; n < NO; ++n) o[n][i] *= alpha;
            for (int n = 0; n < NS; ++n) {
                const float pe = va_exp2(fmaf(s[n][i], factor, -shift));
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
        const int token = q_start + row;
        const bool seen = sum != 0.0f;
        const float lse = seen ? row_max[i] * factor * VA_LN2 + logf(sum) : VA_NEG_INF;
        for (int n = 0; n < NO; ++n) {
            const int c = n * 16 + col;
            const float value = seen ? o[n][i] / sum : 0.0f;
            if (p.splits == 1) {
                if (c < p.head_dim_v) p.out[(va_i64)token * p.out_token_stride + (va_i64)head * p.out_head_stride + c] = va_from_float(value);
            } else {
                p.partial_out[(((va_i64)split * p.total_q + token) * p.heads + head) * VA_HEAD_DIM_V_PAD + c] = value;
            }
        }
        if (col == 0) {
            if (p.splits == 1) {
                if (p.lse) p.lse[(va_i64)head * p.total_q + token] = lse;
            } else {
                p.partial_lse[((va_i64)split * p.heads + head) * p.total_q + token] = lse;
            }
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds_va(VA_THREADS) va_attention_forward(VA_GRID_CONSTANT const VaParams p) {
    extern __shared__ __align__(16) va_u16 smem[];
    va_u16* q_smem = smem;
    va_u16* k_smem = q_smem + VA_BLOCK_M * VA_Q_STRIDE;           // [2][BLOCK_N][Q_STRIDE]
    va_u16* v_smem = k_smem + 2 * VA_BLOCK_N * VA_Q_STRIDE;       // [2][BLOCK_N][V_STRIDE]

    // Which sequence and query tile: the last sequence whose first tile is <= this one (empty
    // sequences have no tiles and are skipped).
    const int tile = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
    int lo = 0, hi = p.batch;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (va_metadata(p, 2, mid) <= tile) lo = mid; else hi = mid - 1;
    }
    const int b = lo;
    const int q_start = va_metadata(p, 0, b), lq = va_metadata(p, 0, b + 1) - q_start;
    const int k_start = va_metadata(p, 1, b), lk = va_metadata(p, 1, b + 1) - k_start;
    const int m0 = (tile - va_metadata(p, 2, b)) * VA_BLOCK_M;
    const int kv_head = head / p.group;
    const int offset = lk - lq; // bottom-right alignment of masks

    // Keys seen by any row of this tile, then this split's share of their tiles.
    const int last_row = min(m0 + VA_BLOCK_M, lq) - 1;
    int n_lo = 0, n_hi = lk;
    if (p.window_left >= 0) n_lo = max(0, m0 + offset - p.window_left);
    if (p.window_right >= 0) n_hi = min(lk, last_row + offset + p.window_right + 1);
    const int first_block = n_lo / VA_BLOCK_N;
    const int blocks = n_hi > n_lo ? (n_hi + VA_BLOCK_N - 1) / VA_BLOCK_N - first_block : 0;
    const int per_split = (blocks + p.splits - 1) / p.splits;
    const int j_begin = first_block + min(blocks, split * per_split);
    const int j_end = first_block + min(blocks, (split + 1) * per_split);

    const va_u16* q_base = p.q + (va_i64)q_start * p.q_token_stride + (va_i64)head * p.q_head_stride;
    const va_u16* k_base = p.k + (va_i64)k_start * p.k_token_stride + (va_i64)kv_head * p.k_head_stride;
    const va_u16* v_base = p.v + (va_i64)k_start * p.v_token_stride + (va_i64)kv_head * p.v_head_stride;

    const int warp = threadIdx.x / VA_WARP, lane = threadIdx.x % VA_WARP;

#if defined(VA_NVIDIA)
    // ---- NVIDIA: mma.sync m16n8k16. Each warp owns MT tiles of 16 rows; thread (g = lane / 4,
    // t = lane % 4) holds, of each 16x8 accumulator tile, rows g and g + 8, columns 2t, 2t + 1.
    // With MT = 2 every K and V fragment read from shared memory feeds two MMAs.
    const int g = lane / 4, t = lane % 4;
    constexpr int MT = VA_ROWS_PER_WARP / 16;
    constexpr int KQ = VA_HEAD_DIM_PAD / 16;  // k-steps of the score product
    constexpr int NS = VA_BLOCK_N / 8;        // 8-key accumulator tiles of a score row
    constexpr int NO = VA_HEAD_DIM_V_PAD / 8; // 8-column accumulator tiles of an output row

    va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_M>(q_smem, VA_Q_STRIDE, q_base, p.q_token_stride, m0, lq, p.head_dim);
    va_copy_commit();
    if (j_begin < j_end) {
        va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_N>(k_smem, VA_Q_STRIDE, k_base, p.k_token_stride, j_begin * VA_BLOCK_N, lk, p.head_dim);
        va_load_tile<VA_HEAD_DIM_V_PAD, VA_BLOCK_N>(v_smem, VA_V_STRIDE, v_base, p.v_token_stride, j_begin * VA_BLOCK_N, lk, p.head_dim_v);
    }
    va_copy_commit();
    va_copy_wait<1>();
    va_syncthreads();

    const int warp_first = m0 + warp * VA_ROWS_PER_WARP;
    // This lane's ldmatrix row of Q, per 16-row tile.
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
    float row_max[MT][2], row_sum[MT][2];
    int rows[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int n = 0; n < NO; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
        row_max[mt][0] = row_max[mt][1] = VA_NEG_INF;
        row_sum[mt][0] = row_sum[mt][1] = 0.0f;
        rows[mt][0] = warp_first + mt * 16 + g;
        rows[mt][1] = warp_first + mt * 16 + g + 8;
    }
    // Scores stay in `factor` units so that each probability costs one FMA and one ex2:
    // exp2(s · factor - max · factor).
    const float factor = p.softcap > 0.0f ? 1.0f : p.scale_log2;

    for (int j = j_begin; j < j_end; ++j) {
        const int buf = (j - j_begin) & 1;
        if (j + 1 < j_end) {
            const int nb = buf ^ 1;
            va_load_tile<VA_HEAD_DIM_PAD, VA_BLOCK_N>(k_smem + nb * VA_BLOCK_N * VA_Q_STRIDE, VA_Q_STRIDE, k_base, p.k_token_stride,
                                                      (j + 1) * VA_BLOCK_N, lk, p.head_dim);
            va_load_tile<VA_HEAD_DIM_V_PAD, VA_BLOCK_N>(v_smem + nb * VA_BLOCK_N * VA_V_STRIDE, VA_V_STRIDE, v_base, p.v_token_stride,
                                                        (j + 1) * VA_BLOCK_N, lk, p.head_dim_v);
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
            // Wide heads with two row tiles per warp: Q fragments come from shared memory per
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

        // Soft-cap (in base-2 units), masked keys to -inf, then the online softmax. Only tiles
        // that straddle a boundary (the sequence's end, a window edge, the causal diagonal)
        // pay for the mask.
        const int key_lo = j * VA_BLOCK_N, key_hi = key_lo + VA_BLOCK_N;
        const int warp_last = min(warp_first + VA_ROWS_PER_WARP - 1, lq - 1);
        const bool masked = key_hi > lk || (p.window_left >= 0 && key_lo < warp_last + offset - p.window_left) ||
                            (p.window_right >= 0 && key_hi - 1 > warp_first + offset + p.window_right);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if (p.softcap > 0.0f) {
#pragma unroll
                for (int n = 0; n < NS; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][n][e] = p.softcap * tanhf(s[mt][n][e] * p.scale_over_softcap) * VA_LOG2E;
            }
            if (masked) {
                const int key0 = key_lo + 2 * t;
#pragma unroll
                for (int n = 0; n < NS; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = rows[mt][e / 2], key = key0 + n * 8 + (e % 2);
                        const bool seen = key < lk && (p.window_left < 0 || key >= row + offset - p.window_left) &&
                                          (p.window_right < 0 || key <= row + offset + p.window_right);
                        s[mt][n][e] = seen ? s[mt][n][e] : VA_NEG_INF;
                    }
                }
            }
            float tile_max[2] = {VA_NEG_INF, VA_NEG_INF};
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                tile_max[0] = fmaxf(tile_max[0], fmaxf(s[mt][n][0], s[mt][n][1]));
                tile_max[1] = fmaxf(tile_max[1], fmaxf(s[mt][n][2], s[mt][n][3]));
            }
            float alpha[2], shift[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                tile_max[r] = fmaxf(tile_max[r], va_shfl_xor(tile_max[r], 1));
                tile_max[r] = fmaxf(tile_max[r], va_shfl_xor(tile_max[r], 2));
                const float new_max = fmaxf(row_max[mt][r], tile_max[r]);
                // A row that has seen only masked keys subtracts 0, not -inf (no NaN from inf - inf).
                shift[r] = new_max == VA_NEG_INF ? 0.0f : new_max * factor;
                alpha[r] = va_exp2(row_max[mt][r] * factor - shift[r]);
                row_max[mt][r] = new_max;
                row_sum[mt][r] *= alpha[r];
            }
#pragma unroll
            for (int n = 0; n < NS; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float pe = va_exp2(fmaf(s[mt][n][e], factor, -shift[e / 2]));
                    s[mt][n][e] = pe;
                    row_sum[mt][e / 2] += pe;
                }
            }
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                o[mt][n][0] *= alpha[0];
                o[mt][n][1] *= alpha[0];
                o[mt][n][2] *= alpha[1];
                o[mt][n][3] *= alpha[1];
            }
        }

        // O += P V: the score accumulators of two adjacent 8-key tiles are exactly the A
        // fragment of one 16-key step (FlashAttention-2's register reuse).
#pragma unroll
        for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) {
            va_u32 pf[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pf[mt][0] = va_pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pf[mt][1] = va_pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pf[mt][2] = va_pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pf[mt][3] = va_pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
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

    // Finish: the row sums across the quad, then one write of O and the LSE.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = row_sum[mt][r];
            sum += va_shfl_xor(sum, 1);
            sum += va_shfl_xor(sum, 2);
            const int row = rows[mt][r];
            if (row >= lq) continue;
            const int token = q_start + row;
            const bool seen = sum != 0.0f; // no visible key (or only -inf scores): 0 and -inf
            const float lse = seen ? row_max[mt][r] * factor * VA_LN2 + logf(sum) : VA_NEG_INF;
            if (p.splits == 1) {
                va_u16* dst = p.out + (va_i64)token * p.out_token_stride + (va_i64)head * p.out_head_stride;
#pragma unroll
                for (int n = 0; n < NO; ++n) {
                    const int col = n * 8 + 2 * t;
                    const float a = seen ? o[mt][n][2 * r] / sum : 0.0f, c = seen ? o[mt][n][2 * r + 1] / sum : 0.0f;
                    if (col + 1 < p.head_dim_v) {
                        *(va_u32*)(dst + col) = va_pack2(a, c);
                    } else if (col < p.head_dim_v) {
                        dst[col] = va_from_float(a);
                    }
                }
                if (t == 0 && p.lse) p.lse[(va_i64)head * p.total_q + token] = lse;
            } else {
                float* dst = p.partial_out + (((va_i64)split * p.total_q + token) * p.heads + head) * VA_HEAD_DIM_V_PAD;
#pragma unroll
                for (int n = 0; n < NO; ++n) {
                    const int col = n * 8 + 2 * t;
                    dst[col] = seen ? o[mt][n][2 * r] / sum : 0.0f;
                    dst[col + 1] = seen ? o[mt][n][2 * r + 1] / sum : 0.0f;
                }
                if (t == 0) p.partial_lse[((va_i64)split * p.heads + head) * p.total_q + token] = lse;
            }
        }
    }
#else
    // ---- AMD: 16x16x16 bf16/f16 MFMA on wave64 (va_attention_tile_amd above).
    va_attention_tile_amd(p, q_smem, k_smem, v_smem, v_smem + 2 * VA_BLOCK_N * VA_V_STRIDE, q_base, k_base, v_base, q_start, lq, lk, m0,
                          offset, head, split, j_begin, j_end);
#endif
}

// Combines the key splits of each (token, head): lse = log Σ exp(lse_s), out = Σ exp(lse_s -
// lse) out_s. One thread per (token, head, column).
extern "C" __global__ void va_attention_merge(VA_GRID_CONSTANT const VaParams p) {
    const va_i64 index = (va_i64)blockIdx.x * blockDim.x + threadIdx.x;
    const va_i64 columns = p.head_dim_v;
    if (index >= (va_i64)p.total_q * p.heads * columns) return;
    const int col = (int)(index % columns);
    const int head = (int)((index / columns) % p.heads);
    const int token = (int)(index / (columns * p.heads));
    float max_lse = VA_NEG_INF;
    for (int s = 0; s < p.splits; ++s) max_lse = fmaxf(max_lse, p.partial_lse[((va_i64)s * p.heads + head) * p.total_q + token]);
    float total = 0.0f, acc = 0.0f;
    if (max_lse != VA_NEG_INF) {
        for (int s = 0; s < p.splits; ++s) {
            const float w = exp2f((p.partial_lse[((va_i64)s * p.heads + head) * p.total_q + token] - max_lse) * VA_LOG2E);
            total += w;
            acc += w * p.partial_out[(((va_i64)s * p.total_q + token) * p.heads + head) * VA_HEAD_DIM_V_PAD + col];
        }
    }
    const bool seen = total > 0.0f;
    p.out[(va_i64)token * p.out_token_stride + (va_i64)head * p.out_head_stride + col] = va_from_float(seen ? acc / total : 0.0f);
    if (col == 0 && p.lse) p.lse[(va_i64)head * p.total_q + token] = seen ? max_lse + logf(total) : VA_NEG_INF;
}

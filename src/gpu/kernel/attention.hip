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
// (f16 instead of bf16). BLOCK_M is 16 rows per warp times VA_WARPS.
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
#define VA_WARPS 4
#define VA_THREADS (VA_WARPS * VA_WARP)
#define VA_ROWS_PER_WARP 16
#define VA_BLOCK_M (VA_WARPS * VA_ROWS_PER_WARP)
// Shared-memory rows are padded by 8 elements (16 bytes) so that the 8 rows of an ldmatrix
// land on distinct banks.
#define VA_Q_STRIDE (VA_HEAD_DIM_PAD + 8)
#define VA_V_STRIDE (VA_HEAD_DIM_V_PAD + 8)

// Must match `KernelParams` in src/gpu/launch.rs field by field.
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
};

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

extern "C" __global__ void __launch_bounds_va(VA_THREADS) va_attention_forward(const VaParams p) {
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
        if (p.tile_start[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    const int b = lo;
    const int q_start = p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - q_start;
    const int k_start = p.cu_seqlens_k[b], lk = p.cu_seqlens_k[b + 1] - k_start;
    const int m0 = (tile - p.tile_start[b]) * VA_BLOCK_M;
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
    // ---- NVIDIA: mma.sync m16n8k16. Thread (g = lane / 4, t = lane % 4) holds, of each 16x8
    // accumulator tile, rows g and g + 8, columns 2t and 2t + 1.
    const int g = lane / 4, t = lane % 4;
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

    va_u32 qf[KQ][4];
    {
        const va_u16* row = q_smem + (warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * VA_Q_STRIDE + 8 * (lane / 16);
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) va_ldmatrix_x4(qf[kk], row + kk * 16);
    }

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float row_max[2] = {VA_NEG_INF, VA_NEG_INF};
    float row_sum[2] = {0.0f, 0.0f};
    const int rows[2] = {m0 + warp * 16 + g, m0 + warp * 16 + g + 8};

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

        // S = Q K^T for this warp's 16 rows and the tile's keys.
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
#pragma unroll
            for (int nn = 0; nn < NS / 2; ++nn) {
                va_u32 kb[4];
                va_ldmatrix_x4(kb, ks + (nn * 16 + (lane % 8) + 8 * (lane / 16)) * VA_Q_STRIDE + kk * 16 + 8 * ((lane / 8) % 2));
                va_mma_16816(s[2 * nn], qf[kk], kb[0], kb[1]);
                va_mma_16816(s[2 * nn + 1], qf[kk], kb[2], kb[3]);
            }
        }

        // Scores to base-2 logits, masked keys to -inf, then the online softmax.
        const int key0 = j * VA_BLOCK_N + 2 * t;
        float tile_max[2] = {VA_NEG_INF, VA_NEG_INF};
#pragma unroll
        for (int n = 0; n < NS; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2, key = key0 + n * 8 + (e % 2);
                float x = s[n][e];
                x = p.softcap > 0.0f ? p.softcap * tanhf(x * p.scale_over_softcap) * VA_LOG2E : x * p.scale_log2;
                const int row = rows[r];
                const bool seen = key < lk && row < lq && (p.window_left < 0 || key >= row + offset - p.window_left) &&
                                  (p.window_right < 0 || key <= row + offset + p.window_right);
                x = seen ? x : VA_NEG_INF;
                s[n][e] = x;
                tile_max[r] = fmaxf(tile_max[r], x);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = fmaxf(tile_max[r], va_shfl_xor(tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], va_shfl_xor(tile_max[r], 2));
            const float new_max = fmaxf(row_max[r], tile_max[r]);
            // A row that has seen only masked keys subtracts 0, not -inf (no NaN from inf - inf).
            const float shift = new_max == VA_NEG_INF ? 0.0f : new_max;
            alpha[r] = exp2f(row_max[r] - shift);
            row_max[r] = new_max;
            row_sum[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < NS; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2;
                const float shift = row_max[r] == VA_NEG_INF ? 0.0f : row_max[r];
                const float pe = exp2f(s[n][e] - shift);
                s[n][e] = pe;
                row_sum[r] += pe;
            }
        }
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }

        // O += P V: the score accumulators of two adjacent 8-key tiles are exactly the A
        // fragment of one 16-key step (FlashAttention-2's register reuse).
#pragma unroll
        for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) {
            const va_u32 pf[4] = {va_pack2(s[2 * kk][0], s[2 * kk][1]), va_pack2(s[2 * kk][2], s[2 * kk][3]),
                                  va_pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]), va_pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int nn = 0; nn < NO / 2; ++nn) {
                va_u32 vb[4];
                va_ldmatrix_x4_trans(vb, vs + (kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * VA_V_STRIDE + nn * 16 + 8 * (lane / 16));
                va_mma_16816(o[2 * nn], pf, vb[0], vb[1]);
                va_mma_16816(o[2 * nn + 1], pf, vb[2], vb[3]);
            }
        }
        va_syncthreads(); // the buffer is refilled next iteration
    }

    // Finish: the row sums across the quad, then one write of O and the LSE.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        row_sum[r] += va_shfl_xor(row_sum[r], 1);
        row_sum[r] += va_shfl_xor(row_sum[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = rows[r];
        if (row >= lq) continue;
        const int token = q_start + row;
        const bool seen = row_sum[r] != 0.0f; // no visible key (or only -inf scores): 0 and -inf
        const float inv = seen ? 1.0f / row_sum[r] : 0.0f;
        const float lse = seen ? row_max[r] * VA_LN2 + logf(row_sum[r]) : VA_NEG_INF;
        if (p.splits == 1) {
            va_u16* dst = p.out + (va_i64)token * p.out_token_stride + (va_i64)head * p.out_head_stride;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                const int col = n * 8 + 2 * t;
                const float a = seen ? o[n][2 * r] / row_sum[r] : 0.0f, c = seen ? o[n][2 * r + 1] / row_sum[r] : 0.0f;
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
                dst[col] = o[n][2 * r] * inv;
                dst[col + 1] = o[n][2 * r + 1] * inv;
            }
            if (t == 0) p.partial_lse[((va_i64)split * p.heads + head) * p.total_q + token] = lse;
        }
    }
#else
    // ---- AMD: 16x16x16 bf16/f16 MFMA on wave64 (see va_attention_tile_amd in portability).
    va_attention_tile_amd(p, q_smem, k_smem, v_smem, q_base, k_base, v_base, q_start, lq, lk, m0, offset, head, split, j_begin, j_end);
#endif
}

// Combines the key splits of each (token, head): lse = log Σ exp(lse_s), out = Σ exp(lse_s -
// lse) out_s. One thread per (token, head, column).
extern "C" __global__ void va_attention_merge(const VaParams p) {
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

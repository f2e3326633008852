// Variable-length multi-head attention, forward pass: FlashAttention-2's structure (on Hopper,
// FlashAttention-3's: see tile_wgmma.h).
//
// One block per (query tile of BLOCK_M rows, head, key split), the query tiles of all sequences
// numbered one after another (`tile_start`, the prefix sums of each sequence's tile count), so a
// batch of many short sequences is one launch with no idle blocks. Each warp owns 16 or 32 query
// rows; K/V tiles of BLOCK_N keys stream through shared memory, double-buffered with
// asynchronous copies; scores, the online softmax (base-2, scale folded in) and the output
// accumulate in f32 registers; O and the LSE are written once. With key splits (small problems
// that would leave the GPU idle), each split writes a partial result and `va_attention_merge`
// combines them by their LSE.
//
// This file holds what every target shares (parameters, scheduling, loads, the merge); the
// tensor-core code of one tile (the score product, the softmax, the P·V update) is one of
//   tile_wgmma.h  NVIDIA Hopper (sm_90a): warpgroup MMAs reading K and V from shared memory,
//                 a copying warpgroup and two computing ones (FlashAttention-3's structure),
//   tile_mma.h    NVIDIA sm_80 and newer: m16n8k16 `mma.sync`,
//   tile_mfma.h   AMD CDNA: 16x16x16 MFMA on wave64.
//
// Compile-time constants (-D): VA_HEAD_DIM_PAD (head_dim rounded up to 16, the MMA's K step),
// VA_HEAD_DIM_V_PAD (head_dim_v rounded up: to 8 for wgmma, else 16), VA_BLOCK_N (keys per
// tile), VA_IS_F16 (f16 instead of bf16), VA_WARPS (per block), VA_ROWS_PER_WARP (16 or 32;
// BLOCK_M is VA_WARPS times that), VA_Q_IN_REGISTERS (mma.sync: 0 re-reads Q's fragments from
// shared memory, for wide heads), VA_WGMMA (1: the Hopper tile), VA_MIN_BLOCKS (blocks per
// multiprocessor the register budget must allow), VA_STAGES (Hopper: shared-memory stages of K
// and V, 2 or 3), VA_SOFTCAP (0: the soft-cap code is left out; the host sets 1 for calls that
// have one).

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
#ifndef VA_WARPS
#define VA_WARPS 4
#endif
#ifndef VA_ROWS_PER_WARP
#define VA_ROWS_PER_WARP 16
#endif
#ifndef VA_Q_IN_REGISTERS
#define VA_Q_IN_REGISTERS 1
#endif
#ifndef VA_WGMMA
#define VA_WGMMA 0
#endif
#ifndef VA_MIN_BLOCKS
#define VA_MIN_BLOCKS 1
#endif
#ifndef VA_SOFTCAP
#define VA_SOFTCAP 1
#endif
#ifndef VA_STAGES
#define VA_STAGES 2
#endif
// VA_THREADS compute; on Hopper one more warpgroup copies (warp specialization), and the
// registers move from it to the computing ones: 128 · 56 + 256 · 224 fit the 64K of an SM.
#define VA_THREADS (VA_WARPS * VA_WARP)
#if VA_WGMMA
#define VA_PRODUCER_THREADS 128
#define VA_PRODUCER_REGISTERS 56
#define VA_CONSUMER_REGISTERS 224
#define VA_BLOCK_THREADS (VA_THREADS + VA_PRODUCER_THREADS)
#else
#define VA_BLOCK_THREADS VA_THREADS
#endif
#define VA_BLOCK_M (VA_WARPS * VA_ROWS_PER_WARP)
// Shared-memory rows of the mma.sync and MFMA tiles are padded by 8 elements (16 bytes) so that
// the 8 rows of an ldmatrix land on distinct banks.
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


// One block's work: a query tile of one (sequence, head) and the key tiles of its split.
struct VaTile {
    const va_u16* q;  // the sequence's first query row of this head
    const va_u16* k;  // the sequence's first key row of this head's KV head
    const va_u16* v;
    int q_start;      // the sequence's first token
    int lq, lk;       // its query and key lengths
    int m0;           // the tile's first row within the sequence
    int offset;       // lk - lq: masks align bottom-right
    int head, split;
    int j_begin, j_end; // key tiles [j_begin, j_end) of BLOCK_N keys
    int k_start;        // the sequence's first key token
    int kv_head;
};

// The keys [first, last] visible from query row `row`: within the sequence, inside the window.
struct VaVisible {
    int first, last;
};
VA_DEVICE VaVisible va_visible_keys(const VaParams& p, const VaTile& tile, int row) {
    // In 64 bits: row + offset + window can pass 2^31 for windows wider than the sequence.
    const va_i64 diagonal = (va_i64)row + tile.offset;
    VaVisible v{0, tile.lk - 1};
    if (p.window_left >= 0) v.first = (int)max((va_i64)v.first, diagonal - p.window_left);
    if (p.window_right >= 0) v.last = (int)min((va_i64)v.last, diagonal + p.window_right);
    return v;
}

// Whether key `key` is visible from query row `row`.
VA_DEVICE bool va_key_visible(const VaParams& p, const VaTile& tile, int row, int key) {
    const VaVisible v = va_visible_keys(p, tile, row);
    return key >= v.first && key <= v.last;
}

// Whether key tile j needs the mask for rows [first_row, last_row]: only tiles that straddle
// the sequence's end, a window edge or the causal diagonal pay for it.
VA_DEVICE bool va_tile_needs_mask(const VaParams& p, const VaTile& tile, int j, int first_row, int last_row) {
    const int key_lo = j * VA_BLOCK_N, key_hi = key_lo + VA_BLOCK_N;
    return key_hi > tile.lk || key_lo < va_visible_keys(p, tile, last_row).first ||
           key_hi - 1 > va_visible_keys(p, tile, first_row).last;
}

#if defined(VA_AMD)
#include "tile_mfma.h"
#elif VA_WGMMA
#include "fragments.h"
#include "tile_wgmma.h"
#else
#include "fragments.h"
#include "tile_mma.h"
#endif

#if VA_WGMMA
// Hopper also takes the tensor maps of K and V (boxes of 64 columns × 1 head × BLOCK_N tokens,
// 128-byte swizzle), and whether the host could encode them (`tma`; else every copy is cp.async).
#define VA_TMA_PARAMETERS , VA_GRID_CONSTANT const VaTensorMap k_map, VA_GRID_CONSTANT const VaTensorMap v_map, const int tma
#else
#define VA_TMA_PARAMETERS
#endif

extern "C" __global__ void __launch_bounds_va(VA_BLOCK_THREADS, VA_MIN_BLOCKS)
    va_attention_forward(VA_GRID_CONSTANT const VaParams p VA_TMA_PARAMETERS) {
    extern __shared__ __align__(128) va_u16 smem[];

    // Which sequence and query tile: the last sequence whose first tile is <= this one (empty
    // sequences have no tiles and are skipped).
    const int tile_index = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
    int lo = 0, hi = p.batch;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (va_metadata(p, 2, mid) <= tile_index) lo = mid; else hi = mid - 1;
    }
    const int b = lo;
    VaTile tile;
    tile.q_start = va_metadata(p, 0, b);
    tile.lq = va_metadata(p, 0, b + 1) - tile.q_start;
    const int k_start = va_metadata(p, 1, b);
    tile.lk = va_metadata(p, 1, b + 1) - k_start;
    tile.m0 = (tile_index - va_metadata(p, 2, b)) * VA_BLOCK_M;
    tile.offset = tile.lk - tile.lq;
    tile.head = head;
    tile.split = split;

    // Keys seen by any row of this tile, then this split's share of their tiles.
    const int last_row = min(tile.m0 + VA_BLOCK_M, tile.lq) - 1;
    const int n_lo = va_visible_keys(p, tile, tile.m0).first, n_hi = va_visible_keys(p, tile, last_row).last + 1;
    const int first_block = n_lo / VA_BLOCK_N;
    const int blocks = n_hi > n_lo ? (n_hi + VA_BLOCK_N - 1) / VA_BLOCK_N - first_block : 0;
    const int per_split = (blocks + p.splits - 1) / p.splits;
    tile.j_begin = first_block + min(blocks, split * per_split);
    tile.j_end = first_block + min(blocks, (split + 1) * per_split);

    const int kv_head = head / p.group;
    tile.k_start = k_start;
    tile.kv_head = kv_head;
    tile.q = p.q + (va_i64)tile.q_start * p.q_token_stride + (va_i64)head * p.q_head_stride;
    tile.k = p.k + (va_i64)k_start * p.k_token_stride + (va_i64)kv_head * p.k_head_stride;
    tile.v = p.v + (va_i64)k_start * p.v_token_stride + (va_i64)kv_head * p.v_head_stride;

#if defined(VA_AMD)
    va_attention_tile_mfma(p, tile, smem);
#elif VA_WGMMA
    va_attention_tile_wgmma(p, tile, smem, &k_map, &v_map, tma != 0);
#else
    va_attention_tile_mma(p, tile, smem);
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

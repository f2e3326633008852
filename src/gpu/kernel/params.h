// Compile-time constants and the parameters of one launch: the block the host builds
// (`VaParams`, one struct for every target) and the work one block is handed (`VaTile`).
//
// Compile-time constants (-D): VA_HEAD_DIM_PAD (head_dim rounded up to one of a few widths, 32 to
// 256, multiples of the MMA's K step of 16), VA_HEAD_DIM_V_PAD (head_dim_v likewise; for wgmma
// also 72), VA_BLOCK_N (keys per tile), VA_IS_F16 (f16 instead of bf16), VA_WARPS (per block),
// VA_ROWS_PER_WARP (16 or 32; BLOCK_M is VA_WARPS times that), VA_Q_IN_REGISTERS (mma.sync: 0
// re-reads Q's fragments from shared memory, for wide heads), VA_WGMMA (1: the Hopper tile),
// VA_MIN_BLOCKS (blocks per multiprocessor the register budget must allow), VA_STAGES (Hopper:
// shared-memory stages of K and V, 2 or 3), VA_Q_BUFFERS (Hopper: Q's buffers, 1 or 2),
// VA_SOFTCAP (0: the soft-cap code is left out; the host sets 1 for calls that have one),
// VA_ALIBI (likewise for ALiBi's bias), VA_PAGED (1: keys and values in a paged cache).

#pragma once

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
#ifndef VA_ALIBI
#define VA_ALIBI 1
#endif
#ifndef VA_SOFTCAP
#define VA_SOFTCAP 1
#endif
#ifndef VA_STAGES
#define VA_STAGES 2
#endif
#ifndef VA_Q_BUFFERS
#define VA_Q_BUFFERS 1
#endif
#ifndef VA_HEADS_INNER
#define VA_HEADS_INNER 0
#endif
#ifndef VA_PAGED
#define VA_PAGED 0
#endif
// VA_THREADS compute; on Hopper one more warpgroup copies (warp specialization), and the
// registers move from it to the computing ones: 128 · 56 + 256 · 224 fit the 64K of an SM, and
// with three computing warpgroups 128 · 32 + 384 · 160.
#define VA_THREADS (VA_WARPS * VA_WARP)
#if VA_WGMMA
#define VA_PRODUCER_THREADS 128
#if VA_WARPS == 12
#define VA_PRODUCER_REGISTERS 32
#define VA_CONSUMER_REGISTERS 160
#else
#define VA_PRODUCER_REGISTERS 56
#define VA_CONSUMER_REGISTERS 224
#endif
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
#define VA_INLINE_MODIFIERS 256
struct VaParams {
    const va_u16* q;
    const va_u16* k;
    const va_u16* v;
    va_u16* out;
    float* lse;              // [heads][total_q], or null
    float* partial_out;      // [split blocks][VA_BLOCK_M][VA_HEAD_DIM_V_PAD] with splits > 1
    float* partial_lse;      // [split blocks][VA_BLOCK_M] with splits > 1
    // NVIDIA, with splits > 1: one counter per split pair's 16-row group, zero between launches
    // (`va_last_split`); null where the merge kernel combines the splits (AMD, or a switch).
    int* split_counters;
    const int* cu_seqlens_q;
    const int* cu_seqlens_k;
    // [batch + 1]: first query tile of each sequence, then their count. With cu_seqlens on
    // the device, the workspace, followed by the table `va_plan_tiles` writes
    // (`va_tile_sequence_table`).
    int* tile_start;
    // Calls whose cu_seqlens are on the device: the flag `va_plan_tiles` raises (and never
    // lowers) for cu_seqlens that break a rule; null for calls planned on the host.
    int* status;
    // Paged K/V (VA_PAGED): [batch][block_table_stride] block indices, checked on the host;
    // `k` and `v` then point at caches [blocks][block_size][kv heads][dims], blocks
    // `k_block_stride` and `v_block_stride` elements apart.
    const int* block_table;
    va_i64 q_token_stride, q_head_stride;
    va_i64 k_token_stride, k_head_stride;
    va_i64 v_token_stride, v_head_stride;
    va_i64 out_token_stride, out_head_stride;
    va_i64 k_block_stride, v_block_stride, block_table_stride;
    int block_size;
    int batch, heads, group, total_q, total_k;
    int head_dim, head_dim_v;
    int window_left, window_right; // -1: unbounded
    // The units of work, one after another: the first `whole_pairs` (query tile, head) pairs
    // whole, then each later pair's keys in `splits` blocks (`va_block_work`). Pair i is query
    // tile i % tiles of head i / tiles; `tiles` is the grid's query tiles (cu_seqlens on the
    // device: an upper bound, see `va_unit_tiles`).
    int tiles;
    int whole_pairs;
    int splits;
    // The query tiles of every sequence where two or more all have as many (at least one;
    // cu_seqlens on the host), else 0: a tile's sequence is then a division
    // (`va_tile_sequence`).
    int tiles_per_sequence;
    // `modifiers` holds `alibi_count` ALiBi coefficients (0, heads, or batch · heads: sequence
    // by sequence, then head), each the slope in score units per unit of distance (`score.h`),
    // then `sinks_count` attention sinks (0 or heads), natural units.
    int alibi_count, sinks_count;
    float scale_log2;        // softmax scale times log2(e) (no soft-cap)
    float softcap;           // 0: none
    float scale_over_softcap;
    // Small batches carry cu_seqlens_q, cu_seqlens_k and tile_start here, one after another
    // (batch + 1 each), so a call needs no copy to the device before its launch.
    int inline_metadata;
    int metadata[VA_INLINE_METADATA];
    float modifiers[VA_INLINE_MODIFIERS];
};

// The host passes sizeof(KernelParams): a field added on one side only fails to compile.
#ifdef VA_PARAMS_BYTES
static_assert(sizeof(VaParams) == VA_PARAMS_BYTES, "VaParams must match KernelParams in src/gpu/plan.rs");
#endif

// Entry `i` of cu_seqlens_q (which = 0), cu_seqlens_k (1) or tile_start (2).
VA_DEVICE int va_metadata(const VaParams& p, int which, int i) {
    if (p.inline_metadata) return p.metadata[which * (p.batch + 1) + i];
    const int* a = which == 0 ? p.cu_seqlens_q : which == 1 ? p.cu_seqlens_k : p.tile_start;
    return a[i];
}

// Query tiles of the grid with cu_seqlens on the device: the most the token count allows
// (`Plan::with_device_seqlens` sizes the grid the same way).
VA_DEVICE int va_device_grid_tiles(const VaParams& p) {
    return p.total_q == 0 ? 0 : (p.total_q + VA_BLOCK_M - 1) / VA_BLOCK_M + p.batch;
}

// With cu_seqlens on the device: each of the grid's query tiles' sequence (-1: none), after
// tile_start in the workspace.
VA_DEVICE int* va_tile_sequence_table(const VaParams& p) { return p.tile_start + p.batch + 1; }

#define VA_LOG2E 1.4426950408889634f
#define VA_LN2 0.6931471805599453f
#define VA_NEG_INF (-__int_as_float(0x7f800000))

#include "rows.h"

// One block's work: a query tile of one (sequence, head) and the key tiles of its split.
struct VaTile {
    VaHeadRows q;         // the sequence's query rows of this head
    VaKeyRows k;      // its keys and values of this head's KV head
    VaKeyRows v;
    int q_start;      // the sequence's first token
    int lq, lk;       // its query and key lengths
    int m0;           // the tile's first row within the sequence
    int offset;       // lk - lq: masks align bottom-right
    int head;
    int slot;           // the split block's partial output (`VaWork::slot`), -1 for a whole pair
    int split, splits;  // which of the pair's key splits this is, and of how many (1: whole)
    int j_begin, j_end; // key tiles [j_begin, j_end) of BLOCK_N keys
    int k_start;        // the sequence's first key token
    int kv_head;
    float alibi;        // ALiBi's coefficient for this (sequence, head), 0 without ALiBi
};

// A split block's row of the partial outputs and LSEs, for row `row` of its sequence.
VA_DEVICE va_i64 va_partial_row(const VaTile& tile, int row) { return (va_i64)tile.slot * VA_BLOCK_M + (row - tile.m0); }

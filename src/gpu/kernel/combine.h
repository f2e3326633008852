// The key splits' merge kernel: the split (query tile, head) pairs (`va_block_work`) have each
// split's partial output and log-sum-exp in the workspace; this kernel combines them. AMD's
// launches run it after the attention kernel (and NVIDIA's under VARLEN_ATTN_GPU_MERGE=kernel);
// NVIDIA's attention kernel otherwise combines them itself, in the last split block to finish
// each 16-row group (`va_last_split`, fragments.h).

#pragma once

// Combines the key splits of each split pair's rows: lse = log Σ exp(lse_s), out = Σ exp(lse_s -
// lse) out_s. One thread per output element of the split pairs (blockIdx.y: the pair), so that
// their loads from L2 overlap across the GPU (a block per pair walking its tile was latency
// bound: 62 µs instead of 42 for shape 1's 28 pairs).
#define VA_MERGE_THREADS 256
extern "C" __global__ void __launch_bounds__(VA_MERGE_THREADS) va_attention_merge(VA_GRID_CONSTANT const VaParams p) {
    const int index = blockIdx.x * VA_MERGE_THREADS + threadIdx.x, columns = p.head_dim_v;
    if (index >= VA_BLOCK_M * columns) return;
    // The pair's first split block: its partial rows come first, split s's VA_BLOCK_M · s later.
    const VaWork work = va_block_work(p, p.tiles, p.whole_pairs + blockIdx.y * p.splits);
    const VaTile tile = va_schedule_tile(p, va_tile_sequence(p, work.tile_index), work);
    const int row = tile.m0 + index / columns, col = index % columns;
    if (row >= tile.lq) return;
    const va_i64 first = va_partial_row(tile, row);
    float max_lse = VA_NEG_INF;
    for (int s = 0; s < p.splits; ++s) max_lse = fmaxf(max_lse, p.partial_lse[first + s * VA_BLOCK_M]);
    float total = 0.0f, acc = 0.0f;
    if (max_lse != VA_NEG_INF) {
        for (int s = 0; s < p.splits; ++s) {
            const va_i64 partial = first + s * VA_BLOCK_M;
            const float w = exp2f((p.partial_lse[partial] - max_lse) * VA_LOG2E);
            total += w;
            acc += w * p.partial_out[partial * VA_HEAD_DIM_V_PAD + col];
        }
    }
    const bool seen = total > 0.0f;
    const int token = tile.q_start + row;
    float lse = seen ? max_lse + logf(total) : VA_NEG_INF;
    const float keep = va_join_sink(p, tile.head, lse);
    p.out[(va_i64)token * p.out_token_stride + (va_i64)tile.head * p.out_head_stride + col] = va_from_float(seen ? acc / total * keep : 0.0f);
    if (col == 0 && p.lse) p.lse[(va_i64)tile.head * p.total_q + token] = lse;
}

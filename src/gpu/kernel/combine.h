// The key splits' merge: small problems split their keys over several blocks, each writing a
// partial output and log-sum-exp; this kernel combines them.

#pragma once

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

// Where a raw score q·k becomes the softmax's base-2 logit, for every tile: the scale, or the
// soft-cap `cap · tanh(s · scale / cap)` in base-2 units; ALiBi's bias; and the attention sink
// that joins each row's softmax at the end.

#pragma once

// Whether this call soft-caps its scores (the code is compiled in only for calls with a cap).
VA_DEVICE bool va_has_softcap(const VaParams& p) { return VA_SOFTCAP && p.softcap > 0.0f; }

// The soft-capped score, in base-2 units.
VA_DEVICE float va_softcap_score(const VaParams& p, float s) {
    return p.softcap * tanhf(s * p.scale_over_softcap) * VA_LOG2E;
}

// What the softmax multiplies scores by to reach base-2 logits: scale · log2(e), or 1 where the
// soft-cap has already put them in base-2 units.
VA_DEVICE float va_score_factor(const VaParams& p) { return va_has_softcap(p) ? 1.0f : p.scale_log2; }

// A raw score as a base-2 logit, in one step.
VA_DEVICE float va_logit(const VaParams& p, float s) { return va_has_softcap(p) ? va_softcap_score(p, s) : s * p.scale_log2; }

// ALiBi's coefficient for sequence `b`, query head `head`: the slope in the units scores are
// kept in (`slope · log2(e) / va_score_factor`, computed on the host in f64 and rounded once),
// 0 without ALiBi.
VA_DEVICE float va_alibi_coefficient(const VaParams& p, int b, int head) {
    if (!VA_ALIBI || p.alibi_count == 0) return 0.0f;
    return p.modifiers[p.alibi_count == p.heads ? head : b * p.heads + head];
}

// The distance ALiBi weighs: |row + Lk - Lq - key|, exact in f32 below 2^24.
VA_DEVICE float va_alibi_distance(const VaTile& tile, int row, int key) {
    const va_i64 d = (va_i64)row + tile.offset - key;
    return (float)(d < 0 ? -d : d);
}

// A row's attention sink joining its softmax: `lse` is the row's log-sum-exp over its keys
// (natural units, -inf where it saw none) and becomes the one including the sink; the returned
// factor scales the row's normalized output, exp(lse) / (exp(lse) + exp(sink)). 1 without
// sinks. A NaN LSE stays NaN (so does the factor).
VA_DEVICE float va_join_sink(const VaParams& p, int head, float& lse) {
    if (p.sinks_count == 0) return 1.0f;
    const float sink = p.modifiers[p.alibi_count + head];
    const float m = fmaxf(lse, sink);
    const float keep = exp2f((lse - m) * VA_LOG2E), total = keep + exp2f((sink - m) * VA_LOG2E);
    lse = m + logf(total);
    return keep / total;
}

// Where a raw score q·k becomes the softmax's base-2 logit, for every tile: the scale, or the
// soft-cap `cap · tanh(s · scale / cap)` in base-2 units. Score modifiers (ALiBi, sinks)
// belong here, beside them.

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

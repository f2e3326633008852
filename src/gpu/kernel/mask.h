// Which keys a query row sees: those of its sequence, inside the causal or sliding window
// (masks align bottom-right: the last query row sees the last key). A new score modifier
// (ALiBi) or mask belongs here.

#pragma once

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

// Variable-length multi-head attention, forward pass: FlashAttention-2's structure (on Hopper,
// FlashAttention-3's: see tile_wgmma.h).
//
// The work is a list of units: one per (query tile of BLOCK_M rows, head) pair, or per key split
// of one, the query tiles of all sequences numbered one after another (`tile_start`, the prefix
// sums of each sequence's tile count), so a batch of many short sequences is one launch with
// no idle blocks. A block does one unit (on Hopper, a persistent grid's block walks every
// grid-th unit). Each warp owns 16 or 32 query rows; K/V tiles of BLOCK_N keys stream through
// shared memory, double-buffered or more with asynchronous copies; scores, the online softmax
// (base-2, scale folded in) and the output accumulate in f32 registers; O and the LSE are
// written once. With key splits (the pairs of a last, partly filled wave of blocks, or of a
// problem smaller than one wave), each split writes a partial result, combined by their LSEs:
// on NVIDIA by the last split block to finish each 16-row group (`va_last_split`), on AMD by
// `va_attention_merge`, a second kernel.
//
// This file holds the two entry points; each concern has a header of its own:
//   params.h      compile-time constants and the parameter block (`VaParams`, `VaTile`),
//   rows.h        a head's rows as the loaders copy them: packed, or in a paged cache,
//   kv_address.h  where a tile's rows live: a head's rows of Q, K and V, the token of a key,
//   mask.h        which keys a query row sees (sequence end, causal diagonal, windows),
//   score.h       raw scores to base-2 logits (the scale, the soft-cap),
//   scheduling.h  the units of work: which sequence, query tile and key tiles each is,
//   load.h        tile copies from global to shared memory (the cp.async path),
//   combine.h     the merge kernel of key splits (AMD),
// and the tensor-core code of one tile (the score product, the softmax, the P·V update) is one of
//   tile_wgmma.h  NVIDIA Hopper (sm_90a): warpgroup MMAs reading K and V from shared memory,
//                 a copying warpgroup and two computing ones (FlashAttention-3's structure),
//   tile_mma.h    NVIDIA sm_80 and newer: m16n8k16 `mma.sync`,
//   tile_mfma.h   AMD CDNA: 16x16x16 MFMA on wave64.
//
// The compile-time constants (-D) are listed in params.h.

#include "portability.h"
#include "params.h"
#include "kv_address.h"
#include "load.h"
#include "mask.h"
#include "score.h"
#include "scheduling.h"

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

#if VA_WGMMA
    // Hopper: the block's warpgroups walk its units themselves (`va_for_each_tile`).
    // (Paged keys and values have no tensor maps.)
    va_attention_wgmma(p, smem, &k_map, &v_map, tma != 0 && !VA_PAGED);
#else
    // With cu_seqlens on the device the grid is an upper bound: blocks past the last tile (all
    // of them when the cu_seqlens were refused) have nothing to do.
    const VaWork work = va_block_work(p, p.tiles, blockIdx.x);
    const int sequence = va_tile_sequence(p, work.tile_index);
    if (sequence < 0) return;

    const VaTile tile = va_schedule_tile(p, sequence, work);
#if defined(VA_AMD)
    va_attention_tile_mfma(p, tile, smem);
#else
    va_attention_tile_mma(p, tile, smem);
#endif
#endif
}

#include "combine.h"

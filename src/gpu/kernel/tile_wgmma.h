// NVIDIA Hopper (sm_90a): tiles with warpgroup MMAs, warp-specialized as in FlashAttention-3,
// each block walking its units of work one tile after another (`va_for_each_tile`; the host
// launches one block per multiprocessor). One warpgroup copies Q, then K and V tiles into two
// or three stages of shared memory (TMA for whole tiles where the host encoded tensor maps,
// cp.async for the rest, signalling mbarriers; it gives most of its registers to the others);
// two compute (one, VA_WARPS = 4, for problems too small to fill the GPU with 128-row tiles;
// three, VA_WARPS = 12, for 192-row tiles), each owning 64 query rows (16 per warp, in the same
// fragment layout as mma.sync, so the softmax and the write are shared with tile_mma.h). The
// computing warpgroups take turns at the tensor cores (one's softmax runs while the others'
// products do), and within each the score product of key tile i runs alongside the value
// product of tile i - 1.
//
// Q, K and V sit in shared memory in layouts the tensor cores read directly (64-column slabs with
// 128-byte swizzle; Q's and K's last columns past a multiple of 64 in core matrices, V's in one
// more, partly used slab): S = Q K^T takes both operands from there, O += P V takes P from
// registers (the score accumulators, rounded) and V from there, transposed by the instruction.
// No ldmatrix, and one K or V read serves 64 rows. Descriptors are each tile's 16-byte address
// plus constants (`va_wgmma_descriptor16`), the warpgroup's index uniform across its warps.

#pragma once

#include "barriers.h"
#include "wgmma.h"

// A [ROWS, WIDTH] tile in shared memory as the tensor cores read it: the first 64 · SLABS
// columns in slabs of 64, each slab a column of 1024-byte atoms (8 rows × 128 bytes, 128-byte
// swizzle: a row's 16-byte chunk c sits at chunk c XOR row % 8); the last TAIL_CHUNKS · 8
// columns (head dims that are not multiples of 64: 72's last 8) after the slabs in the
// no-swizzle core-matrix layout, groups of 8 rows each TAIL_CHUNKS core matrices long. Every
// part is a multiple of 1024 bytes, so every slab starts on an atom.
//
// With WHOLE_SLABS, the rest of the columns go into one more slab, partly used (72's second
// slab holds 8 columns): V's tiles, so that one instruction of N = WIDTH reads all its columns
// (a slab and a tail took two per 16 keys, each with its own descriptor).
template <int ROWS_, int WIDTH, bool WHOLE_SLABS = false> struct VaCoreTile {
    static constexpr int ROWS = ROWS_;
    static constexpr int SLABS = WHOLE_SLABS ? (WIDTH + 63) / 64 : WIDTH / 64;
    static constexpr int TAIL_CHUNKS = WHOLE_SLABS ? 0 : (WIDTH % 64) / 8;
    static constexpr int SLAB = ROWS * 64;      // elements of one slab
    static constexpr int TAIL = SLABS * SLAB;   // where the tail starts
    static constexpr int ELEMS = TAIL + ROWS * TAIL_CHUNKS * 8;
};
using VaQTile = VaCoreTile<VA_BLOCK_M, VA_HEAD_DIM_PAD>;
using VaKTile = VaCoreTile<VA_BLOCK_N, VA_HEAD_DIM_PAD>;
using VaVTile = VaCoreTile<VA_BLOCK_N, VA_HEAD_DIM_V_PAD, true>;

// Calls copy(i) for i in [thread, COUNT) in steps of THREADS, UNROLL steps at a time.
template <int COUNT, int THREADS, int UNROLL, typename F> VA_DEVICE void va_for_each_copy(int thread, F copy) {
#pragma unroll(UNROLL)
    for (int k = 0; k < COUNT / THREADS; ++k) copy(thread + k * THREADS);
    if constexpr (COUNT % THREADS != 0) {
        if (thread < COUNT % THREADS) copy(thread + COUNT / THREADS * THREADS);
    }
}

// Rows [row0, row0 + T::ROWS) of one head's rows (`VaHeadRows` or `VaPagedRows`) into the slabs of a
// VaCoreTile T, copied by THREADS threads (`thread` is this one's index among them); rows past
// `valid_rows` and columns past `dims` are zero-filled, and not addressed. Eight consecutive
// threads copy one row's 128 contiguous bytes into one 128-byte atom row (full sectors from
// L2, distinct banks), and each thread keeps its 16-byte column and every (THREADS / 8)-th
// row: that row's swizzle (row % 8) stays the same, so its copies are a fixed stride apart in
// shared memory (and in global memory for packed rows), unrolled with immediate offsets.
template <typename T, int THREADS, typename R>
VA_DEVICE void va_load_slabs(va_u16* smem, int thread, const R& rows, int row0, int valid_rows, int dims) {
    constexpr int ROWS = T::ROWS;
    constexpr int STEP = THREADS / 8; // rows between one thread's slab copies
    static_assert(STEP % 8 == 0 && ROWS % STEP == 0, "each thread's slab rows share a swizzle and tile the rows");
    const int chunk = thread % 8, first = thread / 8;
    const int rows_left = valid_rows - row0 - first;
    va_u16* dst = smem + first * 64 + (chunk ^ (first % 8)) * 8;
    // (The slab loop stays rolled: the copying warps have 32 to 56 registers, and whole packed
    // K and V tiles come by TMA, so this path serves Q, the tiles at sequences' ends and paged
    // keys. A thread's packed rows lie STEP token strides apart.)
    const va_u16* src = R::PAGED ? rows.base : rows.row(row0 + first) + chunk * 8;
#pragma unroll 1
    for (int slab = 0; slab < T::SLABS; ++slab) {
        int elems = dims - slab * 64 - chunk * 8;
        elems = elems < 0 ? 0 : (elems > 8 ? 8 : elems);
#pragma unroll
        for (int k = 0; k < ROWS / STEP; ++k) {
            const bool real = k * STEP < rows_left && elems > 0;
            const va_u16* from = rows.base;
            if (real) {
                if constexpr (R::PAGED) from = rows.row(row0 + first + k * STEP) + slab * 64 + chunk * 8;
                else from = src + slab * 64 + k * STEP * rows.token_stride;
            }
            va_copy16(dst + slab * T::SLAB + k * STEP * 64, from, real ? elems * 2 : 0);
        }
    }
}

// The same rows into the tail of a VaCoreTile: eight consecutive threads fill one core matrix.
template <typename T, int THREADS, typename R>
VA_DEVICE void va_load_tail(va_u16* smem, int thread, const R& rows, int row0, int valid_rows, int dims) {
    const auto copy = [&](va_u16* to, int row, int col) {
        int elems = dims - col;
        elems = row0 + row < valid_rows ? (elems < 0 ? 0 : (elems > 8 ? 8 : elems)) : 0;
        va_copy16(to, elems > 0 ? rows.row(row0 + row) + col : rows.base, elems * 2);
    };
    if constexpr (T::TAIL_CHUNKS > 0) {
        va_for_each_copy<T::ROWS * T::TAIL_CHUNKS, THREADS, 2>(thread, [&](int i) {
            const int r8 = i % 8, c = (i / 8) % T::TAIL_CHUNKS, group = i / (8 * T::TAIL_CHUNKS);
            copy(smem + T::TAIL + ((group * T::TAIL_CHUNKS + c) * 8 + r8) * 8, group * 8 + r8, T::SLABS * 64 + c * 8);
        });
    }
}

// A whole VaCoreTile: the slabs and the tail.
template <typename T, int THREADS, typename R>
VA_DEVICE void va_load_core_tile(va_u16* smem, int thread, const R& rows, int row0, int valid_rows, int dims) {
    va_load_slabs<T, THREADS>(smem, thread, rows, row0, valid_rows, dims);
    va_load_tail<T, THREADS>(smem, thread, rows, row0, valid_rows, dims);
}

// The descriptor of k-step kk (16 columns) of the rows from `first_row` (a multiple of 8) of a
// K-major VaCoreTile T at `tile16` (`va_smem_address16`): in a slab, the 32-byte step within its
// atoms; in the tail, two core matrices. Offsets are in elements, 8 to a 16-byte unit.
template <typename T> VA_DEVICE va_u64 va_k_major_descriptor(va_u32 tile16, int first_row, int kk) {
    if (kk < T::SLABS * 4) return va_wgmma_descriptor16(tile16 + ((kk / 4) * T::SLAB + first_row * 64 + (kk % 4) * 16) / 8, 16, 1024, 1);
    return va_wgmma_descriptor16(tile16 + (T::TAIL + first_row * T::TAIL_CHUNKS * 8 + (kk - T::SLABS * 4) * 128) / 8, 128,
                                 T::TAIL_CHUNKS * 128);
}

// O[:, N0 : N0 + REST) += P V for the 16-key step kk of the V tile at `v16`, one instruction
// per piece of up to 128 columns (MN-major, 128-byte swizzle: atoms along N one slab apart,
// along K 1024 bytes apart): head_dim_v 72 is one instruction of N = 72 over a slab and 8
// columns of the next.
template <int N0, int REST>
VA_DEVICE void va_wgmma_pv(float (&o)[VA_HEAD_DIM_V_PAD / 8][4], const va_u32 (&a)[4], va_u32 v16, int kk) {
    if constexpr (REST > 0) {
        static_assert(N0 % 64 == 0, "every piece starts on a slab");
        constexpr int P = REST >= 128 ? 128 : REST;
        const va_u64 b = va_wgmma_descriptor16(v16 + ((N0 / 64) * VaVTile::SLAB + kk * 16 * 64) / 8, VaVTile::SLAB * 2, 1024, 1);
        VaWgmma<P>::template rs<1>(*reinterpret_cast<float(*)[P / 2]>(&o[N0 / 8][0]), a, b, 1);
        va_wgmma_pv<N0 + P, REST - P>(o, a, v16, kk);
    }
}

// The block's shared memory: Q, VA_STAGES stages each of K and V, and their barriers ("full": the
// copies of a stage, or of Q, have landed; "empty": every computing warp is done reading it).
// A block works through several tiles (`va_for_each_tile`): the key tiles are counted across
// them, and Q is refilled once per tile that has keys (its "round"), into VA_Q_BUFFERS
// buffers in turn: with two, the next tile's Q is loaded while the last one's is still read.
struct VaWgmmaSmem {
    va_u16* q; // [VA_Q_BUFFERS][VaQTile::ELEMS]
    va_u16* k; // [VA_STAGES][VaKTile::ELEMS]
    va_u16* v; // [VA_STAGES][VaVTile::ELEMS]
    va_u64* k_full;
    va_u64* v_full;
    va_u64* k_empty;
    va_u64* v_empty;
    va_u64* q_full;  // [VA_Q_BUFFERS]
    va_u64* q_empty; // [VA_Q_BUFFERS]
};

// Key tile n of the block (counted from its first tile's first) sits in stage n % VA_STAGES,
// whose barriers are then in their phase n / VA_STAGES; Q's round r likewise in buffer
// r % VA_Q_BUFFERS, phase r / VA_Q_BUFFERS.
VA_DEVICE int va_stage(int i) { return i % VA_STAGES; }
VA_DEVICE int va_phase(int i) { return (i / VA_STAGES) & 1; }
VA_DEVICE int va_q_buffer(int round) { return round % VA_Q_BUFFERS; }
VA_DEVICE int va_q_phase(int round) { return (round / VA_Q_BUFFERS) & 1; }

// The first key of key tile j's copy in shared memory: j · BLOCK_N, but where a sequence of
// at least BLOCK_N keys ends inside the tile and tensor maps exist, its last BLOCK_N keys, so
// that the tile comes by TMA, flush with the sequence's end, instead of by cp.async with
// zero-fill (a cold path that cost small problems up to a microsecond); its first rows repeat
// keys of the tile before, which the softmax masks (`key_floor`). Both warpgroups ask this.
VA_DEVICE int va_key_tile_start(const VaTile& tile, int j, bool tma) {
    const int key0 = j * VA_BLOCK_N;
    return tma && key0 + VA_BLOCK_N > tile.lk && tile.lk >= VA_BLOCK_N ? tile.lk - VA_BLOCK_N : key0;
}

// The copying warpgroup: for each of the block's tiles, streams Q (as soon as every computing
// warp has the previous tile's last scores), then its K and V tiles into the stages, each
// into a stage as soon as every computing warp has finished reading it: the next tile's Q and
// first keys land while the computing warps finish the last one's values and write it. A tile of keys that all
// belong to the sequence comes by TMA (one thread issues a box per 64-column slab) where the
// host encoded tensor maps, its tail columns by cp.async; a tile that runs past the sequence's
// end comes flush with that end (`va_key_tile_start`), or, in a sequence shorter than a tile or
// without tensor maps, wholly by cp.async with zero-fill: nothing of the next sequence enters.
// Narrow heads load the keys of tile i + 1 before the values of tile i, which are needed later;
// wide heads keep each tile's keys and values together (measured on the H200: keys ahead 10%
// faster at head_dim 72, 6% slower at 128, whose larger values then arrive late; where between
// the two it turns is not measured). A stage's "full" barrier counts one arrival from the
// first copying thread (with the TMA bytes it expects) and one per copying thread's cp.async.
// V's partly used last slab comes by TMA too: the box's columns past the head's are out of the
// tensor, which TMA fills with zeros (and counts in the bytes).
// Key (or value) tile i of the tile, the block's n-th, into its stage (a VaCoreTile T), by the
// copying warpgroup.
template <typename T>
VA_DEVICE void va_load_stage(const VaTile& tile, va_u16* stages, va_u64* full, va_u64* empty, const VaTensorMap* map,
                             const VaKeyRows& rows, int dims, int i, int n, int thread, bool tma) {
    const int stage = va_stage(n), key0 = va_key_tile_start(tile, tile.j_begin + i, tma);
    va_u16* dst = stages + stage * T::ELEMS;
    va_mbarrier_wait(&empty[stage], va_phase(n) ^ 1);
    if (T::SLABS > 0 && tma && key0 + VA_BLOCK_N <= tile.lk) {
        if (thread == 0) {
            va_mbarrier_arrive_expect_tx(&full[stage], T::SLABS * VA_BLOCK_N * 128);
            for (int slab = 0; slab < T::SLABS; ++slab)
                va_tma_load_3d(dst + slab * T::SLAB, map, slab * 64, tile.kv_head, va_key_token(tile, key0), &full[stage]);
        }
        va_load_tail<T, VA_PRODUCER_THREADS>(dst, thread, rows, key0, tile.lk, dims);
    } else {
        va_load_core_tile<T, VA_PRODUCER_THREADS>(dst, thread, rows, key0, tile.lk, dims);
        if (thread == 0) va_mbarrier_arrive(&full[stage]);
    }
    va_copy_arrive(&full[stage]);
}

#define VA_KEYS_AHEAD (VA_HEAD_DIM_PAD <= 96)
VA_DEVICE void va_produce_tiles(const VaParams& p, const VaWgmmaSmem& sm, const VaTensorMap* k_map, const VaTensorMap* v_map,
                                bool tma) {
    va_registers_release<VA_PRODUCER_REGISTERS>();
    const int thread = threadIdx.x - VA_THREADS;
    if (tma && thread == 0) {
        va_prefetch_tensor_map(k_map);
        va_prefetch_tensor_map(v_map);
    }
    int first = 0, round = 0; // the block's key tiles and Q rounds so far
    va_for_each_tile(p, [&](const VaTile& tile) {
        const int tiles = tile.j_end - tile.j_begin;
        if (tiles == 0) return;
        const int q = va_q_buffer(round);
        va_mbarrier_wait(&sm.q_empty[q], va_q_phase(round) ^ 1);
        va_load_core_tile<VaQTile, VA_PRODUCER_THREADS>(sm.q + q * VaQTile::ELEMS, thread, tile.q, tile.m0,
                                                        tile.lq, p.head_dim);
        va_copy_arrive(&sm.q_full[q]);
        const auto load_keys = [&](int i) {
            va_load_stage<VaKTile>(tile, sm.k, sm.k_full, sm.k_empty, k_map, tile.k, p.head_dim, i, first + i,
                                   thread, tma);
        };
        const auto load_values = [&](int i) {
            va_load_stage<VaVTile>(tile, sm.v, sm.v_full, sm.v_empty, v_map, tile.v, p.head_dim_v, i, first + i,
                                   thread, tma);
        };
        if (VA_KEYS_AHEAD) load_keys(0);
        for (int i = 0; i < tiles; ++i) {
            if (!VA_KEYS_AHEAD) {
                load_keys(i);
            } else if (i + 1 < tiles) {
                load_keys(i + 1);
            }
            load_values(i);
        }
        first += tiles;
        ++round;
    });
    va_copy_wait_all();
}

// Waits for a stage's copies; they were written through the generic proxy and are read next by
// the tensor cores (the asynchronous proxy).
VA_DEVICE void va_wait_stage(va_u64* full, int i) {
    va_mbarrier_wait(&full[va_stage(i)], va_phase(i));
    va_fence_proxy_async();
}

// One arrival per computing warp: this warp's products have read the stage (or Q).
VA_DEVICE void va_release_stage(va_u64* empty, int i) {
    if (threadIdx.x % VA_WARP == 0) va_mbarrier_arrive(&empty[va_stage(i)]);
}
VA_DEVICE void va_release_q(const VaWgmmaSmem& sm, int round) {
    if (threadIdx.x % VA_WARP == 0) va_mbarrier_arrive(&sm.q_empty[va_q_buffer(round)]);
}

// The computing warpgroups take turns at the tensor cores (FlashAttention-3's ping-pong): a
// warpgroup issues its products only when the one before it (in a ring) has issued its own, so
// that one's softmax runs while the others' products do. Barrier VA_TURN + g is warpgroup g's
// turn, met by its 128 threads and the 128 of the warpgroup passing it. A lone computing
// warpgroup has no one to wait for. Three (192-row tiles) suit narrow heads, whose products are
// short beside the softmax.
//
// Every warpgroup passes its turn on right after issuing each product, the last one too, so
// that warpgroup 0 may start the next tile while the others wait for their last values and
// write theirs. The ring starts with one pass from the last warpgroup to warpgroup 0
// (`va_start_turns`) and ends with warpgroup 0 taking that many more (`va_end_turns`): named
// barriers must balance.
#define VA_GROUPS (VA_WARPS / 4)
static_assert(VA_GROUPS >= 1 && VA_GROUPS <= 3, "one to three computing warpgroups");
#define VA_TURN 1
VA_DEVICE void va_take_turn(int group) {
    if (VA_GROUPS > 1) va_named_sync(VA_TURN + group, 2 * 128);
}
VA_DEVICE void va_pass_turn(int group) {
    if (VA_GROUPS > 1) va_named_arrive(VA_TURN + (group + 1) % VA_GROUPS, 2 * 128);
}
// This computing warpgroup's index, read through a shuffle so that the compiler knows it is the
// same across the warp: Q's descriptors then stay in uniform registers (as CUTLASS does).
VA_DEVICE int va_computing_group() { return __shfl_sync(0xffffffffu, threadIdx.x / VA_WARP / 4, 0); }
VA_DEVICE void va_start_turns(int group) {
    if (group == VA_GROUPS - 1) va_pass_turn(group);
}
VA_DEVICE void va_end_turns(int group) {
    if (group == 0) va_take_turn(group);
}

// S = Q K^T for this warpgroup's 64 rows, issued (not waited for): both operands K-major in
// shared memory, Q's tile at `q16` and the K tile at `k16` (`va_smem_address16`).
template <int NS>
VA_DEVICE void va_issue_scores(float (&s)[NS][4], va_u32 q16, int q_first, va_u32 k16) {
    float(&s_flat)[NS * 4] = reinterpret_cast<float(&)[NS * 4]>(s);
    va_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < VA_HEAD_DIM_PAD / 16; ++kk) {
        VaWgmma<VA_BLOCK_N>::ss<0>(s_flat, va_k_major_descriptor<VaQTile>(q16, q_first, kk), va_k_major_descriptor<VaKTile>(k16, 0, kk),
                                   kk > 0);
    }
    va_wgmma_commit();
}

// O += P V, issued: P from registers, V MN-major in shared memory at `v16`.
template <int NO>
VA_DEVICE void va_issue_values(float (&o)[NO][4], const va_u32 (&pf)[VA_BLOCK_N / 16][4], va_u32 v16) {
    va_fence_registers(reinterpret_cast<float(&)[NO * 4]>(o));
    va_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) va_wgmma_pv<0, VA_HEAD_DIM_V_PAD>(o, pf[kk], v16, kk);
    va_wgmma_commit();
}

// The 16-byte addresses of the stage holding the block's key (or value) tile n, and of Q's
// buffer for round r: the descriptors of every instruction are these plus constants.
VA_DEVICE va_u32 va_k_stage16(const VaWgmmaSmem& sm, int n) { return va_smem_address16(sm.k) + va_stage(n) * (VaKTile::ELEMS / 8); }
VA_DEVICE va_u32 va_v_stage16(const VaWgmmaSmem& sm, int n) { return va_smem_address16(sm.v) + va_stage(n) * (VaVTile::ELEMS / 8); }
VA_DEVICE va_u32 va_q_buffer16(const VaWgmmaSmem& sm, int r) { return va_smem_address16(sm.q) + va_q_buffer(r) * (VaQTile::ELEMS / 8); }

// A computing warpgroup: its 64 query rows of one tile against the tile's key tiles, the
// block's from `first` on, with Q's round `round`. The score product of key tile i runs
// alongside the value product of tile i - 1 (FlashAttention-3's intra-warpgroup overlap): the
// softmax of tile i waits only for the scores, then the values.
VA_DEVICE void va_consume_tile(const VaParams& p, const VaTile& tile, const VaWgmmaSmem& sm, int first, int round, bool tma) {
    constexpr int NS = VA_BLOCK_N / 8;        // 8-key chunks of a score row
    constexpr int NO = VA_HEAD_DIM_V_PAD / 8; // 8-column chunks of an output row
    const int warp = threadIdx.x / VA_WARP, lane = threadIdx.x % VA_WARP;
    const int g = lane / 4, t = lane % 4;
    const int group = va_computing_group();
    const int q_first = group * 64;
    const int warp_first = tile.m0 + warp * 16;
    const int warp_last = min(warp_first + 15, tile.lq - 1);
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float(&o_flat)[NO * 4] = reinterpret_cast<float(&)[NO * 4]>(o);
    VaRows rows = va_rows(warp_first, g);
    const float factor = va_score_factor(p);
    const int tiles = tile.j_end - tile.j_begin;

    if (tiles > 0) {
        float s[NS][4];
        float(&s_flat)[NS * 4] = reinterpret_cast<float(&)[NS * 4]>(s);
        va_u32 pf[VA_BLOCK_N / 16][4];
        float alpha[2];
        // The softmax of key tile i, whose scores are in `s`: the probabilities replace them,
        // the rescaling of O goes into `alpha`; `probabilities` then packs them into `pf`.
        const auto softmax = [&](int i) {
            const int j = tile.j_begin + i;
            const bool masked = va_tile_needs_mask(p, tile, j, warp_first, warp_last);
            va_softmax_fragment(p, tile, s, rows, va_key_tile_start(tile, j, tma) + 2 * t, j * VA_BLOCK_N, masked, factor, alpha);
        };
        const auto probabilities = [&] {
#pragma unroll
            for (int kk = 0; kk < VA_BLOCK_N / 16; ++kk) va_probability_fragment(pf[kk], s, kk);
        };

        // The scores of key tile i have been read into registers: its K stage is free, and
        // after the tile's last, Q's buffer.
        const auto scores_read = [&](int i) {
            va_release_stage(sm.k_empty, first + i);
            if (i == tiles - 1) va_release_q(sm, round);
        };

        const va_u32 q16 = va_q_buffer16(sm, round);
        va_mbarrier_wait(&sm.q_full[va_q_buffer(round)], va_q_phase(round));
        va_wait_stage(sm.k_full, first);
        va_take_turn(group);
        va_issue_scores(s, q16, q_first, va_k_stage16(sm, first));
        va_pass_turn(group);
        va_wgmma_wait<0>();
        va_fence_registers(s_flat);
        scores_read(0);
        softmax(0);
        probabilities();

        for (int i = 1; i < tiles; ++i) {
            const int n = first + i;
            va_wait_stage(sm.k_full, n);
            va_take_turn(group);
            va_issue_scores(s, q16, q_first, va_k_stage16(sm, n));
            va_rescale_fragment(o, alpha);
            va_wait_stage(sm.v_full, n - 1);
            va_issue_values(o, pf, va_v_stage16(sm, n - 1));
            va_pass_turn(group);
            va_wgmma_wait<1>(); // the scores
            va_fence_registers(s_flat);
            scores_read(i);
            softmax(i);
            va_wgmma_wait<0>(); // the values
            va_fence_registers(o_flat);
            va_release_stage(sm.v_empty, n - 1);
            probabilities();
        }

        const int last = first + tiles - 1;
        va_rescale_fragment(o, alpha);
        va_wait_stage(sm.v_full, last);
        va_take_turn(group);
        va_issue_values(o, pf, va_v_stage16(sm, last));
        va_pass_turn(group);
        va_total_rows(rows); // under the last product
        va_wgmma_wait<0>();
        va_fence_registers(o_flat);
        va_release_stage(sm.v_empty, last);
    } // else no key: every thread's sums are 0, already the totals

    va_store_fragment(p, tile, o, rows, factor, t);
}

// The computing warpgroups' part of the block: each of its tiles in turn.
VA_DEVICE void va_consume_tiles(const VaParams& p, const VaWgmmaSmem& sm, bool tma) {
    va_registers_claim<VA_CONSUMER_REGISTERS>();
    int first = 0, round = 0; // as the copying warpgroup counts them
    const int group = va_computing_group();
    va_start_turns(group);
    va_for_each_tile(p, [&](const VaTile& tile) {
        va_consume_tile(p, tile, sm, first, round, tma);
        const int tiles = tile.j_end - tile.j_begin;
        if (tiles > 0) {
            first += tiles;
            ++round;
        }
    });
    va_end_turns(group);
}

// The Hopper block: its shared memory and barriers, then the copying and computing warpgroups
// each through the block's tiles.
VA_DEVICE void va_attention_wgmma(const VaParams& p, va_u16* smem, const VaTensorMap* k_map, const VaTensorMap* v_map, bool tma) {
    // Swizzled atoms must start on 1024 bytes: the host allots 1 KiB more for the alignment.
    smem += ((1024 - (va_smem_addr(smem) & 1023)) & 1023) / 2;
    VaWgmmaSmem sm;
    sm.q = smem;
    sm.k = sm.q + VA_Q_BUFFERS * VaQTile::ELEMS;
    sm.v = sm.k + VA_STAGES * VaKTile::ELEMS;
    sm.k_full = reinterpret_cast<va_u64*>(sm.v + VA_STAGES * VaVTile::ELEMS);
    sm.v_full = sm.k_full + VA_STAGES;
    sm.k_empty = sm.k_full + 2 * VA_STAGES;
    sm.v_empty = sm.k_full + 3 * VA_STAGES;
    sm.q_full = sm.k_full + 4 * VA_STAGES;
    sm.q_empty = sm.q_full + VA_Q_BUFFERS;
    if (threadIdx.x == 0) {
        for (int stage = 0; stage < VA_STAGES; ++stage) {
            va_mbarrier_init(&sm.k_full[stage], VA_PRODUCER_THREADS + 1);
            va_mbarrier_init(&sm.v_full[stage], VA_PRODUCER_THREADS + 1);
            va_mbarrier_init(&sm.k_empty[stage], VA_WARPS);
            va_mbarrier_init(&sm.v_empty[stage], VA_WARPS);
        }
        for (int q = 0; q < VA_Q_BUFFERS; ++q) {
            va_mbarrier_init(&sm.q_full[q], VA_PRODUCER_THREADS);
            va_mbarrier_init(&sm.q_empty[q], VA_WARPS);
        }
    }
    va_syncthreads(); // the barriers are initialized for everyone

    if (threadIdx.x >= VA_THREADS) {
        va_produce_tiles(p, sm, k_map, v_map, tma);
    } else {
        va_consume_tiles(p, sm, tma);
    }
}

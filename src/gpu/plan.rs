//! Everything about a GPU launch that does not depend on the vendor: the kernel variant, the
//! grid, the key splits, and the parameter block the kernel reads. Shared by the CUDA and HIP
//! runtimes, so the AMD path runs the same host logic as the tested NVIDIA one.

use super::tensor_map::TensorMapShape;
use super::tuning::Tuning;
use crate::problem::Problem;

/// Dynamic shared memory a block may have on the GPUs we target (227 KiB on Hopper and A100).
const MAX_SHARED_BYTES: usize = 227 * 1024;

/// Threads of a merge block (`VA_MERGE_THREADS`).
const MERGE_THREADS: usize = 256;

/// Most key splits of one query tile.
const MAX_SPLITS: usize = 16;

/// Scores (query rows × keys) a split must spare each split block before splitting pays for its
/// partial outputs and their combination: 1024 keys of a 64-row tile, 512 of a 128-row one
/// (measured on the H200 with 64-row tiles and the merge kernel: sparing 256 keys took shape 12
/// from 10.4 to 13.6 µs, sparing 512 took shape 13 from 13.4 to 17.6; on an H100 with the
/// splits combined in the attention kernel, a quarter of this still made both slower, by 11%
/// and 5%).
const MIN_SPARED_SCORES: usize = 64 * 1024;

/// The most keys of any sequence among the last `split_pairs` (query tile, head) pairs, which
/// are the last query tiles of the last head (`va_block_work`: pair i is tile i % tiles of head
/// i / tiles), or every tile when there are more pairs than tiles; `tile_start` holds each
/// sequence's first query tile (`batch + 1` entries).
fn split_pairs_longest_keys(problem: &Problem, tile_start: &[i32], tiles: usize, split_pairs: usize) -> usize {
    let first_split_tile = tiles - split_pairs.min(tiles);
    (0..problem.batch())
        .filter(|&b| tile_start[b + 1] as usize > first_split_tile.max(tile_start[b] as usize))
        .map(|b| problem.sequence(b).k_len)
        .max()
        .unwrap_or(0)
}

/// The cu_seqlens of `tokens` cut into `batch` sequences whose lengths differ by at most one.
fn even_cu_seqlens(tokens: usize, batch: usize) -> Vec<i32> {
    (0..=batch).map(|b| (tokens as u64 * b as u64 / batch as u64) as i32).collect()
}

/// Query rows times keys, each rounded up to whole tiles of `block_m` rows and `block_n` keys:
/// the scores a call computes, the padding of each sequence's last tiles included.
fn padded_scores(problem: &Problem, block_m: usize, block_n: usize) -> usize {
    (0..problem.batch())
        .map(|b| {
            let s = problem.sequence(b);
            s.q_len.next_multiple_of(block_m) * s.k_len.next_multiple_of(block_n)
        })
        .sum()
}

/// Which tensor-core code a kernel is built for (one file of `kernel/` each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    /// NVIDIA sm_80 and newer: `mma.sync` (`tile_mma.h`).
    Mma,
    /// NVIDIA Hopper (sm_90a): warpgroup MMAs (`tile_wgmma.h`).
    Wgmma,
    /// AMD CDNA: MFMA on wave64 (`tile_mfma.h`).
    Mfma,
}

impl Target {
    /// The NVIDIA target for compute capability `major.minor`: warpgroup MMAs on Hopper, unless
    /// the tuning asks for the `mma.sync` kernel there (for comparisons).
    pub fn nvidia(major: i32, minor: i32, tuning: &Tuning) -> Target {
        if (major, minor) == (9, 0) && !tuning.mma_on_hopper {
            Target::Wgmma
        } else {
            Target::Mma
        }
    }
}

/// A compiled kernel's compile-time constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    /// head_dim rounded up to the next of a few widths (32, 64, 80, 96, 128, 192, 256: multiples
    /// of the MMA's reduction step of 16); see [`Variant::new`].
    pub head_dim_pad: usize,
    /// head_dim_v rounded up likewise; for warpgroup MMAs (whose N step is 8) also to 72.
    pub head_dim_v_pad: usize,
    /// Keys per shared-memory tile.
    pub block_n: usize,
    /// Computing warps (NVIDIA) or waves (AMD) per block; Hopper adds a copying warpgroup.
    pub warps: usize,
    /// Query rows per warp (16 or 32).
    pub rows_per_warp: usize,
    /// Blocks per multiprocessor the register budget is cut for (`__launch_bounds__`).
    pub min_blocks: usize,
    /// mma.sync: whether Q's fragments stay in registers (else re-read from shared memory).
    pub q_in_registers: bool,
    /// Shared-memory stages of K and V: 2, or 3 on Hopper where they fit.
    pub stages: usize,
    /// Hopper: Q's buffers, 2 where they fit beside three stages (the next tile's Q loads
    /// while the last one's is read), else 1.
    pub q_buffers: usize,
    /// Whether the soft-cap code is compiled in (only for calls that ask for one: it is a
    /// sizeable share of the kernel's code, which small problems fetch cold).
    pub softcap: bool,
    pub f16: bool,
    pub target: Target,
}

impl Variant {
    /// The variant for head dims `d` and `dv`: each padded up to the next of a few widths
    /// (multiples of the MMA's 16), so that a handful of compiled kernels serve every head dim;
    /// the common ones (64, 72 → 80, 96, 128, 256) pad no further than the MMA needs. Warpgroup
    /// MMAs take any multiple of 8 as the output width, so there head_dim_v 72 stays 72.
    pub fn new(d: usize, dv: usize, f16: bool, target: Target) -> Self {
        const WIDTHS: [usize; 7] = [32, 64, 80, 96, 128, 192, 256];
        let width = |x: usize| WIDTHS.into_iter().find(|&w| w >= x).unwrap_or(x.next_multiple_of(16));
        let head_dim_pad = width(d);
        match target {
            Target::Wgmma => {
                // Any multiple of 8 would do; a few widths keep the compiled variants few.
                const V_WIDTHS: [usize; 8] = [32, 64, 72, 80, 96, 128, 192, 256];
                let head_dim_v_pad = V_WIDTHS.into_iter().find(|&w| w >= dv).unwrap_or(dv.next_multiple_of(8));
                // Two computing warpgroups of 64 rows (and one copying). Up to 128 columns the
                // scores of 128 keys, the probabilities of the previous tile and the output fit
                // in the 224 registers a computing thread gets (no spills in `ptxas -v`); wider
                // heads take 64 keys, so that the double-buffered tiles stay within shared
                // memory.
                let block_n = if head_dim_pad.max(head_dim_v_pad) <= 128 { 128 } else { 64 };
                Variant {
                    head_dim_pad,
                    head_dim_v_pad,
                    block_n,
                    warps: 8,
                    rows_per_warp: 16,
                    min_blocks: 1,
                    q_in_registers: false,
                    stages: 2,
                    q_buffers: 1,
                    softcap: false,
                    f16,
                    target,
                }
                .with_hopper_stages()
            }
            Target::Mma | Target::Mfma => {
                let head_dim_v_pad = width(dv);
                let widest = head_dim_pad.max(head_dim_v_pad);
                // Wide heads get narrower key tiles, so shared memory and registers still allow
                // two blocks per multiprocessor.
                let block_n = if widest <= 128 { 64 } else { 32 };
                // Two 16-row slices per warp halve the shared-memory reads per MMA, where the
                // registers allow it (FlashAttention-2 does the same); beyond 96 columns Q's
                // fragments then leave the registers to the accumulators.
                let rows_per_warp = if widest <= 128 && target == Target::Mma { 32 } else { 16 };
                let q_in_registers = widest <= 96 || rows_per_warp == 16;
                // 255 registers × 128 threads (measured with `ptxas -v` on sm_90): two blocks.
                Variant {
                    head_dim_pad,
                    head_dim_v_pad,
                    block_n,
                    warps: 4,
                    rows_per_warp,
                    min_blocks: 2,
                    q_in_registers,
                    stages: 2,
                    q_buffers: 1,
                    softcap: false,
                    f16,
                    target,
                }
            }
        }
    }

    /// Hopper: the most K/V stages (they give the copies more lead), then the most Q buffers,
    /// that shared memory holds: three stages and two buffers, else three and one, else two
    /// and two, else two and one.
    pub fn with_hopper_stages(self) -> Self {
        [(3, 2), (3, 1), (2, 2)]
            .into_iter()
            .map(|(stages, q_buffers)| Variant { stages, q_buffers, ..self })
            .find(|v| v.shared_bytes() <= MAX_SHARED_BYTES)
            .unwrap_or(Variant { stages: 2, q_buffers: 1, ..self })
    }

    /// Hopper: one computing warpgroup, 64-row tiles (twice the blocks, for small problems).
    pub fn with_one_warpgroup(self) -> Self {
        debug_assert_eq!(self.target, Target::Wgmma);
        Variant { warps: 4, ..self }.with_hopper_stages()
    }

    /// Hopper: three computing warpgroups, 192-row tiles (`VARLEN_ATTN_GPU_BLOCK_M=192`).
    pub fn with_three_warpgroups(self) -> Self {
        debug_assert_eq!(self.target, Target::Wgmma);
        Variant { warps: 12, ..self }.with_hopper_stages()
    }

    /// Hopper's tiles for `problem`. A problem whose 128-row tiles would not fill half the
    /// multiprocessors takes 64-row tiles (one computing warpgroup each): twice the blocks,
    /// each half the work, where a block's fixed cost is most of the time. Heads of at most 80
    /// (K) and 72 (V) columns take 192-row tiles (three computing warpgroups, whose turns at
    /// the tensor cores cover the softmax better where the products are short) where they pad
    /// the rows at most 13% more and either fill a wave of multiprocessors or spare the
    /// 128-row tiles a second wave: on the H200 10-14% faster on long head_dim-72 sequences,
    /// 8% on 16 × 1024 tokens (12.5% more rows); on an H100 22-30% faster where one wave of
    /// 192-row tiles replaces two of 128 (16 heads × 1100-1536 tokens, 4 × 5000-6000, 8 ×
    /// 2800, 16 × 2 × 700: their second wave was a key split and its merge; 4 × 4300, with 136
    /// tiles of 128 rows, evens). Slower where 128-row tiles fit one wave (4 heads × 4100
    /// tokens, 132 tiles: 28% on the H200, 19% on an H100; 16 × 720: 17%), with rows half
    /// padding (64 × 256: 23%), and on
    /// wider heads, whose accumulators spill from the 160 registers a computing thread then
    /// gets. Other heads up to 96 wide
    /// take 192-key tiles where they pad the keys by at most 2% more than 128-key ones: per
    /// key they ran 3-6% faster on the H200 (fewer fixed costs per tile), but each sequence's
    /// last tile pads up to 191 keys, which short sequences pay for (16 images × 1024 tokens:
    /// 9% slower). Where 64-key tiles pad the keys at least 15% less (short sequences: at
    /// most 320 keys, the last 128-key tile at most half full), they take those: on an H100,
    /// 4 heads × 276 tokens (320 keys padded instead of 384) took 8.4 µs of kernel time
    /// against 8.7, 32 sequences of 60 (64 keys, not 128) 16.2 against 20.4. With cu_seqlens on
    /// the device `problem`'s lengths are a guess (`Plan::with_device_seqlens`). Then whatever
    /// the tuning switches force.
    fn hopper_tiles(self, problem: &Problem, multiprocessors: usize, tuning: &Tuning) -> Self {
        let mut variant = self;
        let query_tiles =
            |rows: usize| -> usize { (0..problem.batch()).map(|b| problem.sequence(b).q_len.div_ceil(rows)).sum() };
        let pairs = |rows: usize| query_tiles(rows) * problem.num_heads;
        let small = 2 * pairs(self.block_m()) <= multiprocessors;
        let tall_tiles_pay = !small
            && self.head_dim_pad <= 80
            && self.head_dim_v_pad <= 72
            && (pairs(192) >= multiprocessors || pairs(128) > multiprocessors)
            && 100 * padded_scores(problem, 192, self.block_n) <= 113 * padded_scores(problem, 128, self.block_n);
        match tuning.block_m {
            Some(64) => variant = variant.with_one_warpgroup(),
            Some(192) => variant = variant.with_three_warpgroups(),
            None if small => variant = variant.with_one_warpgroup(),
            None if tall_tiles_pay => variant = variant.with_three_warpgroups(),
            _ => {}
        }
        let widest = variant.head_dim_pad.max(variant.head_dim_v_pad);
        let wide_tiles_pay = widest <= 96
            && variant.warps == 8
            && 50 * padded_scores(problem, 1, 192) <= 51 * padded_scores(problem, 1, variant.block_n);
        let narrow_tiles_pay = variant.block_n == 128
            && 100 * padded_scores(problem, 1, 64) <= 85 * padded_scores(problem, 1, variant.block_n);
        let block_n = tuning.block_n.or(wide_tiles_pay.then_some(192)).or(narrow_tiles_pay.then_some(64));
        if let Some(block_n) = block_n.filter(|_| widest <= 128) {
            variant = Variant { block_n, ..variant }.with_hopper_stages();
        }
        if tuning.two_stages {
            variant.stages = 2;
        }
        if tuning.one_q_buffer {
            variant.q_buffers = 1;
        }
        variant
    }

    /// Query rows per block.
    pub fn block_m(&self) -> usize {
        self.warps * self.rows_per_warp
    }

    /// Threads per block: the computing warps, and on Hopper one more warpgroup that copies
    /// K and V (`VA_PRODUCER_THREADS`).
    pub fn threads(&self) -> usize {
        match self.target {
            Target::Wgmma => self.warps * 32 + 128,
            Target::Mma => self.warps * 32,
            Target::Mfma => self.warps * 64,
        }
    }

    pub fn for_problem(problem: &Problem, f16: bool, target: Target) -> Self {
        Variant { softcap: problem.softcap.is_some(), ..Self::new(problem.head_dim, problem.head_dim_v, f16, target) }
    }

    /// The `-D` definitions the kernel source expects.
    pub fn defines(&self) -> Vec<String> {
        let mut d = vec![
            format!("-DVA_HEAD_DIM_PAD={}", self.head_dim_pad),
            format!("-DVA_HEAD_DIM_V_PAD={}", self.head_dim_v_pad),
            format!("-DVA_BLOCK_N={}", self.block_n),
            format!("-DVA_WARPS={}", self.warps),
            format!("-DVA_ROWS_PER_WARP={}", self.rows_per_warp),
            format!("-DVA_Q_IN_REGISTERS={}", u8::from(self.q_in_registers)),
            format!("-DVA_MIN_BLOCKS={}", self.min_blocks),
            format!("-DVA_STAGES={}", self.stages),
            format!("-DVA_Q_BUFFERS={}", self.q_buffers),
            format!("-DVA_SOFTCAP={}", u8::from(self.softcap)),
            format!("-DVA_PARAMS_BYTES={}", core::mem::size_of::<KernelParams>()),
        ];
        if self.target == Target::Wgmma {
            d.push("-DVA_WGMMA=1".into());
        }
        if self.f16 {
            d.push("-DVA_IS_F16=1".into());
        }
        d
    }

    /// Dynamic shared memory of one block, in bytes (must match the kernel's layout): Q, the
    /// stages of K and V tiles, and on AMD the probabilities' staging; mma.sync and MFMA rows
    /// are padded by 8 elements; the Hopper tile's swizzled atoms need 1 KiB for their
    /// alignment, its V tiles take whole 64-column slabs (`VaVTile`), and its 8-byte barriers
    /// (four per stage, two per Q buffer) follow the tiles.
    pub fn shared_bytes(&self) -> usize {
        let wgmma = self.target == Target::Wgmma;
        let (pad, extra) = if wgmma { (0, 1024 + 8 * (4 * self.stages + 2 * self.q_buffers)) } else { (8, 0) };
        let v_width = if wgmma { self.head_dim_v_pad.next_multiple_of(64) } else { self.head_dim_v_pad };
        let (q_stride, v_stride) = (self.head_dim_pad + pad, v_width + pad);
        let staging = if self.target == Target::Mfma { self.block_m() * self.block_n } else { 0 };
        let stages = self.stages * self.block_n * (q_stride + v_stride);
        2 * (self.q_buffers * self.block_m() * q_stride + stages + staging) + extra
    }
}

/// The kernel's parameter block; must match `VaParams` in `kernel/attention.hip` field by field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub out: u64,
    pub lse: u64,
    pub partial_out: u64,
    pub partial_lse: u64,
    pub split_counters: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub tile_start: u64,
    pub status: u64,
    pub q_token_stride: i64,
    pub q_head_stride: i64,
    pub k_token_stride: i64,
    pub k_head_stride: i64,
    pub v_token_stride: i64,
    pub v_head_stride: i64,
    pub out_token_stride: i64,
    pub out_head_stride: i64,
    pub batch: i32,
    pub heads: i32,
    pub group: i32,
    pub total_q: i32,
    pub total_k: i32,
    pub head_dim: i32,
    pub head_dim_v: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub tiles: i32,
    pub whole_pairs: i32,
    pub splits: i32,
    pub tiles_per_sequence: i32,
    pub scale_log2: f32,
    pub softcap: f32,
    pub scale_over_softcap: f32,
    pub inline_metadata: i32,
    pub metadata: [i32; INLINE_METADATA],
}

/// Room for cu_seqlens_q, cu_seqlens_k and tile_start in the parameter block: batches of up to
/// 64 sequences launch with no copy to the device first (3 × 65 entries). Must match
/// `VA_INLINE_METADATA`.
pub(crate) const INLINE_METADATA: usize = 195;

/// A `[tokens, heads, dims]` tensor on the device: its address and the element strides of the
/// token and head axes (the dims are contiguous).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Operand {
    pub address: u64,
    pub token_stride: usize,
    pub head_stride: usize,
}

/// The tensors of one call on the device; `lse` is 0 when the caller wants none.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Operands {
    pub q: Operand,
    pub k: Operand,
    pub v: Operand,
    pub out: Operand,
    pub lse: u64,
}

/// The GPU a plan is made for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gpu {
    pub target: Target,
    pub multiprocessors: usize,
}

/// Where the kernel finds its sequences.
#[derive(Clone, Debug)]
enum Schedule {
    /// Planned on the host: `cu_seqlens_q`, `cu_seqlens_k` and `tile_start` (`tile_start[b]`:
    /// the first query tile of sequence `b`), `batch + 1` entries each, one after another;
    /// inline in the parameter block when they fit, else copied to the device.
    Host(Vec<i32>),
    /// `cu_seqlens_q` and `cu_seqlens_k` on the device (their addresses): `va_plan_tiles`
    /// checks them and writes `tile_start` and each query tile's sequence into the workspace;
    /// the grid is an upper bound.
    Device { cu_seqlens_q: u64, cu_seqlens_k: u64 },
}

/// How one call runs: the variant, the grid, the key splits, and everything the parameter
/// block is built from ([`Plan::params`], the one place that builds it).
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub variant: Variant,
    schedule: Schedule,
    /// Query tiles of all sequences (with cu_seqlens on the device, the most there can be).
    pub tiles: usize,
    /// The (query tile, head) pairs whose keys are split, the last ones (`va_block_work`).
    split_pairs: usize,
    /// Key splits of each split pair (1: none).
    pub splits: usize,
    /// Whether the last split block of each row group combines the splits (NVIDIA), not the
    /// merge kernel after the attention kernel (AMD, or `VARLEN_ATTN_GPU_MERGE=kernel`).
    merges_in_kernel: bool,
    /// The query tiles of each sequence where two or more all have as many (at least one),
    /// else 0 (`va_tile_sequence` then searches).
    tiles_per_sequence: usize,
    /// Blocks of a persistent grid (one per multiprocessor's slot, each walking several units
    /// of work; Hopper), or `None` for a block per unit.
    persistent_blocks: Option<usize>,
    operands: Operands,
    /// The problem's scalars, as the kernel reads them (`total_k` and `kv_heads`: K's and V's
    /// rows and heads, also what their tensor maps describe on Hopper).
    kv_heads: usize,
    batch: usize,
    heads: usize,
    group: usize,
    total_q: usize,
    total_k: usize,
    head_dim: usize,
    head_dim_v: usize,
    window_left: i32,
    window_right: i32,
    scale: f32,
    softcap: f32,
}

impl Plan {
    /// Plans `problem` on `gpu` for the tensors `operands`.
    pub fn new(problem: &Problem, f16: bool, gpu: Gpu, tuning: &Tuning, operands: Operands) -> Plan {
        let (target, multiprocessors) = (gpu.target, gpu.multiprocessors);
        let mut variant = Variant::for_problem(problem, f16, target);
        if target == Target::Wgmma {
            variant = variant.hopper_tiles(problem, multiprocessors, tuning);
        }
        let (cu_seqlens_q, cu_seqlens_k) = problem.cu_seqlens();
        let mut metadata = Vec::with_capacity(3 * (problem.batch() + 1));
        metadata.extend_from_slice(cu_seqlens_q);
        metadata.extend_from_slice(cu_seqlens_k);
        let tile_count = |b| problem.sequence(b).q_len.div_ceil(variant.block_m());
        let mut tiles = 0usize;
        for b in 0..problem.batch() {
            metadata.push(tiles as i32);
            tiles += tile_count(b);
        }
        metadata.push(tiles as i32);
        // Sequences of as many tiles each (same-sized images): the kernel divides to find a
        // tile's sequence instead of searching tile_start (64 images × 256 tokens: 5% faster
        // on the H200). A lone sequence keeps the search, one step there.
        let first_count = if problem.batch() > 1 { tile_count(0) } else { 0 };
        let uniform = (0..problem.batch()).all(|b| tile_count(b) == first_count);
        let tiles_per_sequence = if uniform { first_count } else { 0 };

        // The (query tile, head) pairs of the last wave of blocks, when it is only partly filled
        // (all of them when the problem is smaller than one wave), split their keys: the other
        // pairs run whole, then each of these as many ways as still fit in that one wave (a
        // second, mostly empty wave would double its time: measured 56 µs for shape 0 split 3
        // ways into 288 blocks for 264 slots), each split keeping at least two key tiles to
        // stream, and only where that spares the longest of those pairs' sequences
        // MIN_SPARED_SCORES per block. Their own sequences, not the batch's longest: the mixed
        // batch's last pairs are its last image's (600 keys), which 15 splits sized for its
        // 3844-key image cut into mostly empty blocks (measured 4-5% slower than unsplit).
        let pairs = tiles * problem.num_heads;
        let slots = multiprocessors * variant.min_blocks;
        let last_wave = pairs % slots;
        let tile_start = &metadata[2 * (problem.batch() + 1)..];
        let key_tiles = split_pairs_longest_keys(problem, tile_start, tiles, last_wave).div_ceil(variant.block_n);
        let max_splits = tuning.max_splits.unwrap_or(MAX_SPLITS).clamp(1, MAX_SPLITS);
        let splits = if last_wave > 0 && key_tiles >= 4 {
            (slots / last_wave).min(key_tiles / 2).clamp(1, max_splits)
        } else {
            1
        };
        let spared_scores = (key_tiles - key_tiles.div_ceil(splits)) * variant.block_n * variant.block_m();
        let splits = if spared_scores >= MIN_SPARED_SCORES { splits } else { 1 };
        let split_pairs = if splits > 1 { last_wave } else { 0 };
        // Hopper's blocks walk several tiles each, the copying warpgroup loading the next
        // tile's Q and keys while the computing ones finish the last: a grid of one wave.
        let persistent_blocks = (target == Target::Wgmma && !tuning.no_persistent).then_some(slots);

        // A window wider than every query-key distance is no window: clamped to that width, so
        // that the kernel's row + offset ± window cannot wrap (usize::MAX windows did, and
        // masked every key).
        let key_tokens = problem.total_k();
        let widest = (problem.total_q + key_tokens).min(i32::MAX as usize);
        let window = |w: Option<usize>| w.map_or(-1, |w| w.min(widest) as i32);
        Plan {
            variant,
            schedule: Schedule::Host(metadata),
            tiles,
            split_pairs,
            splits,
            merges_in_kernel: target != Target::Mfma && !tuning.merge_kernel,
            tiles_per_sequence,
            persistent_blocks,
            operands,
            kv_heads: problem.num_kv_heads,
            batch: problem.batch(),
            heads: problem.num_heads,
            group: problem.group_size(),
            total_q: problem.total_q,
            total_k: key_tokens,
            head_dim: problem.head_dim,
            head_dim_v: problem.head_dim_v,
            window_left: window(problem.mask.left),
            window_right: window(problem.mask.right),
            scale: problem.scale,
            softcap: problem.softcap.unwrap_or(0.0),
        }
    }

    /// Plans a call whose `cu_seqlens` (`batch + 1` entries each, at `cu_seqlens`) are on the
    /// device and are neither read nor checked here: `problem` is the call as one sequence of
    /// all the tokens (its shapes and parameters validated). The tiles are chosen as if the
    /// tokens were `batch` sequences of equal length, the one guess the host can make without
    /// reading the lengths: it picks the host's tiles for batches of same-sized images, and
    /// where lengths vary the longest sequences, which take most of the time, are at least as
    /// long as the guess. The grid covers the most tiles the token count allows,
    /// `total_q / BLOCK_M + batch`; the keys are not split.
    pub fn with_device_seqlens(
        problem: &Problem,
        batch: usize,
        cu_seqlens: [u64; 2],
        f16: bool,
        gpu: Gpu,
        tuning: &Tuning,
        operands: Operands,
    ) -> Plan {
        let (even_q, even_k) = (even_cu_seqlens(problem.total_q, batch), even_cu_seqlens(problem.total_k(), batch));
        let mut plan = Plan::new(&problem.with_cu_seqlens(&even_q, &even_k), f16, gpu, tuning, operands);
        plan.schedule = Schedule::Device { cu_seqlens_q: cu_seqlens[0], cu_seqlens_k: cu_seqlens[1] };
        plan.batch = batch;
        plan.splits = 1;
        plan.split_pairs = 0;
        plan.tiles_per_sequence = 0;
        plan.tiles = if problem.total_q == 0 { 0 } else { problem.total_q.div_ceil(plan.variant.block_m()) + batch };
        plan
    }

    /// Whether `va_plan_tiles` must run first (cu_seqlens on the device).
    pub fn plans_on_the_device(&self) -> bool {
        matches!(self.schedule, Schedule::Device { .. })
    }

    /// `tile_start[b]`: the first query tile of sequence `b`; `batch + 1` entries.
    #[cfg(test)]
    fn tile_start(&self) -> &[i32] {
        match &self.schedule {
            Schedule::Host(metadata) => &metadata[2 * (self.batch + 1)..],
            Schedule::Device { .. } => &[],
        }
    }

    /// Whether the metadata travels in the parameter block (batches of up to 64 sequences).
    fn metadata_inline(&self) -> bool {
        matches!(&self.schedule, Schedule::Host(metadata) if metadata.len() <= INLINE_METADATA)
    }

    /// The metadata to copy to the device before the launch (`cu_seqlens_q`, `cu_seqlens_k`,
    /// `tile_start`, one after another), or `None` when it travels in the parameter block or
    /// is on the device already.
    pub fn metadata_to_copy(&self) -> Option<&[i32]> {
        match &self.schedule {
            Schedule::Host(metadata) if metadata.len() > INLINE_METADATA => Some(metadata),
            _ => None,
        }
    }

    /// Bytes of the workspace: with cu_seqlens on the device, `tile_start` and then each of the
    /// grid's query tiles' sequence (both written by `va_plan_tiles`); with key splits, the f32
    /// partial outputs, then partial LSEs; else 0.
    pub fn workspace_bytes(&self) -> usize {
        if self.plans_on_the_device() {
            4 * (self.batch + 1 + self.tiles)
        } else if self.splits > 1 {
            let (out, lse) = self.partial_lens();
            4 * (out + lse)
        } else {
            0
        }
    }

    /// Bytes of the split counters (`va_last_split`): an `i32` per split pair's 16-row group
    /// where the kernel combines the splits itself, else 0. They must be zero before the
    /// launch, and the kernel leaves them so.
    pub fn split_counter_bytes(&self) -> usize {
        if self.splits > 1 && self.merges_in_kernel {
            4 * self.split_pairs * self.variant.block_m() / 16
        } else {
            0
        }
    }

    /// Whether the merge kernel runs after the attention kernel (key splits that the
    /// attention kernel does not combine itself).
    pub fn launches_merge(&self) -> bool {
        self.splits > 1 && !self.merges_in_kernel
    }

    /// The kernel's parameter block, given the device addresses of the copied metadata (when
    /// [`Plan::metadata_to_copy`] gave some), of the workspace (when [`Plan::workspace_bytes`]
    /// is not 0), of the split counters (when [`Plan::split_counter_bytes`] is not 0) and,
    /// with cu_seqlens on the device, of the device's status flag.
    pub fn params(
        &self,
        metadata: Option<u64>,
        workspace: Option<u64>,
        split_counters: Option<u64>,
        status: Option<u64>,
    ) -> KernelParams {
        let o = &self.operands;
        let entries = self.batch as u64 + 1;
        let ((partial_out, partial_lse), (cu_seqlens_q, cu_seqlens_k, tile_start), status) = match self.schedule {
            Schedule::Device { cu_seqlens_q, cu_seqlens_k } => {
                let tile_start = workspace.expect("the workspace holds tile_start");
                ((0, 0), (cu_seqlens_q, cu_seqlens_k, tile_start), status.expect("a status flag"))
            }
            Schedule::Host(_) => {
                let partial = match workspace {
                    Some(base) => (base, base + 4 * self.partial_lens().0 as u64),
                    None => (0, 0),
                };
                let metadata = match metadata {
                    Some(base) => (base, base + 4 * entries, base + 8 * entries),
                    None => (0, 0, 0),
                };
                (partial, metadata, 0)
            }
        };
        let mut params = KernelParams {
            q: o.q.address,
            k: o.k.address,
            v: o.v.address,
            out: o.out.address,
            lse: o.lse,
            partial_out,
            partial_lse,
            split_counters: split_counters.unwrap_or(0),
            cu_seqlens_q,
            cu_seqlens_k,
            tile_start,
            status,
            q_token_stride: o.q.token_stride as i64,
            q_head_stride: o.q.head_stride as i64,
            k_token_stride: o.k.token_stride as i64,
            k_head_stride: o.k.head_stride as i64,
            v_token_stride: o.v.token_stride as i64,
            v_head_stride: o.v.head_stride as i64,
            out_token_stride: o.out.token_stride as i64,
            out_head_stride: o.out.head_stride as i64,
            batch: self.batch as i32,
            heads: self.heads as i32,
            group: self.group as i32,
            total_q: self.total_q as i32,
            total_k: self.total_k as i32,
            head_dim: self.head_dim as i32,
            head_dim_v: self.head_dim_v as i32,
            window_left: self.window_left,
            window_right: self.window_right,
            tiles: self.tiles as i32,
            whole_pairs: (self.tiles * self.heads - self.split_pairs) as i32,
            splits: self.splits as i32,
            tiles_per_sequence: self.tiles_per_sequence as i32,
            scale_log2: self.scale * core::f32::consts::LOG2_E,
            softcap: self.softcap,
            scale_over_softcap: if self.softcap > 0.0 { self.scale / self.softcap } else { 0.0 },
            inline_metadata: 0,
            metadata: [0; INLINE_METADATA],
        };
        if let (true, Schedule::Host(metadata)) = (self.metadata_inline(), &self.schedule) {
            params.metadata[..metadata.len()].copy_from_slice(metadata);
            params.inline_metadata = 1;
        }
        params
    }

    /// Units of work of the attention kernel: one per whole (query tile, head) pair, then
    /// `splits` per split pair (`va_units`).
    pub fn units(&self) -> usize {
        self.tiles * self.heads + self.split_pairs * (self.splits - 1)
    }

    /// Grid of the attention kernel, one dimension: a block per unit of work, or a persistent
    /// grid of at most one wave whose blocks take every `grid`-th unit.
    pub fn grid(&self) -> (u32, u32, u32) {
        let units = self.units();
        (self.persistent_blocks.map_or(units, |blocks| blocks.min(units)) as u32, 1, 1)
    }

    /// f32 elements of the split workspace (partial outputs, then partial LSEs): a tile's rows
    /// for each split block.
    fn partial_lens(&self) -> (usize, usize) {
        let rows = self.split_pairs * self.splits * self.variant.block_m();
        (rows * self.variant.head_dim_v_pad, rows)
    }

    /// K's and V's shapes for their tensor maps (Hopper), boxes of one key tile.
    pub fn key_value_shapes(&self) -> [TensorMapShape; 2] {
        let shape = |o: &Operand, dims: usize| TensorMapShape {
            address: o.address,
            tokens: self.total_k,
            heads: self.kv_heads,
            dims,
            token_stride: o.token_stride,
            head_stride: o.head_stride,
            rows: self.variant.block_n,
        };
        [shape(&self.operands.k, self.head_dim), shape(&self.operands.v, self.head_dim_v)]
    }

    /// The merge kernel's grid and threads (`VA_MERGE_THREADS`): a thread per element of a
    /// tile's output rows, times the split pairs.
    pub fn merge_grid(&self) -> ((u32, u32, u32), u32) {
        let per_pair = (self.variant.block_m() * self.head_dim_v).div_ceil(MERGE_THREADS);
        ((per_pair as u32, self.split_pairs as u32, 1), MERGE_THREADS as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;

    #[test]
    fn params_match_the_kernel_struct_layout() {
        // 12 pointers, 8 strides, 17 four-byte fields and the 195-entry array (no padding: 1008
        // bytes are a multiple of the 8-byte alignment), as C++ lays out VaParams; the kernel
        // checks its own size against this one (`VA_PARAMS_BYTES`).
        assert_eq!(core::mem::size_of::<KernelParams>(), 96 + 64 + 4 * (17 + INLINE_METADATA));
        let variant = Variant::new(72, 72, false, Target::Wgmma);
        assert!(variant.defines().contains(&format!("-DVA_PARAMS_BYTES={}", 96 + 64 + 4 * (17 + INLINE_METADATA))));
        assert_eq!(core::mem::align_of::<KernelParams>(), 8);
    }

    #[test]
    fn windows_wider_than_every_distance_are_clamped() {
        let with = |params: &Params| plan_with(Target::Wgmma, 100, 1, params);
        let plain = with(&Params::default()).params(None, None, None, None);
        assert_eq!((plain.window_left, plain.window_right), (-1, -1));
        // 100 queries + 100 keys: no distance reaches 200.
        let huge = with(&Params { window_left: Some(usize::MAX), window_right: Some(7), ..Params::default() })
            .params(None, None, None, None);
        assert_eq!((huge.window_left, huge.window_right), (200, 7));
    }

    #[test]
    fn soft_cap_code_is_compiled_in_only_for_calls_with_a_cap() {
        let with = |params: &Params| plan_with(Target::Wgmma, 100, 1, params);
        let plain = with(&Params::default());
        assert!(!plain.variant.softcap && plain.variant.defines().contains(&"-DVA_SOFTCAP=0".to_string()));
        let capped = with(&Params { softcap: Some(30.0), ..Params::default() });
        assert!(capped.variant.softcap && capped.variant.defines().contains(&"-DVA_SOFTCAP=1".to_string()));
    }

    #[test]
    fn tiles_count_each_sequence_and_skip_empty_ones() {
        let cu_q = [0, 64, 64, 130];
        let cu_k = [0, 10, 20, 30];
        let problem = Problem::new([130, 2, 72], [30, 1, 72], [30, 1, 72], &cu_q, &cu_k, &Params::default()).unwrap();
        let plan = plan_on(Target::Mma, &problem);
        assert_eq!(plan.tile_start(), [0, 1, 1, 2]);
        // Two tiles × two heads, one block each.
        assert_eq!(plan.grid(), (4, 1, 1));
        assert_eq!(
            plan.variant,
            Variant {
                head_dim_pad: 80,
                head_dim_v_pad: 80,
                block_n: 64,
                warps: 4,
                rows_per_warp: 32,
                min_blocks: 2,
                q_in_registers: true,
                stages: 2,
                q_buffers: 1,
                softcap: false,
                f16: false,
                target: Target::Mma
            }
        );
    }

    #[test]
    fn hopper_variants_keep_head_dim_v_72_and_fit_shared_memory() {
        let v = Variant::new(72, 72, false, Target::Wgmma);
        assert_eq!((v.head_dim_pad, v.head_dim_v_pad, v.block_n, v.block_m(), v.threads()), (80, 72, 128, 128, 384));
        // Two Q buffers, three K tiles, three V tiles of bf16 in whole slabs (72 columns take
        // two), no row padding: (2·128·80 + 3·128·80 + 3·128·128) · 2, 1 KiB to align the
        // swizzled atoms, and 16 barriers.
        assert_eq!((v.stages, v.q_buffers, v.shared_bytes()), (3, 2, 200704 + 1024 + 128));
        // Three stages of 128 columns still fit with one Q buffer (Q 32 KiB, K and V 3 · 64
        // KiB), not with two; 256 columns take two stages.
        let wide = Variant::new(128, 128, false, Target::Wgmma);
        assert_eq!((wide.stages, wide.q_buffers), (3, 1));
        let widest = Variant::new(256, 256, false, Target::Wgmma);
        assert_eq!((widest.stages, widest.q_buffers), (2, 1));
        assert!(v.defines().contains(&"-DVA_WGMMA=1".to_string()));
        for (d, dv) in [(256, 256), (200, 40), (1, 1), (128, 128)] {
            let v = Variant::new(d, dv, true, Target::Wgmma);
            assert!(v.shared_bytes() <= MAX_SHARED_BYTES, "{v:?}");
            assert!(v.head_dim_v_pad >= dv && v.head_dim_v_pad.is_multiple_of(8));
        }
        assert_eq!(Variant::new(72, 72, false, Target::Mma).threads(), 128);
        assert_eq!(Variant::new(72, 72, false, Target::Mfma).threads(), 256);
    }

    #[test]
    fn metadata_travels_inline_or_is_laid_out_for_the_copy() {
        let cu_small = [0, 64, 64, 130];
        let problem =
            Problem::new([130, 1, 72], [130, 1, 72], [130, 1, 72], &cu_small, &cu_small, &Params::default()).unwrap();
        let plan = plan_on(Target::Mma, &problem);
        assert_eq!(plan.metadata_to_copy(), None);
        let params = plan.params(None, None, None, None);
        assert_eq!(params.inline_metadata, 1);
        assert_eq!(params.metadata[..12], [0, 64, 64, 130, 0, 64, 64, 130, 0, 1, 1, 2]);

        // 100 sequences: 3 × 101 entries do not fit in the parameter block.
        let cu_q: Vec<i32> = (0..=100).collect();
        let cu_k: Vec<i32> = (0..=100).map(|i| 2 * i).collect();
        let problem = Problem::new([100, 1, 72], [200, 1, 72], [200, 1, 72], &cu_q, &cu_k, &Params::default()).unwrap();
        let plan = plan_on(Target::Mma, &problem);
        let copied = plan.metadata_to_copy().expect("too large to inline");
        assert_eq!((&copied[..101], &copied[101..202], &copied[202..]), (&cu_q[..], &cu_k[..], &cu_q[..]));
        let params = plan.params(Some(4096), None, None, None);
        assert_eq!(params.inline_metadata, 0);
        assert_eq!((params.cu_seqlens_q, params.cu_seqlens_k, params.tile_start), (4096, 4096 + 404, 4096 + 808));
        assert_eq!((params.partial_out, params.partial_lse), (0, 0));
    }

    /// One sequence of `length` tokens and `heads` heads of 72 columns, planned for 132
    /// multiprocessors (an H200).
    fn plan_one(target: Target, length: usize, heads: usize) -> Plan {
        plan_with(target, length, heads, &Params::default())
    }

    fn plan_with(target: Target, length: usize, heads: usize, params: &Params) -> Plan {
        let cu = [0, length as i32];
        let shape = [length, heads, 72];
        let problem = Problem::new(shape, shape, shape, &cu, &cu, params).unwrap();
        plan_on(target, &problem)
    }

    #[test]
    fn the_parameter_block_carries_the_operands_and_the_problem() {
        let cu = [0, 100];
        let problem = Problem::new([100, 4, 72], [100, 2, 72], [100, 2, 64], &cu, &cu, &Params::default()).unwrap();
        let operand = |address, token_stride, head_stride| Operand { address, token_stride, head_stride };
        let operands = Operands {
            q: operand(1 << 20, 288, 72),
            k: operand(2 << 20, 152, 72),
            v: operand(3 << 20, 128, 64),
            out: operand(4 << 20, 256, 64),
            lse: 5 << 20,
        };
        let gpu = Gpu { target: Target::Wgmma, multiprocessors: 132 };
        let plan = Plan::new(&problem, false, gpu, &Tuning::default(), operands);
        let p = plan.params(None, None, None, None);
        assert_eq!((p.q, p.k, p.v, p.out, p.lse), (1 << 20, 2 << 20, 3 << 20, 4 << 20, 5 << 20));
        assert_eq!((p.q_token_stride, p.k_token_stride, p.v_token_stride, p.out_token_stride), (288, 152, 128, 256));
        assert_eq!((p.q_head_stride, p.k_head_stride, p.v_head_stride, p.out_head_stride), (72, 72, 64, 64));
        assert_eq!((p.batch, p.heads, p.group, p.total_q, p.head_dim, p.head_dim_v), (1, 4, 2, 100, 72, 64));
        assert_eq!((p.scale_log2, p.softcap, p.splits), (problem.scale * core::f32::consts::LOG2_E, 0.0, 1));
        let [k, v] = plan.key_value_shapes();
        assert_eq!((k.address, k.tokens, k.heads, k.dims, k.token_stride, k.rows), (2 << 20, 100, 2, 72, 152, 128));
        assert_eq!((v.address, v.dims, v.token_stride, v.head_stride), (3 << 20, 64, 128, 64));
    }

    #[test]
    fn narrow_heads_take_192_row_or_192_key_tiles_where_they_pad_little() {
        let hopper = Gpu { target: Target::Wgmma, multiprocessors: 132 };
        let tiles = |lengths: &[usize], d: usize| {
            let mut cu = vec![0i32];
            for &l in lengths {
                cu.push(cu.last().unwrap() + l as i32);
            }
            let total = *cu.last().unwrap() as usize;
            let problem =
                Problem::new([total, 16, d], [total, 16, d], [total, 16, d], &cu, &cu, &Params::default()).unwrap();
            let v = Plan::new(&problem, false, hopper, &Tuning::default(), Operands::default()).variant;
            (v.block_m(), v.block_n)
        };
        // 17296 rows: 91 tiles of 192 per head (1456 with 16 heads), 0.4% more padding.
        assert_eq!(tiles(&[17296], 72), (192, 128));
        // 16 × 1024: 12.5% more rows; 64 × 256: 50% more. 1200 rows: 112 tiles of 192, one
        // wave where the 160 of 128 rows take two; 720 rows: 96 tiles of 128, one wave already.
        assert_eq!(tiles(&[1024; 16], 72), (192, 128));
        assert_eq!(tiles(&[256; 64], 72), (128, 128));
        assert_eq!(tiles(&[1200], 72), (192, 128));
        assert_eq!(tiles(&[720], 72), (128, 192));
        // Short sequences whose last 128-key tile is at most half full take 64-key tiles
        // (276 keys: 320 padded instead of 384; 60: 64 instead of 128); 350 keys pad 384
        // either way.
        assert_eq!((tiles(&[276], 72), tiles(&[60; 32], 72)), ((64, 64), (128, 64)));
        assert_eq!((tiles(&[350], 72), tiles(&[276], 128)), ((64, 128), (64, 64)));
        // The mixed batch of nine images (58 tiles of 192 rows per head): head_dim 64 and 72
        // take 192 rows, 80 does not (its accumulators would spill).
        let mixed = [720, 1200, 276, 3844, 64, 1, 2116, 1012, 600];
        assert_eq!((tiles(&mixed, 64), tiles(&mixed, 72), tiles(&mixed, 80)), ((192, 128), (192, 128), (128, 128)));
        // Wider heads: two warpgroups, and 192 keys where they pad at most 2% more (17296 keys
        // pad 112 at 128, 176 at 192; 16 × 1024 pad none at 128, 128 at 192).
        assert_eq!(tiles(&[17296], 80), (128, 192));
        assert_eq!(tiles(&[1024; 16], 80), (128, 128));
        assert_eq!(tiles(&[17296], 128), (128, 128));
        // With cu_seqlens on the device the host sees only the token counts and the batch: it
        // takes the tiles of as many sequences of equal length.
        let on_device = |tokens: usize, batch: usize, d: usize| {
            let (cu, shape) = ([0, tokens as i32], [tokens, 16, d]);
            let problem = Problem::new(shape, shape, shape, &cu, &cu, &Params::default()).unwrap();
            let tuning = Tuning::default();
            let v = Plan::with_device_seqlens(
                &problem,
                batch,
                [0x1000, 0x2000],
                false,
                hopper,
                &tuning,
                Operands::default(),
            )
            .variant;
            (v.block_m(), v.block_n)
        };
        assert_eq!(on_device(16384, 16, 72), tiles(&[1024; 16], 72));
        assert_eq!(on_device(16384, 64, 72), tiles(&[256; 64], 72));
        assert_eq!(on_device(17296, 1, 80), tiles(&[17296], 80));
        // The mixed batch's 9833 tokens as nine of 1092-1093: 192 rows, as its own lengths take.
        assert_eq!(on_device(9833, 9, 72), (192, 128));
        // tests/gpu.rs's device-cu_seqlens batches: 2861 tokens as 7 sequences, 5994 as 2000
        // (of 3 tokens: 64-key tiles), one sequence of 768 (its 96 tiles of 128 rows fit one
        // wave; 192 keys pad none).
        assert_eq!((on_device(2861, 7, 72), on_device(5994, 2000, 72)), ((192, 128), (128, 64)));
        assert_eq!(on_device(768, 1, 72), (128, 192));
    }

    #[test]
    fn tuning_switches_change_the_plan_they_name() {
        let cu = [0, 276];
        let shape = [276, 4, 72];
        let problem = Problem::new(shape, shape, shape, &cu, &cu, &Params::default()).unwrap();
        let hopper = Gpu { target: Target::Wgmma, multiprocessors: 132 };
        let with = |tuning: Tuning| Plan::new(&problem, false, hopper, &tuning, Operands::default()).variant;
        assert_eq!((with(Tuning::default()).block_m(), with(Tuning::default()).stages), (64, 3));
        assert_eq!(with(Tuning { block_m: Some(128), ..Tuning::default() }).block_m(), 128);
        assert_eq!(with(Tuning { two_stages: true, ..Tuning::default() }).stages, 2);
        assert_eq!(with(Tuning::default()).q_buffers, 2);
        assert_eq!(with(Tuning { one_q_buffer: true, ..Tuning::default() }).q_buffers, 1);
        // 192-key tiles leave room for two stages (and two Q buffers), not three.
        let wide_tiles = with(Tuning { block_n: Some(192), ..Tuning::default() });
        assert_eq!((wide_tiles.block_n, wide_tiles.stages, wide_tiles.q_buffers), (192, 2, 2));
        // 276 keys take 64-key tiles (320 padded) unless told 128 (384).
        assert_eq!(with(Tuning::default()).block_n, 64);
        assert_eq!(with(Tuning { block_n: Some(128), ..Tuning::default() }).block_n, 128);
        // 192-row tiles: three computing warpgroups and the copying one, room for three
        // stages of 128 keys.
        let tall = with(Tuning { block_m: Some(192), block_n: Some(128), ..Tuning::default() });
        assert_eq!((tall.block_m(), tall.threads(), tall.block_n, tall.stages, tall.q_buffers), (192, 512, 128, 3, 2));
        assert!(tall.shared_bytes() <= MAX_SHARED_BYTES);
        // A problem that fills the GPU with 192-row tiles takes them unless told otherwise.
        let (cu, shape) = ([0, 16384], [16384, 16, 72]);
        let large = Problem::new(shape, shape, shape, &cu, &cu, &Params::default()).unwrap();
        let with = |tuning: Tuning| Plan::new(&large, false, hopper, &tuning, Operands::default()).variant.block_m();
        let forced = |block_m| with(Tuning { block_m: Some(block_m), ..Tuning::default() });
        assert_eq!((with(Tuning::default()), forced(64), forced(128)), (192, 64, 128));
        let long = plan_one(Target::Mma, 4096, 1);
        let cu = [0, 4096];
        let shape = [4096, 1, 72];
        let problem = Problem::new(shape, shape, shape, &cu, &cu, &Params::default()).unwrap();
        let gpu = Gpu { target: Target::Mma, multiprocessors: 132 };
        let unsplit =
            Plan::new(&problem, false, gpu, &Tuning { max_splits: Some(1), ..Tuning::default() }, Operands::default());
        assert_eq!((long.splits, unsplit.splits), (8, 1));
    }

    #[test]
    fn device_seqlens_plan_an_upper_bound_of_tiles_and_point_at_the_device() {
        // 7 sequences of 2,861 tokens in all, cu_seqlens on the device at 0x1000 and 0x2000.
        let cu = [0, 2861];
        let shape = [2861, 16, 72];
        let problem = Problem::new(shape, shape, shape, &cu, &cu, &Params::default()).unwrap();
        let gpu = Gpu { target: Target::Wgmma, multiprocessors: 132 };
        let plan = Plan::with_device_seqlens(
            &problem,
            7,
            [0x1000, 0x2000],
            false,
            gpu,
            &Tuning::default(),
            Operands::default(),
        );
        assert!(plan.plans_on_the_device() && plan.metadata_to_copy().is_none());
        assert_eq!((plan.splits, plan.tiles), (1, 2861usize.div_ceil(plan.variant.block_m()) + 7));
        // tile_start (8 entries), then the grid's tile table.
        assert_eq!(plan.workspace_bytes(), 4 * (8 + plan.tiles));
        let p = plan.params(None, Some(0x3000), None, Some(0x4000));
        assert_eq!((p.cu_seqlens_q, p.cu_seqlens_k, p.tile_start, p.status), (0x1000, 0x2000, 0x3000, 0x4000));
        assert_eq!((p.batch, p.total_q, p.total_k, p.inline_metadata), (7, 2861, 2861, 0));
        // The lengths are unknown here: no division (`va_plan_tiles` writes the tiles' table).
        assert_eq!(p.tiles_per_sequence, 0);
        // Calls planned on the host leave the flag null: the kernel's device-schedule test.
        assert_eq!(plan_on(Target::Wgmma, &problem).params(None, None, None, None).status, 0);
    }

    #[test]
    fn batches_whose_sequences_have_as_many_tiles_skip_the_search() {
        let plan = |q_lengths: &[i32], k_lengths: &[i32], heads: usize| {
            let (cu_q, cu_k) = (cu_seqlens(q_lengths), cu_seqlens(k_lengths));
            let q_shape = [*cu_q.last().unwrap() as usize, heads, 72];
            let k_shape = [*cu_k.last().unwrap() as usize, 1, 72];
            let problem = Problem::new(q_shape, k_shape, k_shape, &cu_q, &cu_k, &Params::default()).unwrap();
            let plan = plan_on(Target::Wgmma, &problem);
            (plan.variant.block_m(), plan.params(None, None, None, None).tiles_per_sequence)
        };
        let tiles_per_sequence = |lengths: &[i32], heads| plan(lengths, lengths, heads);
        // 64 images of 256 tokens: two 128-row tiles each; 16 of 1,024: six of 192 rows.
        assert_eq!(tiles_per_sequence(&[256; 64], 16), (128, 2));
        assert_eq!(tiles_per_sequence(&[1024; 16], 16), (192, 6));
        // tests/gpu.rs's batches of equal tile counts: lengths that differ but take as many
        // tiles count too (the division needs only the tile counts), whatever the keys.
        let cycle = |lengths: &[i32], n| -> Vec<i32> { lengths.iter().copied().cycle().take(n).collect() };
        assert_eq!(plan(&cycle(&[200, 256, 250, 129], 80), &cycle(&[7, 300, 129, 64, 1], 80), 2), (128, 2));
        assert_eq!(tiles_per_sequence(&[250; 64], 2), (128, 2));
        assert_eq!(tiles_per_sequence(&[40; 3], 2), (64, 1));
        assert_eq!(tiles_per_sequence(&[190; 66], 2), (192, 1));
        // One sequence, different counts, or an empty sequence among them: the search.
        assert_eq!(tiles_per_sequence(&[17296], 16), (192, 0));
        assert_eq!(tiles_per_sequence(&[256, 128], 16), (64, 0));
        assert_eq!(tiles_per_sequence(&[256, 0, 256], 16), (64, 0));
    }

    /// The cu_seqlens of sequences of `lengths` tokens.
    fn cu_seqlens(lengths: &[i32]) -> Vec<i32> {
        let ends = lengths.iter().scan(0, |end, &l| {
            *end += l;
            Some(*end)
        });
        std::iter::once(0).chain(ends).collect()
    }

    /// `problem` planned for 132 multiprocessors (an H200) with the default tuning.
    fn plan_on(target: Target, problem: &Problem) -> Plan {
        Plan::new(problem, false, Gpu { target, multiprocessors: 132 }, &Tuning::default(), Operands::default())
    }

    #[test]
    fn the_split_workspace_holds_partial_outputs_then_partial_lses() {
        // A tile's rows for each split block: 32 tiles of 128 rows, 8 splits each.
        let plan = plan_one(Target::Mma, 4096, 1);
        let rows = 32 * plan.splits * 128;
        assert!(plan.splits > 1);
        assert_eq!(plan.workspace_bytes(), 4 * rows * (80 + 1));
        let params = plan.params(None, Some(1 << 20), None, None);
        assert_eq!((params.partial_out, params.partial_lse), (1 << 20, (1 << 20) + 4 * rows as u64 * 80));
        assert_eq!(params.cu_seqlens_q, 0);
        assert_eq!(plan_one(Target::Mma, 16384, 16).workspace_bytes(), 0);
    }

    #[test]
    fn nvidia_combines_the_splits_in_the_kernel_and_amd_in_a_second_one() {
        // A counter per split pair's 16-row group, and no merge kernel; none without splits.
        let plan = plan_one(Target::Mma, 4096, 1);
        assert_eq!((plan.split_counter_bytes(), plan.launches_merge()), (4 * 32 * 128 / 16, false));
        let params = plan.params(None, Some(1 << 20), Some(2 << 20), None);
        assert_eq!(params.split_counters, 2 << 20);
        let whole = plan_one(Target::Mma, 16384, 16);
        assert_eq!((whole.split_counter_bytes(), whole.launches_merge()), (0, false));
        let amd = plan_one(Target::Mfma, 4096, 1);
        assert!(amd.splits > 1 && amd.launches_merge() && amd.split_counter_bytes() == 0);
        let problem =
            Problem::new([4096, 1, 72], [4096, 1, 72], [4096, 1, 72], &[0, 4096], &[0, 4096], &Params::default())
                .unwrap();
        let gpu = Gpu { target: Target::Wgmma, multiprocessors: 132 };
        let switched =
            Plan::new(&problem, false, gpu, &Tuning { merge_kernel: true, ..Tuning::default() }, Operands::default());
        assert!(switched.splits > 1 && switched.launches_merge() && switched.split_counter_bytes() == 0);
    }

    #[test]
    fn small_problems_with_long_keys_are_split() {
        // One head of 4096 tokens: 32 tiles of 128 rows for 264 slots, 64 key tiles of 64.
        let plan = plan_one(Target::Mma, 4096, 1);
        assert_eq!((plan.split_pairs, plan.splits), (32, 8));
        assert!(plan.grid().0 as usize <= 2 * 132);
        // Hopper: 64 tiles of 64 rows, 32 key tiles of 128: two splits spare 2048 keys.
        assert_eq!(plan_one(Target::Wgmma, 4096, 1).splits, 2);
        // The shortest single-head case of tests/gpu.rs's key-split suite splits on both.
        assert_eq!((plan_one(Target::Wgmma, 1500, 1).splits, plan_one(Target::Mma, 1500, 1).splits), (5, 12));
        // Problems that fill the GPU split at most their last wave's pairs.
        assert_eq!(plan_one(Target::Mma, 16384, 16).splits, 1);
        let large = plan_one(Target::Wgmma, 16384, 16);
        assert_eq!((large.variant.block_m(), large.tiles * large.heads, large.split_pairs), (192, 1376, 1376 % 132));
    }

    #[test]
    fn only_the_last_pairs_own_sequences_size_their_splits() {
        // The mixed nine-image batch at head_dim 72: 58 tiles of 192 rows per head, 928 pairs,
        // 4 past seven waves. Its last four pairs are the last image's (600 keys: five key
        // tiles, of which two splits would spare too few scores); with the 3844-token image
        // last they are its, and split 15 ways.
        let split = |lengths: &[i32]| {
            let cu = cu_seqlens(lengths);
            let total = *cu.last().unwrap() as usize;
            let shape = [total, 16, 72];
            let problem = Problem::new(shape, shape, shape, &cu, &cu, &Params::default()).unwrap();
            let plan = plan_on(Target::Wgmma, &problem);
            assert_eq!((plan.variant.block_m(), plan.tiles * plan.heads), (192, 928));
            (plan.split_pairs, plan.splits)
        };
        assert_eq!(split(&[720, 1200, 276, 3844, 64, 1, 2116, 1012, 600]), (0, 1));
        assert_eq!(split(&[720, 1200, 276, 64, 1, 2116, 1012, 600, 3844]), (4, 15));
    }

    #[test]
    fn splits_that_spare_fewer_than_min_spared_keys_are_not_made() {
        // The seed's shapes 12 and 13 on Hopper (measured slower split), and shape 0 with
        // `mma.sync` (two splits of 12 key tiles spare 384 keys).
        assert_eq!(plan_one(Target::Wgmma, 600, 4).splits, 1);
        assert_eq!(plan_one(Target::Wgmma, 1012, 4).splits, 1);
        assert_eq!(plan_one(Target::Mma, 720, 16).splits, 1);
    }

    #[test]
    fn hopper_takes_64_row_tiles_for_problems_that_would_not_fill_half_the_gpu() {
        let plan = |length, heads| plan_one(Target::Wgmma, length, heads);
        // The seed's shape 11 (276 tokens, 4 heads): 3 tiles of 128 rows × 4 heads = 12 blocks.
        let small = plan(276, 4);
        assert_eq!((small.variant.block_m(), small.variant.threads(), small.tiles), (64, 256, 5));
        assert!(small.variant.shared_bytes() < plan(8192, 16).variant.shared_bytes());
        // Shape 0 (720 tokens, 16 heads): 96 blocks of 128 rows are more than half of 132.
        let large = plan(720, 16);
        assert_eq!((large.variant.block_m(), large.variant.threads(), large.tiles), (128, 384, 6));
    }

    #[test]
    fn the_seed_shapes_on_the_h200_take_64_row_tiles_where_small_and_split_only_a_last_wave() {
        // 64-row tiles for shapes 11-14 and 20, 192-row ones for the head_dim-72 shapes with a
        // wave of them (2-8, 16-19) or whose 128-row tiles would take two (1: 112 tiles of 192
        // rows against 160 of 128); no shape smaller than one wave is split; the pairs of a
        // partly filled last wave are, where that spares enough (shape 2: 192 pairs of 192
        // rows, 60 past the first wave, 2 splits of its 17 key tiles).
        for shape in crate::internal::workloads::SEED_SHAPES {
            let cu = shape.cu_seqlens();
            let dims = [shape.tokens(), shape.num_heads, shape.head_dim];
            let problem = Problem::new(dims, dims, dims, &cu, &cu, &Params::default()).unwrap();
            let plan = plan_on(Target::Wgmma, &problem);
            let block_m = match shape.index {
                11..=14 | 20 => 64,
                1..=8 | 16..=19 => 192,
                _ => 128,
            };
            let pairs = plan.tiles * plan.heads;
            assert_eq!(plan.variant.block_m(), block_m, "shape {}", shape.index);
            if pairs <= 132 {
                assert_eq!(plan.splits, 1, "shape {}", shape.index);
            }
            if plan.splits > 1 {
                assert_eq!(plan.split_pairs, pairs % 132, "shape {}", shape.index);
                assert!(plan.split_pairs * plan.splits <= 132, "shape {}: one wave", shape.index);
            }
            let params = plan.params(None, None, None, None);
            assert_eq!(params.whole_pairs as usize, pairs - plan.split_pairs);
            assert_eq!(plan.units(), pairs + plan.split_pairs * (plan.splits - 1));
            // A persistent grid: at most a block per multiprocessor.
            assert_eq!(plan.grid().0 as usize, plan.units().min(132));
            match shape.index {
                1 => assert_eq!((plan.split_pairs, plan.splits, plan.units()), (0, 1, 112)),
                2 => assert_eq!((plan.split_pairs, plan.splits, plan.units()), (60, 2, 252)),
                _ => {}
            }
        }
    }

    #[test]
    fn a_batchs_last_wave_splits_across_sequences() {
        // tests/gpu.rs's batch: 10 + 6 + 3 + 1 tiles × 8 heads = 160 pairs of 128 rows (head_dim
        // 80 takes no 192-row tiles), 28 past the first wave (heads 6 and 7, the tiles of all
        // four sequences among them): four splits of the longest sequence's 10 key tiles.
        let lengths = [0, 1200, 1900, 2200, 2201];
        let problem =
            Problem::new([2201, 8, 80], [2201, 2, 80], [2201, 2, 80], &lengths, &lengths, &Params::default()).unwrap();
        let plan = plan_on(Target::Wgmma, &problem);
        assert_eq!(plan.variant.block_m(), 128);
        assert_eq!((plan.tiles, plan.split_pairs, plan.splits, plan.units()), (20, 28, 4, 160 + 3 * 28));
        let params = plan.params(None, Some(1 << 20), None, None);
        assert_eq!((params.tiles, params.whole_pairs, params.splits), (20, 132, 4));
        assert_eq!(plan.workspace_bytes(), 4 * 28 * 4 * 128 * (80 + 1));
        // 128 rows × 80 columns of each of the 28 pairs, a thread each.
        assert_eq!(plan.merge_grid(), ((40, 28, 1), 256));
        // Its head_dim-72 twin with the first sequence twice as long: 13 + 4 + 2 + 1 tiles of
        // 192 rows, the same 160 pairs, 28 split four ways (of the first sequence's 19 key tiles).
        let twin_lengths = [0, 2400, 3100, 3400, 3401];
        let shape = |heads| [3401, heads, 72];
        let twin =
            Problem::new(shape(8), shape(2), shape(2), &twin_lengths, &twin_lengths, &Params::default()).unwrap();
        let tall = plan_on(Target::Wgmma, &twin);
        assert_eq!(tall.variant.block_m(), 192);
        assert_eq!((tall.tiles, tall.split_pairs, tall.splits, tall.units()), (20, 28, 4, 160 + 3 * 28));
        // The switch that turns splits off runs every pair whole.
        let whole = Plan::new(
            &problem,
            false,
            Gpu { target: Target::Wgmma, multiprocessors: 132 },
            &Tuning { max_splits: Some(1), ..Tuning::default() },
            Operands::default(),
        );
        assert_eq!((whole.split_pairs, whole.units(), whole.workspace_bytes()), (0, 160, 0));
        // Without the persistent grid, a block per unit.
        let blocks = |tuning: Tuning| {
            Plan::new(
                &problem,
                false,
                Gpu { target: Target::Wgmma, multiprocessors: 132 },
                &tuning,
                Operands::default(),
            )
            .grid()
        };
        assert_eq!(blocks(Tuning::default()), (132, 1, 1));
        assert_eq!(blocks(Tuning { no_persistent: true, ..Tuning::default() }), (244, 1, 1));
    }
}

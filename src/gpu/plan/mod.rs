//! Everything about a GPU launch that does not depend on the vendor, shared by the CUDA and
//! HIP runtimes (so the AMD path runs the same host logic as the tested NVIDIA one):
//! - `variant.rs`: the kernel's compile-time shape (`Target`, `Variant`);
//! - `tiles.rs`: the tile and split choices, as pure functions;
//! - `params.rs`: the parameter block's layout (`KernelParams`);
//! - here: the `Plan` of one call (variant, grid, splits, metadata, workspace) and the one
//!   place that fills the parameter block.

mod params;
mod tiles;
mod variant;

pub(crate) use params::{KernelParams, INLINE_METADATA, MODIFIERS};
pub(crate) use variant::{Target, Variant};

use super::tensor_map::TensorMapShape;
use super::tuning::Tuning;
use crate::problem::Problem;

/// Threads of a merge block (`VA_MERGE_THREADS`).
const MERGE_THREADS: usize = 256;

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

/// How the keys and values of a paged cache are addressed: `Operands::k` and `v` point at the
/// caches `[blocks, block_size, kv heads, dims]` (their `token_stride` within a block,
/// `head_stride`), blocks `k_block_stride` and `v_block_stride` elements apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Paging {
    pub block_size: usize,
    pub k_block_stride: usize,
    pub v_block_stride: usize,
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
    /// the first query tile of sequence `b`), `batch + 1` entries each, one after another
    /// (then a paged call's block table, `batch` rows); inline in the parameter block when
    /// they fit and no block table follows, else copied to the device.
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
    /// Block slots of the GPU where a persistent grid may run (Hopper: one block per
    /// multiprocessor's slot, each walking several units of work; `tiles::persistent_blocks`
    /// decides per launch), or `None` for a block per unit.
    persistent_slots: Option<usize>,
    operands: Operands,
    /// A paged call's cache addressing and block table columns (its rows follow the
    /// metadata, see `Schedule::Host`).
    paging: Option<(Paging, usize)>,
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
    /// ALiBi's coefficients (score units per unit of distance), then the sinks: the parameter
    /// block's `modifiers`.
    modifiers: Vec<f32>,
    alibi_count: usize,
    sinks_count: usize,
}

/// ALiBi's slopes as the kernel applies them, in the units it keeps scores in (base-2 logits
/// over `factor`: `scale · log2(e)`, or 1 with a soft-cap), each rounded once from f64; then
/// the sinks as they are. Callers check the count against [`MODIFIERS`].
fn modifiers(problem: &Problem) -> (Vec<f32>, usize, usize) {
    let (slopes, sinks) = problem.modifiers();
    let factor = if problem.softcap.is_some() { 1.0 } else { (problem.scale * core::f32::consts::LOG2_E) as f64 };
    let mut values: Vec<f32> =
        slopes.unwrap_or(&[]).iter().map(|&s| (s as f64 * core::f64::consts::LOG2_E / factor) as f32).collect();
    let alibi_count = values.len();
    values.extend_from_slice(sinks.unwrap_or(&[]));
    let sinks_count = values.len() - alibi_count;
    (values, alibi_count, sinks_count)
}

impl Plan {
    /// Plans `problem` on `gpu` for the tensors `operands`.
    pub fn new(problem: &Problem, f16: bool, gpu: Gpu, tuning: &Tuning, operands: Operands) -> Plan {
        let (target, multiprocessors) = (gpu.target, gpu.multiprocessors);
        let mut variant = Variant::for_problem(problem, f16, target);
        if target == Target::Wgmma {
            variant = tiles::hopper_tiles(variant, problem, multiprocessors, tuning);
        }
        variant.heads_inner = tiles::heads_inner(problem, tuning);
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
        let tile_start = &metadata[2 * (problem.batch() + 1)..];
        let (splits, split_pairs) = tiles::key_splits(problem, &variant, tile_start, tiles, multiprocessors, tuning);
        // Hopper's blocks walk several tiles each, the copying warpgroup loading the next
        // tile's Q and keys while the computing ones finish the last: a grid of one wave.
        let slots = multiprocessors * variant.min_blocks;
        let persistent_slots = (target == Target::Wgmma && !tuning.no_persistent).then_some(slots);

        // A window wider than every query-key distance is no window: clamped to that width, so
        // that the kernel's row + offset ± window cannot wrap (usize::MAX windows did, and
        // masked every key).
        let key_tokens = problem.total_k();
        let widest = (problem.total_q + key_tokens).min(i32::MAX as usize);
        let window = |w: Option<usize>| w.map_or(-1, |w| w.min(widest) as i32);
        let (modifiers, alibi_count, sinks_count) = modifiers(problem);
        Plan {
            variant,
            schedule: Schedule::Host(metadata),
            tiles,
            split_pairs,
            splits,
            merges_in_kernel: target != Target::Mfma && !tuning.merge_kernel,
            tiles_per_sequence: tiles::tiles_per_sequence(problem, variant.block_m()),
            persistent_slots,
            operands,
            paging: None,
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
            modifiers,
            alibi_count,
            sinks_count,
        }
    }

    /// Turns a host-planned call of a paged problem (`Variant::paged`) into one that reads its
    /// keys and values through `block_table` (`batch` rows of `columns` entries, checked by
    /// `Problem::new_paged`), copied to the device after the metadata.
    pub fn with_block_table(mut self, paging: Paging, block_table: &[i32], columns: usize) -> Plan {
        debug_assert!(self.variant.paged && block_table.len() == self.batch * columns);
        if let Schedule::Host(metadata) = &mut self.schedule {
            metadata.extend_from_slice(block_table);
        }
        self.paging = Some((paging, columns));
        self
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
        let (even_q, even_k) =
            (tiles::even_cu_seqlens(problem.total_q, batch), tiles::even_cu_seqlens(problem.total_k(), batch));
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
            Schedule::Host(metadata) => &metadata[2 * (self.batch + 1)..3 * (self.batch + 1)],
            Schedule::Device { .. } => &[],
        }
    }

    /// Whether the metadata travels in the parameter block (batches of up to 64 sequences,
    /// without a block table).
    fn metadata_inline(&self) -> bool {
        matches!(&self.schedule, Schedule::Host(metadata) if metadata.len() <= INLINE_METADATA && self.paging.is_none())
    }

    /// The metadata to copy to the device before the launch (`cu_seqlens_q`, `cu_seqlens_k`,
    /// `tile_start`, one after another), or `None` when it travels in the parameter block or
    /// is on the device already.
    pub fn metadata_to_copy(&self) -> Option<&[i32]> {
        match &self.schedule {
            Schedule::Host(metadata) if !self.metadata_inline() => Some(metadata),
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
        let block_table = match (self.paging, metadata) {
            (Some(_), Some(base)) => base + 12 * entries,
            _ => 0,
        };
        let (paging, block_table_stride) = self.paging.unwrap_or_default();
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
            block_table,
            q_token_stride: o.q.token_stride as i64,
            q_head_stride: o.q.head_stride as i64,
            k_token_stride: o.k.token_stride as i64,
            k_head_stride: o.k.head_stride as i64,
            v_token_stride: o.v.token_stride as i64,
            v_head_stride: o.v.head_stride as i64,
            out_token_stride: o.out.token_stride as i64,
            out_head_stride: o.out.head_stride as i64,
            k_block_stride: paging.k_block_stride as i64,
            v_block_stride: paging.v_block_stride as i64,
            block_table_stride: block_table_stride as i64,
            block_size: paging.block_size as i32,
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
            alibi_count: self.alibi_count as i32,
            sinks_count: self.sinks_count as i32,
            scale_log2: self.scale * core::f32::consts::LOG2_E,
            softcap: self.softcap,
            scale_over_softcap: if self.softcap > 0.0 { self.scale / self.softcap } else { 0.0 },
            inline_metadata: 0,
            metadata: [0; INLINE_METADATA],
            modifiers: [0.0; MODIFIERS],
        };
        params.modifiers[..self.modifiers.len()].copy_from_slice(&self.modifiers);
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
    /// grid of at most one wave whose blocks take every `grid`-th unit (Hopper, up to
    /// `tiles::persistent_blocks`' count of waves).
    pub fn grid(&self) -> (u32, u32, u32) {
        let units = self.units();
        let persistent = self.persistent_slots.and_then(|slots| tiles::persistent_blocks(units, slots));
        (persistent.unwrap_or(units) as u32, 1, 1)
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
mod tests;

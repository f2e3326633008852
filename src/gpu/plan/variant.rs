//! The kernel's compile-time shape: which tensor-core code (`Target`), the padded head widths,
//! the tile sizes, warps, stages and buffers (`Variant`), and the `-D` definitions and shared
//! memory they imply. One compiled kernel per variant.

use super::params::KernelParams;
use crate::gpu::tuning::Tuning;
use crate::problem::Problem;

/// Dynamic shared memory a block may have on the GPUs we target (227 KiB on Hopper and A100).
pub(super) const MAX_SHARED_BYTES: usize = 227 * 1024;

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
    /// Whether ALiBi's bias is compiled in (likewise, only for calls with slopes).
    pub alibi: bool,
    /// Whether the units of work walk each query tile's heads one after another, instead of
    /// each head's tiles (`tiles::heads_inner`).
    pub heads_inner: bool,
    /// Whether keys and values come from a paged cache through the block table (`VA_PAGED`;
    /// copied by cp.async, without tensor maps).
    pub paged: bool,
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
                    alibi: false,
                    heads_inner: false,
                    paged: false,
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
                    alibi: false,
                    heads_inner: false,
                    paged: false,
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
        Variant {
            softcap: problem.softcap.is_some(),
            alibi: problem.modifiers().0.is_some(),
            paged: problem.block_size.is_some(),
            ..Self::new(problem.head_dim, problem.head_dim_v, f16, target)
        }
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
            format!("-DVA_ALIBI={}", u8::from(self.alibi)),
            format!("-DVA_PARAMS_BYTES={}", core::mem::size_of::<KernelParams>()),
        ];
        if self.target == Target::Wgmma {
            d.push("-DVA_WGMMA=1".into());
        }
        if self.f16 {
            d.push("-DVA_IS_F16=1".into());
        }
        if self.heads_inner {
            d.push("-DVA_HEADS_INNER=1".into());
        }
        if self.paged {
            d.push("-DVA_PAGED=1".into());
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

//! Everything about a GPU launch that does not depend on the vendor: the kernel variant, the
//! grid, the key splits, and the parameter block the kernel reads. Shared by the CUDA and HIP
//! runtimes, so the AMD path runs the same host logic as the tested NVIDIA one.

use crate::problem::Problem;

/// Query rows per block (4 warps of 16 rows; on AMD 4 waves of 16).
pub(crate) const BLOCK_M: usize = 64;
/// Threads per block on NVIDIA (4 warps of 32) and AMD (4 waves of 64).
pub(crate) const THREADS_NVIDIA: u32 = 128;
pub(crate) const THREADS_AMD: u32 = 256;
/// Most key splits of one query tile.
const MAX_SPLITS: usize = 16;

/// A compiled kernel's compile-time constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    /// head_dim rounded up to 16 (the MMA's reduction step).
    pub head_dim_pad: usize,
    /// head_dim_v rounded up to 16.
    pub head_dim_v_pad: usize,
    /// Keys per shared-memory tile.
    pub block_n: usize,
    pub f16: bool,
}

impl Variant {
    pub fn for_problem(problem: &Problem, f16: bool) -> Self {
        let head_dim_pad = problem.head_dim.next_multiple_of(16);
        let head_dim_v_pad = problem.head_dim_v.next_multiple_of(16);
        // Wide heads get narrower key tiles, so shared memory and registers still allow two
        // blocks per multiprocessor.
        let block_n = if head_dim_pad.max(head_dim_v_pad) <= 128 { 64 } else { 32 };
        Variant { head_dim_pad, head_dim_v_pad, block_n, f16 }
    }

    /// The `-D` definitions the kernel source expects.
    pub fn defines(&self) -> Vec<String> {
        let mut d = vec![
            format!("-DVA_HEAD_DIM_PAD={}", self.head_dim_pad),
            format!("-DVA_HEAD_DIM_V_PAD={}", self.head_dim_v_pad),
            format!("-DVA_BLOCK_N={}", self.block_n),
        ];
        if self.f16 {
            d.push("-DVA_IS_F16=1".into());
        }
        d
    }

    /// Dynamic shared memory of one block, in bytes (must match the kernel's layout).
    pub fn shared_bytes(&self) -> usize {
        let q_stride = self.head_dim_pad + 8;
        let v_stride = self.head_dim_v_pad + 8;
        2 * (BLOCK_M * q_stride + 2 * self.block_n * q_stride + 2 * self.block_n * v_stride)
    }
}

/// The kernel's parameter block; must match `VaParams` in `kernel/attention.hip` field by field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KernelParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub out: u64,
    pub lse: u64,
    pub partial_out: u64,
    pub partial_lse: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub tile_start: u64,
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
    pub head_dim: i32,
    pub head_dim_v: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub splits: i32,
    pub scale_log2: f32,
    pub softcap: f32,
    pub scale_over_softcap: f32,
}

/// Element strides of a `[tokens, heads, dims]` tensor on the device (the dims are contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Strides {
    pub token: usize,
    pub head: usize,
}

/// How one call runs: the variant, the grid, and the parameters (device pointers to be filled
/// in by the runtime).
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub variant: Variant,
    /// `tile_start[b]`: the first query tile of sequence `b`; `batch + 1` entries.
    pub tile_start: Vec<i32>,
    pub tiles: usize,
    pub splits: usize,
    pub params: KernelParams,
}

impl Plan {
    /// Plans `problem` for a GPU with `multiprocessors`, reading q/k/v and writing the output
    /// with the given strides.
    pub fn new(
        problem: &Problem,
        f16: bool,
        multiprocessors: usize,
        q: Strides,
        k: Strides,
        v: Strides,
        out: Strides,
    ) -> Plan {
        let variant = Variant::for_problem(problem, f16);
        let mut tile_start = Vec::with_capacity(problem.batch() + 1);
        let mut tiles = 0usize;
        let mut longest_keys = 0usize;
        for b in 0..problem.batch() {
            tile_start.push(tiles as i32);
            let s = problem.sequence(b);
            tiles += s.q_len.div_ceil(BLOCK_M);
            longest_keys = longest_keys.max(s.k_len);
        }
        tile_start.push(tiles as i32);

        // Split the keys when the query tiles alone would leave most multiprocessors idle and
        // each split still gets at least two key tiles to stream.
        let blocks = tiles * problem.num_heads;
        let key_tiles = longest_keys.div_ceil(variant.block_n);
        let splits = if blocks > 0 && blocks < multiprocessors * 2 && key_tiles >= 4 {
            (multiprocessors * 2).div_ceil(blocks).min(key_tiles / 2).clamp(1, MAX_SPLITS)
        } else {
            1
        };

        let (scale, softcap) = (problem.scale, problem.softcap.unwrap_or(0.0));
        let window = |w: Option<usize>| w.map_or(-1, |w| w.min(i32::MAX as usize) as i32);
        let params = KernelParams {
            q_token_stride: q.token as i64,
            q_head_stride: q.head as i64,
            k_token_stride: k.token as i64,
            k_head_stride: k.head as i64,
            v_token_stride: v.token as i64,
            v_head_stride: v.head as i64,
            out_token_stride: out.token as i64,
            out_head_stride: out.head as i64,
            batch: problem.batch() as i32,
            heads: problem.num_heads as i32,
            group: problem.group_size() as i32,
            total_q: problem.total_q as i32,
            head_dim: problem.head_dim as i32,
            head_dim_v: problem.head_dim_v as i32,
            window_left: window(problem.mask.left),
            window_right: window(problem.mask.right),
            splits: splits as i32,
            scale_log2: scale * core::f32::consts::LOG2_E,
            softcap,
            scale_over_softcap: if softcap > 0.0 { scale / softcap } else { 0.0 },
            ..KernelParams::default()
        };
        Plan { variant, tile_start, tiles, splits, params }
    }

    /// Grid of the attention kernel: (query tiles, heads, splits).
    pub fn grid(&self) -> (u32, u32, u32) {
        (self.tiles as u32, self.params.heads as u32, self.splits as u32)
    }

    /// f32 elements of the split workspace (partial outputs, then partial LSEs).
    pub fn partial_lens(&self) -> (usize, usize) {
        let rows = self.splits * self.params.total_q as usize * self.params.heads as usize;
        (rows * self.variant.head_dim_v_pad, rows)
    }

    /// Threads of the merge kernel and its grid, one thread per output element.
    pub fn merge_grid(&self) -> (u32, u32) {
        let elements = self.params.total_q as usize * self.params.heads as usize * self.params.head_dim_v as usize;
        (elements.div_ceil(256) as u32, 256)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;

    #[test]
    fn params_match_the_kernel_struct_layout() {
        // 10 pointers, 8 strides, 11 four-byte fields, padded to 8.
        assert_eq!(core::mem::size_of::<KernelParams>(), 192);
    }

    #[test]
    fn tiles_count_each_sequence_and_skip_empty_ones() {
        let cu_q = [0, 64, 64, 130];
        let cu_k = [0, 10, 20, 30];
        let problem = Problem::new([130, 2, 72], [30, 1, 72], [30, 1, 72], &cu_q, &cu_k, &Params::default()).unwrap();
        let s = Strides { token: 144, head: 72 };
        let plan =
            Plan::new(&problem, false, 132, s, Strides { token: 72, head: 72 }, Strides { token: 72, head: 72 }, s);
        assert_eq!(plan.tile_start, vec![0, 1, 1, 3]);
        assert_eq!(plan.grid(), (3, 2, 1));
        assert_eq!(plan.variant, Variant { head_dim_pad: 80, head_dim_v_pad: 80, block_n: 64, f16: false });
    }

    #[test]
    fn small_problems_with_long_keys_are_split() {
        let cu = [0, 720];
        let problem = Problem::new([720, 4, 72], [720, 4, 72], [720, 4, 72], &cu, &cu, &Params::default()).unwrap();
        let s = Strides { token: 288, head: 72 };
        let plan = Plan::new(&problem, false, 132, s, s, s, s);
        assert!(plan.splits > 1 && plan.splits <= 720usize.div_ceil(64) / 2, "{}", plan.splits);
        let big = [0, 16384];
        let problem =
            Problem::new([16384, 16, 72], [16384, 16, 72], [16384, 16, 72], &big, &big, &Params::default()).unwrap();
        assert_eq!(Plan::new(&problem, false, 132, s, s, s, s).splits, 1);
    }
}

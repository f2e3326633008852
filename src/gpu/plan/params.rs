//! The kernel's parameter block, laid out field by field as `VaParams` in
//! `kernel/params.h` (the kernel checks its size against this one's).

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
    pub block_table: u64,
    pub q_token_stride: i64,
    pub q_head_stride: i64,
    pub k_token_stride: i64,
    pub k_head_stride: i64,
    pub v_token_stride: i64,
    pub v_head_stride: i64,
    pub out_token_stride: i64,
    pub out_head_stride: i64,
    pub k_block_stride: i64,
    pub v_block_stride: i64,
    pub block_table_stride: i64,
    pub block_size: i32,
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
    pub alibi_count: i32,
    pub sinks_count: i32,
    pub scale_log2: f32,
    pub softcap: f32,
    pub scale_over_softcap: f32,
    pub inline_metadata: i32,
    pub metadata: [i32; INLINE_METADATA],
    pub modifiers: [f32; MODIFIERS],
}

/// Room for cu_seqlens_q, cu_seqlens_k and tile_start in the parameter block: batches of up to
/// 64 sequences launch with no copy to the device first (3 × 65 entries). Must match
/// `VA_INLINE_METADATA`.
pub(crate) const INLINE_METADATA: usize = 195;

pub(crate) use crate::gpu::call::MODIFIERS;

//! The plan's rules, checked on the host (no GPU needed).

use super::variant::MAX_SHARED_BYTES;
use super::*;
use crate::params::{default_params, Params};

#[test]
fn params_match_the_kernel_struct_layout() {
    // 13 pointers, 11 strides, 20 four-byte fields, the 195-entry metadata and the 256-entry
    // modifiers (2076 bytes), padded to the 8-byte alignment, as C++ lays out VaParams; the
    // kernel checks its own size against this one (`VA_PARAMS_BYTES`).
    let bytes = (104 + 88 + 4 * (20 + INLINE_METADATA + MODIFIERS)).next_multiple_of(8);
    assert_eq!((core::mem::size_of::<KernelParams>(), bytes), (bytes, 2080));
    let variant = Variant::new(72, 72, false, Target::Wgmma);
    assert!(variant.defines().contains(&format!("-DVA_PARAMS_BYTES={bytes}")));
    assert_eq!(core::mem::align_of::<KernelParams>(), 8);
}

#[test]
fn windows_wider_than_every_distance_are_clamped() {
    let with = |params: &Params| plan_with(Target::Wgmma, 100, 1, params);
    let plain = with(default_params()).params(None, None, None, None);
    assert_eq!((plain.window_left, plain.window_right), (-1, -1));
    // 100 queries + 100 keys: no distance reaches 200.
    let huge = with(&Params { window_left: Some(usize::MAX), window_right: Some(7), ..Params::default() })
        .params(None, None, None, None);
    assert_eq!((huge.window_left, huge.window_right), (200, 7));
}

#[test]
fn soft_cap_code_is_compiled_in_only_for_calls_with_a_cap() {
    let with = |params: &Params| plan_with(Target::Wgmma, 100, 1, params);
    let plain = with(default_params());
    assert!(!plain.variant.softcap && plain.variant.defines().contains(&"-DVA_SOFTCAP=0".to_string()));
    let capped = with(&Params { softcap: Some(30.0), ..Params::default() });
    assert!(capped.variant.softcap && capped.variant.defines().contains(&"-DVA_SOFTCAP=1".to_string()));
}

#[test]
fn alibi_slopes_and_sinks_travel_in_the_parameter_block() {
    let with = |params: &Params| plan_with(Target::Wgmma, 100, 4, params);
    let plain = with(default_params()).params(None, None, None, None);
    assert_eq!((plain.alibi_count, plain.sinks_count), (0, 0));
    assert!(!with(default_params()).variant.defines().contains(&"-DVA_ALIBI=1".to_string()));
    let p = Params {
        alibi_slopes: Some(vec![0.5, 0.25, 0.125, 1.0]),
        sinks: Some(vec![1.0, 2.0, 3.0, 4.0]),
        ..Params::default()
    };
    let plan = with(&p);
    assert!(plan.variant.defines().contains(&"-DVA_ALIBI=1".to_string()));
    let k = plan.params(None, None, None, None);
    assert_eq!((k.alibi_count, k.sinks_count), (4, 4));
    // Coefficients in score units: slope · log2(e) / (scale · log2(e)) = slope / scale.
    let scale = (1.0 / 72f64.sqrt()) as f32;
    let factor = (scale * core::f32::consts::LOG2_E) as f64;
    assert_eq!(k.modifiers[0], (0.5 * core::f64::consts::LOG2_E / factor) as f32);
    assert!((k.modifiers[0] - 0.5 / scale).abs() < 1e-5);
    assert_eq!(&k.modifiers[4..8], &[1.0, 2.0, 3.0, 4.0]);
    // With a soft-cap the scores are base-2 logits already: slope · log2(e).
    let capped = with(&Params { softcap: Some(10.0), ..p.clone() }).params(None, None, None, None);
    assert_eq!(capped.modifiers[1], (0.25 * core::f64::consts::LOG2_E) as f32);
}

#[test]
fn tiles_count_each_sequence_and_skip_empty_ones() {
    let cu_q = [0, 64, 64, 130];
    let cu_k = [0, 10, 20, 30];
    let problem = Problem::new([130, 2, 72], [30, 1, 72], [30, 1, 72], &cu_q, &cu_k, default_params()).unwrap();
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
            alibi: false,
            // Three sequences whose keys all fit the L2 many times over.
            heads_inner: true,
            paged: false,
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
        Problem::new([130, 1, 72], [130, 1, 72], [130, 1, 72], &cu_small, &cu_small, default_params()).unwrap();
    let plan = plan_on(Target::Mma, &problem);
    assert_eq!(plan.metadata_to_copy(), None);
    let params = plan.params(None, None, None, None);
    assert_eq!(params.inline_metadata, 1);
    assert_eq!(params.metadata[..12], [0, 64, 64, 130, 0, 64, 64, 130, 0, 1, 1, 2]);

    // 100 sequences: 3 × 101 entries do not fit in the parameter block.
    let cu_q: Vec<i32> = (0..=100).collect();
    let cu_k: Vec<i32> = (0..=100).map(|i| 2 * i).collect();
    let problem = Problem::new([100, 1, 72], [200, 1, 72], [200, 1, 72], &cu_q, &cu_k, default_params()).unwrap();
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
    plan_with(target, length, heads, default_params())
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
    let problem = Problem::new([100, 4, 72], [100, 2, 72], [100, 2, 64], &cu, &cu, default_params()).unwrap();
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
        let problem = Problem::new([total, 16, d], [total, 16, d], [total, 16, d], &cu, &cu, default_params()).unwrap();
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
        let problem = Problem::new(shape, shape, shape, &cu, &cu, default_params()).unwrap();
        let tuning = Tuning::default();
        let v =
            Plan::with_device_seqlens(&problem, batch, [0x1000, 0x2000], false, hopper, &tuning, Operands::default())
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
    let problem = Problem::new(shape, shape, shape, &cu, &cu, default_params()).unwrap();
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
    let large = Problem::new(shape, shape, shape, &cu, &cu, default_params()).unwrap();
    let with = |tuning: Tuning| Plan::new(&large, false, hopper, &tuning, Operands::default()).variant.block_m();
    let forced = |block_m| with(Tuning { block_m: Some(block_m), ..Tuning::default() });
    assert_eq!((with(Tuning::default()), forced(64), forced(128)), (192, 64, 128));
    let long = plan_one(Target::Mma, 4096, 1);
    let cu = [0, 4096];
    let shape = [4096, 1, 72];
    let problem = Problem::new(shape, shape, shape, &cu, &cu, default_params()).unwrap();
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
    let problem = Problem::new(shape, shape, shape, &cu, &cu, default_params()).unwrap();
    let gpu = Gpu { target: Target::Wgmma, multiprocessors: 132 };
    let plan =
        Plan::with_device_seqlens(&problem, 7, [0x1000, 0x2000], false, gpu, &Tuning::default(), Operands::default());
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
        let problem = Problem::new(q_shape, k_shape, k_shape, &cu_q, &cu_k, default_params()).unwrap();
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
        Problem::new([4096, 1, 72], [4096, 1, 72], [4096, 1, 72], &[0, 4096], &[0, 4096], default_params()).unwrap();
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
        let problem = Problem::new(shape, shape, shape, &cu, &cu, default_params()).unwrap();
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
        let problem = Problem::new(dims, dims, dims, &cu, &cu, default_params()).unwrap();
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
    // Walking each head's tiles (the order this batch would take with longer sequences).
    let head_major = Tuning { heads_inner: Some(false), ..Tuning::default() };
    let hopper = Gpu { target: Target::Wgmma, multiprocessors: 132 };
    let lengths = [0, 1200, 1900, 2200, 2201];
    let problem =
        Problem::new([2201, 8, 80], [2201, 2, 80], [2201, 2, 80], &lengths, &lengths, default_params()).unwrap();
    let plan = Plan::new(&problem, false, hopper, &head_major, Operands::default());
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
    let twin = Problem::new(shape(8), shape(2), shape(2), &twin_lengths, &twin_lengths, default_params()).unwrap();
    let tall = Plan::new(&twin, false, hopper, &head_major, Operands::default());
    assert_eq!(tall.variant.block_m(), 192);
    assert_eq!((tall.tiles, tall.split_pairs, tall.splits, tall.units()), (20, 28, 4, 160 + 3 * 28));
    // The switch that turns splits off runs every pair whole.
    let whole =
        Plan::new(&problem, false, hopper, &Tuning { max_splits: Some(1), ..head_major.clone() }, Operands::default());
    assert_eq!((whole.split_pairs, whole.units(), whole.workspace_bytes()), (0, 160, 0));
    // Without the persistent grid, a block per unit.
    let blocks = |tuning: Tuning| Plan::new(&problem, false, hopper, &tuning, Operands::default()).grid();
    assert_eq!(blocks(head_major.clone()), (132, 1, 1));
    assert_eq!(blocks(Tuning { no_persistent: true, ..head_major }), (244, 1, 1));
}

#[test]
fn batches_of_sequences_whose_keys_fit_half_the_l2_walk_each_tiles_heads() {
    let order = |lengths: &[i32], heads: usize, kv_heads: usize, d: usize| {
        let cu = cu_seqlens(lengths);
        let total = *cu.last().unwrap() as usize;
        let problem =
            Problem::new([total, heads, d], [total, kv_heads, d], [total, kv_heads, d], &cu, &cu, default_params())
                .unwrap();
        plan_on(Target::Wgmma, &problem).variant.heads_inner
    };
    // Images of 1024 tokens, 16 heads × 72: 4.7 MB of keys and values each.
    assert!(order(&[1024; 64], 16, 16, 72));
    assert!(order(&[1024; 16], 16, 16, 72));
    // The mixed batch's largest image (3844 tokens) takes 17.7 MB.
    assert!(order(&[720, 1200, 276, 3844, 64, 1, 2116, 1012, 600], 16, 16, 72));
    // One sequence keeps each head's tiles together; so does a batch whose longest sequence's
    // keys and values (16742 tokens × 8 kv heads × 128, 68.6 MB) do not fit.
    assert!(!order(&[8136], 16, 16, 72));
    assert!(!order(&[16742, 500, 3000, 1], 32, 8, 128));
    // The switch decides where it is set.
    let forced = Tuning { heads_inner: Some(false), ..Tuning::default() };
    let cu = cu_seqlens(&[1024; 64]);
    let problem = Problem::new([65536, 16, 72], [65536, 16, 72], [65536, 16, 72], &cu, &cu, default_params()).unwrap();
    let gpu = Gpu { target: Target::Wgmma, multiprocessors: 132 };
    assert!(!Plan::new(&problem, false, gpu, &forced, Operands::default()).variant.heads_inner);
}

#[test]
fn heads_inner_launches_split_the_last_tiles_heads_by_their_own_sequences() {
    // 10 + 9 + 3 + 1 tiles of 128 rows × 8 heads = 184 pairs, 52 past the first wave: under the
    // heads-inner order, every head of the last 6.5 tiles (the 1100-token sequence's last ones,
    // the 300-token one's and the lone token's), split by the 1100 keys (9 key tiles) two ways.
    let cu = cu_seqlens(&[1200, 1100, 300, 1]);
    let problem = Problem::new([2601, 8, 80], [2601, 2, 80], [2601, 2, 80], &cu, &cu, default_params()).unwrap();
    let plan = plan_on(Target::Wgmma, &problem);
    assert!(plan.variant.heads_inner);
    assert_eq!((plan.tiles, plan.split_pairs, plan.splits), (23, 52, 2));
    // The same batch whose last wave holds only the lone token's heads and part of the
    // 300-token sequence's: 1200 + 700 + 300 + 1 (20 tiles, 28 pairs past the wave) spares
    // too few keys to split.
    let cu = cu_seqlens(&[1200, 700, 300, 1]);
    let problem = Problem::new([2201, 8, 80], [2201, 2, 80], [2201, 2, 80], &cu, &cu, default_params()).unwrap();
    let plan = plan_on(Target::Wgmma, &problem);
    assert_eq!((plan.tiles, plan.split_pairs, plan.splits), (20, 0, 1));
}

#[test]
fn many_waves_of_units_launch_a_block_per_unit() {
    // Images of 1,024 tokens, 16 heads × 72: 6 tiles of 192 rows each, 96 units per image
    // (and the last wave's key splits).
    let images = |n: usize| {
        let lengths: Vec<i32> = vec![1024; n];
        let cu = cu_seqlens(&lengths);
        let shape = [1024 * n, 16, 72];
        plan_on(Target::Wgmma, &Problem::new(shape, shape, shape, &cu, &cu, default_params()).unwrap())
    };
    let (few, many) = (images(256), images(1024));
    assert_eq!(few.variant.block_m(), 192);
    assert!(few.units() >= 256 * 96 && few.units() <= 132 * 256);
    assert_eq!(few.grid(), (132, 1, 1));
    assert!(many.units() > 132 * 256);
    assert_eq!(many.grid(), (many.units() as u32, 1, 1));
}

#[test]
fn paged_calls_copy_their_block_table_after_the_metadata() {
    // Two sequences of 5 and 3 keys in blocks of 2; the table has 3 columns.
    let table = ndarray::Array2::from_shape_vec((2, 3), vec![2, 3, 4, 0, 1, 0]).unwrap();
    let (cu_q, cu_k) = ([0, 2, 4], [0, 5, 8]);
    let problem =
        Problem::new_paged([4, 1, 64], [5, 2, 1, 64], [5, 2, 1, 64], table.view(), &cu_q, &cu_k, default_params())
            .unwrap();
    let paging = Paging { block_size: 2, k_block_stride: 128, v_block_stride: 256 };
    let plan = plan_on(Target::Wgmma, &problem).with_block_table(paging, table.as_slice().unwrap(), 3);
    assert!(plan.variant.paged);
    assert!(plan.variant.defines().contains(&"-DVA_PAGED=1".to_string()));
    // Not inline, even for two sequences: cu_seqlens_q, cu_seqlens_k, tile_start, then the table.
    let copied = plan.metadata_to_copy().expect("copied").to_vec();
    assert_eq!(copied, [0, 2, 4, 0, 5, 8, 0, 1, 2, 2, 3, 4, 0, 1, 0]);
    let params = plan.params(Some(1 << 20), None, None, None);
    assert_eq!(params.inline_metadata, 0);
    assert_eq!(params.block_table, (1 << 20) + 4 * 9);
    assert_eq!((params.block_size, params.block_table_stride), (2, 3));
    assert_eq!((params.k_block_stride, params.v_block_stride), (128, 256));
    assert_eq!(params.total_k, 8);
}

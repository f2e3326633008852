//! The property suite of `agreement.rs` against the GPU (`Backend::Gpu`), plus sequence
//! isolation, the seed's shapes and the device-resident API. Needs the `gpu` feature and a GPU;
//! without one every test prints why it is skipped (it does not pass silently: the message names
//! the missing piece).
//!
//! On a GPU machine without Rust: `tools/gpu-bundle.sh test --test gpu` here, then
//! `bash .gpu-bin/run-all.sh` there.

#![cfg(feature = "gpu")]

mod common;

use common::cases::{case, check, long_case};
use common::check_non_finite_inputs_stay_in_their_sequence;
use common::extreme::{check_extreme, check_paths, extreme, uniform};
use half::{bf16, f16};
use proptest::prelude::*;
use varlen_attn::gpu::{forward_device, forward_device_seqlens, Device, DeviceBuffer, DeviceTensor, DeviceTensorMut};
use varlen_attn::{internal::workloads::SEED_SHAPES, oracle, Backend, CpuIsa, Params};

/// The device, or `None` after printing (once) why there is none.
fn device() -> Option<Device> {
    static REASON: std::sync::Once = std::sync::Once::new();
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            REASON.call_once(|| eprintln!("note: skipping the GPU tests: {e}"));
            None
        }
    }
}

const GPU: [(Backend, CpuIsa); 1] = [(Backend::Gpu, CpuIsa::Auto)];

/// `n` property cases, or fewer where `VARLEN_ATTN_GPU_CASES` caps them (the sanitizer runs,
/// `fuzz/sanitize-gpu.sh`, where every kernel runs tens of times slower).
fn cases(n: u32) -> u32 {
    std::env::var("VARLEN_ATTN_GPU_CASES").ok().and_then(|c| c.parse().ok()).map_or(n, |cap: u32| n.min(cap.max(1)))
}

/// Whether the tests that need tens of GiB (tensors past 2^31 elements) are skipped: under a
/// sanitizer, which shadows every byte.
fn skip_huge() -> bool {
    std::env::var_os("VARLEN_ATTN_GPU_CASES").is_some()
}

/// Asserts that two results hold the same bits and equal values, element for element (so a
/// NaN, which equals nothing, fails as under `assert_eq!`). A failure names how many elements
/// differ, not the tensors: those are millions of values.
fn assert_same_bits<T: bytemuck::Pod + PartialEq>(got: &[T], expected: &[T], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths differ");
    let same = |a: &T, b: &T| a == b && bytemuck::bytes_of(a) == bytemuck::bytes_of(b);
    let differing = got.iter().zip(expected).filter(|(a, b)| !same(a, b)).count();
    assert_eq!(differing, 0, "{what}: {differing} of {} elements differ", got.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), ..ProptestConfig::default() })]

    #[test]
    fn bf16_on_the_gpu_matches_the_oracle(c in case()) {
        if device().is_some() {
            check::<bf16>(&c, &GPU)?;
        }
    }

    #[test]
    fn f16_on_the_gpu_matches_the_oracle(c in case()) {
        if device().is_some() {
            check::<f16>(&c, &GPU)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(12), ..ProptestConfig::default() })]

    /// Long sequences of one or two heads: the keys are split across blocks where that pays
    /// (most single-head cases; see the plan's tests), and the last split block of each row
    /// group combines them (with windows and causal masks some splits see no key).
    #[test]
    fn key_split_problems_on_the_gpu_match_the_oracle(c in long_case()) {
        if device().is_some() {
            check::<bf16>(&c, &GPU)?;
        }
    }
}

#[test]
fn seed_shapes_on_the_gpu_match_the_oracle() {
    if device().is_none() {
        return;
    }
    // Shape 2 splits its last wave's keys on the H200 (the plan's tests); shape 3 runs three
    // waves of 192-row tiles, the last one partly filled.
    for index in [0, 1, 2, 3, 11, 14, 20] {
        let shape = SEED_SHAPES[index];
        let [q, k, v] = shape.random_inputs::<bf16>(index as u64);
        let cu = shape.cu_seqlens();
        let params = Params { backend: Backend::Gpu, ..Params::default() };
        let (out, lse) = varlen_attn::forward_with_lse(q.view(), k.view(), v.view(), &cu, &cu, &params).unwrap();
        let rows: Vec<usize> = (0..shape.tokens()).step_by(shape.tokens().div_ceil(256).max(1)).collect();
        let reference = oracle::reference_rows(q.view(), k.view(), v.view(), &cu, &cu, &params, &rows).unwrap();
        let report = reference.compare(out.view());
        eprintln!("shape {index}: {report}");
        assert!(report.worst.is_none(), "shape {index}: {report}");
        assert!(reference.compare_lse(lse.view()).worst.is_none());
    }
}

/// NaN or infinity in one sequence reaches no other: the kernel's key tiles past a sequence's
/// end are zero-filled, not read from the next sequence.
#[test]
fn non_finite_inputs_stay_in_their_sequence_on_the_gpu() {
    if device().is_some() {
        check_non_finite_inputs_stay_in_their_sequence(&Params { backend: Backend::Gpu, ..Params::default() });
    }
}

#[test]
fn device_resident_api_matches_the_host_api() {
    let Some(device) = device() else { return };
    let shape = SEED_SHAPES[12];
    let [q, k, v] = shape.random_inputs::<bf16>(3);
    let cu = shape.cu_seqlens();
    let dims = [shape.tokens(), shape.num_heads, shape.head_dim];
    let (qd, kd, vd) = (
        device.upload(q.as_slice().unwrap()).unwrap(),
        device.upload(k.as_slice().unwrap()).unwrap(),
        device.upload(v.as_slice().unwrap()).unwrap(),
    );
    let mut out = device.zeros::<bf16>(q.len()).unwrap();
    let mut lse = device.zeros::<f32>(shape.tokens() * shape.num_heads).unwrap();
    // The device call with these K and V, and the given Q buffer, cu_seqlens_q and outputs.
    let call =
        |q: &DeviceBuffer<bf16>, cu_q: &[i32], out: &mut DeviceBuffer<bf16>, lse: Option<&mut DeviceBuffer<f32>>| {
            forward_device(
                &device,
                DeviceTensor::new(q, dims).unwrap(),
                DeviceTensor::new(&kd, dims).unwrap(),
                DeviceTensor::new(&vd, dims).unwrap(),
                cu_q,
                &cu,
                &Params::default(),
                DeviceTensorMut::new(out, dims).unwrap(),
                lse,
            )
        };
    call(&qd, &cu, &mut out, Some(&mut lse)).unwrap();
    let got = device.download(&out).unwrap();
    let host = varlen_attn::forward_with_lse(
        q.view(),
        k.view(),
        v.view(),
        &cu,
        &cu,
        &Params { backend: Backend::Gpu, ..Params::default() },
    )
    .unwrap();
    assert_same_bits(&got, host.0.as_slice().unwrap(), "device output against the host call's");
    assert_same_bits(&device.download(&lse).unwrap(), host.1.as_slice().unwrap(), "device LSE against the host call's");
    // A bad cu_seqlens is refused before anything runs on the device.
    let err = call(&qd, &[0, 5], &mut out, None).unwrap_err();
    assert!(matches!(err, varlen_attn::Error::CuSeqlens { .. }), "{err}");
    // Buffers of another device (another queue) are refused, for the call and for downloads.
    let other = Device::open(0).unwrap();
    let foreign = other.upload(q.as_slice().unwrap()).unwrap();
    let err = call(&foreign, &cu, &mut out, None).unwrap_err();
    assert!(err.to_string().contains("another `Device`"), "{err}");
    assert!(device.download(&foreign).unwrap_err().to_string().contains("another `Device`"));
}

#[test]
fn f32_is_refused_on_the_gpu_and_served_by_the_cpu_on_auto() {
    if device().is_none() {
        return;
    }
    let x = ndarray::Array3::<f32>::ones((4, 2, 8));
    let gpu = Params { backend: Backend::Gpu, ..Params::default() };
    let err = varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &gpu).unwrap_err();
    assert!(matches!(err, varlen_attn::Error::GpuUnsupported(_)), "{err}");
    assert!(varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 4], &[0, 4], &Params::default()).is_ok());
}

#[test]
fn windows_wider_than_the_sequence_are_no_window_on_the_gpu() {
    if device().is_none() {
        return;
    }
    let shape = SEED_SHAPES[12];
    let [q, k, v] = shape.random_inputs::<bf16>(5);
    let cu = shape.cu_seqlens();
    let gpu = Params { backend: Backend::Gpu, ..Params::default() };
    let run = |p: &Params| varlen_attn::forward(q.view(), k.view(), v.view(), &cu, &cu, p).unwrap();
    let full = run(&gpu);
    // usize::MAX windows: row + offset + window must not wrap in the kernel.
    let huge = Params { window_left: Some(usize::MAX), window_right: Some(usize::MAX), ..gpu.clone() };
    assert_same_bits(run(&huge).as_slice().unwrap(), full.as_slice().unwrap(), "usize::MAX windows against none");
    let causal = run(&Params { causal: true, ..gpu.clone() });
    let causal_huge = run(&Params { causal: true, window_left: Some(usize::MAX), ..gpu.clone() });
    let what = "causal with a usize::MAX window against causal";
    assert_same_bits(causal_huge.as_slice().unwrap(), causal.as_slice().unwrap(), what);
    assert!(causal != full, "causal masking changes the output");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    /// Large finite score gaps (magnitudes from bf16's subnormals to past the edge, scales up
    /// to 1e30, with soft-caps and causal masks): the oracle's answer or `Error::BeyondF32`,
    /// never inf/NaN.
    #[test]
    fn extreme_magnitudes_on_the_gpu(case in extreme(-40.0, 20.0)) {
        if device().is_some() {
            check_extreme::<bf16>(&case, &GPU)?;
        }
    }

    /// f16 from its subnormals (6e-8) to its largest values.
    #[test]
    fn extreme_f16_magnitudes_on_the_gpu(case in extreme(-7.2, 4.8)) {
        if device().is_some() {
            check_extreme::<f16>(&case, &GPU)?;
        }
    }
}

/// Values where tensor cores could flush: bf16 `v` near f32's smallest normal (1e-37 to
/// bf16's subnormals), f16 `v` in f16's subnormal range (below 6.1e-5), and subnormal f16 q
/// under a large scale; with and without a causal mask, one sequence long enough to split.
#[test]
fn tiny_values_on_the_gpu() {
    if device().is_none() {
        return;
    }
    let lengths = [40, 700];
    let tokens = lengths.iter().sum();
    for m in [1e-30, 1e-37, 3e-38, 1e-39, 1e-40] {
        let mut rng = common::Rng::new(10);
        let q = uniform::<bf16>(&mut rng, (tokens, 2, 64), 2.0);
        let k = uniform::<bf16>(&mut rng, (tokens, 2, 64), 2.0);
        let v = uniform::<bf16>(&mut rng, (tokens, 2, 64), 2.0 * m);
        for causal in [false, true] {
            let p = Params { causal, ..Params::default() };
            check_paths(&GPU, &q, &k, &v, &lengths, &lengths, &p).unwrap();
        }
    }
    for (mq, mv, scale) in
        [(2.0, 1e-4, None), (2.0, 1e-5, None), (2.0, 1e-6, None), (2.0, 1e-7, None), (1e-5, 2.0, Some(1e4f32))]
    {
        let mut rng = common::Rng::new(11);
        let q = uniform::<f16>(&mut rng, (tokens, 2, 64), mq);
        let k = uniform::<f16>(&mut rng, (tokens, 2, 64), 2.0);
        let v = uniform::<f16>(&mut rng, (tokens, 2, 64), mv);
        for causal in [false, true] {
            let p = Params { causal, softmax_scale: scale, ..Params::default() };
            check_paths(&GPU, &q, &k, &v, &lengths, &lengths, &p).unwrap();
        }
    }
}

/// Huge scales on long sequences, which the GPU splits across blocks: the splits' combination sees
/// LSEs of 1e30 and more.
#[test]
fn huge_scales_with_key_splits_on_the_gpu() {
    if device().is_none() {
        return;
    }
    let mut rng = common::Rng::new(9);
    let q = uniform::<bf16>(&mut rng, (2100, 1, 72), 4.0);
    let k = uniform::<bf16>(&mut rng, (2100, 1, 72), 4.0);
    let v = uniform::<bf16>(&mut rng, (2100, 1, 72), 4.0);
    for scale in [1e10f32, 1e30] {
        for (causal, softcap, window_left) in [(false, None, None), (true, None, Some(700)), (false, Some(20.0), None)]
        {
            let p = Params { softmax_scale: Some(scale), causal, softcap, window_left, ..Params::default() };
            check_paths(&GPU, &q, &k, &v, &[2000, 100], &[2000, 100], &p).unwrap();
        }
    }
}

/// Batches whose last, partly filled wave of (query tile, head) pairs on 132 multiprocessors
/// splits its keys (the plan's tests pin it), the other pairs running whole; under the
/// heads-inner order these batches take, the last wave is every head of the last tiles:
/// head_dim 72 in 192-row tiles (28 pairs three ways), head_dim 80 in 128-row ones (52 pairs
/// two ways; the first batch's last wave spares too little to split). The split pairs mix
/// sequences (a 1-token one among them, whose later splits see no key), heads of a GQA group,
/// and masks that leave some splits without a visible key.
#[test]
fn batches_whose_last_wave_is_split_match_the_oracle() {
    if device().is_none() {
        return;
    }
    let mut rng = common::Rng::new(17);
    for (lengths, head_dim) in [([1200, 700, 300, 1], 80), ([2400, 700, 300, 1], 72), ([1200, 1100, 300, 1], 80)] {
        let tokens = lengths.iter().sum();
        let q = uniform::<bf16>(&mut rng, (tokens, 8, head_dim), 2.0);
        let k = uniform::<bf16>(&mut rng, (tokens, 2, head_dim), 2.0);
        let v = uniform::<bf16>(&mut rng, (tokens, 2, head_dim), 2.0);
        for (causal, softcap, window_left) in [(false, None, None), (true, None, Some(300)), (false, Some(20.0), None)]
        {
            let p = Params { causal, softcap, window_left, ..Params::default() };
            check_paths(&GPU, &q, &k, &v, &lengths, &lengths, &p).unwrap();
        }
    }
}

/// The key splits are combined in their order, whichever split finishes last, so one call gives
/// the same bits on every run: seed shapes 2 and 16 split their last wave's keys on Hopper, 12
/// splits under the sm_80 kernel.
#[test]
fn key_split_results_are_the_same_on_every_run() {
    if device().is_none() {
        return;
    }
    for index in [2, 12, 16] {
        let shape = SEED_SHAPES[index];
        let [q, k, v] = shape.random_inputs::<bf16>(index as u64);
        let cu = shape.cu_seqlens();
        let params = Params { backend: Backend::Gpu, ..Params::default() };
        let run = || varlen_attn::forward_with_lse(q.view(), k.view(), v.view(), &cu, &cu, &params).unwrap();
        let (out, lse) = run();
        for round in 1..6 {
            let (again, again_lse) = run();
            let what = format!("shape {index}, run {round} against the first run");
            assert_same_bits(again.as_slice().unwrap(), out.as_slice().unwrap(), &format!("{what}: outputs"));
            assert_same_bits(again_lse.as_slice().unwrap(), lse.as_slice().unwrap(), &format!("{what}: LSEs"));
        }
    }
}

/// Batches whose sequences all take as many query tiles, where the kernel divides to find a
/// tile's sequence (`Plan`'s tests pin these batches' tiles): 64 images of 250 tokens (two
/// 128-row tiles each, cu_seqlens in the parameter block), 80 sequences of different lengths
/// but two tiles each, against other key lengths (cu_seqlens copied to the device), three of 40
/// tokens (one 64-row tile each) and 66 of 190 (one 192-row tile each); plain, causal, and a
/// window.
#[test]
fn batches_of_equal_tile_counts_match_the_oracle() {
    if device().is_none() {
        return;
    }
    let mut rng = common::Rng::new(23);
    let cycle = |lengths: &[usize], n: usize| -> Vec<usize> { lengths.iter().copied().cycle().take(n).collect() };
    let batches = [
        (vec![250; 64], vec![250; 64]),
        (cycle(&[200, 256, 250, 129], 80), cycle(&[7, 300, 129, 64, 1], 80)),
        (vec![40; 3], vec![40; 3]),
        (vec![190; 66], vec![190; 66]),
    ];
    for (q_lengths, k_lengths) in batches {
        let (q_tokens, k_tokens) = (q_lengths.iter().sum(), k_lengths.iter().sum());
        let q = uniform::<bf16>(&mut rng, (q_tokens, 2, 72), 2.0);
        let k = uniform::<bf16>(&mut rng, (k_tokens, 1, 72), 2.0);
        let v = uniform::<bf16>(&mut rng, (k_tokens, 1, 72), 2.0);
        for (causal, window_left) in [(false, None), (true, None), (false, Some(100))] {
            let p = Params { causal, window_left, ..Params::default() };
            check_paths(&GPU, &q, &k, &v, &q_lengths, &k_lengths, &p).unwrap();
        }
    }
}

/// Tensors past 2^31 elements (2,200 sequences of 1,024 tokens, 16 heads × 72: 2.6e9 elements,
/// 5.2 GB each in bf16): every offset into q, k, v and the output is computed in 64 bits. Rows
/// before, around and far past element 2^31 are checked against the oracle.
#[test]
fn tensors_past_two_to_the_31_elements() {
    if device().is_none() {
        return;
    }
    if skip_huge() {
        eprintln!("note: skipping the 2^31-element test under VARLEN_ATTN_GPU_CASES (a sanitizer run)");
        return;
    }
    use rayon::prelude::*;
    let (sequences, length, heads, dim) = (2200usize, 1024usize, 16usize, 72usize);
    let tokens = sequences * length;
    assert!(tokens * heads * dim > 1 << 31);
    // Deterministic values in [-2, 2), filled in parallel (2.6e9 per tensor).
    let random = |seed: u64| {
        let mut data = vec![bf16::ZERO; tokens * heads * dim];
        data.par_chunks_mut(1 << 16).enumerate().for_each(|(chunk, values)| {
            let mut state = (seed << 40) ^ chunk as u64 ^ 0x9E37_79B9_7F4A_7C15;
            for x in values {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *x = bf16::from_f32((state >> 40) as f32 / (1u64 << 22) as f32 - 2.0);
            }
        });
        ndarray::Array3::from_shape_vec((tokens, heads, dim), data).unwrap()
    };
    let (q, k, v) = (random(1), random(2), random(3));
    let cu: Vec<i32> = (0..=sequences).map(|b| (b * length) as i32).collect();
    let params = Params { backend: Backend::Gpu, ..Params::default() };
    let out = match varlen_attn::forward(q.view(), k.view(), v.view(), &cu, &cu, &params) {
        Ok(out) => out,
        Err(varlen_attn::Error::Gpu(e)) if e.contains("out of device memory") => {
            eprintln!("note: skipping the 2^31-element test: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    // Element 2^31 falls in token 2^31 / (16 · 72) = 1,864,135.
    let boundary = (1usize << 31) / (heads * dim);
    let rows: Vec<usize> =
        [0, 1023, 1024, boundary - 1, boundary, boundary + 1, tokens / 2, tokens - 1025, tokens - 1].into();
    let reference = oracle::reference_rows(q.view(), k.view(), v.view(), &cu, &cu, &params, &rows).unwrap();
    let report = reference.compare(out.view());
    eprintln!("2^31 elements: {report}");
    assert!(report.worst.is_none(), "{report}");
}

/// Packed random bf16 inputs for sequences of `lengths` (the same for queries and keys), 16
/// heads × 72, with their cu_seqlens.
fn packed_batch(lengths: &[usize], seed: u64) -> ([ndarray::Array3<bf16>; 3], Vec<i32>) {
    let mut rng = common::Rng::new(seed);
    let tokens: usize = lengths.iter().sum();
    let tensor = |rng: &mut common::Rng| uniform::<bf16>(rng, (tokens, 16, 72), 2.0);
    let cu = std::iter::once(0).chain(lengths.iter().scan(0, |s, &l| {
        *s += l as i32;
        Some(*s)
    }));
    ([tensor(&mut rng), tensor(&mut rng), tensor(&mut rng)], cu.collect())
}

/// The device-seqlens call on `device` with the inputs uploaded, into `out` (and an LSE).
fn run_device_seqlens(
    device: &Device,
    inputs: &[DeviceBuffer<bf16>; 3],
    cu: &DeviceBuffer<i32>,
    params: &Params,
    out: &mut DeviceBuffer<bf16>,
    lse: &mut DeviceBuffer<f32>,
) -> Result<(), varlen_attn::Error> {
    let tokens = out.len() / (16 * 72);
    let t = |b| DeviceTensor::new(b, [tokens, 16, 72]).unwrap();
    let out = DeviceTensorMut::new(out, [tokens, 16, 72]).unwrap();
    forward_device_seqlens(device, t(&inputs[0]), t(&inputs[1]), t(&inputs[2]), cu, cu, params, out, Some(lse))
}

/// Checks `out` and `lse` (from the device) against the oracle on sampled rows.
fn check_against_oracle(
    inputs: &[ndarray::Array3<bf16>; 3],
    cu: &[i32],
    params: &Params,
    out: Vec<bf16>,
    lse: Vec<f32>,
) {
    let [q, k, v] = inputs;
    let tokens = q.dim().0;
    let out = ndarray::Array3::from_shape_vec((tokens, 16, 72), out).unwrap();
    let lse = ndarray::Array2::from_shape_vec((16, tokens), lse).unwrap();
    let rows: Vec<usize> = (0..tokens).step_by(tokens.div_ceil(300).max(1)).chain([tokens - 1]).collect();
    let reference = oracle::reference_rows(q.view(), k.view(), v.view(), cu, cu, params, &rows).unwrap();
    let report = reference.compare(out.view());
    assert!(report.worst.is_none(), "{report}");
    assert!(reference.compare_lse(lse.view()).worst.is_none());
}

/// cu_seqlens on the device: a mixed batch of images (with an empty one), causal and not, and a
/// batch of 2,000 short sequences (more than the planning kernel's threads), match the oracle.
/// On Hopper the first two take 192-row tiles (the tiles of seven equal sequences of 408-409
/// tokens), the short ones 128-row tiles and the lone 768-token sequence 192-key tiles.
#[test]
fn device_seqlens_match_the_oracle() {
    let Some(device) = device() else { return };
    let many: Vec<usize> = (0..2000).map(|i| i % 7).collect();
    let mixed = vec![720, 1200, 276, 0, 64, 1, 600];
    for (lengths, causal) in [(mixed.clone(), false), (mixed, true), (many, false), (vec![768], false)] {
        let (inputs, cu) = packed_batch(&lengths, 11);
        let uploaded = inputs.clone().map(|a| device.upload(a.as_slice().unwrap()).unwrap());
        let cu_device = device.upload(&cu).unwrap();
        let mut out = device.zeros::<bf16>(inputs[0].len()).unwrap();
        let mut lse = device.zeros::<f32>(inputs[0].dim().0 * 16).unwrap();
        let params = Params { causal, ..Params::default() };
        run_device_seqlens(&device, &uploaded, &cu_device, &params, &mut out, &mut lse).unwrap();
        device.check_seqlens().unwrap();
        check_against_oracle(&inputs, &cu, &params, device.download(&out).unwrap(), device.download(&lse).unwrap());
    }
}

/// cu_seqlens on the device that break a rule: the call fills its outputs with NaN, and the
/// next check reports it once.
#[test]
fn bad_device_seqlens_write_nan_and_are_reported() {
    let Some(device) = device() else { return };
    let (inputs, cu) = packed_batch(&[100, 50, 30], 12);
    let uploaded = inputs.clone().map(|a| device.upload(a.as_slice().unwrap()).unwrap());
    let sentinel = bf16::from_f32(7.0);
    for bad in [vec![0, 100, 90, 180], vec![1, 100, 150, 180], vec![0, 100, 150, 179], vec![0, 100, 150, 5000]] {
        let cu_device = device.upload(&bad).unwrap();
        let mut out = device.upload(&vec![sentinel; inputs[0].len()]).unwrap();
        let mut lse = device.zeros::<f32>(180 * 16).unwrap();
        run_device_seqlens(&device, &uploaded, &cu_device, &Params::default(), &mut out, &mut lse).unwrap();
        assert_eq!(device.check_seqlens(), Err(varlen_attn::Error::DeviceCuSeqlens), "{bad:?}");
        assert!(device.download(&out).unwrap().iter().all(|x| x.is_nan()), "{bad:?}: out not all NaN");
        assert!(device.download(&lse).unwrap().iter().all(|x| x.is_nan()), "{bad:?}: lse not all NaN");
        assert_eq!(device.check_seqlens(), Ok(()), "the flag is lowered once reported");
    }
    // A strided output: NaN over its elements, the padding between its heads untouched.
    let cu_device = device.upload(&[0i32, 100, 90, 180]).unwrap();
    let mut padded = device.upload(&vec![sentinel; 180 * 16 * 80]).unwrap();
    let t = |b| DeviceTensor::new(b, [180, 16, 72]).unwrap();
    let strided = DeviceTensorMut::with_strides(&mut padded, [180, 16, 72], 16 * 80, 80).unwrap();
    let (q, k, v) = (t(&uploaded[0]), t(&uploaded[1]), t(&uploaded[2]));
    forward_device_seqlens(&device, q, k, v, &cu_device, &cu_device, &Params::default(), strided, None).unwrap();
    assert_eq!(device.check_seqlens(), Err(varlen_attn::Error::DeviceCuSeqlens));
    for (i, x) in device.download(&padded).unwrap().into_iter().enumerate() {
        assert_eq!(x.is_nan(), i % 80 < 72, "element {i}");
        assert!(x.is_nan() || x == sentinel, "element {i}: {x}");
    }
    // Buffers of different lengths are refused on the host.
    let (short, long) = (device.upload(&[0i32, 180]).unwrap(), device.upload(&cu).unwrap());
    let t = |b| DeviceTensor::new(b, [180, 16, 72]).unwrap();
    let mut out = device.zeros::<bf16>(inputs[0].len()).unwrap();
    let err = forward_device_seqlens(
        &device,
        t(&uploaded[0]),
        t(&uploaded[1]),
        t(&uploaded[2]),
        &short,
        &long,
        &Params::default(),
        DeviceTensorMut::new(&mut out, [180, 16, 72]).unwrap(),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, varlen_attn::Error::CuSeqlensLength { .. }), "{err}");
}

/// A CUDA graph captures the device-seqlens call once and replays it with other cu_seqlens
/// written into the same buffer: each replay matches the oracle for the lengths of then.
#[test]
fn a_captured_call_replays_with_new_device_seqlens() {
    let Some(device) = device() else { return };
    let (inputs, first) = packed_batch(&[300, 700, 24, 1000], 13);
    let second: Vec<i32> = vec![0, 1000, 1001, 1600, 2024];
    let uploaded = inputs.clone().map(|a| device.upload(a.as_slice().unwrap()).unwrap());
    let mut cu = device.upload(&first).unwrap();
    let mut out = device.zeros::<bf16>(inputs[0].len()).unwrap();
    let mut lse = device.zeros::<f32>(2024 * 16).unwrap();
    let params = Params { causal: true, ..Params::default() };
    // One call first: the kernel compiles, the workspace and the flag are made.
    run_device_seqlens(&device, &uploaded, &cu, &params, &mut out, &mut lse).unwrap();
    let direct = device.download(&out).unwrap();
    let graph =
        device.capture(&mut || run_device_seqlens(&device, &uploaded, &cu, &params, &mut out, &mut lse)).unwrap();
    for lengths in [&second, &first, &second] {
        device.write(&mut cu, lengths).unwrap();
        graph.replay().unwrap();
        device.check_seqlens().unwrap();
        let (got, got_lse) = (device.download(&out).unwrap(), device.download(&lse).unwrap());
        if lengths == &first {
            assert_same_bits(&got, &direct, "the replay against the direct call");
        }
        check_against_oracle(&inputs, lengths, &params, got, got_lse);
    }
}

/// ALiBi (per head and per sequence, with the soft-cap, causal and windowed) and attention
/// sinks on the GPU, against the oracle, output and LSE: a mixed batch with an empty key
/// sequence (its rows' LSE is the sink), and the batches whose last wave splits its keys (the
/// sink joins after the splits are combined).
#[test]
fn alibi_and_sinks_on_the_gpu_match_the_oracle() {
    if device().is_none() {
        return;
    }
    let mut rng = common::Rng::new(23);
    let heads = 8;
    let slopes: Vec<f32> = (0..heads).map(|h| 2f32.powf(-8.0 * (h + 1) as f32 / heads as f32)).collect();
    let sinks: Vec<f32> = (0..heads).map(|h| h as f32 * 0.75 - 3.0).collect();
    let batches: [(&[usize], &[usize], usize); 4] = [
        (&[300, 77, 5, 1000], &[300, 0, 40, 1000], 72),
        (&[1200, 700, 300, 1], &[1200, 700, 300, 1], 80),
        (&[2400, 700, 300, 1], &[2400, 700, 300, 1], 72),
        (&[64; 20], &[64; 20], 128),
    ];
    for (q_lengths, k_lengths, head_dim) in batches {
        let per_sequence: Vec<f32> =
            (0..q_lengths.len() * heads).map(|i| 0.01 + 0.2 * ((i * 7) % 11) as f32 / 11.0).collect();
        let cases = [
            Params { alibi_slopes: Some(slopes.clone()), ..Params::default() },
            Params { alibi_slopes: Some(per_sequence), causal: true, ..Params::default() },
            Params {
                alibi_slopes: Some(slopes.clone()),
                softcap: Some(15.0),
                window_left: Some(200),
                ..Params::default()
            },
            Params { sinks: Some(sinks.clone()), ..Params::default() },
            Params {
                sinks: Some(sinks.clone()),
                alibi_slopes: Some(slopes.clone()),
                causal: true,
                ..Params::default()
            },
        ];
        let (tq, tk) = (q_lengths.iter().sum(), k_lengths.iter().sum());
        let q = uniform::<bf16>(&mut rng, (tq, heads, head_dim), 2.0);
        let k = uniform::<bf16>(&mut rng, (tk, 2, head_dim), 2.0);
        let v = uniform::<bf16>(&mut rng, (tk, 2, head_dim), 2.0);
        for p in &cases {
            check_paths(&GPU, &q, &k, &v, q_lengths, k_lengths, p).unwrap();
        }
        let (q, k, v) = (
            q.mapv(|x| f16::from_f32(x.to_f32())),
            k.mapv(|x| f16::from_f32(x.to_f32())),
            v.mapv(|x| f16::from_f32(x.to_f32())),
        );
        check_paths(&GPU, &q, &k, &v, q_lengths, k_lengths, &cases[4]).unwrap();
    }
}

/// ALiBi and sinks with cu_seqlens on the device: within the oracle's bound, and a CUDA graph's
/// replay gives the same bits.
#[test]
fn alibi_and_sinks_with_device_seqlens_and_graphs() {
    let Some(device) = device() else { return };
    let lengths = vec![720, 64, 1, 300];
    let (inputs, cu) = packed_batch(&lengths, 29);
    let uploaded = inputs.clone().map(|a| device.upload(a.as_slice().unwrap()).unwrap());
    let cu_device = device.upload(&cu).unwrap();
    let tokens = inputs[0].dim().0;
    let params = Params {
        alibi_slopes: Some((0..16).map(|h| 0.5f32.powi(h / 2 + 1)).collect()),
        sinks: Some((0..16).map(|h| h as f32 / 4.0 - 2.0).collect()),
        causal: true,
        ..Params::default()
    };
    let mut out = device.zeros::<bf16>(inputs[0].len()).unwrap();
    let mut lse = device.zeros::<f32>(tokens * 16).unwrap();
    run_device_seqlens(&device, &uploaded, &cu_device, &params, &mut out, &mut lse).unwrap();
    device.check_seqlens().unwrap();
    let (out_device, lse_device) = (device.download(&out).unwrap(), device.download(&lse).unwrap());
    // Not the host-planned call's bits: without the lengths the tile shape is a guess.
    check_against_oracle(&inputs, &cu, &params, out_device.clone(), lse_device);

    let mut replayed = device.zeros::<bf16>(inputs[0].len()).unwrap();
    let mut replayed_lse = device.zeros::<f32>(tokens * 16).unwrap();
    let graph = device
        .capture(&mut || run_device_seqlens(&device, &uploaded, &cu_device, &params, &mut replayed, &mut replayed_lse))
        .unwrap();
    graph.replay().unwrap();
    device.synchronize().unwrap();
    assert_same_bits(&device.download(&replayed).unwrap(), &out_device, "graph replay: outputs");
}

/// A random paged cache of `blocks` blocks of `block_size` tokens holding the keys (or values)
/// of sequences of `k_lengths`, each sequence's blocks drawn in a shuffled order (the last
/// sequence shares the first one's first block when both have keys: prefix caching), with its
/// block table.
fn paged_cache<T: varlen_attn::Element + Copy>(
    rng: &mut common::Rng,
    k_lengths: &[usize],
    block_size: usize,
    kv_heads: usize,
    dims: usize,
) -> (ndarray::Array4<T>, ndarray::Array4<T>, ndarray::Array2<i32>) {
    let per_sequence: Vec<usize> = k_lengths.iter().map(|l| l.div_ceil(block_size)).collect();
    let blocks = per_sequence.iter().sum::<usize>() + 3;
    let columns = per_sequence.iter().max().copied().unwrap_or(0).max(1) + 1;
    // A permutation of the blocks: sequence b takes the next per_sequence[b] of it.
    let mut order: Vec<i32> = (0..blocks as i32).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut table = ndarray::Array2::from_elem((k_lengths.len(), columns), -1);
    let mut next = 0;
    for (b, &n) in per_sequence.iter().enumerate() {
        for e in 0..n {
            table[[b, e]] = order[next];
            next += 1;
        }
    }
    let last = k_lengths.len() - 1;
    if last > 0 && per_sequence[0] > 0 && per_sequence[last] > 0 {
        table[[last, 0]] = table[[0, 0]];
    }
    let cache = |rng: &mut common::Rng| {
        let rows = uniform::<T>(rng, (blocks * block_size, kv_heads, dims), 2.0);
        rows.into_shape_with_order((blocks, block_size, kv_heads, dims)).unwrap()
    };
    (cache(rng), cache(rng), table)
}

/// Paged K/V on the GPU against the oracle, output and LSE: block sizes from 1 to 256 (and
/// ones that divide no tile), prefill and decode batches (with an empty key sequence and a
/// shared block), GQA, head dims 64, 72 and 128, masks, soft-cap, ALiBi and sinks, bf16 and
/// f16; and the device-resident call, bit for bit the host-array one.
#[test]
fn paged_caches_on_the_gpu_match_the_oracle() {
    let Some(device) = device() else { return };
    let mut rng = common::Rng::new(31);
    let heads = 8;
    let slopes: Vec<f32> = (0..heads).map(|h| 2f32.powf(-8.0 * (h + 1) as f32 / heads as f32)).collect();
    let sinks: Vec<f32> = (0..heads).map(|h| h as f32 * 0.5 - 2.0).collect();
    let gpu = |p: Params| Params { backend: Backend::Gpu, ..p };
    let cases = [
        gpu(Params::default()),
        gpu(Params { causal: true, ..Params::default() }),
        gpu(Params { window_left: Some(100), softcap: Some(20.0), ..Params::default() }),
        gpu(Params { alibi_slopes: Some(slopes), sinks: Some(sinks), causal: true, ..Params::default() }),
    ];
    // (query lengths, key lengths, head_dim, block sizes)
    type Batch<'a> = (&'a [usize], &'a [usize], usize, &'a [usize]);
    let batches: [Batch; 4] = [
        (&[300, 77, 5, 1000], &[300, 0, 40, 1000], 72, &[16, 1, 256]),
        (&[1; 6], &[5000, 17, 1, 2048, 300, 999], 128, &[32, 3, 128]),
        (&[4, 4, 4], &[900, 64, 130], 64, &[64, 5]),
        (&[700, 1], &[700, 33], 72, &[48]),
    ];
    for (q_lengths, k_lengths, head_dim, block_sizes) in batches {
        let (cu_q, cu_k) = (common::cu_seqlens(q_lengths), common::cu_seqlens(k_lengths));
        let tq = *cu_q.last().unwrap() as usize;
        let q = uniform::<bf16>(&mut rng, (tq, heads, head_dim), 2.0);
        for &block_size in block_sizes {
            let (k_cache, v_cache, table) = paged_cache::<bf16>(&mut rng, k_lengths, block_size, 2, head_dim);
            let kv =
                varlen_attn::PagedKv { k_cache: k_cache.view(), v_cache: v_cache.view(), block_table: table.view() };
            for p in &cases {
                let what = format!("{q_lengths:?}/{k_lengths:?} d {head_dim}, blocks of {block_size}, {p:?}");
                let (out, lse) = varlen_attn::forward_paged_with_lse(q.view(), &kv, &cu_q, &cu_k, p).unwrap();
                let reference = oracle::reference_paged(q.view(), &kv, &cu_q, &cu_k, p).unwrap();
                let report = reference.compare(out.view());
                assert!(report.worst.is_none(), "{what}: {report}");
                let report = reference.compare_lse(lse.view());
                assert!(report.worst.is_none(), "{what}: LSE {report}");
            }
            // The device-resident call on the same cache: the same bits.
            let rows = |c: &ndarray::Array4<bf16>| device.upload(c.as_slice().unwrap()).unwrap();
            let (kb, vb, qb) = (rows(&k_cache), rows(&v_cache), device.upload(q.as_slice().unwrap()).unwrap());
            let cache_rows = [k_cache.dim().0 * block_size, 2, head_dim];
            let device_kv = varlen_attn::gpu::DevicePagedKv {
                k_cache: DeviceTensor::new(&kb, cache_rows).unwrap(),
                v_cache: DeviceTensor::new(&vb, cache_rows).unwrap(),
                block_size,
                block_table: table.view(),
            };
            let mut out = device.zeros::<bf16>(q.len()).unwrap();
            let shape = [tq, heads, head_dim];
            varlen_attn::gpu::forward_device_paged(
                &device,
                DeviceTensor::new(&qb, shape).unwrap(),
                &device_kv,
                &cu_q,
                &cu_k,
                &cases[1],
                DeviceTensorMut::new(&mut out, shape).unwrap(),
                None,
            )
            .unwrap();
            let host = varlen_attn::forward_paged(q.view(), &kv, &cu_q, &cu_k, &cases[1]).unwrap();
            assert_same_bits(&device.download(&out).unwrap(), host.as_slice().unwrap(), "device paged call");
        }
    }
    // f16, and a cache whose blocks are strided views (staged into rows first).
    let (q_lengths, k_lengths) = ([3usize, 200], [3000usize, 200]);
    let (cu_q, cu_k) = (common::cu_seqlens(&q_lengths), common::cu_seqlens(&k_lengths));
    let q = uniform::<f16>(&mut rng, (203, heads, 72), 2.0);
    let (k_cache, v_cache, table) = paged_cache::<f16>(&mut rng, &k_lengths, 16, 2, 80);
    let (k_view, v_view) = (k_cache.slice(ndarray::s![.., .., .., ..72]), v_cache.slice(ndarray::s![.., .., .., ..72]));
    let kv = varlen_attn::PagedKv { k_cache: k_view, v_cache: v_view, block_table: table.view() };
    for p in &cases {
        let out = varlen_attn::forward_paged(q.view(), &kv, &cu_q, &cu_k, p).unwrap();
        let report = oracle::reference_paged(q.view(), &kv, &cu_q, &cu_k, p).unwrap().compare(out.view());
        assert!(report.worst.is_none(), "f16 strided cache, {p:?}: {report}");
    }
}

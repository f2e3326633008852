//! candle's CUDA tensors (`--features candle-cuda`, run on a GPU): every entry point equals
//! `gpu::forward_device_seqlens` on the same data bit for bit (the same path: cu_seqlens on the
//! device; the paged one, the host-array paged call on the GPU) and stays within the oracle's
//! bound; strided views of a packed qkv tensor, bf16 and
//! f16, a candle device with its own stream; bad arguments give candle errors, and cu_seqlens
//! that break a rule give NaN. Without a CUDA device each test says so and passes.

use candle_core::{DType, Device, IndexOp, Tensor};
use half::{bf16, f16};
use ndarray::Array3;
use varlen_attn::candle::{
    flash_attn_varlen, flash_attn_varlen_alibi_windowed_softcap, flash_attn_varlen_cpu,
    flash_attn_varlen_paged_windowed, flash_attn_varlen_windowed, flash_attn_varlen_with_lse,
};
use varlen_attn::gpu::{forward_device_seqlens, DeviceTensor, DeviceTensorMut};
use varlen_attn::{oracle, Element, Params};

mod common;

use common::{extreme::uniform, Rng};

/// candle's default CUDA device 0, or `None` (with a note) where there is none.
fn cuda() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(device) => Some(device),
        Err(e) => {
            eprintln!("note: skipping: no CUDA device for candle ({e})");
            None
        }
    }
}

/// Our own runtime on GPU 0 (opened once: it keeps its compiled kernels), for the reference
/// calls.
fn ours() -> &'static varlen_attn::gpu::Device {
    static DEVICE: std::sync::OnceLock<varlen_attn::gpu::Device> = std::sync::OnceLock::new();
    DEVICE.get_or_init(|| varlen_attn::gpu::Device::open(0).expect("candle found a CUDA device"))
}

const LENGTHS: [usize; 5] = [300, 77, 1, 0, 530];

fn cu_seqlens(lengths: &[usize]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lengths.iter().scan(0, |s, &l| {
            *s += l as i32;
            Some(*s)
        }))
        .collect()
}

/// q, k and v of [`LENGTHS`], 8 query and 2 kv heads of 72 (head_dim_v 72 too).
fn inputs<T: Element>(seed: u64) -> [Array3<T>; 3] {
    let mut rng = Rng::new(seed);
    let tokens: usize = LENGTHS.iter().sum();
    [
        uniform::<T>(&mut rng, (tokens, 8, 72), 2.0),
        uniform::<T>(&mut rng, (tokens, 2, 72), 2.0),
        uniform::<T>(&mut rng, (tokens, 2, 72), 2.0),
    ]
}

fn to_candle<T: Element + candle_core::WithDType>(a: &Array3<T>, device: &Device) -> Tensor {
    Tensor::from_vec(a.iter().copied().collect::<Vec<T>>(), a.dim(), device).unwrap()
}

/// Our device-seqlens call on the same data: output and LSE.
fn reference<T: Element + bytemuck::Pod>(inputs: &[Array3<T>; 3], params: &Params) -> (Vec<T>, Vec<f32>) {
    let device = ours();
    let [q, k, v] = inputs.each_ref().map(|a| device.upload(a.as_slice().unwrap()).unwrap());
    let cu = device.upload(&cu_seqlens(&LENGTHS)).unwrap();
    let (tokens, heads) = (inputs[0].dim().0, inputs[0].dim().1);
    let mut out = device.zeros::<T>(inputs[0].len()).unwrap();
    let mut lse = device.zeros::<f32>(heads * tokens).unwrap();
    let t = |b, a: &Array3<T>| DeviceTensor::new(b, a.dim().into()).unwrap();
    let (qt, kt, vt) = (t(&q, &inputs[0]), t(&k, &inputs[1]), t(&v, &inputs[2]));
    let out_t = DeviceTensorMut::new(&mut out, inputs[0].dim().into()).unwrap();
    forward_device_seqlens(device, qt, kt, vt, &cu, &cu, params, out_t, Some(&mut lse)).unwrap();
    device.check_seqlens().unwrap();
    (device.download(&out).unwrap(), device.download(&lse).unwrap())
}

fn bits<T: Element>(x: &[T]) -> Vec<u32> {
    x.iter().map(|v| v.to_f32().to_bits()).collect()
}

/// The candle output equals the reference bit for bit and is within the oracle's bound.
fn check<T: Element + candle_core::WithDType + bytemuck::Pod>(
    got: &Tensor,
    inputs: &[Array3<T>; 3],
    params: &Params,
    what: &str,
) {
    let got: Vec<T> = got.flatten_all().unwrap().to_vec1::<T>().unwrap();
    let (expected, _) = reference(inputs, params);
    assert_eq!(bits(&got), bits(&expected), "{what}: against forward_device_seqlens");
    let [q, k, v] = inputs;
    let cu = cu_seqlens(&LENGTHS);
    let rows: Vec<usize> = (0..q.dim().0).step_by(7).collect();
    let oracle = oracle::reference_rows(q.view(), k.view(), v.view(), &cu, &cu, params, &rows).unwrap();
    let got = Array3::from_shape_vec(q.dim(), got).unwrap();
    let report = oracle.compare(got.view());
    assert!(report.worst.is_none(), "{what}: {report}");
}

fn every_entry_point<T: Element + candle_core::WithDType + bytemuck::Pod>(device: &Device) {
    let inputs = inputs::<T>(5);
    let [q, k, v] = inputs.each_ref().map(|a| to_candle(a, device));
    let cu = cu_seqlens(&LENGTHS);
    let cu_u32: Vec<u32> = cu.iter().map(|&x| x as u32).collect();
    let seqlens = Tensor::new(cu_u32.as_slice(), device).unwrap();
    let scale = 0.13f32;
    let base = Params { softmax_scale: Some(scale), ..Params::default() };
    let longest = 530;

    for causal in [false, true] {
        let out = flash_attn_varlen(&q, &k, &v, &seqlens, &seqlens, longest, longest, scale, causal).unwrap();
        check(&out, &inputs, &Params { causal, ..base.clone() }, &format!("flash_attn_varlen causal={causal}"));
    }
    let windowed = Params { window_left: Some(40), window_right: Some(3), ..base.clone() };
    let out =
        flash_attn_varlen_windowed(&q, &k, &v, &seqlens, &seqlens, longest, longest, scale, Some(40), Some(3)).unwrap();
    check(&out, &inputs, &windowed, "flash_attn_varlen_windowed");

    let slopes: Vec<f32> = (0..8).map(|h| 0.5f32.powi(h + 1)).collect();
    let slopes_tensor = Tensor::new(slopes.as_slice(), device).unwrap();
    let alibi = Params {
        alibi_slopes: Some(slopes),
        softcap: Some(20.0),
        window_left: Some(100),
        window_right: Some(0),
        ..base.clone()
    };
    let out = flash_attn_varlen_alibi_windowed_softcap(
        &q,
        &k,
        &v,
        Some(&slopes_tensor),
        &seqlens,
        &seqlens,
        longest,
        longest,
        scale,
        Some(100),
        Some(0),
        20.0,
    )
    .unwrap();
    check(&out, &inputs, &alibi, "flash_attn_varlen_alibi_windowed_softcap");

    let (out, lse) = flash_attn_varlen_with_lse(&q, &k, &v, &seqlens, &seqlens, longest, longest, scale, true).unwrap();
    let causal = Params { causal: true, ..base.clone() };
    check(&out, &inputs, &causal, "flash_attn_varlen_with_lse: out");
    let (_, expected_lse) = reference(&inputs, &causal);
    assert_eq!(lse.dims(), &[8, q.dims()[0]]);
    let lse: Vec<f32> = lse.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(bits(&lse), bits(&expected_lse), "flash_attn_varlen_with_lse: lse");

    // candle-nn's convention: per-sequence lengths.
    let lengths: Vec<u32> = LENGTHS.iter().map(|&l| l as u32).collect();
    let lengths = Tensor::new(lengths.as_slice(), device).unwrap();
    let out =
        flash_attn_varlen_cpu(&q, &k, &v, None, &lengths, &lengths, longest, longest, scale, true, None, None).unwrap();
    check(&out, &inputs, &causal, "flash_attn_varlen_cpu (lengths)");

    // A paged cache of 16-token blocks, each sequence's blocks in reverse order: the same bits
    // as the host-array paged call on the GPU (the same plan), within the oracle's bound.
    let [q_host, k_host, v_host] = &inputs;
    let block_size = 16;
    let per_sequence: Vec<usize> = LENGTHS.iter().map(|l| l.div_ceil(block_size)).collect();
    let blocks: usize = per_sequence.iter().sum();
    let columns = *per_sequence.iter().max().unwrap();
    let mut table = ndarray::Array2::<i32>::zeros((LENGTHS.len(), columns));
    let (mut k_cache, mut v_cache) = (
        ndarray::Array4::<T>::from_elem((blocks, block_size, 2, 72), T::from_f32(0.0)),
        ndarray::Array4::<T>::from_elem((blocks, block_size, 2, 72), T::from_f32(0.0)),
    );
    let mut first_block = 0;
    for (b, &n) in per_sequence.iter().enumerate() {
        for e in 0..n {
            let block = first_block + n - 1 - e;
            table[[b, e]] = block as i32;
            for slot in 0..block_size.min(LENGTHS[b] - e * block_size) {
                let token = cu[b] as usize + e * block_size + slot;
                k_cache.slice_mut(ndarray::s![block, slot, .., ..]).assign(&k_host.slice(ndarray::s![token, .., ..]));
                v_cache.slice_mut(ndarray::s![block, slot, .., ..]).assign(&v_host.slice(ndarray::s![token, .., ..]));
            }
        }
        first_block += n;
    }
    let cache_tensor =
        |a: &ndarray::Array4<T>| Tensor::from_vec(a.iter().copied().collect::<Vec<T>>(), a.dim(), device).unwrap();
    let table_u32: Vec<u32> = table.iter().map(|&x| x as u32).collect();
    let table_tensor = Tensor::from_vec(table_u32, table.dim(), device).unwrap();
    let out = flash_attn_varlen_paged_windowed(
        &q,
        &cache_tensor(&k_cache),
        &cache_tensor(&v_cache),
        &table_tensor,
        &seqlens,
        &seqlens,
        longest,
        longest,
        scale,
        Some(40),
        Some(3),
    )
    .unwrap();
    let got: Vec<T> = out.flatten_all().unwrap().to_vec1::<T>().unwrap();
    let kv = varlen_attn::PagedKv { k_cache: k_cache.view(), v_cache: v_cache.view(), block_table: table.view() };
    let on_gpu = Params { backend: varlen_attn::Backend::Gpu, ..windowed.clone() };
    let expected = varlen_attn::forward_paged(q_host.view(), &kv, &cu, &cu, &on_gpu).unwrap();
    assert_eq!(bits(&got), bits(expected.as_slice().unwrap()), "flash_attn_varlen_paged_windowed");
    let report = oracle::reference_paged(q_host.view(), &kv, &cu, &cu, &windowed)
        .unwrap()
        .compare(Array3::from_shape_vec(q_host.dim(), got).unwrap().view());
    assert!(report.worst.is_none(), "flash_attn_varlen_paged_windowed: {report}");
}

#[test]
fn every_entry_point_in_bf16_and_f16() {
    let Some(device) = cuda() else { return };
    every_entry_point::<bf16>(&device);
    every_entry_point::<f16>(&device);
}

#[test]
fn a_candle_device_with_its_own_stream() {
    let Some(_) = cuda() else { return };
    let device = Device::Cuda(candle_core::CudaDevice::new_with_stream(0).unwrap());
    every_entry_point::<bf16>(&device);
}

/// q, k and v as views of one packed `[tokens, 3, heads, dims]` tensor (a fused projection's
/// output): read in place at their strides.
#[test]
fn strided_views_of_a_packed_qkv_tensor() {
    let Some(device) = cuda() else { return };
    let tokens: usize = LENGTHS.iter().sum();
    let packed = uniform::<bf16>(&mut Rng::new(9), (tokens, 3 * 4, 64), 2.0);
    let qkv = to_candle(&packed, &device).reshape((tokens, 3, 4, 64)).unwrap();
    let (q, k, v) = (qkv.i((.., 0)).unwrap(), qkv.i((.., 1)).unwrap(), qkv.i((.., 2)).unwrap());
    assert!(!q.is_contiguous());
    let cu: Vec<u32> = cu_seqlens(&LENGTHS).iter().map(|&x| x as u32).collect();
    let seqlens = Tensor::new(cu.as_slice(), &device).unwrap();
    let out = flash_attn_varlen(&q, &k, &v, &seqlens, &seqlens, 530, 530, 0.125, true).unwrap();
    let contiguous = |t: &Tensor| -> Array3<bf16> {
        let values: Vec<bf16> = t.contiguous().unwrap().flatten_all().unwrap().to_vec1().unwrap();
        Array3::from_shape_vec((tokens, 4, 64), values).unwrap()
    };
    let inputs = [contiguous(&q), contiguous(&k), contiguous(&v)];
    check(&out, &inputs, &Params { softmax_scale: Some(0.125), causal: true, ..Params::default() }, "qkv views");
}

#[test]
fn bad_arguments_give_candle_errors_naming_them() {
    let Some(device) = cuda() else { return };
    let x = Tensor::ones((10, 2, 64), DType::BF16, &device).unwrap();
    let cu = Tensor::new(&[0u32, 10], &device).unwrap();
    let message = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();

    let f32s = x.to_dtype(DType::F32).unwrap();
    assert!(message(flash_attn_varlen(&f32s, &f32s, &f32s, &cu, &cu, 10, 10, 0.1, false)).contains("bf16 or f16"));
    let on_cpu = Tensor::ones((10, 2, 64), DType::BF16, &Device::Cpu).unwrap();
    assert!(message(flash_attn_varlen(&x, &on_cpu, &x, &cu, &cu, 10, 10, 0.1, false)).contains("k is on"));
    let i64s = Tensor::new(&[0i64, 10], &device).unwrap();
    assert!(message(flash_attn_varlen(&x, &x, &x, &i64s, &cu, 10, 10, 0.1, false)).contains("seqlens_q"));
    let short = Tensor::new(&[0u32], &device).unwrap();
    assert!(message(flash_attn_varlen(&x, &x, &x, &short, &short, 10, 10, 0.1, false)).contains("seqlens_q"));
    let rank2 = Tensor::ones((10, 128), DType::BF16, &device).unwrap();
    assert!(message(flash_attn_varlen(&rank2, &x, &x, &cu, &cu, 10, 10, 0.1, false)).contains("q"));
    // A view whose rows do not start on 16 bytes.
    let wide = Tensor::ones((10, 2, 68), DType::BF16, &device).unwrap();
    let shifted = wide.narrow(2, 4, 64).unwrap();
    assert!(message(flash_attn_varlen(&shifted, &x, &x, &cu, &cu, 10, 10, 0.1, false)).contains("16 bytes"));
    // Paged caches: a block table entry that names no block, a cache on the CPU, a cache of
    // the wrong rank.
    let cache = Tensor::ones((1, 16, 2, 64), DType::BF16, &device).unwrap();
    let paged = |table: &Tensor, k_cache: &Tensor| {
        message(flash_attn_varlen_paged_windowed(&x, k_cache, &cache, table, &cu, &cu, 10, 10, 0.1, None, None))
    };
    let good = Tensor::new(&[[0u32]], &device).unwrap();
    assert!(paged(&Tensor::new(&[[1u32]], &device).unwrap(), &cache).contains("block_table[0, 0] = 1"));
    let cpu_cache = Tensor::ones((1, 16, 2, 64), DType::BF16, &Device::Cpu).unwrap();
    assert!(paged(&good, &cpu_cache).contains("k_cache is on"));
    assert!(paged(&good, &x).contains("k_cache"));
}

/// cu_seqlens that break a rule (checked on the device): the output is NaN, not a result.
#[test]
fn bad_cu_seqlens_give_nan() {
    let Some(device) = cuda() else { return };
    let x = Tensor::ones((10, 2, 64), DType::F16, &device).unwrap();
    for bad in [[0u32, 6, 4, 10], [1, 4, 6, 10], [0, 4, 6, 9]] {
        let cu = Tensor::new(&bad, &device).unwrap();
        let out = flash_attn_varlen(&x, &x, &x, &cu, &cu, 10, 10, 0.1, false).unwrap();
        let values: Vec<f16> = out.flatten_all().unwrap().to_vec1().unwrap();
        assert!(values.iter().all(|v| v.is_nan()), "{bad:?}");
    }
}

/// No tokens: empty outputs of the right shapes, nothing launched.
#[test]
fn empty_batches_give_empty_outputs() {
    let Some(device) = cuda() else { return };
    let x = Tensor::zeros((0, 2, 64), DType::BF16, &device).unwrap();
    let cu = Tensor::new(&[0u32, 0], &device).unwrap();
    let (out, lse) = flash_attn_varlen_with_lse(&x, &x, &x, &cu, &cu, 0, 0, 0.1, true).unwrap();
    assert_eq!((out.dims(), lse.dims()), (&[0, 2, 64][..], &[2, 0][..]));
}

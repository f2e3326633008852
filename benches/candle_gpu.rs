//! The candle call on CUDA tensors (`varlen_attn::candle::flash_attn_varlen`, feature
//! `candle-cuda`) against the same kernel called directly (`gpu::forward_device_seqlens`), on
//! the seed's shapes 0-4, 9 and 11-16 and a batch of 64 images × 256 tokens, bf16: wall time of
//! back-to-back calls between two synchronizations, so the candle call's host work shows.
//! `benches/peers/torch_gpu.py 0-4,9,11-16` times FA2 varlen on the same shapes.
//!
//! Build here: `eval "$(tools/cuda-from-pypi.sh)"; CUDA_COMPUTE_CAP=90 tools/gpu-bundle.sh
//! bench --features candle-cuda --bench candle_gpu`; run on the GPU machine with the CUDA
//! libraries on the loader path: `LD_LIBRARY_PATH=/usr/local/cuda/lib64 .gpu-bin/candle_gpu`.

use candle_core::{Device, Tensor};
use half::bf16;
use std::time::Instant;
use varlen_attn::gpu::{forward_device_seqlens, DeviceTensor, DeviceTensorMut};
use varlen_attn::internal::workloads::{Shape, SEED_SHAPES};
use varlen_attn::Params;

/// Milliseconds per call of `repeats` back-to-back calls, after three warm-up calls.
fn per_call_ms(repeats: usize, mut call: impl FnMut(), wait: &dyn Fn()) -> f64 {
    for _ in 0..3 {
        call();
    }
    wait();
    let start = Instant::now();
    for _ in 0..repeats {
        call();
    }
    wait();
    start.elapsed().as_secs_f64() * 1e3 / repeats as f64
}

fn main() {
    let device = Device::new_cuda(0).expect("a CUDA device for candle");
    let ours = varlen_attn::gpu::Device::open(0).expect("the GPU for the direct call");
    let mut shapes: Vec<Shape> = [0, 1, 2, 3, 4, 9, 11, 12, 13, 14, 15, 16].iter().map(|&i| SEED_SHAPES[i]).collect();
    shapes.push(Shape { index: 100, num_heads: 16, head_dim: 72, seq_len: 256, sequences: 64 });
    println!("{}", ours.name());
    println!("| # | H | D | L x N | candle call ms | direct call ms | candle / direct |");
    println!("|---|---|---|---|---|---|---|");
    for shape in shapes {
        let [q, k, v] = shape.random_inputs::<bf16>(7);
        let cu = shape.cu_seqlens();
        let dims = q.dim();
        let repeats = if shape.flops() > 1e12 { 10 } else { 100 };

        let tensor =
            |a: &ndarray::Array3<bf16>| Tensor::from_vec(a.iter().copied().collect(), a.dim(), &device).unwrap();
        let (qt, kt, vt) = (tensor(&q), tensor(&k), tensor(&v));
        let cu_u32: Vec<u32> = cu.iter().map(|&x| x as u32).collect();
        let seqlens = Tensor::new(cu_u32.as_slice(), &device).unwrap();
        let scale = (shape.head_dim as f32).powf(-0.5);
        let candle_ms = per_call_ms(
            repeats,
            || {
                let l = shape.seq_len;
                varlen_attn::candle::flash_attn_varlen(&qt, &kt, &vt, &seqlens, &seqlens, l, l, scale, false).unwrap();
            },
            &|| device.synchronize().unwrap(),
        );

        let [qd, kd, vd] = [&q, &k, &v].map(|a| ours.upload(a.as_slice().unwrap()).unwrap());
        let cu_device = ours.upload(&cu).unwrap();
        let mut out = ours.zeros::<bf16>(q.len()).unwrap();
        let shape3: [usize; 3] = dims.into();
        let params = Params::default();
        let direct_ms = per_call_ms(
            repeats,
            || {
                let t = |b| DeviceTensor::new(b, shape3).unwrap();
                let out = DeviceTensorMut::new(&mut out, shape3).unwrap();
                forward_device_seqlens(&ours, t(&qd), t(&kd), t(&vd), &cu_device, &cu_device, &params, out, None)
                    .unwrap();
            },
            &|| ours.synchronize().unwrap(),
        );
        println!(
            "| {} | {} | {} | {} x {} | {candle_ms:.4} | {direct_ms:.4} | {:.2} |",
            shape.index,
            shape.num_heads,
            shape.head_dim,
            shape.seq_len,
            shape.sequences,
            candle_ms / direct_ms
        );
    }
}

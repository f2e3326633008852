//! GPU timings of the seed's shapes: kernel time from device events around `forward_device`
//! (inputs already on the GPU): the median of single calls, and the average of back-to-back
//! calls between two events (launch gaps hidden, as a profiler's kernel time); TFLOP/s (from
//! the faster of the two) and the fraction of the
//! card's limit (the larger of FLOP / 790 TFLOP/s, the bf16 matrix rate measured on an H200, and
//! scores / 4.18e12 exp/s, the H200's measured exponential rate); plus the host-array call (`forward` with
//! `Backend::Gpu`, copies included) by wall clock, and the error against the f64 oracle on
//! sampled rows.
//!
//! `tools/gpu-bundle.sh bench --bench gpu`, then on the GPU machine
//! `bash .gpu-bin/run-all.sh [shapes, e.g. 0-20]`. Prints a markdown table. Shapes outside the
//! seed's, for tuning the plan's rules: `VARLEN_ATTN_BENCH_SHAPES="16x72x1300,4x72x5000x2"`
//! (heads × head_dim × tokens per sequence, × sequences where more than one), numbered from 100
//! after the selected seed shapes. With `--batches`,
//! realistic vision batches instead (many images of different sizes in one call; GQA; head
//! dims 80 and 64), timed with cu_seqlens from the host and on the device
//! (`benches/peers/torch_gpu_batches.py` times FA2 varlen on the same batches); `--batches
//! "x 1024,mixed"` runs the batches whose label contains one of the comma-separated texts.
//! With `--host`, the host-array call end to end (seed shapes 4 and 9, 1,024 images × 1,024
//! tokens): its first call, the median of the next five, and the kernel alone
//! (`benches/peers/torch_host_path.py` measures the page-locked bus bandwidth and PyTorch's
//! end-to-end FA2 call on the same shapes).

use half::bf16;
use std::time::Instant;
use varlen_attn::gpu::{forward_device, forward_device_seqlens, Device, DeviceTensor, DeviceTensorMut};
use varlen_attn::{
    internal::workloads::{Shape, SEED_SHAPES},
    oracle, Backend, Params,
};

fn selection() -> Vec<usize> {
    let arg = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_else(|| "0-20".into());
    let mut out = Vec::new();
    for part in arg.split(',') {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

/// The shapes of `VARLEN_ATTN_BENCH_SHAPES` (`HxDxL` or `HxDxLxN`), numbered from 100.
fn custom_shapes() -> Vec<Shape> {
    let list = std::env::var("VARLEN_ATTN_BENCH_SHAPES").unwrap_or_default();
    list.split(',')
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, text)| {
            let n: Vec<usize> =
                text.split('x').map(|v| v.parse().expect("VARLEN_ATTN_BENCH_SHAPES: HxDxL[xN]")).collect();
            assert!(n.len() == 3 || n.len() == 4, "VARLEN_ATTN_BENCH_SHAPES: HxDxL[xN], got {text}");
            Shape {
                index: 100 + i,
                num_heads: n[0],
                head_dim: n[1],
                seq_len: n[2],
                sequences: n.get(3).copied().unwrap_or(1),
            }
        })
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("gpu: bench");
        return;
    }
    let device = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("no GPU: {e}");
            return;
        }
    };
    println!("{}\n", device.name());
    if std::env::args().any(|a| a == "--batches") {
        batches(&device);
        return;
    }
    if std::env::args().any(|a| a == "--host") {
        host_path(&device);
        return;
    }
    println!("| # | H | D | L | call ms | back-to-back ms | TFLOP/s | % of limit | host call ms | max error |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // Custom shapes alone, unless seed shapes are named too.
    let custom = custom_shapes();
    let seed_shapes = if custom.is_empty() || std::env::args().skip(1).any(|a| !a.starts_with('-')) {
        selection().into_iter().map(|i| SEED_SHAPES[i]).collect()
    } else {
        Vec::new()
    };
    for shape in seed_shapes.into_iter().chain(custom) {
        let index = shape.index;
        let [q, k, v] = shape.random_inputs::<bf16>(index as u64);
        let cu = shape.cu_seqlens();
        let dims = [shape.tokens(), shape.num_heads, shape.head_dim];
        let upload = |a: &ndarray::Array3<bf16>| device.upload(a.as_slice().unwrap()).unwrap();
        let (qd, kd, vd) = (upload(&q), upload(&k), upload(&v));
        let mut out = device.zeros::<bf16>(q.len()).unwrap();
        let params = Params::default();
        let mut run = || {
            forward_device(
                &device,
                DeviceTensor::new(&qd, dims)?,
                DeviceTensor::new(&kd, dims)?,
                DeviceTensor::new(&vd, dims)?,
                &cu,
                &cu,
                &params,
                DeviceTensorMut::new(&mut out, dims)?,
                None,
            )
        };
        // VARLEN_ATTN_BENCH_REPEATS=n runs n calls per timing (few, under a profiler).
        let repeats = if let Some(n) = std::env::var("VARLEN_ATTN_BENCH_REPEATS").ok().and_then(|n| n.parse().ok()) {
            n
        } else if shape.flops() > 1e12 {
            5
        } else if shape.flops() > 1e10 {
            20
        } else {
            100
        };
        for _ in 0..3 {
            run().unwrap();
        }
        device.synchronize().unwrap();
        let mut times: Vec<f32> = (0..repeats).map(|_| device.time_ms(&mut run).unwrap()).collect();
        times.sort_by(f32::total_cmp);
        let kernel_ms = times[times.len() / 2] as f64;
        // Back to back: the average of `repeats` calls between two events (launch gaps hidden).
        let batch_ms = device
            .time_ms(&mut || {
                for _ in 0..repeats {
                    run()?;
                }
                Ok(())
            })
            .unwrap() as f64
            / repeats as f64;

        let got = ndarray::Array3::from_shape_vec((dims[0], dims[1], dims[2]), device.download(&out).unwrap()).unwrap();
        let rows: Vec<usize> = (0..shape.tokens()).step_by(shape.tokens().div_ceil(8).max(1)).collect();
        let reference = oracle::reference_rows(q.view(), k.view(), v.view(), &cu, &cu, &params, &rows).unwrap();
        let report = reference.compare(got.view());

        let host = Params { backend: Backend::Gpu, ..Params::default() };
        let start = Instant::now();
        varlen_attn::forward(q.view(), k.view(), v.view(), &cu, &cu, &host).unwrap();
        let host_ms = start.elapsed().as_secs_f64() * 1e3;

        let scores = (shape.seq_len * shape.seq_len * shape.num_heads * shape.sequences) as f64;
        let limit_ms = (shape.flops() / 790e12).max(scores / 4.18e12) * 1e3;
        println!(
            "| {} | {} | {} | {} | {:.4} | {:.4} | {:.1} | {:.1} | {:.2} | {:.1e}{} |",
            index,
            shape.num_heads,
            shape.head_dim,
            shape.seq_len,
            kernel_ms,
            batch_ms,
            shape.flops() / batch_ms.min(kernel_ms) / 1e9,
            100.0 * limit_ms / batch_ms.min(kernel_ms),
            host_ms,
            report.max_abs_error,
            if report.worst.is_some() { " OUT OF TOLERANCE" } else { "" }
        );
    }
}

/// Vision batches (`benches/peers/torch_gpu_batches.py` times the same): label, query heads, kv heads,
/// head_dim, sequence lengths.
fn batch_cases() -> Vec<(&'static str, usize, usize, usize, Vec<usize>)> {
    let mixed = vec![720, 1200, 276, 3844, 64, 1, 2116, 1012, 600];
    vec![
        ("64 images x 256", 16, 16, 72, vec![256; 64]),
        ("16 images x 1024", 16, 16, 72, vec![1024; 16]),
        ("mixed 9 images", 16, 16, 72, mixed.clone()),
        ("GQA 32/8 x 128", 32, 8, 128, vec![16742, 500, 3000, 1]),
        ("mixed, head_dim 80", 16, 16, 80, mixed.clone()),
        ("mixed, head_dim 64", 16, 16, 64, mixed),
        ("256 images x 64", 16, 16, 72, vec![64; 256]),
        // Throughput against batch size: the same 1,024-token image, N times.
        ("64 images x 1024", 16, 16, 72, vec![1024; 64]),
        ("256 images x 1024", 16, 16, 72, vec![1024; 256]),
        ("1024 images x 1024", 16, 16, 72, vec![1024; 1024]),
        ("2200 images x 1024", 16, 16, 72, vec![1024; 2200]),
    ]
}

/// Back-to-back kernel time of each batch: cu_seqlens from the host and on the device.
fn batches(device: &Device) {
    println!("| batch | Hq/Hkv | D | tokens | host cu_seqlens ms | device cu_seqlens ms | TFLOP/s | max error |");
    println!("|---|---|---|---|---|---|---|---|");
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let chosen = |label: &str| filter.as_ref().is_none_or(|f| f.split(',').any(|part| label.contains(part)));
    for (label, heads, kv_heads, dim, lengths) in batch_cases().into_iter().filter(|case| chosen(case.0)) {
        let tokens: usize = lengths.iter().sum();
        let cu: Vec<i32> = std::iter::once(0)
            .chain(lengths.iter().scan(0i32, |s, &l| {
                *s += l as i32;
                Some(*s)
            }))
            .collect();
        let (q, k, v) = (
            repeated_random(tokens * heads * dim, tokens as u64),
            repeated_random(tokens * kv_heads * dim, tokens as u64 + 1),
            repeated_random(tokens * kv_heads * dim, tokens as u64 + 2),
        );
        let (qd, kd, vd) = (device.upload(&q).unwrap(), device.upload(&k).unwrap(), device.upload(&v).unwrap());
        let cu_device = device.upload(&cu).unwrap();
        let mut out = device.zeros::<bf16>(q.len()).unwrap();
        let (qs, ks) = ([tokens, heads, dim], [tokens, kv_heads, dim]);
        let params = Params::default();
        let mut host = || {
            forward_device(
                device,
                DeviceTensor::new(&qd, qs)?,
                DeviceTensor::new(&kd, ks)?,
                DeviceTensor::new(&vd, ks)?,
                &cu,
                &cu,
                &params,
                DeviceTensorMut::new(&mut out, qs)?,
                None,
            )
        };
        let flops = 4.0 * lengths.iter().map(|&l| (l * l) as f64).sum::<f64>() * (heads * dim) as f64;
        let repeats = if flops > 1e12 { 10 } else { 100 };
        let back_to_back = |run: &mut dyn FnMut() -> Result<(), varlen_attn::Error>| {
            for _ in 0..3 {
                run().unwrap();
            }
            device
                .time_ms(&mut || {
                    for _ in 0..repeats {
                        run()?;
                    }
                    Ok(())
                })
                .unwrap() as f64
                / repeats as f64
        };
        let host_ms = back_to_back(&mut host);
        let mut on_device = || {
            forward_device_seqlens(
                device,
                DeviceTensor::new(&qd, qs)?,
                DeviceTensor::new(&kd, ks)?,
                DeviceTensor::new(&vd, ks)?,
                &cu_device,
                &cu_device,
                &params,
                DeviceTensorMut::new(&mut out, qs)?,
                None,
            )
        };
        let device_ms = back_to_back(&mut on_device);
        device.check_seqlens().unwrap();
        let got = ndarray::Array3::from_shape_vec((tokens, heads, dim), device.download(&out).unwrap()).unwrap();
        fn view(x: &[bf16], shape: (usize, usize, usize)) -> ndarray::ArrayView3<'_, bf16> {
            ndarray::ArrayView3::from_shape(shape, x).unwrap()
        }
        let (q_shape, kv_shape) = ((tokens, heads, dim), (tokens, kv_heads, dim));
        let rows: Vec<usize> = (0..tokens).step_by(tokens.div_ceil(16).max(1)).collect();
        let reference =
            oracle::reference_rows(view(&q, q_shape), view(&k, kv_shape), view(&v, kv_shape), &cu, &cu, &params, &rows)
                .unwrap();
        let report = reference.compare(got.view());
        println!(
            "| {label} | {heads}/{kv_heads} | {dim} | {tokens} | {host_ms:.4} | {device_ms:.4} | {:.1} | {:.1e}{} |",
            flops / host_ms.min(device_ms) / 1e9,
            report.max_abs_error,
            if report.worst.is_some() { " OUT OF TOLERANCE" } else { "" }
        );
    }
}

/// `n` pseudo-random bf16 values in [-1, 1): up to 2^24 drawn, then repeated (the largest
/// problems hold billions of elements, which one host thread would take minutes to draw).
fn repeated_random(n: usize, seed: u64) -> Vec<bf16> {
    let mut state = 0x2545_F491_4F6C_DD1Du64 ^ seed;
    let mut values: Vec<bf16> = (0..n.min(1 << 24))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bf16::from_f32((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect();
    let drawn = values.len();
    while values.len() < n {
        values.extend_from_within(..(n - values.len()).min(drawn));
    }
    values
}

/// The host-array call (`forward`, `Backend::Gpu`) end to end against its kernel alone.
fn host_path(device: &Device) {
    println!("| shape | MB moved | kernel ms | first call ms | host call ms (median of 5) | GB/s moved |");
    println!("|---|---|---|---|---|---|");
    let images = Shape { index: 100, num_heads: 16, head_dim: 72, seq_len: 1024, sequences: 1024 };
    for shape in [SEED_SHAPES[4], SEED_SHAPES[9], images] {
        let dims = [shape.tokens(), shape.num_heads, shape.head_dim];
        let elements = dims.iter().product::<usize>();
        let array = |seed| ndarray::Array3::from_shape_vec(dims, repeated_random(elements, seed)).unwrap();
        let (q, k, v) = (array(1), array(2), array(3));
        let cu = shape.cu_seqlens();
        let kernel_ms = {
            let upload = |a: &ndarray::Array3<bf16>| device.upload(a.as_slice().unwrap()).unwrap();
            let (qd, kd, vd) = (upload(&q), upload(&k), upload(&v));
            let mut out = device.zeros::<bf16>(elements).unwrap();
            let mut run = || {
                forward_device(
                    device,
                    DeviceTensor::new(&qd, dims)?,
                    DeviceTensor::new(&kd, dims)?,
                    DeviceTensor::new(&vd, dims)?,
                    &cu,
                    &cu,
                    &Params::default(),
                    DeviceTensorMut::new(&mut out, dims)?,
                    None,
                )
            };
            run().unwrap();
            let mut times: Vec<f32> = (0..5).map(|_| device.time_ms(&mut run).unwrap()).collect();
            times.sort_by(f32::total_cmp);
            times[2] as f64
        };
        let host = Params { backend: Backend::Gpu, ..Params::default() };
        let mut out = ndarray::Array3::<bf16>::zeros(dims);
        let mut call = || {
            let start = Instant::now();
            varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &host, out.view_mut()).unwrap();
            start.elapsed().as_secs_f64() * 1e3
        };
        let first_ms = call();
        let mut times: Vec<f64> = (0..5).map(|_| call()).collect();
        times.sort_by(f64::total_cmp);
        let bytes = 4.0 * elements as f64 * 2.0;
        println!(
            "| {} x {} x {}{} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} |",
            shape.num_heads,
            shape.head_dim,
            shape.seq_len,
            if shape.sequences > 1 { format!(" x {}", shape.sequences) } else { String::new() },
            bytes / 1e6,
            kernel_ms,
            first_ms,
            times[2],
            bytes / (times[2] - kernel_ms) / 1e6,
        );
    }
}

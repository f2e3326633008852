//! GPU timings of the seed's shapes: kernel time from device events around `forward_device`
//! (inputs already on the GPU): the median of single calls, and the average of back-to-back
//! calls between two events (launch gaps hidden, as a profiler's kernel time); TFLOP/s (from
//! the faster of the two) and the fraction of the
//! card's limit (the larger of FLOP / 790 TFLOP/s, the bf16 matrix rate measured on an H200, and
//! scores / 4.18e12 exp/s, as in `shapes.md`); plus the host-array call (`forward` with
//! `Backend::Gpu`, copies included) by wall clock, and the error against the f64 oracle on
//! sampled rows.
//!
//! `../shared/tools/gpu-bundle bench --bench gpu`, then on the GPU machine
//! `bash .gpu-bin/run-all.sh [shapes, e.g. 0-20]`. Prints a markdown table.

use half::bf16;
use std::time::Instant;
use varlen_attn::gpu::{forward_device, Device, DeviceTensor, DeviceTensorMut};
use varlen_attn::{internal::workloads::SEED_SHAPES, oracle, Backend, Params};

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
    println!("| # | H | D | L | call ms | back-to-back ms | TFLOP/s | % of limit | host call ms | max error |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for index in selection() {
        let shape = SEED_SHAPES[index];
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

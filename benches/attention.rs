//! Criterion benchmarks of the CPU forward pass on the seed's shapes (throughput reported in
//! FLOP/s: criterion's "elements" are floating-point operations), plus 1-vs-2-thread scaling.
//!
//! `cargo bench --bench attention` runs every shape up to `VARLEN_BENCH_MAX_FLOP` (default
//! 2e11, so the run stays in minutes on 2 cores); `-- shape/0` picks one.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use ndarray::Array3;
use std::time::Duration;
use varlen_attn::{internal::workloads::SEED_SHAPES, Backend, Params};

fn max_flop() -> f64 {
    std::env::var("VARLEN_BENCH_MAX_FLOP").ok().and_then(|s| s.parse().ok()).unwrap_or(2e11)
}

fn seed_shapes(c: &mut Criterion) {
    let params = Params { backend: Backend::Cpu, ..Params::default() };
    let mut group = c.benchmark_group("shape");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for shape in SEED_SHAPES.iter().filter(|s| s.flops() <= max_flop()) {
        let [q, k, v] = shape.random_inputs::<bf16>(shape.index as u64);
        let cu = shape.cu_seqlens();
        let mut out = Array3::<bf16>::default((shape.tokens(), shape.num_heads, shape.head_dim));
        group.throughput(Throughput::Elements(shape.flops() as u64));
        group.bench_function(BenchmarkId::from_parameter(shape.index), |b| {
            b.iter(|| {
                varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut()).unwrap()
            })
        });
    }
    group.finish();
}

fn thread_scaling(c: &mut Criterion) {
    let params = Params { backend: Backend::Cpu, ..Params::default() };
    let mut group = c.benchmark_group("threads");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for index in [2, 14] {
        let shape = SEED_SHAPES[index];
        let [q, k, v] = shape.random_inputs::<bf16>(index as u64);
        let cu = shape.cu_seqlens();
        let mut out = Array3::<bf16>::default((shape.tokens(), shape.num_heads, shape.head_dim));
        group.throughput(Throughput::Elements(shape.flops() as u64));
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            group.bench_function(BenchmarkId::new(format!("shape{index}"), threads), |b| {
                b.iter(|| {
                    pool.install(|| {
                        varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut())
                            .unwrap()
                    })
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, seed_shapes, thread_scaling);
criterion_main!(benches);

//! Runs one seed shape repeatedly (for profilers) and prints its fastest call: `cargo run --release --example profile_shape -- 3 20`.
use half::bf16;
use ndarray::Array3;
use varlen_attn::{internal::workloads::SEED_SHAPES, Params};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let shape = SEED_SHAPES[args.first().copied().unwrap_or(3)];
    let repeats = args.get(1).copied().unwrap_or(10);
    let [q, k, v] = shape.random_inputs::<bf16>(1);
    let cu = shape.cu_seqlens();
    let mut out = Array3::<bf16>::default((shape.tokens(), shape.num_heads, shape.head_dim));
    let params = Params::default();
    // The fastest call: on a shared machine the others mostly measure the neighbours.
    let mut t = f64::INFINITY;
    for _ in 0..repeats {
        let start = std::time::Instant::now();
        varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut()).unwrap();
        t = t.min(start.elapsed().as_secs_f64());
    }
    println!("shape {}: {:.3} ms, {:.1} GFLOP/s", shape.index, t * 1e3, shape.flops() / t / 1e9);
}

//! A batch of `n` images of `len` tokens each (16 heads × 72, bf16) on the CPU, its fastest of
//! ten calls: `cargo run --release --example cpu_batch -- 64 256`. PyTorch's side:
//! `benches/peers/torch_cpu_batches.py` (BENCHMARKS.md has both).
use half::bf16;
use ndarray::Array3;
use varlen_attn::Params;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("two numbers: images, tokens")).collect();
    let (n, len) = (args.first().copied().unwrap_or(64), args.get(1).copied().unwrap_or(256));
    let (heads, d, tokens) = (16, 72, n * len);
    let mut state = 1u64;
    let mut random = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        bf16::from_f32((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
    };
    let q = Array3::from_shape_simple_fn((tokens, heads, d), &mut random);
    let k = Array3::from_shape_simple_fn((tokens, heads, d), &mut random);
    let v = Array3::from_shape_simple_fn((tokens, heads, d), &mut random);
    let cu: Vec<i32> = (0..=n).map(|i| (i * len) as i32).collect();
    let mut out = Array3::<bf16>::default((tokens, heads, d));
    let flops = 4.0 * (n * len * len * d * heads) as f64;
    // The fastest call: on a shared machine the others mostly measure the neighbours.
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let start = std::time::Instant::now();
        varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &Params::default(), out.view_mut()).unwrap();
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!("{n} x {len}: {:.2} ms, {:.1} GFLOP/s", best * 1e3, flops / best / 1e9);
}

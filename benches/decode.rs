//! Decode on the CPU: one query token per sequence against long contexts in a paged cache
//! (vLLM's decode step), beside the machine's memory bandwidth measured in the same run
//! (STREAM-style copy and read of 512 MiB on every thread of the pool).
//!
//! `cargo bench --bench decode` (`RAYON_NUM_THREADS` sets the threads).

use half::bf16;
use ndarray::{Array2, Array3, Array4};
use rayon::prelude::*;
use std::time::Instant;
use varlen_attn::{forward_paged_into, Backend, PagedKv, Params};

/// The best of `runs` timings of `f`, in seconds.
fn best(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("decode: bench");
        return;
    }
    let threads = rayon::current_num_threads();
    // Bandwidth: a parallel copy (bytes read + written) and a parallel sum (bytes read).
    let n = 64 << 20;
    let source = vec![1u64; n];
    let mut target = vec![0u64; n];
    let copy = best(5, || {
        target.par_chunks_mut(1 << 16).zip(source.par_chunks(1 << 16)).for_each(|(t, s)| t.copy_from_slice(s))
    });
    let read = best(5, || {
        std::hint::black_box(
            source.par_chunks(1 << 16).map(|c| c.iter().fold(0u64, |a, &x| a ^ x)).reduce(|| 0, |a, b| a ^ b),
        );
    });
    let copy_gbs = 2.0 * (n * 8) as f64 / copy / 1e9;
    let read_gbs = (n * 8) as f64 / read / 1e9;
    println!("{threads} threads; copy {copy_gbs:.1} GB/s (read + write), read {read_gbs:.1} GB/s\n");
    println!("| batch x context | Hq/Hkv x D | block | ms | K+V GB/s | % of read bandwidth |");
    println!("|---|---|---|---|---|---|");
    for (batch, context, heads, kv_heads, d, block) in
        [(8, 8192, 32, 8, 128, 32), (1, 32768, 32, 8, 128, 16), (32, 2048, 32, 8, 128, 16), (8, 8192, 16, 16, 72, 32)]
    {
        let blocks_per = context / block;
        let value = |i: usize| bf16::from_f32((i % 17) as f32 / 17.0 - 0.5);
        let k_cache = Array4::from_shape_fn((batch * blocks_per, block, kv_heads, d), |(b, s, h, e)| {
            value(b * 7 + s * 3 + h + e)
        });
        let v_cache =
            Array4::from_shape_fn((batch * blocks_per, block, kv_heads, d), |(b, s, h, e)| value(b + s * 5 + h + e));
        // Blocks of each sequence scattered over the cache, as an allocator leaves them.
        let table =
            Array2::from_shape_fn((batch, blocks_per), |(b, e)| ((e * batch + b) % (batch * blocks_per)) as i32);
        let q = Array3::from_shape_fn((batch, heads, d), |(t, h, e)| value(t + h * 5 + e));
        let cu_q: Vec<i32> = (0..=batch as i32).collect();
        let cu_k: Vec<i32> = (0..=batch).map(|s| (s * context) as i32).collect();
        let kv = PagedKv { k_cache: k_cache.view(), v_cache: v_cache.view(), block_table: table.view() };
        let params = Params { backend: Backend::Cpu, causal: true, ..Params::default() };
        let mut out = Array3::from_elem((batch, heads, d), bf16::ZERO);
        let seconds = best(10, || forward_paged_into(q.view(), &kv, &cu_q, &cu_k, &params, out.view_mut()).unwrap());
        let bytes = (2 * batch * context * kv_heads * d * 2) as f64;
        let gbs = bytes / seconds / 1e9;
        println!(
            "| {batch} x {context} | {heads}/{kv_heads} x {d} | {block} | {:.2} | {gbs:.1} | {:.0}% |",
            seconds * 1e3,
            100.0 * gbs / read_gbs
        );
    }
}

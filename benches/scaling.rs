//! CPU time against sequence length for H = 16, D = 72 (the seed's vision-tower heads), one
//! sequence, bf16, L from 256 to 65 556: the L² slope with no cliffs. Prints CSV
//! (`L,milliseconds,GFLOP/s`); `tools/plot_scaling.py` turns it into `docs/cpu-scaling.png`.
//!
//! `cargo bench --bench scaling > scaling.csv` (about two minutes on 2 cores).

use half::bf16;
use ndarray::Array3;
use std::time::Instant;
use varlen_attn::{internal::workloads::Shape, Backend, Params};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("scaling: bench");
        return;
    }
    let params = Params { backend: Backend::Cpu, ..Params::default() };
    println!("L,milliseconds,gflops");
    for length in
        [256, 362, 512, 724, 1024, 1448, 2048, 2896, 4096, 5793, 8192, 11585, 16384, 23170, 32768, 46341, 65556]
    {
        let shape = Shape { index: 0, num_heads: 16, head_dim: 72, seq_len: length, sequences: 1 };
        let [q, k, v] = shape.random_inputs::<bf16>(length as u64);
        let cu = shape.cu_seqlens();
        let mut out = Array3::<bf16>::default((length, 16, 72));
        let repeats = if shape.flops() > 1e12 {
            1
        } else if shape.flops() > 1e10 {
            3
        } else {
            9
        };
        // Warm up for 0.3 s (threads, scratch, clocks and the matrix units come up to speed).
        let warm_up = Instant::now();
        varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut()).unwrap();
        while warm_up.elapsed().as_secs_f64() < 0.3 {
            varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut()).unwrap();
        }
        let mut times: Vec<f64> = (0..repeats)
            .map(|_| {
                let start = Instant::now();
                varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut()).unwrap();
                start.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let t = times[times.len() / 2];
        println!("{length},{:.4},{:.1}", t * 1e3, shape.flops() / t / 1e9);
    }
}

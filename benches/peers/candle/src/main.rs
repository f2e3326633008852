//! varlen-attn's candle call against candle-nn 0.11's `flash_attn_varlen_cpu` (f32, f16) and
//! against the unfused per-image loop candle's Qwen3-VL vision tower runs (bf16), on the same
//! candle tensors, side by side. Prints a markdown table.
//!
//! `cargo run --release --manifest-path benches/peers/candle/Cargo.toml [-- --quick]`

use candle_core::{DType, Device, Tensor};
use std::time::Instant;

/// The unfused loop: per image, `softmax(q kᵀ · scale) v` in f32 on `[heads, len, dim]`.
fn unfused(q: &Tensor, k: &Tensor, v: &Tensor, cu: &[u32], scale: f64) -> candle_core::Result<Tensor> {
    let mut outputs = Vec::new();
    for w in cu.windows(2) {
        let (start, len) = (w[0] as usize, (w[1] - w[0]) as usize);
        let slice = |t: &Tensor| t.narrow(0, start, len)?.transpose(0, 1)?.to_dtype(DType::F32)?.contiguous();
        let (qi, ki, vi) = (slice(q)?, slice(k)?, slice(v)?);
        let scores = (qi.matmul(&ki.t()?)? * scale)?;
        let p = candle_nn::ops::softmax_last_dim(&scores)?;
        outputs.push(p.matmul(&vi)?.transpose(0, 1)?.to_dtype(q.dtype())?);
    }
    Tensor::cat(&outputs, 0)
}

/// Best wall time of `runs` calls (at least one), in seconds.
fn time(runs: usize, mut f: impl FnMut() -> candle_core::Result<Tensor>) -> candle_core::Result<(f64, Tensor)> {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        out = Some(f()?);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok((best, out.expect("ran")))
}

fn max_difference(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

fn main() -> candle_core::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    // (label, heads, lengths): seed shapes 0, 2, 11, 14 and a mixed batch of images.
    let cases: [(&str, usize, Vec<u32>); 5] = [
        ("shape 0", 16, vec![720]),
        ("shape 2", 16, vec![2116]),
        ("shape 11", 4, vec![276]),
        ("shape 14", 4, vec![2024]),
        ("mixed 6 images", 16, vec![720, 1200, 276, 64, 1, 600]),
    ];
    let dim = 72;
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into());
    println!("head_dim {dim}, RAYON_NUM_THREADS={threads}; best of 3 calls (1 where a call takes over 2 s)\n");
    println!("| case | dtype | candle-nn ms | unfused loop ms | ours ms | speed-up | ours GFLOP/s | max difference |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, heads, lengths) in cases {
        if quick && lengths.iter().sum::<u32>() > 1000 {
            continue;
        }
        let tokens: u32 = lengths.iter().sum();
        let cu: Vec<u32> = std::iter::once(0)
            .chain(lengths.iter().scan(0, |s, &l| {
                *s += l;
                Some(*s)
            }))
            .collect();
        let flops = 4.0 * lengths.iter().map(|&l| (l as f64).powi(2)).sum::<f64>() * (heads * dim) as f64;
        let longest = *lengths.iter().max().expect("one") as usize;
        let base = Tensor::randn(0f32, 1.0, (tokens as usize, 3, heads, dim), &Device::Cpu)?;
        let scale = (dim as f64).powf(-0.5);
        let (cu_t, len_t) = (Tensor::new(cu.as_slice(), &Device::Cpu)?, Tensor::new(lengths.as_slice(), &Device::Cpu)?);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let qkv = base.to_dtype(dtype)?;
            let part = |i| qkv.narrow(1, i, 1)?.squeeze(1)?.contiguous();
            let (q, k, v) = (part(0)?, part(1)?, part(2)?);
            let ours = || {
                varlen_attn::candle::flash_attn_varlen(&q, &k, &v, &cu_t, &cu_t, longest, longest, scale as f32, false)
            };
            let (ours_s, ours_out) = time(3, ours)?;
            let (theirs, theirs_s, theirs_out) = if dtype == DType::BF16 {
                // candle-nn's fused call refuses bf16: the unfused loop, as Qwen3-VL runs it.
                let (s, out) = time(3, || unfused(&q, &k, &v, &cu, scale))?;
                ("unfused", s, out)
            } else {
                let call = || {
                    candle_nn::attention::flash_attn_varlen_cpu(
                        &q,
                        &k,
                        &v,
                        None,
                        &len_t,
                        &len_t,
                        longest,
                        longest,
                        scale as f32,
                        false,
                        None,
                        None,
                    )
                };
                let (first, out) = time(1, call)?;
                let (s, out) = if first > 2.0 { (first, out) } else { time(3, call)? };
                ("candle-nn", s, out)
            };
            let (nn, loop_) = if theirs == "candle-nn" {
                (format!("{:.1}", theirs_s * 1e3), "-".into())
            } else {
                ("refuses bf16".into(), format!("{:.1}", theirs_s * 1e3))
            };
            println!(
                "| {label} | {dtype:?} | {nn} | {loop_} | {:.1} | {:.1}x | {:.1} | {:.1e} |",
                ours_s * 1e3,
                theirs_s / ours_s,
                flops / ours_s / 1e9,
                max_difference(&ours_out, &theirs_out)?
            );
        }
    }
    Ok(())
}

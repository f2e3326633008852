//! A Qwen3-VL-style vision attention block on candle tensors: several images of different sizes
//! packed into one batch (16 heads × 72), computed the way candle's model does it today (a loop
//! over the images, each an f32 matmul, softmax, matmul) and with one `varlen_attn::candle`
//! call. Prints both times and the largest difference.
//!
//! `cargo run --release --features candle --example candle_vision_attention [tokens per image…]`;
//! with `--features candle-cuda` and `--cuda`, on candle's CUDA device 0 (both ways on the GPU).

use candle_core::{DType, Device, Tensor, D};
use std::time::Instant;

/// candle's unfused loop: per image, `softmax(q kᵀ · scale) v` in f32 on `[heads, len, dim]`.
fn attention_per_image(q: &Tensor, k: &Tensor, v: &Tensor, cu: &[u32], scale: f64) -> candle_core::Result<Tensor> {
    let mut outputs = Vec::with_capacity(cu.len() - 1);
    for window in cu.windows(2) {
        let (start, len) = (window[0] as usize, (window[1] - window[0]) as usize);
        let slice = |t: &Tensor| t.narrow(0, start, len)?.transpose(0, 1)?.to_dtype(DType::F32)?.contiguous();
        let (qi, ki, vi) = (slice(q)?, slice(k)?, slice(v)?);
        let scores = (qi.matmul(&ki.t()?)? * scale)?;
        // The softmax over the keys, as candle_nn::ops::softmax_last_dim computes it.
        let shifted = scores.broadcast_sub(&scores.max_keepdim(D::Minus1)?)?.exp()?;
        let probabilities = shifted.broadcast_div(&shifted.sum_keepdim(D::Minus1)?)?;
        outputs.push(probabilities.matmul(&vi)?.transpose(0, 1)?.to_dtype(q.dtype())?);
    }
    Tensor::cat(&outputs, 0)
}

/// The best wall time of `runs` calls, each waited for on `device`.
fn best_of<T>(
    device: &Device,
    runs: usize,
    mut f: impl FnMut() -> candle_core::Result<T>,
) -> candle_core::Result<(f64, T)> {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let value = f()?;
        device.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
        last = Some(value);
    }
    Ok((best, last.expect("runs > 0")))
}

fn main() -> candle_core::Result<()> {
    let mut images: Vec<u32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let device = if std::env::args().any(|a| a == "--cuda") { Device::new_cuda(0)? } else { Device::Cpu };
    if images.is_empty() {
        images = vec![720, 1200, 276, 64, 1, 600];
    }
    let (heads, dim) = (16, 72);
    let cu: Vec<u32> =
        std::iter::once(0).chain(images.iter().scan(0, |sum, &l| Some(*sum + l).inspect(|s| *sum = *s))).collect();
    let tokens = *cu.last().expect("not empty") as usize;
    let qkv = Tensor::randn(0f32, 1.0, (tokens, 3, heads, dim), &device)?.to_dtype(DType::BF16)?;
    // Views into one packed qkv tensor, as the vision block's projection leaves them.
    let (q, k, v) =
        (qkv.narrow(1, 0, 1)?.squeeze(1)?, qkv.narrow(1, 1, 1)?.squeeze(1)?, qkv.narrow(1, 2, 1)?.squeeze(1)?);
    let scale = (dim as f64).powf(-0.5);
    let cu_tensor = Tensor::new(cu.as_slice(), &device)?;
    let longest = *images.iter().max().expect("not empty") as usize;

    let (looped_s, looped) = best_of(&device, 3, || attention_per_image(&q, &k, &v, &cu, scale))?;
    let (ours_s, ours) = best_of(&device, 3, || {
        varlen_attn::candle::flash_attn_varlen(
            &q,
            &k,
            &v,
            &cu_tensor,
            &cu_tensor,
            longest,
            longest,
            scale as f32,
            false,
        )
    })?;
    let difference = (looped.to_dtype(DType::F32)? - ours.to_dtype(DType::F32)?)?.abs()?.flatten_all()?.max(0)?;
    let flops = 4.0 * images.iter().map(|&l| (l as f64).powi(2)).sum::<f64>() * (heads * dim) as f64;
    let on = if device.is_cpu() { format!("{} threads", rayon_threads()) } else { format!("{device:?}") };
    println!("images {images:?}, {heads} heads x {dim}, bf16, {on}");
    println!(
        "candle loop (f32 matmul + softmax per image): {:9.3} ms  {:6.1} GFLOP/s",
        looped_s * 1e3,
        flops / looped_s / 1e9
    );
    println!(
        "varlen_attn::candle::flash_attn_varlen:       {:9.3} ms  {:6.1} GFLOP/s",
        ours_s * 1e3,
        flops / ours_s / 1e9
    );
    println!("speed-up {:.1}x, max |difference| {}", looped_s / ours_s, difference.to_scalar::<f32>()?);
    Ok(())
}

fn rayon_threads() -> String {
    std::env::var("RAYON_NUM_THREADS")
        .unwrap_or_else(|_| format!("{}", std::thread::available_parallelism().map_or(1, |n| n.get())))
}

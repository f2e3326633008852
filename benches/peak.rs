//! The machine's arithmetic peaks, the denominators of every "% of peak" figure: AMX
//! `tdpbf16ps`, `vdpbf16ps` (bf16 dot product, AVX-512 BF16) and f32 FMA, on 1 and 2 threads.
//!
//! `cargo bench --bench peak`

use std::time::Duration;
use varlen_attn::internal::{measure_peak, PeakUnit};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("peak: bench");
        return;
    }
    println!("{:<12} {:>8} {:>12}", "unit", "threads", "GFLOP/s");
    for unit in [PeakUnit::AmxBf16, PeakUnit::Bf16Dot, PeakUnit::F32Fma, PeakUnit::F32FmaAvx2] {
        for threads in [1, 2] {
            match measure_peak(unit, threads, Duration::from_millis(500)) {
                Some(flops) => println!("{:<12} {:>8} {:>12.1}", format!("{unit:?}"), threads, flops / 1e9),
                None => println!("{:<12} {:>8} {:>12}", format!("{unit:?}"), threads, "n/a"),
            }
        }
    }
}

//! Microbenchmarks of the CPU's arithmetic peak, so attention throughput can be reported as a
//! fraction of what the machine can do.
//!
//! Each thread runs a loop of independent accumulator chains (enough to cover the latency of
//! every FMA pipe) with no memory traffic; the rate is total FLOP over the slowest thread's
//! time.

use pulp::{Simd, WithSimd};
use std::time::{Duration, Instant};

/// The arithmetic unit to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeakUnit {
    /// `vdpbf16ps` on 512-bit registers: 32 bf16 products and 32 additions per instruction.
    Bf16Dot,
    /// f32 fused multiply-add on the widest registers pulp dispatches to.
    F32Fma,
    /// f32 fused multiply-add on AVX2's 256-bit registers: the peak of the `avx2` path, also on
    /// CPUs whose widest registers are AVX-512's.
    F32FmaAvx2,
    /// AMX `tdpbf16ps` on 16×16 tiles (16 384 FLOP per instruction), operands in tiles.
    AmxBf16,
}

/// Independent accumulators per thread: 2 FMA pipes × 4-5 cycles latency, with room to spare.
const CHAINS: usize = 24;
/// Inner iterations between clock reads.
const BATCH: usize = 20_000;

/// Measures the peak FLOP/s of `unit` on `threads` threads for about `duration`; `None` when
/// this CPU lacks the unit.
///
/// ```
/// use std::time::Duration;
/// use varlen_attn::internal::{measure_peak, PeakUnit};
/// let fma = measure_peak(PeakUnit::F32Fma, 1, Duration::from_millis(20)).unwrap();
/// assert!(fma > 1e8);
/// ```
pub fn measure_peak(unit: PeakUnit, threads: usize, duration: Duration) -> Option<f64> {
    let per_batch: fn() -> f64 = match unit {
        PeakUnit::Bf16Dot if bf16_dot_available() => bf16_dot_batch_checked,
        PeakUnit::Bf16Dot => return None,
        PeakUnit::F32Fma => || pulp::Arch::new().dispatch(FmaBatch),
        #[cfg(target_arch = "x86_64")]
        PeakUnit::F32FmaAvx2 if pulp::x86::V3::try_new().is_some() => {
            || pulp::x86::V3::try_new().map_or(0.0, |simd| <pulp::x86::V3 as Simd>::vectorize(simd, FmaBatch))
        }
        PeakUnit::F32FmaAvx2 => return None,
        #[cfg(target_arch = "x86_64")]
        PeakUnit::AmxBf16 if crate::cpu::amx_available() => crate::cpu::amx_peak_batch,
        PeakUnit::AmxBf16 => return None,
    };
    let threads = threads.max(1);
    let results: Vec<(f64, Duration)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || {
                    per_batch(); // warm up the clocks and the instruction cache
                    let start = Instant::now();
                    let mut flops = 0.0;
                    while start.elapsed() < duration {
                        flops += per_batch();
                    }
                    (flops, start.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("peak thread")).collect()
    });
    let flops: f64 = results.iter().map(|r| r.0).sum();
    let slowest = results.iter().map(|r| r.1).max().unwrap_or_default();
    Some(flops / slowest.as_secs_f64())
}

fn bf16_dot_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::cpu::bf16dot_available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`bf16_dot_batch`] behind the feature check.
fn bf16_dot_batch_checked() -> f64 {
    assert!(bf16_dot_available());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the features were checked just above.
    return unsafe { bf16_dot_batch() };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!()
}

/// One batch of bf16 dot products; returns its FLOP.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512 BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_dot_batch() -> f64 {
    use core::arch::x86_64::*;
    // Operands from a black box so the loop cannot be folded away.
    let a: __m512bh = core::hint::black_box(_mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3), _mm512_set1_ps(1e-3)));
    let b: __m512bh = core::hint::black_box(_mm512_cvtne2ps_pbh(_mm512_set1_ps(-1e-3), _mm512_set1_ps(1e-3)));
    let mut acc = [_mm512_setzero_ps(); CHAINS];
    for _ in 0..BATCH {
        for x in acc.iter_mut() {
            *x = _mm512_dpbf16_ps(*x, a, b);
        }
    }
    core::hint::black_box(acc);
    (BATCH * CHAINS * 64) as f64
}

/// One batch of f32 FMAs on the dispatched registers; returns its FLOP.
struct FmaBatch;

impl WithSimd for FmaBatch {
    type Output = f64;
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> f64 {
        // Leave room for the two operands among the architectural registers.
        if S::REGISTER_COUNT >= 32 {
            fma_chains::<S, CHAINS>(simd)
        } else {
            fma_chains::<S, 12>(simd)
        }
    }
}

#[inline(always)]
fn fma_chains<S: Simd, const N: usize>(simd: S) -> f64 {
    let a = core::hint::black_box(simd.splat_f32s(1.000_001));
    let b = core::hint::black_box(simd.splat_f32s(1e-7));
    let mut acc = [simd.splat_f32s(0.0); N];
    for _ in 0..BATCH {
        for x in acc.iter_mut() {
            *x = simd.mul_add_f32s(*x, a, b);
        }
    }
    core::hint::black_box(acc);
    (BATCH * N * 2 * S::F32_LANES) as f64
}

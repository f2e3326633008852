//! The CPU backend: FlashAttention's blocked online softmax, parallel over (sequence, head,
//! query block) work items with rayon.
//!
//! The instruction set is chosen once per call, here; everything below is generic over it:
//! `tile.rs` is the contract an instruction set implements, `fma.rs` the portable f32 kernel
//! (pulp: AVX-512, AVX2+FMA, NEON, scalar), `bf16dot.rs` the AVX-512 BF16 kernel, `driver.rs`
//! the blocked loop of one work item, `softmax.rs` and `math.rs` the shared online softmax.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod bf16dot;
mod driver;
mod fma;
mod math;
pub(crate) mod peak;
mod softmax;
mod tile;
mod workspace;

pub(crate) use driver::Io;

use crate::element::Element;
use crate::error::Error;
use crate::params::CpuIsa;
use crate::problem::Problem;
use driver::WorkItem;
use fma::FmaKernel;
use pulp::{Simd, WithSimd};
use rayon::prelude::*;
use tile::TileKernel;

/// Below this many multiply-adds a call runs on the calling thread: fanning out would cost
/// more than it saves.
const PARALLEL_MIN_WORK: f64 = 1.0e6;

/// The instruction set [`forward`] would use for element type `T` with `isa` (for reports).
pub(crate) fn resolved_isa<T: Element>(isa: CpuIsa) -> CpuIsa {
    if isa != CpuIsa::Auto {
        return isa;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if amx::AmxKernel::<T>::try_new().is_some() {
            return CpuIsa::Amx;
        }
        if bf16dot::Bf16DotKernel::<T>::try_new().is_some() {
            return CpuIsa::Avx512Bf16;
        }
        match pulp::Arch::new() {
            pulp::Arch::V4(_) => return CpuIsa::Avx512,
            pulp::Arch::V3(_) => return CpuIsa::Avx2,
            _ => {}
        }
    }
    CpuIsa::Scalar
}

/// Runs a validated problem on the CPU with the instruction set `isa`.
pub(crate) fn forward<T: Element>(problem: &Problem, io: Io<T>, isa: CpuIsa) -> Result<(), Error> {
    let unavailable = || Error::IsaUnavailable { isa: isa.name() };
    match isa {
        CpuIsa::Auto => {
            #[cfg(target_arch = "x86_64")]
            if let (Some(kernel), Some(simd)) = (amx::AmxKernel::<T>::try_new(), pulp::x86::V4::try_new()) {
                run(simd, kernel, problem, &io);
                return Ok(());
            }
            #[cfg(target_arch = "x86_64")]
            if let (Some(kernel), Some(simd)) = (bf16dot::Bf16DotKernel::<T>::try_new(), pulp::x86::V4::try_new()) {
                run(simd, kernel, problem, &io);
                return Ok(());
            }
            pulp::Arch::new().dispatch(Portable { problem, io: &io });
        }
        CpuIsa::Scalar => Portable { problem, io: &io }.with_simd(pulp::Scalar::new()),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx2 => Portable { problem, io: &io }.with_simd(pulp::x86::V3::try_new().ok_or_else(unavailable)?),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx512 => Portable { problem, io: &io }.with_simd(pulp::x86::V4::try_new().ok_or_else(unavailable)?),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx512Bf16 | CpuIsa::Amx => {
            if T::DTYPE != crate::DType::BF16 {
                return Err(Error::Param {
                    name: "cpu_isa",
                    value: isa.name().to_string(),
                    reason: "the bf16 kernels (avx512-bf16, amx) take bf16 input only",
                });
            }
            let simd = pulp::x86::V4::try_new().ok_or_else(unavailable)?;
            if isa == CpuIsa::Amx {
                run(simd, amx::AmxKernel::<T>::try_new().ok_or_else(unavailable)?, problem, &io);
            } else {
                run(simd, bf16dot::Bf16DotKernel::<T>::try_new().ok_or_else(unavailable)?, problem, &io);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuIsa::Avx2 | CpuIsa::Avx512 | CpuIsa::Avx512Bf16 | CpuIsa::Amx => return Err(unavailable()),
    }
    Ok(())
}

/// The portable kernel for whichever instruction set pulp dispatches to.
struct Portable<'a, 'io, T> {
    problem: &'a Problem<'a>,
    io: &'a Io<'io, T>,
}

impl<T: Element> WithSimd for Portable<'_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        run(simd, FmaKernel::new(simd), self.problem, self.io);
    }
}

/// Runs every work item of `problem`, in parallel when it is worth it.
fn run<S: Simd, T: Element, K: TileKernel<T>>(simd: S, kernel: K, problem: &Problem, io: &Io<T>) {
    let lines = driver::workspace_lines::<T, K>(problem.head_dim, problem.head_dim_v);
    let heads = problem.num_heads;
    // Work items are (sequence, head) pairs `bh`, each cut into blocks of query rows.
    let blocks = |bh: usize| problem.sequence(bh / heads).q_len.div_ceil(K::QUERY_BLOCK);
    let process = |bh: usize, block: usize| {
        let sequence = problem.sequence(bh / heads);
        let rows = block * K::QUERY_BLOCK..((block + 1) * K::QUERY_BLOCK).min(sequence.q_len);
        let item = WorkItem { sequence, head: bh % heads, rows };
        workspace::with_workspace(lines, |carver| {
            simd.vectorize(Attend { kernel, problem, io, item: &item, carver });
        })
    };
    let pairs = problem.batch() * heads;
    let work: f64 = (0..problem.batch())
        .map(|b| {
            let s = problem.sequence(b);
            (s.q_len * s.k_len) as f64
        })
        .sum::<f64>()
        * (heads * (problem.head_dim + problem.head_dim_v)) as f64;
    if work < PARALLEL_MIN_WORK || rayon::current_num_threads() == 1 {
        for bh in 0..pairs {
            (0..blocks(bh)).for_each(|block| process(bh, block));
        }
    } else {
        // Nested ranges rather than a list of items: nothing to allocate, and rayon's work
        // stealing balances sequences of very different lengths.
        (0..pairs).into_par_iter().for_each(|bh| {
            (0..blocks(bh)).into_par_iter().for_each(|block| process(bh, block));
        });
    }
}

/// One work item inside the instruction set's `target_feature` context.
struct Attend<'a, 'p, 'io, 'w, T, K> {
    kernel: K,
    problem: &'a Problem<'p>,
    io: &'a Io<'io, T>,
    item: &'a WorkItem,
    carver: &'a mut workspace::Carver<'w>,
}

impl<T: Element, K: TileKernel<T>> WithSimd for Attend<'_, '_, '_, '_, T, K> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        // SAFETY: every work item covers its own (rows, head) of the output: sequences own
        // disjoint token ranges (validated cu_seqlens), heads are distinct, and the query blocks
        // of one sequence are disjoint. No two items run on the same rows.
        unsafe { driver::attend(simd, self.kernel, self.problem, self.io, self.item, self.carver) }
    }
}

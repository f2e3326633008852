//! The CPU backend: FlashAttention's blocked online softmax, parallel over (sequence, head,
//! query block) work items with rayon.
//!
//! The instruction set is chosen once per call, here; everything below is generic over it:
//! - `tile.rs`: the contract an instruction set's kernel implements (packing, the two products,
//!   the softmax step);
//! - the kernels: `fma.rs` the portable f32 microkernel (pulp: AVX-512, AVX2+FMA, NEON,
//!   scalar), `bf16dot.rs` AVX-512 BF16 dot products, `amx.rs` AMX tiles, with `pack_bf16.rs`
//!   their bf16 packing;
//! - `driver.rs`: the blocked loop of one work item; `kv_cache.rs` K/V packed once per call;
//!   `workspace.rs` each thread's scratch;
//! - `decode.rs`: calls of few query rows per kv head (decode), which stream K and V once
//!   instead of packing them, on the instruction set's f32 vector unit;
//! - `score.rs`: raw scores to logits (scale, soft-cap, ALiBi), for every path;
//! - `softmax.rs` (f32) and `softmax_bf16.rs` (fused, bf16 probabilities) the online softmax,
//!   `math.rs` its `exp2` and `tanh`, `vector.rs` unaligned vector loads and stores;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod bf16dot;
mod decode;
mod driver;
mod fma;
mod kv_cache;
mod math;
#[cfg(target_arch = "x86_64")]
mod pack_bf16;
mod score;
mod softmax;
#[cfg(target_arch = "x86_64")]
mod softmax_bf16;
mod tile;
mod vector;
mod workspace;

pub(crate) use driver::Io;
// For the peak microbenchmarks (`internal/peak.rs`).
#[cfg(target_arch = "x86_64")]
pub(crate) use amx::{available as amx_available, peak_batch as amx_peak_batch};
#[cfg(target_arch = "x86_64")]
pub(crate) use bf16dot::available as bf16dot_available;

use crate::element::Element;
use crate::error::Error;
use crate::layout::SequenceRows;
use crate::params::CpuIsa;
use crate::problem::{Magnitudes, Problem};
use driver::WorkItem;
use fma::FmaKernel;
use pulp::{Simd, WithSimd};
use rayon::prelude::*;
use tile::TileKernel;

/// Below this many multiply-adds a call runs on the calling thread: fanning out would cost
/// more than it saves.
const PARALLEL_MIN_WORK: f64 = 1.0e6;

/// Below this many multiply-adds `Auto` prefers AVX-512 BF16 to AMX (measured: the seed's
/// L = 1 shape takes 7 µs with AVX-512 BF16 and 19 µs with AMX).
const AMX_MIN_WORK: f64 = 1.0e6;

/// Multiply-adds of the two products, counting every (query, key) pair of each sequence.
fn work(problem: &Problem) -> f64 {
    (0..problem.batch())
        .map(|b| {
            let s = problem.sequence(b);
            (s.q_len * s.k_len) as f64
        })
        .sum::<f64>()
        * (problem.num_heads * (problem.head_dim + problem.head_dim_v)) as f64
}

/// The instruction set a call with element type `T` and `isa` runs on: `isa` itself, or for
/// `Auto` the best this CPU has, AMX only where `amx_worth_it` (see [`AMX_MIN_WORK`]).
pub(crate) fn resolved_isa<T: Element>(isa: CpuIsa, amx_worth_it: bool) -> CpuIsa {
    if isa != CpuIsa::Auto {
        return isa;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if amx_worth_it && amx::AmxKernel::<T>::try_new().is_some() {
            return CpuIsa::Amx;
        }
        if bf16dot::Bf16DotKernel::<T>::try_new().is_some() {
            return CpuIsa::Avx512Bf16;
        }
        match pulp::Arch::new() {
            pulp::Arch::V4(_) => CpuIsa::Avx512,
            pulp::Arch::V3(_) => CpuIsa::Avx2,
            _ => CpuIsa::Scalar,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = (core::marker::PhantomData::<T>, amx_worth_it);
        match pulp::Arch::new() {
            pulp::Arch::Neon(_) => CpuIsa::Neon,
            _ => CpuIsa::Scalar,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (core::marker::PhantomData::<T>, amx_worth_it);
        CpuIsa::Scalar
    }
}

/// Runs a validated problem on the CPU with the instruction set `isa`.
///
/// The bf16 matrix instructions (AMX, AVX-512 BF16) flush subnormal inputs and results to
/// zero; where `magnitudes` says that could move the answer (tiny values, or tiny scores under
/// a huge scale), their calls run on the f32 kernel of the same CPU (AVX-512) instead.
pub(crate) fn forward<T: Element>(
    problem: &Problem,
    io: Io<T>,
    isa: CpuIsa,
    magnitudes: Magnitudes,
) -> Result<(), Error> {
    // Only the x86 bf16 kernels have the flush question.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = magnitudes;
    // Tiny problems skip AMX under `Auto`: configuring the tiles costs more than their work.
    let isa = resolved_isa::<T>(isa, work(problem) >= AMX_MIN_WORK);
    let unavailable = || Error::IsaUnavailable { isa: isa.name() };
    // `Some` where the streaming decode kernel ran: K's and V's largest magnitudes.
    let streamed = match isa {
        CpuIsa::Auto => unreachable!("resolved above"),
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
            let amx = amx::AmxKernel::<T>::try_new();
            let bf16dot = bf16dot::Bf16DotKernel::<T>::try_new();
            match (isa, amx, bf16dot) {
                (CpuIsa::Amx, None, _) | (CpuIsa::Avx512Bf16, _, None) => return Err(unavailable()),
                // Decode-shaped calls are bound by memory, not by the matrix units; calls the
                // flush could move need f32 products.
                _ if decode::applies(problem) || !magnitudes.bf16_products_exact => {
                    Portable { problem, io: &io }.with_simd(simd)
                }
                (CpuIsa::Amx, Some(kernel), _) => {
                    run(simd, kernel, problem, &io);
                    None
                }
                (_, _, Some(kernel)) => {
                    run(simd, kernel, problem, &io);
                    None
                }
                _ => unreachable!("every unavailable case returned above"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuIsa::Avx2 | CpuIsa::Avx512 | CpuIsa::Avx512Bf16 | CpuIsa::Amx => return Err(unavailable()),
        #[cfg(target_arch = "aarch64")]
        CpuIsa::Neon => {
            Portable { problem, io: &io }.with_simd(pulp::aarch64::Neon::try_new().ok_or_else(unavailable)?)
        }
        #[cfg(not(target_arch = "aarch64"))]
        CpuIsa::Neon => return Err(unavailable()),
    };
    // The range check the scan left to the streaming kernel.
    if let (Some(max_q), Some((max_k, max_v))) = (magnitudes.streamed_edge, streamed) {
        problem.check_streamed(max_q, max_k as f64, max_v as f64)?;
    }
    Ok(())
}

/// Whether a call runs the streaming decode kernel (`decode.rs`), which checks K's and V's
/// range as it reads them.
pub(crate) fn streams(problem: &Problem) -> bool {
    decode::applies(problem)
}

/// The portable kernel for whichever instruction set pulp dispatches to.
struct Portable<'a, 'io, T> {
    problem: &'a Problem<'a>,
    io: &'a Io<'io, T>,
}

impl<T: Element> WithSimd for Portable<'_, '_, T> {
    /// K's and V's largest finite magnitudes where the streaming decode kernel ran.
    type Output = Option<(f32, f32)>;
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> Self::Output {
        if decode::applies(self.problem) {
            Some(decode::run(simd, self.problem, self.io))
        } else {
            run(simd, FmaKernel::new(simd), self.problem, self.io);
            None
        }
    }
}

/// Upper bound on the packed K/V of one wave (unless a single sequence needs more): the
/// cached packing buffer never grows past it for ordinary inputs.
const WAVE_BYTES: usize = 64 << 20;

/// Runs every work item of `problem`, in parallel when it is worth it.
///
/// The (sequence, kv head) pairs are processed in waves whose packed K/V fits [`WAVE_BYTES`],
/// the pairs of a wave in parallel: each packs its key blocks once (in parallel), then every
/// query block of its heads streams through them.
fn run<S: Simd, T: Element, K: TileKernel<T>>(simd: S, kernel: K, problem: &Problem, io: &Io<T>) {
    let (d, dv) = (problem.head_dim, problem.head_dim_v);
    let lines = driver::workspace_lines::<T, K>(d, dv);
    let (kv_heads, group) = (problem.num_kv_heads, problem.group_size());
    let k_len = K::k_len(d);
    let slot = k_len + K::v_len(dv);
    let slot_bytes = slot * core::mem::size_of::<K::Packed>();
    let pairs = problem.batch() * kv_heads;
    let key_blocks = |pair: usize| problem.sequence(pair / kv_heads).k_len.div_ceil(K::KEY_BLOCK);
    let query_blocks = |pair: usize| problem.sequence(pair / kv_heads).q_len.div_ceil(K::QUERY_BLOCK);

    let parallel = work(problem) >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1;

    kv_cache::with_cache(|cache| {
        let mut first = 0;
        while first < pairs {
            // The wave: pairs first..last, at least one.
            let mut last = first;
            let mut blocks = 0;
            cache.offsets.clear();
            cache.offsets.push(0);
            while last < pairs && (last == first || (blocks + key_blocks(last)) * slot_bytes <= WAVE_BYTES) {
                blocks += key_blocks(last);
                cache.offsets.push(blocks);
                last += 1;
            }
            let (packed, finite, offsets) = cache.buffers::<K::Packed>(blocks * slot, blocks);

            // Pair `first + w` of the wave: its key blocks packed (in parallel), then every
            // query block of every head reading them. One parallel region per wave: a pair's
            // query blocks start as soon as its own keys are packed, with no barrier for the
            // whole wave between the two (which left threads idle on short calls).
            let pair_work = |w: usize, packed: &mut [K::Packed], finite: &mut [bool]| {
                let pair = first + w;
                let sequence = problem.sequence(pair / kv_heads);
                let head = pair % kv_heads;
                let pack = |block: usize, slot_data: &mut [K::Packed], finite: &mut bool| {
                    let start = block * K::KEY_BLOCK;
                    let keys = start..(start + K::KEY_BLOCK).min(sequence.k_len);
                    let (k, v) = slot_data.split_at_mut(k_len);
                    simd.vectorize(Pack { kernel, io, sequence, keys, head, k, v, finite });
                };
                if parallel {
                    packed
                        .par_chunks_mut(slot)
                        .zip(finite.par_iter_mut())
                        .enumerate()
                        .for_each(|(i, (c, f))| pack(i, c, f));
                } else {
                    packed.chunks_mut(slot).zip(finite.iter_mut()).enumerate().for_each(|(i, (c, f))| pack(i, c, f));
                }
                let kv = driver::PackedKv { blocks: &*packed, finite: &*finite, k_len, slot };
                let process = |head_in_group: usize, block: usize| {
                    let rows = block * K::QUERY_BLOCK..((block + 1) * K::QUERY_BLOCK).min(sequence.q_len);
                    let item = WorkItem { sequence, head: head * group + head_in_group, rows };
                    workspace::with_workspace(lines, |carver| {
                        simd.vectorize(Attend { kernel, problem, io, item: &item, kv: &kv, carver });
                    })
                };
                let items = group * query_blocks(pair);
                if parallel {
                    (0..items).into_par_iter().for_each(|i| process(i % group, i / group));
                } else {
                    (0..items).for_each(|i| process(i % group, i / group));
                }
            };
            // Nested halves rather than a list of pairs: nothing to allocate, and rayon's work
            // stealing balances sequences of very different lengths.
            split_pairs(0..last - first, packed, finite, offsets, slot, parallel, &pair_work);
            first = last;
        }
    });
}

/// Runs `work(w, packed, finite)` for every pair `w` of `pairs` (a wave's (sequence, kv head)
/// pairs, whose key blocks start at `offsets[w]`), each with its own blocks, by halving (the
/// halves in parallel when `parallel`): no list to allocate.
fn split_pairs<P: Send, F: Fn(usize, &mut [P], &mut [bool]) + Sync>(
    pairs: core::ops::Range<usize>,
    packed: &mut [P],
    finite: &mut [bool],
    offsets: &[usize],
    slot: usize,
    parallel: bool,
    work: &F,
) {
    if pairs.len() <= 1 {
        if let Some(w) = pairs.clone().next() {
            work(w, packed, finite);
        }
        return;
    }
    let middle = pairs.start + pairs.len() / 2;
    let blocks = offsets[middle] - offsets[pairs.start];
    let (left, right) = packed.split_at_mut(blocks * slot);
    let (left_finite, right_finite) = finite.split_at_mut(blocks);
    let mut first_half = move || split_pairs(pairs.start..middle, left, left_finite, offsets, slot, parallel, work);
    let mut second_half = move || split_pairs(middle..pairs.end, right, right_finite, offsets, slot, parallel, work);
    if parallel {
        rayon::join(first_half, second_half);
    } else {
        first_half();
        second_half();
    }
}

/// Packs one key block (keys `keys` of `sequence`) inside the instruction set's
/// `target_feature` context.
struct Pack<'a, 'io, T: Element, K: TileKernel<T>> {
    kernel: K,
    io: &'a Io<'io, T>,
    sequence: crate::problem::Sequence,
    keys: core::ops::Range<usize>,
    head: usize,
    k: &'a mut [K::Packed],
    v: &'a mut [K::Packed],
    finite: &'a mut bool,
}

impl<T: Element, K: TileKernel<T>> WithSimd for Pack<'_, '_, T, K> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let (k, v) = (&self.io.k, &self.io.v);
        let (index, first) = (self.sequence.index, self.sequence.k_start);
        self.kernel.pack_k(&SequenceRows::new(k, index, first, self.head), self.keys.clone(), self.k);
        *self.finite = self.kernel.pack_v(&SequenceRows::new(v, index, first, self.head), self.keys, self.v);
    }
}

/// One work item inside the instruction set's `target_feature` context.
struct Attend<'a, 'p, 'io, 'w, T: Element, K: TileKernel<T>> {
    kernel: K,
    problem: &'a Problem<'p>,
    io: &'a Io<'io, T>,
    item: &'a WorkItem,
    kv: &'a driver::PackedKv<'a, K::Packed>,
    carver: &'a mut workspace::Carver<'w>,
}

impl<T: Element, K: TileKernel<T>> WithSimd for Attend<'_, '_, '_, '_, T, K> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        // SAFETY: every work item covers its own (rows, head) of the output: sequences own
        // disjoint token ranges (validated cu_seqlens), heads are distinct, and the query blocks
        // of one sequence are disjoint. No two items run on the same rows.
        unsafe { driver::attend(self.kernel, self.problem, self.io, self.item, self.kv, self.carver) }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::layout::{KvRows, Rows, RowsMut};
    use crate::params::default_params;
    use crate::problem::KeysValues;
    use half::bf16;
    use ndarray::Array3;

    /// Runs the bf16 matrix kernels as they are, whatever the flush question says.
    fn forced_bf16_products(
        q: &Array3<bf16>,
        k: &Array3<bf16>,
        v: &Array3<bf16>,
        cu: &[i32],
        isa: CpuIsa,
    ) -> Array3<bf16> {
        let problem = Problem::new(
            [q.dim().0, q.dim().1, q.dim().2],
            k.shape().try_into().unwrap(),
            v.shape().try_into().unwrap(),
            cu,
            cu,
            default_params(),
        )
        .unwrap();
        let mut out = Array3::from_elem(problem.out_shape(), bf16::ZERO);
        let (qv, kv, vv) = (q.view(), k.view(), v.view());
        let mut out_view = out.view_mut();
        let (k, v) = (KvRows::Packed(Rows::new(&kv)), KvRows::Packed(Rows::new(&vv)));
        let io = Io { q: Rows::new(&qv), k, v, out: RowsMut::new(&mut out_view), lse: None };
        forward(&problem, io, isa, Magnitudes { bf16_products_exact: true, streamed_edge: None }).unwrap();
        out
    }

    /// The floor is where it says: with every nonzero `|v|` at `2^-96` to `2^-95` the bf16
    /// products, flushes and all, stay inside the oracle's bound, and the scan lets them run.
    #[test]
    fn bf16_products_are_exact_down_to_the_v_floor() {
        let floor = crate::problem::BF16_PRODUCTS_V_FLOOR;
        let mut seed = 7u64;
        let mut uniform = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let (tokens, d) = (96, 64);
        let q = Array3::from_shape_simple_fn((tokens, 2, d), || bf16::from_f64(uniform() * 2.0 - 1.0));
        let k = Array3::from_shape_simple_fn((tokens, 2, d), || bf16::from_f64(uniform() * 2.0 - 1.0));
        let v = Array3::from_shape_simple_fn((tokens, 2, d), || {
            let sign = if uniform() < 0.5 { -1.0 } else { 1.0 };
            bf16::from_f64(sign * floor * (1.0 + uniform()))
        });
        let cu = [0, 40, tokens as i32];
        let problem = Problem::new([tokens, 2, d], [tokens, 2, d], [tokens, 2, d], &cu, &cu, default_params()).unwrap();
        assert!(
            problem
                .check_magnitudes(q.view(), &KeysValues::Packed(k.view(), v.view()), false)
                .unwrap()
                .bf16_products_exact
        );
        let reference = crate::oracle::reference(q.view(), k.view(), v.view(), &cu, &cu, default_params()).unwrap();
        for isa in [CpuIsa::Avx512Bf16, CpuIsa::Amx] {
            let available = match isa {
                CpuIsa::Amx => amx::AmxKernel::<bf16>::try_new().is_some(),
                _ => bf16dot::Bf16DotKernel::<bf16>::try_new().is_some(),
            };
            if !available {
                eprintln!("note: skipping the {} path: this CPU lacks it", isa.name());
                continue;
            }
            let out = forced_bf16_products(&q, &k, &v, &cu, isa);
            let report = reference.compare(out.view());
            assert!(report.worst.is_none(), "{isa:?}: {report}");
        }
        // Half the floor (some products now flushed to no purpose) goes to the f32 kernel.
        let below = v.mapv(|x| bf16::from_f64(x.to_f64() / 2.0));
        assert!(
            !problem
                .check_magnitudes(q.view(), &KeysValues::Packed(k.view(), below.view()), false)
                .unwrap()
                .bf16_products_exact
        );
    }
}

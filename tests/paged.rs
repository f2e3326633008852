//! Paged K/V caches (block tables): every CPU path gives bit for bit the answer of the same keys
//! packed, inside the oracle's bound, for any block size, shuffled and shared blocks, strided
//! caches, and with every other feature (GQA, masks, soft-cap, ALiBi, sinks, LSE, `Lq ≠ Lk`);
//! slots and blocks no sequence reads are never read; bad block tables get errors naming the
//! sequence and entry.

mod common;

use common::{cpu_paths, cu_seqlens, random_tensor, Rng};
use half::{bf16, f16};
use ndarray::{s, Array2, Array3, Array4, Array5, ArrayView4, Axis};
use proptest::prelude::*;
use varlen_attn::{
    forward_paged, forward_paged_into, forward_paged_with_lse, forward_with_lse, oracle, Backend, Element, Error,
    PagedKv, Params,
};

/// Packed keys and values laid out in a paged cache: each sequence's blocks drawn from a
/// shuffled pool, the first `shared` blocks of sequence 1 those of sequence 0 (its keys made
/// equal there, as a shared prefix is), every slot no sequence reads filled with `junk`.
struct Paged<T> {
    k: Array3<T>,
    v: Array3<T>,
    k_cache: Array4<T>,
    v_cache: Array4<T>,
    table: Array2<i32>,
}

impl<T: Element> Paged<T> {
    fn new(
        rng: &mut Rng,
        mut k: Array3<T>,
        mut v: Array3<T>,
        cu_k: &[i32],
        block_size: usize,
        shared: usize,
        junk: T,
    ) -> Self {
        let batch = cu_k.len() - 1;
        let len = |b: usize| (cu_k[b + 1] - cu_k[b]) as usize;
        let blocks_of = |b: usize| len(b).div_ceil(block_size);
        // Shared prefix: sequence 1's first `shared` full blocks repeat sequence 0's keys.
        let shared = if batch >= 2 { shared.min(len(0) / block_size).min(len(1) / block_size) } else { 0 };
        for j in 0..shared * block_size {
            let (from, to) = (cu_k[0] as usize + j, cu_k[1] as usize + j);
            let (kr, vr) = (k.index_axis(Axis(0), from).to_owned(), v.index_axis(Axis(0), from).to_owned());
            k.index_axis_mut(Axis(0), to).assign(&kr);
            v.index_axis_mut(Axis(0), to).assign(&vr);
        }
        // Two spare blocks that nobody reads, then a shuffled pool.
        let total: usize = (0..batch).map(blocks_of).sum::<usize>() - shared + 2;
        let mut pool: Vec<i32> = (0..total as i32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, rng.below(i + 1));
        }
        let columns = (0..batch).map(blocks_of).max().unwrap_or(0) + 1;
        // Entries past a sequence's blocks are out of range on purpose: they must not be read.
        let mut table = Array2::from_elem((batch, columns), -7);
        let mut next = pool.into_iter();
        for b in 0..batch {
            for e in 0..blocks_of(b) {
                table[[b, e]] = if b == 1 && e < shared { table[[0, e]] } else { next.next().unwrap() };
            }
        }
        let (_, heads, d) = k.dim();
        let dv = v.dim().2;
        let mut k_cache = Array4::from_elem((total, block_size, heads, d), junk);
        let mut v_cache = Array4::from_elem((total, block_size, heads, dv), junk);
        for b in 0..batch {
            for j in 0..len(b) {
                let (block, slot) = (table[[b, j / block_size]] as usize, j % block_size);
                let token = cu_k[b] as usize + j;
                k_cache.slice_mut(s![block, slot, .., ..]).assign(&k.index_axis(Axis(0), token));
                v_cache.slice_mut(s![block, slot, .., ..]).assign(&v.index_axis(Axis(0), token));
            }
        }
        Paged { k, v, k_cache, v_cache, table }
    }

    fn kv(&self) -> PagedKv<'_, T> {
        PagedKv { k_cache: self.k_cache.view(), v_cache: self.v_cache.view(), block_table: self.table.view() }
    }
}

/// One problem, paged with `block_size`, on every CPU path: equal bit for bit to the packed
/// call, inside the oracle's bound, output and LSE.
fn check<T: Element>(
    rng: &mut Rng,
    lengths_q: &[usize],
    lengths_k: &[usize],
    heads: (usize, usize),
    dims: (usize, usize),
    block_size: usize,
    base: &Params,
) {
    let (cu_q, cu_k) = (cu_seqlens(lengths_q), cu_seqlens(lengths_k));
    let (total_q, total_k) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
    let q = random_tensor::<T>(rng, (total_q, heads.0, dims.0), 1.0);
    let k = random_tensor::<T>(rng, (total_k, heads.1, dims.0), 1.0);
    let v = random_tensor::<T>(rng, (total_k, heads.1, dims.1), 1.0);
    let paged = Paged::new(rng, k, v, &cu_k, block_size, 2, T::from_f32(f32::NAN));
    let reference = oracle::reference_paged(q.view(), &paged.kv(), &cu_q, &cu_k, base).unwrap();
    for isa in cpu_paths::<T>() {
        let params = Params { cpu_isa: isa, backend: Backend::Cpu, ..base.clone() };
        let (out, lse) = forward_paged_with_lse(q.view(), &paged.kv(), &cu_q, &cu_k, &params).unwrap();
        let (packed, packed_lse) =
            forward_with_lse(q.view(), paged.k.view(), paged.v.view(), &cu_q, &cu_k, &params).unwrap();
        let what = format!("{isa:?} block {block_size} {:?} {lengths_q:?}/{lengths_k:?} {base:?}", T::DTYPE);
        assert!(out.mapv(|x| x.to_f32().to_bits()) == packed.mapv(|x| x.to_f32().to_bits()), "{what}: out");
        assert!(lse.mapv(f32::to_bits) == packed_lse.mapv(f32::to_bits), "{what}: lse");
        let report = reference.compare(out.view());
        assert!(report.worst.is_none(), "{what}: {report}");
    }
}

/// Block sizes 1, 16, 32 and 256 (and odd ones) on a mixed batch, each dtype.
#[test]
fn every_block_size_every_dtype() {
    let mut rng = Rng::new(1);
    let (lq, lk) = ([5, 40, 1, 70], [33, 40, 300, 0]);
    for block_size in [1, 3, 16, 32, 256] {
        let p = Params::default();
        check::<bf16>(&mut rng, &lq, &lk, (4, 2), (40, 40), block_size, &p);
        check::<f16>(&mut rng, &lq, &lk, (4, 2), (40, 24), block_size, &p);
        check::<f32>(&mut rng, &lq, &lk, (2, 2), (17, 17), block_size, &p);
    }
}

/// Every other feature composes with the paging.
#[test]
fn composes_with_masks_softcap_alibi_sinks() {
    let mut rng = Rng::new(2);
    let (lq, lk) = ([9, 64, 3], [40, 64, 129]);
    let cases = [
        Params { causal: true, ..Params::default() },
        Params { window_left: Some(7), window_right: Some(3), ..Params::default() },
        Params { softcap: Some(5.0), softmax_scale: Some(0.5), ..Params::default() },
        Params { alibi_slopes: Some(vec![0.5, 0.25, 0.125, 0.0625]), causal: true, ..Params::default() },
        Params { sinks: Some(vec![1.0, -2.0, 0.0, 3.0]), ..Params::default() },
        Params {
            alibi_slopes: Some((0..12).map(|i| 0.05 * i as f32).collect()),
            sinks: Some(vec![0.5; 4]),
            window_left: Some(20),
            ..Params::default()
        },
    ];
    for params in &cases {
        for block_size in [1, 16, 32] {
            check::<bf16>(&mut rng, &lq, &lk, (4, 1), (64, 64), block_size, params);
            check::<f32>(&mut rng, &lq, &lk, (4, 2), (72, 72), block_size, params);
        }
    }
}

/// A decode batch: one query per sequence against long contexts, the shape serving engines run
/// most, and Lq > 1 suffixes (chunked prefill) beside it.
#[test]
fn decode_and_chunked_prefill() {
    let mut rng = Rng::new(3);
    let causal = Params { causal: true, ..Params::default() };
    check::<bf16>(&mut rng, &[1, 1, 1, 1], &[1000, 17, 513, 256], (8, 2), (128, 128), 16, &causal);
    check::<bf16>(&mut rng, &[1, 30, 5], &[700, 300, 5], (8, 2), (128, 128), 32, &causal);
}

/// Decode-shaped calls (at most 16 query rows per kv head: one kernel that streams K and V
/// once, keys split across threads) with every feature, against the oracle and the packed call.
#[test]
fn decode_with_every_feature() {
    let mut rng = Rng::new(7);
    let cases = [
        Params { causal: true, ..Params::default() },
        Params { window_left: Some(100), causal: true, softcap: Some(20.0), ..Params::default() },
        Params { alibi_slopes: Some((0..8).map(|h| 0.5f32.powi(h + 1)).collect()), ..Params::default() },
        Params { sinks: Some((0..8).map(|h| h as f32 - 4.0).collect()), causal: true, ..Params::default() },
    ];
    for params in &cases {
        // GQA 8/1 (8 rows per kv head), 2 queries each (16 rows), one empty context.
        check::<bf16>(&mut rng, &[1, 2, 1], &[2000, 700, 0], (8, 1), (64, 64), 16, params);
        check::<f32>(&mut rng, &[2, 1], &[1500, 33], (8, 2), (40, 24), 32, params);
        check::<f16>(&mut rng, &[1], &[3000], (8, 8), (128, 128), 256, params);
        // Many kv heads of the widest head dim: the widened token is 32 x 256 values.
        let widen = |x: &Option<Vec<f32>>| x.as_ref().map(|x| x.iter().cycle().take(32).copied().collect());
        let wide = Params { alibi_slopes: widen(&params.alibi_slopes), sinks: widen(&params.sinks), ..params.clone() };
        check::<bf16>(&mut rng, &[1, 1], &[300, 50], (32, 32), (256, 256), 16, &wide);
    }
}

/// In a decode call, infinity in the values of keys a row's window leaves out stays out of
/// that row.
#[test]
fn decode_keeps_masked_non_finite_values_out() {
    let mut rng = Rng::new(8);
    let cu = cu_seqlens(&[1, 1]);
    let cu_k = cu_seqlens(&[600, 300]);
    let q = random_tensor::<f32>(&mut rng, (2, 4, 16), 1.0);
    let k = random_tensor::<f32>(&mut rng, (900, 2, 16), 1.0);
    let mut v = random_tensor::<f32>(&mut rng, (900, 2, 16), 1.0);
    // Sequence 0's first 100 keys are outside a window of 50 to the left of its last key.
    v.slice_mut(s![..100, .., ..]).fill(f32::INFINITY);
    let params = Params { window_left: Some(50), causal: true, ..Params::default() };
    let reference = oracle::reference(q.view(), k.view(), v.view(), &cu, &cu_k, &params).unwrap();
    for isa in cpu_paths::<f32>() {
        let p = Params { cpu_isa: isa, backend: Backend::Cpu, ..params.clone() };
        let out = varlen_attn::forward(q.view(), k.view(), v.view(), &cu, &cu_k, &p).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "{isa:?}");
        assert!(reference.compare(out.view()).worst.is_none(), "{isa:?}");
    }
}

/// The decode kernel checks K's and V's range as it streams them: beyond the edge of f32 it
/// answers `Error::BeyondF32` as the scan does, inside it the oracle's answer; junk in slots no
/// sequence reads neither refuses the call nor reaches the output.
#[test]
fn decode_checks_the_range_as_it_streams() {
    let mut rng = Rng::new(9);
    let (cu_q, cu_k) = (cu_seqlens(&[1, 1]), cu_seqlens(&[300, 40]));
    let q = random_tensor::<bf16>(&mut rng, (2, 4, 64), 1e18);
    let k = random_tensor::<bf16>(&mut rng, (340, 2, 64), 1.0);
    let v = random_tensor::<bf16>(&mut rng, (340, 2, 64), 1.0);
    let run = |k: &Array3<bf16>, v: &Array3<bf16>| {
        let p = Params { backend: Backend::Cpu, ..Params::default() };
        varlen_attn::forward(q.view(), k.view(), v.view(), &cu_q, &cu_k, &p)
    };
    let ok = run(&k, &v).unwrap();
    let reference = oracle::reference(q.view(), k.view(), v.view(), &cu_q, &cu_k, &Params::default()).unwrap();
    assert!(reference.compare(ok.view()).worst.is_none());
    let mut big_k = k.clone();
    big_k[[333, 1, 7]] = bf16::from_f32(1e25);
    assert!(matches!(run(&big_k, &v), Err(Error::BeyondF32 { quantity, .. }) if quantity.contains("max|k|")));
    let mut big_v = v.clone();
    big_v[[12, 0, 0]] = bf16::MAX;
    assert!(matches!(run(&k, &big_v), Err(Error::BeyondF32 { quantity, .. }) if quantity.contains("max|v|")));
    // Paged, the same values in used slots, bf16::MAX in every unused one.
    let paged = Paged::new(&mut rng, k.clone(), v.clone(), &cu_k, 16, 0, bf16::MAX);
    let got = forward_paged(q.view(), &paged.kv(), &cu_q, &cu_k, &Params::default()).unwrap();
    assert_eq!(got, ok);
}

/// A cache with K and V in one tensor `[2, num_blocks, block_size, H_kv, D]` (vLLM's layout),
/// and a cache whose heads are every other one of a wider tensor: the views are read in place.
#[test]
fn strided_caches_are_read_in_place() {
    let mut rng = Rng::new(4);
    let (lengths, heads, d) = ([20usize, 45], 2, 32);
    let cu = cu_seqlens(&lengths);
    let total = *cu.last().unwrap() as usize;
    let q = random_tensor::<bf16>(&mut rng, (total, 4, d), 1.0);
    let k = random_tensor::<bf16>(&mut rng, (total, heads, d), 1.0);
    let v = random_tensor::<bf16>(&mut rng, (total, heads, d), 1.0);
    let paged = Paged::new(&mut rng, k, v, &cu, 16, 0, bf16::NAN);
    let expect = forward_paged(q.view(), &paged.kv(), &cu, &cu, &Params::default()).unwrap();

    let (blocks, block_size) = (paged.k_cache.dim().0, 16);
    let mut joint = Array5::from_elem((2, blocks, block_size, heads, d), bf16::NAN);
    joint.index_axis_mut(Axis(0), 0).assign(&paged.k_cache);
    joint.index_axis_mut(Axis(0), 1).assign(&paged.v_cache);
    let kv = PagedKv {
        k_cache: joint.index_axis(Axis(0), 0),
        v_cache: joint.index_axis(Axis(0), 1),
        block_table: paged.table.view(),
    };
    assert_eq!(forward_paged(q.view(), &kv, &cu, &cu, &Params::default()).unwrap(), expect);

    let mut wide = Array4::from_elem((blocks, block_size, 2 * heads, d), bf16::NAN);
    wide.slice_mut(s![.., .., ..;2, ..]).assign(&paged.k_cache);
    let mut wide_v = wide.clone();
    wide_v.slice_mut(s![.., .., ..;2, ..]).assign(&paged.v_cache);
    let table_t = paged.table.t().to_owned();
    let kv = PagedKv {
        k_cache: wide.slice(s![.., .., ..;2, ..]),
        v_cache: wide_v.slice(s![.., .., ..;2, ..]),
        block_table: table_t.t(),
    };
    assert_eq!(forward_paged(q.view(), &kv, &cu, &cu, &Params::default()).unwrap(), expect);
}

/// Slots past a sequence's keys hold values far beyond f32's edge and NaN: neither the scan
/// nor the kernels read them, so they neither refuse the call nor reach the output.
#[test]
fn unread_slots_may_hold_anything() {
    let mut rng = Rng::new(5);
    let cu = cu_seqlens(&[5, 18]);
    let q = random_tensor::<f32>(&mut rng, (23, 2, 8), 1.0);
    let k = random_tensor::<f32>(&mut rng, (23, 2, 8), 1.0);
    let v = random_tensor::<f32>(&mut rng, (23, 2, 8), 1.0);
    for junk in [f32::MAX, f32::NAN, f32::INFINITY, -1e30] {
        let paged = Paged::new(&mut rng, k.clone(), v.clone(), &cu, 16, 0, junk);
        let out = forward_paged(q.view(), &paged.kv(), &cu, &cu, &Params::default()).unwrap();
        let packed = varlen_attn::forward(q.view(), k.view(), v.view(), &cu, &cu, &Params::default()).unwrap();
        assert_eq!(out, packed, "junk {junk}");
    }
}

/// The output may be a caller's strided view.
#[test]
fn into_a_strided_output() {
    let mut rng = Rng::new(6);
    let cu = cu_seqlens(&[7, 9]);
    let q = random_tensor::<bf16>(&mut rng, (16, 2, 8), 1.0);
    let k = random_tensor::<bf16>(&mut rng, (16, 1, 8), 1.0);
    let paged = Paged::new(&mut rng, k.clone(), k, &cu, 4, 1, bf16::ZERO);
    let expect = forward_paged(q.view(), &paged.kv(), &cu, &cu, &Params::default()).unwrap();
    let mut storage = Array3::from_elem((16, 2, 16), bf16::NAN);
    forward_paged_into(q.view(), &paged.kv(), &cu, &cu, &Params::default(), storage.slice_mut(s![.., .., ..;2]))
        .unwrap();
    assert_eq!(storage.slice(s![.., .., ..;2]), expect);
}

fn call(k_cache: ArrayView4<f32>, table: &Array2<i32>, cu_k: &[i32], params: &Params) -> Result<(), Error> {
    let q = Array3::<f32>::zeros((2, 2, 8));
    let kv = PagedKv { k_cache: k_cache.view(), v_cache: k_cache.view(), block_table: table.view() };
    forward_paged(q.view(), &kv, &[0, 1, 2], cu_k, params).map(|_| ())
}

/// Every bad block table, cache shape and backend gets its own error, before any work.
#[test]
fn bad_block_tables_are_refused() {
    let cache = Array4::<f32>::zeros((4, 8, 2, 8));
    let p = Params::default();
    let table = Array2::from_shape_vec((2, 2), vec![0, 1, 2, 3]).unwrap();
    assert_eq!(call(cache.view(), &table, &[0, 16, 32], &p), Ok(()));

    let bad = Array2::from_shape_vec((2, 2), vec![0, 1, 2, 4]).unwrap();
    let err = call(cache.view(), &bad, &[0, 16, 32], &p).unwrap_err();
    assert_eq!(err, Error::BlockTable { sequence: 1, entry: 1, value: 4, num_blocks: 4 });
    assert_eq!(
        err.to_string(),
        "block_table[1, 1] = 4: sequence 1 reads this entry, which must name a block of the cache, 0 to 4 - 1"
    );
    let negative = Array2::from_shape_vec((2, 2), vec![-1, 1, 2, 3]).unwrap();
    assert!(matches!(
        call(cache.view(), &negative, &[0, 16, 32], &p),
        Err(Error::BlockTable { sequence: 0, entry: 0, value: -1, .. })
    ));
    // The same bad entry past the sequence's keys is not read, so not refused.
    assert_eq!(call(cache.view(), &bad, &[0, 16, 24], &p), Ok(()));

    let err = call(cache.view(), &table, &[0, 17, 20], &p).unwrap_err();
    assert_eq!(err, Error::BlockTableTooShort { sequence: 0, keys: 17, block_size: 8, columns: 2 });
    assert_eq!(err.to_string(), "sequence 0 has 17 keys, which need 3 blocks of 8, but block_table has 2 columns");

    let rows = Array2::from_shape_vec((1, 2), vec![0, 1]).unwrap();
    assert!(matches!(
        call(cache.view(), &rows, &[0, 1, 2], &p),
        Err(Error::Shape { arg: "block_table", axis: 0, expected: 2, got: 1 })
    ));
    let empty_blocks = Array4::<f32>::zeros((4, 0, 2, 8));
    assert!(matches!(
        call(empty_blocks.view(), &table, &[0, 0, 0], &p),
        Err(Error::Shape { arg: "k_cache", axis: 1, .. })
    ));
    assert!(matches!(
        call(cache.view(), &table, &[0, 9, 3], &p),
        Err(Error::CuSeqlens { arg: "cu_seqlens_k", index: 2, .. })
    ));
    let q = Array3::<f32>::zeros((2, 2, 8));
    let v_cache = Array4::<f32>::zeros((4, 8, 1, 8));
    let kv = PagedKv { k_cache: cache.view(), v_cache: v_cache.view(), block_table: table.view() };
    assert!(matches!(
        forward_paged(q.view(), &kv, &[0, 1, 2], &[0, 1, 2], &p),
        Err(Error::Shape { arg: "v_cache", axis: 2, expected: 2, got: 1 })
    ));
    let gpu = Params { backend: Backend::Gpu, ..Params::default() };
    assert!(matches!(
        call(cache.view(), &table, &[0, 1, 2], &gpu),
        Err(Error::GpuUnsupported(_) | Error::GpuNotCompiled)
    ));
}

fn lengths(max: usize) -> impl Strategy<Value = Vec<(usize, usize)>> {
    prop::collection::vec((0..max, 0..max), 1..5)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Random batches, block sizes, head counts and masks: paged equals packed bit for bit.
    #[test]
    fn random_paged_problems(
        lens in lengths(90),
        block_size in prop::sample::select(vec![1usize, 2, 5, 16, 32, 64]),
        group in 1usize..4,
        kv_heads in 1usize..3,
        d in prop::sample::select(vec![8usize, 33, 64, 128]),
        causal in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let (lq, lk): (Vec<usize>, Vec<usize>) = lens.into_iter().unzip();
        let params = Params { causal, ..Params::default() };
        check::<bf16>(&mut rng, &lq, &lk, (group * kv_heads, kv_heads), (d, d), block_size, &params);
    }
}

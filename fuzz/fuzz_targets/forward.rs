//! Fuzzes every public entry point of the library (`forward`, `forward_with_lse`,
//! `forward_into`, `forward_with_lse_into`, the paged `forward_paged*`, and the oracle they are
//! checked against) with arbitrary shapes, strides, `cu_seqlens`, block tables, parameters and
//! values. Each call must return the same error as the oracle, or a result within the oracle's
//! tolerance; nothing may panic.

#![no_main]

#[path = "common.rs"]
mod common;

use arbitrary::{Result, Unstructured};
use half::{bf16, f16};
use libfuzzer_sys::fuzz_target;
use ndarray::{s, Array3, ArrayView3};
use varlen_attn::{oracle, Backend, CpuIsa, Element, PagedKv, Params};

/// The instruction sets to pick from.
const ISAS: [CpuIsa; 6] = [CpuIsa::Auto, CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx];

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured) -> Result<()> {
    match u.int_in_range(0..=2)? {
        0 => case::<bf16>(u),
        1 => case::<f16>(u),
        _ => case::<f32>(u),
    }
}

/// A tensor in one of several memory layouts, all viewing the same logical values.
struct Stored<T> {
    storage: Array3<T>,
    layout: u8,
    dims: usize,
}

impl<T: Element> Stored<T> {
    fn new(logical: Array3<T>, layout: u8) -> Self {
        let (t, h, d) = logical.dim();
        let storage = match layout % 4 {
            0 => logical,
            1 => logical.view().permuted_axes([1, 0, 2]).as_standard_layout().to_owned(),
            2 => {
                let mut s = Array3::from_elem((t, h, 2 * d), T::from_f32(f32::NAN));
                s.slice_mut(s![.., .., ..;2]).assign(&logical);
                s
            }
            _ => logical.slice(s![.., .., ..;-1]).to_owned(),
        };
        Stored { storage, layout, dims: d }
    }

    fn view(&self) -> ArrayView3<'_, T> {
        match self.layout % 4 {
            0 => self.storage.view(),
            1 => self.storage.view().permuted_axes([1, 0, 2]),
            2 => self.storage.slice(s![.., .., ..;2]),
            _ => self.storage.slice(s![.., .., ..;-1]),
        }
        .slice_move(s![.., .., ..self.dims])
    }
}

/// How the values of a case are drawn.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Values {
    /// Multiples of 1/16 in [-4, 4].
    Moderate,
    /// Normal numbers of any magnitude.
    Extreme,
    /// Arbitrary bit patterns: NaN, infinities, subnormals.
    Wild,
}

fn dim(u: &mut Unstructured) -> Result<usize> {
    Ok(match u.int_in_range(0..=9)? {
        0 => *u.choose(&[0usize, 72, 128, 256, 257])?,
        _ => u.int_in_range(1..=20)?,
    })
}

fn case<T: Element>(u: &mut Unstructured) -> Result<()> {
    let batch = u.int_in_range(0..=4)?;
    let mut q_lens = Vec::new();
    let mut k_lens = Vec::new();
    for _ in 0..batch {
        q_lens.push(u.int_in_range(0..=40usize)?);
        k_lens.push(u.int_in_range(0..=40usize)?);
    }
    let prefix = |lens: &[usize]| -> Vec<i32> {
        let mut cu = vec![0i32];
        for &l in lens {
            cu.push(cu.last().unwrap() + l as i32);
        }
        cu
    };
    let (mut cu_q, mut cu_k) = (prefix(&q_lens), prefix(&k_lens));
    let (mut total_q, mut total_k): (usize, usize) = (q_lens.iter().sum(), k_lens.iter().sum());
    // Now and then, break the rules.
    if u.ratio(1, 8)? {
        let list = if u.arbitrary()? { &mut cu_q } else { &mut cu_k };
        match u.int_in_range(0..=3)? {
            0 => list.pop().map(|_| ()).unwrap_or(()),
            1 => list.push(u.arbitrary()?),
            _ => {
                if !list.is_empty() {
                    let i = u.choose_index(list.len())?;
                    list[i] = u.arbitrary()?;
                }
            }
        }
    }
    if u.ratio(1, 16)? {
        total_q = total_q.saturating_add(1);
    }
    if u.ratio(1, 16)? {
        total_k = total_k.saturating_sub(1);
    }
    let kv_heads = u.int_in_range(0..=3)?;
    let heads = kv_heads * u.int_in_range(1..=3)? + usize::from(u.ratio(1, 16)?);
    let (d, dv) = (dim(u)?, dim(u)?);
    let d_k = if u.ratio(1, 16)? { d + 1 } else { d };
    let v_tokens = if u.ratio(1, 16)? { total_k + 1 } else { total_k };

    // Moderate values (multiples of 1/16 in [-4, 4]: no subnormals, no overflow), normal
    // numbers of any magnitude (a random sign, significand and exponent across the type's whole
    // normal range, per tensor up to a drawn largest exponent: scores from far below f32's
    // range to past its edge), or anything.
    let mode = match u.int_in_range(0..=7)? {
        0 => Values::Wild,
        1..=3 => Values::Extreme,
        _ => Values::Moderate,
    };
    let (min_exp, max_exp) = match T::DTYPE {
        varlen_attn::DType::F16 => (-14, 15),
        _ => (-126, 127),
    };
    let value = |u: &mut Unstructured, top: i32| -> Result<T> {
        Ok(match mode {
            Values::Wild => T::from_f32(f32::from_bits(u.arbitrary()?)),
            Values::Moderate => T::from_f32(u.int_in_range(-64i8..=64)? as f32 / 16.0),
            Values::Extreme => {
                // A normal number of T: rounding 1.m × 2^e to T stays at or below 2^(top+1).
                let significand = 1.0 + u.int_in_range(0u16..=255)? as f32 / 256.0;
                let e = u.int_in_range(min_exp..=top)?;
                let sign = if u.arbitrary()? { -1.0 } else { 1.0 };
                T::from_f32(sign * significand * (e as f32).exp2())
            }
        })
    };
    let tensor = |u: &mut Unstructured, shape: (usize, usize, usize)| -> Result<Stored<T>> {
        let n = shape.0 * shape.1 * shape.2;
        let top = u.int_in_range(min_exp..=max_exp - 1)?;
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(value(u, top)?);
        }
        let layout = u.arbitrary()?;
        Ok(Stored::new(Array3::from_shape_vec(shape, values).expect("sized"), layout))
    };
    let q = tensor(u, (total_q, heads, d))?;
    let k = tensor(u, (total_k, kv_heads, d_k))?;
    let v = tensor(u, (v_tokens, kv_heads, dv))?;

    let causal: bool = u.arbitrary()?;
    let float = |u: &mut Unstructured| -> Result<Option<f32>> {
        Ok(match u.int_in_range(0..=9)? {
            0..=3 => None,
            4 => Some(*u.choose(&[0.0, -1.0, f32::NAN, f32::INFINITY])?),
            // Any positive normal f32, from 2^-126 to f32::MAX.
            5 | 6 => Some(f32::from_bits(u.int_in_range(0x0080_0000u32..=0x7f7f_ffff)?)),
            _ => Some(u.int_in_range(1u8..=200)? as f32 / 20.0),
        })
    };
    // ALiBi slopes and sinks: none, the right count (per head, or per sequence and head), or a
    // wrong one; moderate values, or any f32.
    let modifiers = |u: &mut Unstructured, counts: &[usize]| -> Result<Option<Vec<f32>>> {
        let count = match u.int_in_range(0..=7)? {
            0..=4 => return Ok(None),
            5 => u.int_in_range(0..=9)?,
            n => counts[(n as usize - 6) % counts.len()],
        };
        let wild = u.ratio(1, 8)?;
        (0..count)
            .map(|_| Ok(if wild { f32::from_bits(u.arbitrary()?) } else { u.int_in_range(-64i8..=64)? as f32 / 16.0 }))
            .collect::<Result<Vec<f32>>>()
            .map(Some)
    };
    let batch = cu_q.len().saturating_sub(1);
    let alibi_slopes = modifiers(u, &[heads, batch * heads])?;
    let sinks = modifiers(u, &[heads])?;
    let params = Params {
        softmax_scale: float(u)?,
        alibi_slopes,
        sinks,
        softcap: float(u)?,
        causal,
        window_left: if u.arbitrary()? { Some(u.int_in_range(0..=50)?) } else { None },
        window_right: if u.ratio(1, 3)? { Some(u.int_in_range(0..=50)?) } else { None },
        backend: Backend::Cpu,
        cpu_isa: *u.choose(&ISAS)?,
        ..Params::default()
    };
    let entry: u8 = u.int_in_range(0..=3)?;
    if u.ratio(1, 4)? {
        return paged(u, q.view(), k.view(), v.view(), &cu_q, &cu_k, &params, entry, mode != Values::Wild);
    }
    let out_shape_error = entry >= 2 && u.ratio(1, 16)?;
    common::check(q.view(), k.view(), v.view(), &cu_q, &cu_k, &params, entry, out_shape_error, mode != Values::Wild);
    Ok(())
}

/// The same keys and values in a paged cache: blocks of a drawn size in a shuffled order (some
/// shared where two sequences' keys agree), junk (NaN, the type's largest value) in every slot
/// no sequence reads, and now and then a broken block table (an entry out of range, too few
/// columns or rows). Checked against the paged oracle.
#[allow(clippy::too_many_arguments)]
fn paged<T: Element>(
    u: &mut Unstructured,
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    cu_q: &[i32],
    cu_k: &[i32],
    params: &Params,
    entry: u8,
    finite_normal: bool,
) -> Result<()> {
    let block_size = u.int_in_range(1..=20usize)?;
    let valid = cu_k.len() >= 2
        && cu_k[0] == 0
        && cu_k.windows(2).all(|w| w[1] >= w[0])
        && *cu_k.last().unwrap() as usize == k.dim().0
        && k.dim().0 == v.dim().0
        && k.dim().1 == v.dim().1;
    let batch = cu_k.len().saturating_sub(1);
    let lengths: Vec<usize> =
        if valid { cu_k.windows(2).map(|w| (w[1] - w[0]) as usize).collect() } else { vec![0; batch] };
    let needed: Vec<usize> = lengths.iter().map(|l| l.div_ceil(block_size)).collect();
    let blocks = needed.iter().sum::<usize>() + usize::from(u.arbitrary::<bool>()?);
    let mut order: Vec<usize> = (0..blocks).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, u.int_in_range(0..=i)?);
    }
    let columns = needed.iter().copied().max().unwrap_or(0) + usize::from(u.arbitrary::<bool>()?);
    let junk = if u.arbitrary()? { T::from_f32(f32::NAN) } else { T::from_f32(f32::MAX) };
    let (_, kv_heads, d) = k.dim();
    let dv = v.dim().2;
    let mut k_cache = ndarray::Array4::from_elem((blocks, block_size, kv_heads, d), junk);
    let mut v_cache = ndarray::Array4::from_elem((blocks, block_size, kv_heads, dv), junk);
    let mut table = ndarray::Array2::from_elem((batch, columns), -1i32);
    let mut next = order.into_iter();
    for (b, &n) in needed.iter().enumerate() {
        for e in 0..n {
            let block = next.next().expect("sized");
            table[[b, e]] = block as i32;
            for slot in 0..block_size.min(lengths[b] - e * block_size) {
                let token = cu_k[b] as usize + e * block_size + slot;
                k_cache.slice_mut(s![block, slot, .., ..]).assign(&k.slice(s![token, .., ..]));
                v_cache.slice_mut(s![block, slot, .., ..]).assign(&v.slice(s![token, .., ..]));
            }
        }
    }
    // Now and then, break the table.
    let mut table = table;
    if u.ratio(1, 8)? && table.len() > 0 {
        let (b, e) = (u.choose_index(table.dim().0)?, u.choose_index(table.dim().1)?);
        table[[b, e]] = *u.choose(&[-1, blocks as i32, i32::MAX, i32::MIN])?;
    }
    if u.ratio(1, 16)? && table.dim().1 > 0 {
        table = table.slice(s![.., ..table.dim().1 - 1]).to_owned();
    }
    if u.ratio(1, 16)? {
        table = table.slice(s![..batch.saturating_sub(1), ..]).to_owned();
    }
    let kv = PagedKv { k_cache: k_cache.view(), v_cache: v_cache.view(), block_table: table.view() };
    let reference = oracle::reference_paged(q, &kv, cu_q, cu_k, params);
    let result = match entry % 2 {
        0 => varlen_attn::forward_paged(q, &kv, cu_q, cu_k, params).map(|o| (o, None)),
        _ => varlen_attn::forward_paged_with_lse(q, &kv, cu_q, cu_k, params).map(|(o, l)| (o, Some(l))),
    };
    // The cache's used slots hold exactly the packed keys and values: the bounds are theirs.
    common::compare(reference, result, q, k, v, cu_q, cu_k, params, false, finite_normal);
    Ok(())
}

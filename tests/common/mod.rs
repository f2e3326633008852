//! Shared helpers for the integration tests: deterministic inputs, strided layouts, and the
//! instruction sets to run.
#![allow(dead_code)]

pub mod cases;
pub mod extreme;

use ndarray::{s, Array3, ArrayView3};
use varlen_attn::{CpuIsa, Element, Params};

/// A small deterministic generator (splitmix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Approximately standard normal (sum of uniforms).
    pub fn normal(&mut self) -> f32 {
        ((0..4).map(|_| self.uniform()).sum::<f64>() - 2.0) as f32 * 1.732
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `[tokens, heads, dims]` values drawn from `amplitude ×` a normal distribution.
pub fn random_tensor<T: Element>(rng: &mut Rng, shape: (usize, usize, usize), amplitude: f32) -> Array3<T> {
    Array3::from_shape_simple_fn(shape, || T::from_f32(rng.normal() * amplitude))
}

/// How a tensor is laid out in memory; every layout views the same logical values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Row-major `[tokens, heads, dims]`.
    Standard,
    /// Stored `[heads, tokens, dims]`, viewed through permuted axes.
    HeadsMajor,
    /// Each row padded with 3 extra values that the view skips.
    Padded,
    /// Every other value along dims (stride 2 on the last axis).
    Strided,
    /// The dims axis stored backwards (negative stride).
    Reversed,
}

pub const LAYOUTS: [Layout; 5] =
    [Layout::Standard, Layout::HeadsMajor, Layout::Padded, Layout::Strided, Layout::Reversed];

/// Logical values stored in a given layout.
pub struct Stored<T> {
    storage: Array3<T>,
    layout: Layout,
    dims: usize,
}

impl<T: Element> Stored<T> {
    pub fn new(logical: &Array3<T>, layout: Layout) -> Self {
        let (t, h, d) = logical.dim();
        let storage = match layout {
            Layout::Standard => logical.clone(),
            Layout::HeadsMajor => logical.view().permuted_axes([1, 0, 2]).as_standard_layout().to_owned(),
            Layout::Padded => {
                let mut s = Array3::from_elem((t, h, d + 3), T::from_f32(f32::NAN));
                s.slice_mut(s![.., .., ..d]).assign(logical);
                s
            }
            Layout::Strided => {
                let mut s = Array3::from_elem((t, h, 2 * d), T::from_f32(f32::NAN));
                s.slice_mut(s![.., .., ..;2]).assign(logical);
                s
            }
            Layout::Reversed => logical.slice(s![.., .., ..;-1]).to_owned(),
        };
        Stored { storage, layout, dims: d }
    }

    pub fn view(&self) -> ArrayView3<'_, T> {
        match self.layout {
            Layout::Standard => self.storage.view(),
            Layout::HeadsMajor => self.storage.view().permuted_axes([1, 0, 2]),
            Layout::Padded => self.storage.slice(s![.., .., ..self.dims]),
            Layout::Strided => self.storage.slice(s![.., .., ..;2]),
            Layout::Reversed => self.storage.slice(s![.., .., ..;-1]),
        }
    }
}

/// Prefix sums of `lengths`, as `cu_seqlens`.
pub fn cu_seqlens(lengths: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &l in lengths {
        cu.push(cu.last().unwrap() + l as i32);
    }
    cu
}

/// The CPU paths to check for element type `T` on this machine; prints the ones skipped.
pub fn cpu_paths<T: Element>() -> Vec<CpuIsa> {
    let mut paths = vec![CpuIsa::Auto, CpuIsa::Scalar];
    for isa in [CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16, CpuIsa::Amx, CpuIsa::Neon] {
        if matches!(isa, CpuIsa::Avx512Bf16 | CpuIsa::Amx) && T::DTYPE != varlen_attn::DType::BF16 {
            continue;
        }
        if isa_available::<T>(isa) {
            paths.push(isa);
        } else {
            eprintln!("note: skipping the {} path: this CPU lacks it", isa.name());
        }
    }
    paths
}

fn isa_available<T: Element>(isa: CpuIsa) -> bool {
    let x = Array3::<T>::default((1, 1, 2));
    // `is_ok` alone would pass an unsupported path that silently fell back: the error must name
    // the missing instruction set.
    let params = Params { cpu_isa: isa, backend: varlen_attn::Backend::Cpu, ..Params::default() };
    varlen_attn::forward(x.view(), x.view(), x.view(), &[0, 1], &[0, 1], &params).is_ok()
}

/// Checks under `params` that NaN or infinity anywhere in the middle sequence of a batch of
/// three (its q, k and v rows, every head) reaches neither neighbour: their output rows and LSEs
/// come out bit for bit as without it. A kernel that reads a whole tile of keys past a
/// sequence's end must keep those rows out, not multiply them by zero (0 · inf is NaN).
pub fn check_non_finite_inputs_stay_in_their_sequence(params: &Params) {
    let mut rng = Rng::new(11);
    let lengths = [37, 45, 150];
    let (heads, d) = (2, 24);
    let total = lengths.iter().sum();
    let cu = cu_seqlens(&lengths);
    let q = random_tensor::<half::bf16>(&mut rng, (total, heads, d), 1.0);
    let k = random_tensor::<half::bf16>(&mut rng, (total, heads, d), 1.0);
    let v = random_tensor::<half::bf16>(&mut rng, (total, heads, d), 1.0);
    let run = |q: &Array3<half::bf16>, k: &Array3<half::bf16>, v: &Array3<half::bf16>| {
        varlen_attn::forward_with_lse(q.view(), k.view(), v.view(), &cu, &cu, params).unwrap()
    };
    let (clean, clean_lse) = run(&q, &k, &v);
    let middle = cu[1] as usize..cu[2] as usize;
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let poison = |x: &Array3<half::bf16>| {
            let mut x = x.clone();
            x.slice_mut(s![middle.clone(), .., ..]).fill(half::bf16::from_f32(bad));
            x
        };
        let (out, lse) = run(&poison(&q), &poison(&k), &poison(&v));
        for rows in [0..middle.start, middle.end..total] {
            let bits = |x: &Array3<half::bf16>| x.slice(s![rows.clone(), .., ..]).mapv(|x| x.to_bits());
            assert!(bits(&out) == bits(&clean), "{bad} in sequence 1 changed the output rows {rows:?}");
            let bits = |x: &ndarray::Array2<f32>| x.slice(s![.., rows.clone()]).mapv(f32::to_bits);
            assert!(bits(&lse) == bits(&clean_lse), "{bad} in sequence 1 changed the LSE of rows {rows:?}");
        }
    }
}

//! The oracle is correctly rounded: its output is within half a unit in the last place of an
//! independent f64 evaluation of the true formula (with the exact default scale `1/sqrt(D)`),
//! up to `2^-40` of the row's magnitude `Σ p|v| / Σ p` for the f64 arithmetic of both.
//!
//! The independent evaluation shares nothing with the oracle: compensated (Neumaier) sums for
//! the dot products and the softmax, scores scaled by the exact scale, keys in reverse order.

mod common;

use common::{cu_seqlens, random_tensor, Rng};
use half::bf16;
use ndarray::{s, Array3};
use varlen_attn::{internal::workloads::SEED_SHAPES, oracle, Element, Params};

/// Neumaier's compensated sum.
#[derive(Default)]
struct Sum {
    total: f64,
    compensation: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        let t = self.total + x;
        self.compensation += if self.total.abs() >= x.abs() { (self.total - t) + x } else { (x - t) + self.total };
        self.total = t;
    }
    fn value(&self) -> f64 {
        self.total + self.compensation
    }
}

/// Checks every output of a non-causal, unwindowed problem with the default scale.
fn check_correctly_rounded<T: Element>(q: &Array3<T>, k: &Array3<T>, v: &Array3<T>, lengths: &[usize]) {
    let cu = cu_seqlens(lengths);
    let got = oracle::forward(q.view(), k.view(), v.view(), &cu, &cu, &Params::default()).unwrap();
    let (heads, d) = (q.dim().1, q.dim().2);
    let group = heads / k.dim().1;
    let scale = 1.0 / (d as f64).sqrt();
    let f = |x: T| x.to_f32() as f64;
    let mut worst = 0f64;
    for (b, w) in cu.windows(2).enumerate() {
        let keys: Vec<usize> = (w[0] as usize..w[1] as usize).rev().collect();
        for t in w[0] as usize..w[1] as usize {
            for h in 0..heads {
                let kh = h / group;
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let mut dot = Sum::default();
                        for (&a, &c) in q.slice(s![t, h, ..]).iter().zip(k.slice(s![j, kh, ..])) {
                            dot.add(f(a) * f(c));
                        }
                        scale * dot.value()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let mut denominator = Sum::default();
                p.iter().for_each(|&x| denominator.add(x));
                for c in 0..v.dim().2 {
                    let (mut numerator, mut magnitude) = (Sum::default(), 0f64);
                    for (&j, &pj) in keys.iter().zip(&p) {
                        numerator.add(pj * f(v[[j, kh, c]]));
                        magnitude += pj * f(v[[j, kh, c]]).abs();
                    }
                    let exact = numerator.value() / denominator.value();
                    let magnitude = magnitude / denominator.value();
                    let o = f(got[[t, h, c]]);
                    let ulp = T::DTYPE.ulp(exact.abs().max(o.abs()));
                    let error = (o - exact).abs();
                    assert!(
                        error <= 0.5 * ulp + 2f64.powi(-40) * magnitude,
                        "sequence {b}, token {t}, head {h}, dim {c}: oracle {o:e}, exact {exact:e}: {:.4} ulp",
                        error / ulp
                    );
                    worst = worst.max(error / ulp);
                }
            }
        }
    }
    eprintln!("{}: worst {worst:.4} ulp", T::DTYPE);
}

/// The seed's shape 11 (4 heads × 276 tokens × 72, bf16 normal inputs): with the scale widened
/// from f32, one element landed 0.54 bf16 ulp from the true value.
#[test]
fn seed_shape_11_is_correctly_rounded() {
    let shape = SEED_SHAPES[11];
    let [q, k, v] = shape.random_inputs::<bf16>(0);
    check_correctly_rounded(&q, &k, &v, &[shape.tokens()]);
}

#[test]
fn random_cases_are_correctly_rounded() {
    let mut rng = Rng::new(5);
    for (heads, kv_heads, d, lengths) in
        [(4, 4, 72, vec![300, 17]), (2, 1, 64, vec![1, 129, 40]), (3, 3, 128, vec![250]), (2, 2, 5, vec![90, 0, 33])]
    {
        let total = lengths.iter().sum();
        let q = random_tensor::<bf16>(&mut rng, (total, heads, d), 1.5);
        let k = random_tensor::<bf16>(&mut rng, (total, kv_heads, d), 1.5);
        let v = random_tensor::<bf16>(&mut rng, (total, kv_heads, d), 1.0);
        check_correctly_rounded(&q, &k, &v, &lengths);
        let q = random_tensor::<half::f16>(&mut rng, (total, heads, d), 1.5);
        let k = random_tensor::<half::f16>(&mut rng, (total, kv_heads, d), 1.5);
        let v = random_tensor::<half::f16>(&mut rng, (total, kv_heads, d), 1.0);
        check_correctly_rounded(&q, &k, &v, &lengths);
    }
}

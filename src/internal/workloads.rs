//! Reference workloads: the shapes of the seed task (vLLM prefill of a vision tower, as AMD's
//! ck_tile `FmhaFwdKernel` runs it), and deterministic random inputs for them, so benchmarks and
//! tests everywhere measure the same thing.

use crate::element::Element;
use ndarray::Array3;

/// One workload: `sequences` packed sequences of `seq_len` tokens (queries and keys alike),
/// `num_heads` heads (no GQA) of `head_dim`, non-causal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The row of the seed's table.
    pub index: usize,
    /// Query and key/value heads.
    pub num_heads: usize,
    /// head_dim of q, k and v.
    pub head_dim: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Sequences packed together.
    pub sequences: usize,
}

const fn shape(index: usize, num_heads: usize, head_dim: usize, seq_len: usize) -> Shape {
    Shape { index, num_heads, head_dim, seq_len, sequences: 1 }
}

/// The seed workload's 21 shapes, in its order.
pub const SEED_SHAPES: [Shape; 21] = [
    shape(0, 16, 72, 720),
    shape(1, 16, 72, 1200),
    shape(2, 16, 72, 2116),
    shape(3, 16, 72, 3844),
    shape(4, 16, 72, 8136),
    shape(5, 16, 72, 17296),
    shape(6, 16, 72, 24368),
    shape(7, 16, 72, 49596),
    shape(8, 16, 72, 65556),
    shape(9, 32, 128, 16742),
    shape(10, 32, 128, 30793),
    shape(11, 4, 72, 276),
    shape(12, 4, 72, 600),
    shape(13, 4, 72, 1012),
    shape(14, 4, 72, 2024),
    shape(15, 4, 72, 4100),
    shape(16, 4, 72, 8184),
    shape(17, 4, 72, 15476),
    shape(18, 4, 72, 24952),
    shape(19, 4, 72, 40560),
    shape(20, 8, 128, 1),
];

impl Shape {
    /// Total tokens.
    ///
    /// ```
    /// assert_eq!(varlen_attn::internal::workloads::SEED_SHAPES[0].tokens(), 720);
    /// ```
    pub fn tokens(&self) -> usize {
        self.seq_len * self.sequences
    }

    /// Floating-point operations of the two matrix products, `4 · L² · D · H` per sequence
    /// (the seed's convention).
    ///
    /// ```
    /// assert_eq!(varlen_attn::internal::workloads::SEED_SHAPES[20].flops(), 4096.0);
    /// ```
    pub fn flops(&self) -> f64 {
        4.0 * (self.seq_len as f64).powi(2) * (self.head_dim * self.num_heads * self.sequences) as f64
    }

    /// `cu_seqlens` for q and k (the same).
    ///
    /// ```
    /// let s = varlen_attn::internal::workloads::Shape { index: 0, num_heads: 1, head_dim: 8, seq_len: 3, sequences: 2 };
    /// assert_eq!(s.cu_seqlens(), vec![0, 3, 6]);
    /// ```
    pub fn cu_seqlens(&self) -> Vec<i32> {
        (0..=self.sequences).map(|b| (b * self.seq_len) as i32).collect()
    }

    /// Random q, k, v `[tokens, num_heads, head_dim]` drawn from a standard normal distribution
    /// (like the seed's `torch.randn`), deterministic in `seed`.
    ///
    /// ```
    /// let s = varlen_attn::internal::workloads::SEED_SHAPES[11];
    /// let [q, k, v] = s.random_inputs::<f32>(1);
    /// assert_eq!(q.dim(), (276, 4, 72));
    /// assert_ne!(q, k);
    /// assert_eq!(v, s.random_inputs::<f32>(1)[2]);
    /// ```
    pub fn random_inputs<T: Element>(&self, seed: u64) -> [Array3<T>; 3] {
        let mut rng = NormalRng::new(seed);
        let dims = (self.tokens(), self.num_heads, self.head_dim);
        core::array::from_fn(|_| Array3::from_shape_simple_fn(dims, || T::from_f32(rng.next())))
    }
}

/// splitmix64 with the Box-Muller transform: small, fast and reproducible everywhere.
struct NormalRng {
    state: u64,
    spare: Option<f32>,
}

impl NormalRng {
    fn new(seed: u64) -> Self {
        NormalRng { state: seed, spare: None }
    }

    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn next(&mut self) -> f32 {
        if let Some(x) = self.spare.take() {
            return x;
        }
        let (u, v) = (1.0 - self.uniform(), self.uniform());
        let radius = (-2.0 * u.ln()).sqrt();
        let angle = core::f64::consts::TAU * v;
        self.spare = Some((radius * angle.sin()) as f32);
        (radius * angle.cos()) as f32
    }
}

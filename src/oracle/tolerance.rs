//! How far a correct `f32`-accumulating implementation may be from the `f64` reference, derived
//! rather than guessed, and the comparison that applies it.
//!
//! # The derivation
//!
//! Let `u = 2^-24` (f32's unit roundoff) and `u_T` the element type's (bf16 `2^-8`, f16 `2^-11`,
//! f32 `2^-24`). For one output row with `n` visible keys, `V = max |v|` over them and exact
//! output `o`:
//!
//! 1. **Scores.** Each `q·k` is a `D`-term dot product of exactly-widened inputs accumulated in
//!    f32: error at most `γ_D Σ_d |q_d k_d|` with `γ_D = D u / (1 - D u)`, plus `2^-126` per
//!    product that falls below f32's normal range (flushed to zero by hardware bf16 dot
//!    products, rounded to a subnormal elsewhere); scaling and folding
//!    the scale into the exponent add `3u |q·k|`. Soft-capping contracts errors (`tanh' <= 1`)
//!    and adds its own approximation error, at most `8u · softcap`. Call the bound `δ`
//!    ([`RowBound::score_error`](super::RowBound::score_error)).
//! 2. **Probabilities.** `p_j = exp(s_j - m)`: the score error and the max's error shift the
//!    exponent by at most `2δ`; the `exp2` polynomial, its argument's rounding, the online
//!    rescaling and the f32 sum of the denominator contribute at most `(16 + n) u` relative to
//!    the denominator. So every `p_j` is off by a relative `η <= 2δ + (16 + n) u` (first order).
//!    Because `o = Σ p_j v_j / Σ p_j` is a weighted mean, relative errors `η` in the weights move
//!    it by at most `2η V`.
//! 3. **P·V in the input precision.** Fast paths may round `p_j` to the input type before the
//!    product (as FlashAttention does): relative `u_T / 2` per weight, while the denominator
//!    keeps the unrounded sum, so at most `(u_T / 2) V`.
//! 4. **Accumulation.** The `n`-term f32 sum `Σ p_j v_j` and the final division: at most
//!    `n u V + u |o|`, plus where products fall below f32's normal range (values near 1e-38
//!    and smaller) an absolute error of up to half f32's smallest subnormal, `2^-150`, for each
//!    rounded product: one per key, one per rescaling of the accumulator (at most one per key)
//!    and the final normalization, `(2n + 2) · 2^-150` in all (sums of subnormals are exact).
//! 5. **Output rounding** to `T`: half a unit in the last place of the result, which is at most
//!    one unit in the last place of `|o|` once the (small) error above is included.
//!
//! Together: `|got - o| <= ulp_T(|o|) + V (u_T/2 + 4δ + (32 + 3n) u) + u |o| + (2n + 2) 2^-150`.
//!
//! For bf16 that is one bf16 ulp of the oracle value plus `V · (2^-9 + 4δ + (32+3n)·2^-24)`, an
//! absolute term relative to `max |v|`. The LSE (`m + ln Σ p`, computed in f32) is within
//! `3δ + (16 + 2n) u + 2 ulp_f32(lse)`.
//!
//! Not covered: inputs beyond the edge of f32 ([`F32_EDGE`](crate::F32_EDGE)), which the fast
//! paths refuse. Tiny values are covered: hardware bf16 products (AVX-512 BF16, AMX) treat
//! subnormal inputs as zero and flush subnormal results, and the calls where that could move
//! an answer past this bound run on the f32 kernel instead (`problem.rs`, `Magnitudes`).

use super::{Reference, RowBound};
use crate::element::{DType, Element};
use ndarray::{ArrayView2, ArrayView3};

const U: f64 = 1.0 / 16_777_216.0; // 2^-24

/// The absolute error of an f32 product rounded into the subnormal range, `2^-150`.
const F32_UNDERFLOW: f64 = f32::MIN_POSITIVE as f64 / 16_777_216.0;

impl Reference {
    /// The largest error allowed for an output element of a row with `bound`, whose exact
    /// value is `exact` (see the module docs for the derivation).
    ///
    /// ```
    /// use varlen_attn::{oracle::{Reference, RowBound}, DType};
    /// let row = RowBound { visible: 100, v_max: 2.0, score_error: 0.0 };
    /// let tol = Reference::tolerance(DType::BF16, &row, 0.75);
    /// // one bf16 ulp of 0.75 plus about 2^-9 of max|v|
    /// assert!(tol > 1.0 / 256.0 + 2.0 / 512.0 && tol < 1.0 / 256.0 + 2.0 / 500.0);
    /// ```
    pub fn tolerance(dtype: DType, bound: &RowBound, exact: f64) -> f64 {
        let n = bound.visible as f64;
        dtype.ulp(exact)
            + bound.v_max * (dtype.unit_roundoff() / 2.0 + 4.0 * bound.score_error + (32.0 + 3.0 * n) * U)
            + U * exact.abs()
            + (2.0 * n + 2.0) * F32_UNDERFLOW
    }

    /// The largest error allowed for the LSE of a row (see the module docs).
    ///
    /// ```
    /// use varlen_attn::oracle::{Reference, RowBound};
    /// let row = RowBound { visible: 10, v_max: 1.0, score_error: 1e-6 };
    /// assert!(Reference::lse_tolerance(&row, 3.0) < 1e-5);
    /// ```
    pub fn lse_tolerance(bound: &RowBound, exact: f64) -> f64 {
        3.0 * bound.score_error + (16.0 + 2.0 * bound.visible as f64) * U + 2.0 * DType::F32.ulp(exact)
    }

    /// Compares another implementation's output (all of q's tokens, or exactly the rows this
    /// reference was computed for) against the reference, element by element.
    ///
    /// NaN matches NaN (and infinities of the same sign match); otherwise the error must be
    /// within [`Reference::tolerance`].
    ///
    /// ```
    /// use ndarray::Array3;
    /// use varlen_attn::{oracle, Params};
    /// let x = Array3::<f32>::ones((2, 1, 3));
    /// let r = oracle::reference(x.view(), x.view(), x.view(), &[0, 2], &[0, 2], &Params::default())?;
    /// let mut wrong = x.clone();
    /// wrong[[1, 0, 2]] = 1.5;
    /// let report = r.compare(wrong.view());
    /// assert_eq!(report.worst.unwrap().index, [1, 0, 2]);
    /// # Ok::<(), varlen_attn::Error>(())
    /// ```
    pub fn compare<T: Element>(&self, got: ArrayView3<T>) -> Comparison {
        let mut report = Comparison::default();
        let rows = self.out.dim().0;
        let full = got.dim().0 != rows;
        let mut worst_ratio = 1.0;
        for ((row, h, d), &exact) in self.out.indexed_iter() {
            let token = if full { self.tokens[row] } else { row };
            let value = got[[token, h, d]].to_f32() as f64;
            let tolerance = Self::tolerance(self.dtype, &self.bounds[[row, h]], exact);
            report.count += 1;
            let same_special = (value.is_nan() && exact.is_nan()) || (value.is_infinite() && value == exact);
            let error = if same_special { 0.0 } else { (value - exact).abs() };
            if error == 0.0 || (exact.is_finite() && super::round_to::<T>(exact).to_f32() as f64 == value) {
                report.exact += 1;
            }
            if error.is_finite() {
                report.max_abs_error = report.max_abs_error.max(error);
                report.max_ulp_error = report.max_ulp_error.max(error / self.dtype.ulp(exact));
            } else {
                report.max_abs_error = f64::INFINITY;
                report.max_ulp_error = f64::INFINITY;
            }
            let ratio = if error.is_nan() { f64::INFINITY } else { error / tolerance };
            if ratio > worst_ratio {
                worst_ratio = ratio;
                report.worst = Some(Mismatch { index: [token, h, d], got: value, expected: exact, error, tolerance });
            }
        }
        report
    }

    /// Compares an LSE `[num_heads, total_q]` against the reference (same rules as
    /// [`Reference::compare`], with [`Reference::lse_tolerance`]).
    ///
    /// ```
    /// use ndarray::Array3;
    /// use varlen_attn::{oracle, Params};
    /// let x = Array3::<f32>::ones((2, 1, 3));
    /// let p = Params::default();
    /// let r = oracle::reference(x.view(), x.view(), x.view(), &[0, 2], &[0, 2], &p)?;
    /// let (_, lse) = varlen_attn::forward_with_lse(x.view(), x.view(), x.view(), &[0, 2], &[0, 2], &p)?;
    /// assert!(r.compare_lse(lse.view()).worst.is_none());
    /// # Ok::<(), varlen_attn::Error>(())
    /// ```
    pub fn compare_lse(&self, got: ArrayView2<f32>) -> Comparison {
        let mut report = Comparison::default();
        let full = got.dim().1 != self.tokens.len();
        let mut worst_ratio = 1.0;
        for ((h, row), &exact) in self.lse.indexed_iter() {
            let token = if full { self.tokens[row] } else { row };
            let value = got[[h, token]] as f64;
            report.count += 1;
            let same_special = (value.is_nan() && exact.is_nan()) || (value.is_infinite() && value == exact);
            let error = if same_special { 0.0 } else { (value - exact).abs() };
            if error == 0.0 || (exact as f32) as f64 == value {
                report.exact += 1;
            }
            let error_or_inf = if error.is_nan() { f64::INFINITY } else { error };
            report.max_abs_error = report.max_abs_error.max(error_or_inf);
            report.max_ulp_error = report.max_ulp_error.max(error_or_inf / DType::F32.ulp(exact));
            let tolerance = Self::lse_tolerance(&self.bounds[[row, h]], exact);
            let ratio = if error.is_nan() { f64::INFINITY } else { error / tolerance };
            if ratio > worst_ratio {
                worst_ratio = ratio;
                report.worst = Some(Mismatch { index: [token, h, 0], got: value, expected: exact, error, tolerance });
            }
        }
        report
    }
}

/// Error statistics of one comparison.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    /// Elements compared.
    pub count: usize,
    /// Elements equal to the correctly rounded reference.
    pub exact: usize,
    /// Largest absolute error.
    pub max_abs_error: f64,
    /// Largest error in units of the element type's last place at the reference value.
    pub max_ulp_error: f64,
    /// The element furthest beyond its tolerance, if any is beyond it.
    pub worst: Option<Mismatch>,
}

impl Comparison {
    /// Fraction of elements equal to the correctly rounded reference.
    ///
    /// ```
    /// assert_eq!(varlen_attn::oracle::Comparison::default().fraction_exact(), 1.0);
    /// ```
    pub fn fraction_exact(&self) -> f64 {
        if self.count == 0 {
            1.0
        } else {
            self.exact as f64 / self.count as f64
        }
    }
}

impl core::fmt::Display for Comparison {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} elements: max abs error {:.3e}, max {:.2} ulp, {:.1}% exact",
            self.count,
            self.max_abs_error,
            self.max_ulp_error,
            100.0 * self.fraction_exact()
        )?;
        if let Some(m) = &self.worst {
            write!(f, "; out of tolerance: {m}")?;
        }
        Ok(())
    }
}

/// One element beyond its tolerance.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// `[token, head, dim]` (for the LSE, `[token, head, 0]`).
    pub index: [usize; 3],
    /// The value compared.
    pub got: f64,
    /// The reference value.
    pub expected: f64,
    /// `|got - expected|`.
    pub error: f64,
    /// The tolerance it exceeds.
    pub tolerance: f64,
}

impl core::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "at [token {}, head {}, dim {}] got {:e}, expected {:e}: error {:.3e} > tolerance {:.3e}",
            self.index[0], self.index[1], self.index[2], self.got, self.expected, self.error, self.tolerance
        )
    }
}

//! The element types the crate accepts: `bf16`, `f16` and `f32`, behind one sealed trait.

use core::fmt::Debug;
use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for f32 {}
}

/// Names an element type at run time (for messages, file formats and tolerances).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// bfloat16: 8 significand bits, the range of `f32`.
    BF16,
    /// IEEE half precision: 11 significand bits.
    F16,
    /// IEEE single precision: 24 significand bits.
    F32,
}

impl DType {
    /// Lower-case name as PyTorch and safetensors spell it (`"bf16"`, `"f16"`, `"f32"`).
    ///
    /// ```
    /// assert_eq!(varlen_attn::DType::BF16.name(), "bf16");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
        }
    }

    /// Significand bits, the implicit leading bit included.
    ///
    /// ```
    /// assert_eq!(varlen_attn::DType::F32.precision_bits(), 24);
    /// ```
    pub fn precision_bits(self) -> i32 {
        match self {
            DType::BF16 => 8,
            DType::F16 => 11,
            DType::F32 => 24,
        }
    }

    /// Exponent of the smallest normal number (`-126` for bf16 and f32, `-14` for f16).
    ///
    /// ```
    /// assert_eq!(varlen_attn::DType::F16.min_exponent(), -14);
    /// ```
    pub fn min_exponent(self) -> i32 {
        match self {
            DType::BF16 | DType::F32 => -126,
            DType::F16 => -14,
        }
    }

    /// The largest finite value.
    ///
    /// ```
    /// assert_eq!(varlen_attn::DType::F16.max_finite(), 65504.0);
    /// assert_eq!(varlen_attn::DType::F32.max_finite(), f32::MAX as f64);
    /// ```
    pub fn max_finite(self) -> f64 {
        match self {
            DType::BF16 => half::bf16::MAX.to_f64(),
            DType::F16 => half::f16::MAX.to_f64(),
            DType::F32 => f32::MAX as f64,
        }
    }

    /// Unit roundoff `u = 2^-p` of round-to-nearest: bf16 `2^-8`, f16 `2^-11`, f32 `2^-24`.
    ///
    /// ```
    /// assert_eq!(varlen_attn::DType::BF16.unit_roundoff(), 1.0 / 256.0);
    /// ```
    pub fn unit_roundoff(self) -> f64 {
        (-self.precision_bits() as f64).exp2()
    }

    /// The spacing of this type's numbers at `|x|`: one unit in the last place.
    ///
    /// Below the normal range the spacing is that of the subnormals.
    ///
    /// ```
    /// use varlen_attn::DType;
    /// assert_eq!(DType::BF16.ulp(1.0), 1.0 / 128.0);
    /// assert_eq!(DType::BF16.ulp(1.5), 1.0 / 128.0);
    /// assert_eq!(DType::F32.ulp(0.0), (-149f64).exp2());
    /// ```
    pub fn ulp(self, x: f64) -> f64 {
        let exponent = exponent_of(x).max(self.min_exponent());
        ((exponent - (self.precision_bits() - 1)) as f64).exp2()
    }
}

impl core::fmt::Display for DType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// `floor(log2(|x|))` for finite non-zero `x`; a very small value for zero and non-finite input.
fn exponent_of(x: f64) -> i32 {
    let x = x.abs();
    if x == 0.0 || !x.is_finite() {
        return i32::MIN / 2;
    }
    let biased = ((x.to_bits() >> 52) & 0x7ff) as i32;
    if biased == 0 {
        // f64 subnormal: far below every target type's range.
        -1075
    } else {
        biased - 1023
    }
}

/// An element type of q, k, v and the output: `half::bf16`, `half::f16` or `f32`.
///
/// Sealed: the kernels are written for exactly these three. Conversions to `f32` are exact;
/// conversions back round to nearest, ties to even.
///
/// ```
/// use half::bf16;
/// use varlen_attn::Element;
/// let x = bf16::from_f32(1.5);
/// assert_eq!(x.to_f32(), 1.5);
/// assert_eq!(<bf16 as Element>::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0); // a tie, to even
/// ```
pub trait Element: sealed::Sealed + bytemuck::Pod + Default + Debug + PartialEq + Send + Sync + 'static {
    /// The run-time name of this type.
    const DTYPE: DType;
    /// Exact widening to `f32`.
    fn to_f32(self) -> f32;
    /// Rounds an `f32` to this type, to nearest, ties to even.
    fn from_f32(x: f32) -> Self;
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    /// The same bits shifted into an f32, exactly (NaN payloads kept: the arithmetic quiets
    /// them); branch-free, so that loops of it vectorise (`half` quiets NaNs per value).
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    /// Branch-free, so that loops of it vectorise (`half`'s conversion branches per value):
    /// adding 0x7fff plus the kept part's lowest bit carries into it exactly when the dropped
    /// half is above a tie, or a tie with an odd kept part; overflow carries into infinity. NaNs
    /// are quieted as `half` does.
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
        let quiet_nan = (b >> 16) as u16 | 0x0040;
        bf16::from_bits(if x.is_nan() { quiet_nan } else { rounded })
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half_bit_for_bit() {
        // Every kept half (both signs, every exponent: subnormals, the largest finite values,
        // which round to infinity, infinities, NaNs) with dropped halves around and at a tie.
        for high in 0..=0xffffu32 {
            for low in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc000] {
                let x = f32::from_bits(high << 16 | low);
                let ours = <bf16 as Element>::from_f32(x).to_bits();
                assert_eq!(ours, bf16::from_f32(x).to_bits(), "{x:e} ({:#010x})", x.to_bits());
            }
        }
    }

    #[test]
    fn ulp_matches_the_next_representable_number() {
        for x in [1.0f32, 3.0, 1e-3, 1234.5, 6.0e-39] {
            let next = bf16::from_bits(bf16::from_f32(x).to_bits() + 1).to_f32();
            let here = bf16::from_f32(x).to_f32();
            assert_eq!(DType::BF16.ulp(here as f64), (next - here) as f64, "at {x}");
        }
        assert_eq!(DType::F16.ulp(1.0), (-10f64).exp2());
        assert_eq!(DType::F16.ulp(1e-6), (-24f64).exp2());
    }
}

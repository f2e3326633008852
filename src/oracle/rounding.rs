//! Correct rounding from `f64` to the element types.

use crate::element::Element;

/// Rounds `x` to `T`, to nearest with ties to even, in one step (no double rounding through
/// `f32`); overflow gives infinity, NaN stays NaN.
///
/// ```
/// use half::bf16;
/// use varlen_attn::oracle::round_to;
/// // Just above the tie between 1 and 1 + 2^-7: rounding through f32 would land on the tie
/// // and then round to even (1.0); one correct rounding goes up.
/// let x = 1.0 + (-8f64).exp2() + (-40f64).exp2();
/// assert_eq!(round_to::<bf16>(x).to_f32(), 1.0 + (-7f32).exp2());
/// assert_eq!(round_to::<f32>(0.1), 0.1f32);
/// ```
pub fn round_to<T: Element>(x: f64) -> T {
    if !x.is_finite() {
        return T::from_f32(x as f32);
    }
    let dtype = T::DTYPE;
    // The spacing of T's numbers around x; x / quantum is exact (a power-of-two division in
    // f64's far wider range), so one round_ties_even does the whole rounding.
    let quantum = dtype.ulp(x);
    let rounded = (x / quantum).round_ties_even() * quantum;
    // `rounded` is a T value (or beyond T's range), so the f32 step below is exact, and
    // `from_f32` only has to map it; values past T's largest finite become infinite there.
    T::from_f32(rounded as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn agrees_with_single_rounding_from_f32() {
        // For f64 values that are f32 values, rounding once from f64 equals half's rounding
        // from f32 (which is correct for f32 input).
        let mut state = 0x9e3779b97f4a7c15u64;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f32::from_bits(state as u32);
            if !x.is_finite() {
                continue;
            }
            assert_eq!(round_to::<bf16>(x as f64).to_bits(), bf16::from_f32(x).to_bits(), "{x:e}");
            assert_eq!(round_to::<f16>(x as f64).to_bits(), f16::from_f32(x).to_bits(), "{x:e}");
            assert_eq!(round_to::<f32>(x as f64).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn overflow_and_subnormals() {
        assert_eq!(round_to::<f16>(70000.0), f16::INFINITY);
        assert_eq!(round_to::<f16>(-70000.0), f16::NEG_INFINITY);
        assert_eq!(round_to::<bf16>(1e-40).to_f32(), bf16::from_f32(1e-40).to_f32());
        assert!(round_to::<bf16>(f64::NAN).is_nan());
    }
}

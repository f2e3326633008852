//! Vector `exp2` and `tanh` for the softmax (pulp has neither), written once against
//! `pulp::Simd`.

use pulp::Simd;

/// `2^f` on `[-0.5, 0.5]`: degree-6 polynomial fitted for least maximum relative error
/// (1.9e-9 in exact arithmetic, under 2 f32 ulp evaluated in f32).
pub(crate) const EXP2_POLY: [f32; 7] =
    [1.0, core::f32::consts::LN_2, 0.240_226_46, 0.055_503_286, 0.009_618_489, 0.001_339_993_1, 0.000_153_458_11];

/// `1.5 · 2^23`: adding it rounds an `f32` of magnitude below `2^22` to an integer, which then
/// sits in the low mantissa bits.
const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// `2^x` lane by lane for `x <= 0`, within 2 ulp for `x` in `[-126, 0]`; `0` below `-126`, NaN
/// for NaN. Every caller's argument is at most 0 (a logit minus the max, `-2|y|` in `tanh`), so
/// only the lower end is clamped, with a compare-and-select so that NaN passes through on every
/// instruction set. Results that would be subnormal are 0: subnormal probabilities cost
/// microcode assists in every product they enter (ALiBi's far keys cross that band once per
/// row), and each is below 2^-126 of its row's largest, far inside the oracle's bound.
#[inline(always)]
pub fn exp2_nonpositive<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let lo = simd.splat_f32s(-126.0);
    let below = simd.less_than_f32s(x, lo);
    let y = exp2_clamped(simd, simd.select_f32s(below, lo, x));
    simd.select_f32s(below, simd.splat_f32s(0.0), y)
}

/// `2^x` for `x` in `[-127, 128]` (or NaN).
#[inline(always)]
fn exp2_clamped<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let magic = simd.splat_f32s(ROUNDING_MAGIC);
    let shifted = simd.add_f32s(x, magic);
    let n = simd.sub_f32s(shifted, magic);
    let f = simd.sub_f32s(x, n);

    let mut p = simd.splat_f32s(EXP2_POLY[6]);
    for &c in EXP2_POLY[..6].iter().rev() {
        p = simd.mul_add_f32s(p, f, simd.splat_f32s(c));
    }

    // 2^n from n's bits: the low 9 bits of (bits(shifted) + 127) are n + 127, the biased
    // exponent, which lands in place after the shift by 23 (n = -127 gives 0.0, n = 128 +inf).
    let bits = simd.transmute_u32s_f32s(shifted);
    let biased = simd.add_u32s(bits, simd.splat_u32s(127));
    let two_n = simd.wrapping_dyn_shl_u32s(biased, simd.splat_u32s(23));
    simd.mul_f32s(p, simd.transmute_f32s_u32s(two_n))
}

/// `tanh(x)` lane by lane, within a few f32 ulp; `±1` for `±inf`, NaN for NaN.
#[inline(always)]
pub fn tanh<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let sign_bit = simd.splat_u32s(0x8000_0000);
    let bits = simd.transmute_u32s_f32s(x);
    let sign = simd.and_u32s(bits, sign_bit);
    let y = simd.transmute_f32s_u32s(simd.and_u32s(bits, simd.not_u32s(sign_bit)));

    // Near zero, the odd Taylor series (its next term is below 0.2 ulp for |y| < 0.25).
    let y2 = simd.mul_f32s(y, y);
    let mut series = simd.splat_f32s(62.0 / 2835.0);
    for c in [-17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0] {
        series = simd.mul_add_f32s(series, y2, simd.splat_f32s(c));
    }
    let small = simd.mul_add_f32s(simd.mul_f32s(series, y2), y, y);

    // Elsewhere (1 - e) / (1 + e) with e = exp(-2y) <= exp(-0.5): no cancellation to speak of.
    // y is clamped so that e stays a normal number (tanh(10) is 1 in f32).
    let ten = simd.splat_f32s(10.0);
    let y_clamped = simd.select_f32s(simd.greater_than_f32s(y, ten), ten, y);
    let e = exp2_nonpositive(simd, simd.mul_f32s(y_clamped, simd.splat_f32s(-2.0 * core::f32::consts::LOG2_E)));
    let one = simd.splat_f32s(1.0);
    let large = simd.div_f32s(simd.sub_f32s(one, e), simd.add_f32s(one, e));

    let magnitude = simd.select_f32s(simd.less_than_f32s(y, simd.splat_f32s(0.25)), small, large);
    simd.transmute_f32s_u32s(simd.or_u32s(simd.transmute_u32s_f32s(magnitude), sign))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulp::{Arch, Scalar, WithSimd};

    /// Applies `exp2` or `tanh` with the given instruction set (the tail with scalar code).
    struct Apply<'a>(&'a mut [f32], bool);

    impl WithSimd for Apply<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let f = |s: S, x| if self.1 { tanh(s, x) } else { exp2_nonpositive(s, x) };
            let (head, tail) = S::as_mut_simd_f32s(self.0);
            head.iter_mut().for_each(|x| *x = f(simd, *x));
            for x in tail {
                *x = if self.1 { tanh(Scalar::new(), *x) } else { exp2_nonpositive(Scalar::new(), *x) };
            }
        }
    }

    /// The results of the scalar path and of the best path of this CPU.
    fn on_every_isa(values: &[f32], use_tanh: bool) -> [Vec<f32>; 2] {
        let (mut scalar, mut best) = (values.to_vec(), values.to_vec());
        Apply(&mut scalar, use_tanh).with_simd(Scalar::new());
        Arch::new().dispatch(Apply(&mut best, use_tanh));
        [scalar, best]
    }

    fn ulps(got: f32, exact: f64) -> f64 {
        (got as f64 - exact).abs() / crate::DType::F32.ulp(exact)
    }

    #[test]
    fn exp2_is_within_two_ulp() {
        let xs: Vec<f32> = (0..200_001).map(|i| -126.0 + 126.0 * i as f32 / 200_000.0).collect();
        for out in on_every_isa(&xs, false) {
            for (&x, &y) in xs.iter().zip(&out) {
                let exact = (x as f64).exp2();
                assert!(ulps(y, exact) <= 2.0, "exp2({x}) = {y}, exact {exact}");
            }
        }
    }

    #[test]
    fn exp2_edges() {
        // Below -126 the result would be subnormal: 0 instead.
        let xs = [f32::NEG_INFINITY, -1000.0, -127.5, -126.25, 0.0, -0.0, f32::NAN];
        for out in on_every_isa(&xs, false) {
            assert_eq!(&out[..6], &[0.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
            assert!(out[6].is_nan());
        }
    }

    #[test]
    fn tanh_is_within_eight_ulp() {
        let xs: Vec<f32> = (0..200_001).map(|i| -12.0 + 24.0 * i as f32 / 200_000.0).chain([1e-30, -3e-8]).collect();
        for out in on_every_isa(&xs, true) {
            for (&x, &y) in xs.iter().zip(&out) {
                let exact = (x as f64).tanh();
                assert!(ulps(y, exact) <= 8.0, "tanh({x}) = {y}, exact {exact}");
            }
        }
        let edges = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0];
        for out in on_every_isa(&edges, true) {
            assert_eq!(&out[..2], &[1.0, -1.0]);
            assert!(out[2].is_nan());
            assert!(out[3] == 0.0 && out[3].is_sign_negative());
        }
    }
}

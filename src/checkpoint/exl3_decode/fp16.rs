//! IEEE binary16 bit patterns: exact widening to `f64`, and rounding an `f64` to the nearest
//! binary16 (ties to even), including subnormals, overflow to infinity and NaN.

/// Exponent bias of binary16.
const BIAS: i32 = 15;

/// The exact value of an fp16 bit pattern.
#[must_use]
pub fn to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1F);
    let frac = f64::from(bits & 0x03FF);
    match exp {
        0 => sign * frac * 2f64.powi(1 - BIAS - 10),
        0x1F if frac == 0.0 => sign * f64::INFINITY,
        0x1F => f64::NAN,
        _ => sign * (1024.0 + frac) * 2f64.powi(exp - BIAS - 10),
    }
}

/// The exact value of an fp16 bit pattern as `f32` (every fp16 value is exact in `f32`).
#[must_use]
#[allow(clippy::cast_possible_truncation)] // exact: binary16 ⊂ binary32
pub fn to_f32(bits: u16) -> f32 {
    to_f64(bits) as f32
}

/// Round `x` to the nearest fp16 value, ties to even; returns the bit pattern.
#[must_use]
pub fn from_f64(x: f64) -> u16 {
    if x.is_nan() {
        return 0x7E00;
    }
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a == 0.0 {
        return sign;
    }
    if a >= 65520.0 {
        return sign | 0x7C00; // infinity, or rounds past the largest finite value (65504)
    }
    // Quantum (ulp) of the binade `a` falls in; subnormals share the smallest one, 2^-24.
    #[allow(clippy::cast_possible_truncation)] // |log2| < 1100 for finite non-zero f64
    let exp = a.log2().floor() as i32;
    let exp = exp.max(1 - BIAS);
    // log2 can be off by one near powers of two: correct it.
    let exp = if a < 2f64.powi(exp) && exp > 1 - BIAS {
        exp - 1
    } else if a >= 2f64.powi(exp + 1) {
        exp + 1
    } else {
        exp
    };
    if exp > BIAS {
        return sign | 0x7C00;
    }
    let quantum = 2f64.powi(exp - 10);
    let scaled = a / quantum; // exact: division by a power of two
    let mut q = scaled.floor();
    let rest = scaled - q;
    if rest > 0.5 || (rest == 0.5 && q % 2.0 == 1.0) {
        q += 1.0;
    }
    // q is an integer in [0, 2048]: the significand in units of `quantum`.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let q = q as u32;
    let bits = if exp == 1 - BIAS && q < 1024 {
        q // subnormal (or rounded up into the first normal binade below)
    } else {
        // q in [1024, 2048]: 2048 carries into the next binade.
        let (q, e) = if q == 2048 { (1024, exp + 1) } else { (q, exp) };
        if e > BIAS {
            return sign | 0x7C00;
        }
        #[allow(clippy::cast_sign_loss)]
        let biased = (e + BIAS) as u32;
        (biased << 10) | (q - 1024)
    };
    // bits < 0x7C00 here.
    #[allow(clippy::cast_possible_truncation)]
    let bits = bits as u16;
    sign | bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_pattern_round_trips() {
        for bits in 0..=u16::MAX {
            let v = to_f64(bits);
            if v.is_nan() {
                assert_eq!(from_f64(v), 0x7E00);
                continue;
            }
            assert_eq!(from_f64(v), bits, "{bits:#06x} = {v}");
        }
    }

    #[test]
    fn ties_go_to_even_and_overflow_to_infinity() {
        // Halfway between 1.0 (0x3C00) and its successor (0x3C01): even = 0x3C00.
        assert_eq!(from_f64(1.0 + 2f64.powi(-11)), 0x3C00);
        // Halfway between 0x3C01 and 0x3C02: even = 0x3C02.
        assert_eq!(from_f64(1.0 + 3.0 * 2f64.powi(-11)), 0x3C02);
        assert_eq!(from_f64(1.0 + 2f64.powi(-11) + 1e-12), 0x3C01);
        assert_eq!(from_f64(65504.0), 0x7BFF);
        assert_eq!(from_f64(65520.0), 0x7C00); // rounds up past the largest finite
        assert_eq!(from_f64(-1e9), 0xFC00);
        assert_eq!(from_f64(2f64.powi(-25)), 0); // tie with 0: even
        assert_eq!(from_f64(3.0 * 2f64.powi(-26)), 1);
        assert_eq!(from_f64(-0.0), 0x8000);
        // The largest subnormal rounds up into the smallest normal.
        assert_eq!(from_f64(2f64.powi(-14) - 2f64.powi(-26)), 0x0400);
    }
}

//! EXL3 codebooks (docs/exl3-format.md §2.4): a 16-bit trellis state → an fp16 value.
//!
//! Each codebook is materialised once per process as a 65,536-entry table of fp16 bit patterns.
//! Integer steps wrap mod 2^32; the kernels' fp16 add / fma is computed exactly in `f64` and
//! rounded to fp16 once (ties to even).

use std::sync::OnceLock;

use super::fp16;
use crate::checkpoint::exl3_audit::Codebook;

/// 3INST multiplier and addend.
const INST3_MUL: u32 = 89_226_354;
const INST3_ADD: u32 = 64_248_484;
/// MCG multiplier (also its marker value).
pub const MCG_MUL: u32 = 0xCBAC_1FED;
/// MUL1 multiplier (also its marker value).
pub const MUL1_MUL: u32 = 0x83DC_D12D;
/// 3INST / MCG mask and xor (two fp16 halves in ±[0.125, 2)).
const HALF_MASK: u32 = 0x8FFF_8FFF;
const HALF_XOR: u32 = 0x3B60_3B60;
/// MUL1's affine map: fp16 0.00676727294921875 and −10.3828125.
const MUL1_SCALE: u16 = 0x1EEE;
const MUL1_OFFSET: u16 = 0xC931;

/// Number of states.
pub const STATES: usize = 1 << 16;

/// fp16 bit pattern of state `s` under `codebook`, computed from the formula.
#[must_use]
pub fn value_bits(codebook: Codebook, s: u16) -> u16 {
    let s = u32::from(s);
    match codebook {
        Codebook::ThreeInst => half_sum(s.wrapping_mul(INST3_MUL).wrapping_add(INST3_ADD)),
        Codebook::Mcg => half_sum(s.wrapping_mul(MCG_MUL)),
        Codebook::Mul1 => {
            let x = s.wrapping_mul(MUL1_MUL);
            let byte_sum: u32 = x.to_le_bytes().iter().map(|&b| u32::from(b)).sum();
            let exact = f64::from(1024 + byte_sum) * fp16::to_f64(MUL1_SCALE) + fp16::to_f64(MUL1_OFFSET);
            fp16::from_f64(exact)
        }
    }
}

/// Two fp16 halves of `(x & mask) ^ xor`, added with one rounding.
fn half_sum(x: u32) -> u16 {
    let x = (x & HALF_MASK) ^ HALF_XOR;
    let [b0, b1, b2, b3] = x.to_le_bytes();
    let lo = u16::from_le_bytes([b0, b1]);
    let hi = u16::from_le_bytes([b2, b3]);
    fp16::from_f64(fp16::to_f64(lo) + fp16::to_f64(hi))
}

/// The codebook's table: `table(c)[s]` = fp16 bits of state `s`. Built once, then shared.
#[must_use]
pub fn table(codebook: Codebook) -> &'static [u16] {
    static TABLES: [OnceLock<Vec<u16>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match codebook {
        Codebook::ThreeInst => 0,
        Codebook::Mcg => 1,
        Codebook::Mul1 => 2,
    };
    TABLES[slot].get_or_init(|| (0..=u16::MAX).map(|s| value_bits(codebook, s)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(c: Codebook) -> (f64, f64, f64, f64) {
        let v: Vec<f64> = table(c).iter().map(|&b| fp16::to_f64(b)).collect();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (mean, std, min, max)
    }

    #[test]
    fn tables_have_the_documented_spread() {
        // Format doc §1.7/§2.4: std ≈ 1.24 for 3INST/MCG, ≈ 1.00 for MUL1 in ≈ [−3.453, 3.348].
        for (c, want_std) in [(Codebook::ThreeInst, 1.2437), (Codebook::Mcg, 1.2437), (Codebook::Mul1, 1.0003)] {
            let (mean, std, min, max) = stats(c);
            assert!(table(c).iter().all(|&b| fp16::to_f64(b).is_finite()), "{c:?}");
            assert!(mean.abs() < 0.02, "{c:?} mean {mean}");
            assert!((std - want_std).abs() < 0.02, "{c:?} std {std}");
            assert!(min > -4.0 && max < 4.0, "{c:?} [{min}, {max}]");
        }
        let (_, _, min, max) = stats(Codebook::Mul1);
        assert!((min + 3.453).abs() < 2e-3 && (max - 3.348).abs() < 2e-3, "[{min}, {max}]");
    }

    #[test]
    fn hand_computed_states() {
        // MUL1, s = 0: x = 0, byte sum 0 → 1024·0.00676727294921875 − 10.3828125 = −3.45312500 → fp16 0xC2E8.
        assert_eq!(value_bits(Codebook::Mul1, 0), fp16::from_f64(1024.0 * 0.006_767_272_949_218_75 - 10.382_812_5));
        assert_eq!(value_bits(Codebook::Mul1, 0), 0xC2E8);
        // MCG, s = 0: x = 0 → (0 & mask) ^ xor = 0x3B603B60 → 0.9219 + 0.9219 = 1.84375 (0x3F60).
        assert_eq!(value_bits(Codebook::Mcg, 0), 0x3F60);
        // 3INST, s = 1: x = 89226354 + 64248484 = 153474838 = 0x0925_D716.
        let x = (0x0925_D716u32 & HALF_MASK) ^ HALF_XOR;
        let want = fp16::to_f64((x & 0xFFFF) as u16) + fp16::to_f64((x >> 16) as u16);
        assert_eq!(value_bits(Codebook::ThreeInst, 1), fp16::from_f64(want));
    }
}

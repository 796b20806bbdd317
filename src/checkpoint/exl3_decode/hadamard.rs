//! The 128-point Hadamard transforms of docs/exl3-format.md §2.6, as fast Walsh–Hadamard
//! butterflies: `H[a, b] = (−1)^popcount(a & b) / sqrt(128)` (Sylvester order, symmetric,
//! orthonormal), applied per 128-block along rows (`Hk · W`) or columns (`W · Hn`).

/// Width of the Hadamard blocks.
pub const BLOCK: usize = 128;

/// 1/sqrt(128) rounded to `f32` (the kernels' constant 0.088388347648).
pub const NORM_F32: f32 = f32::from_bits(0x3DB5_04F3); // 0.088388346…, 1/sqrt(2) / 8

/// 1/sqrt(128).
fn norm() -> f64 {
    1.0 / (BLOCK as f64).sqrt()
}

/// `m ← (I ⊗ H) · m` for a row-major `rows × cols` matrix (`rows` a multiple of 128).
pub fn rows_in_place(m: &mut [f64], rows: usize, cols: usize) {
    rows_unscaled(m, rows, cols);
    let n = norm();
    m.iter_mut().for_each(|v| *v *= n);
}

/// `m ← (I ⊗ H·sqrt(128)) · m`: the ±1 butterflies only.
pub fn rows_unscaled(m: &mut [f64], rows: usize, cols: usize) {
    debug_assert_eq!(m.len(), rows * cols);
    let mut h = 1;
    while h < BLOCK {
        for block in (0..rows).step_by(BLOCK) {
            for i in (block..block + BLOCK).filter(|i| (i - block) & h == 0) {
                let (top, bottom) = m.split_at_mut((i + h) * cols);
                let a = &mut top[i * cols..(i + 1) * cols];
                let b = &mut bottom[..cols];
                for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                    let (p, q) = (*x + *y, *x - *y);
                    *x = p;
                    *y = q;
                }
            }
        }
        h *= 2;
    }
}

/// `m ← m · (I ⊗ H)` for a row-major matrix whose rows are `cols` wide (a multiple of 128).
pub fn cols_in_place(m: &mut [f64], cols: usize) {
    cols_unscaled(m, cols);
    let n = norm();
    m.iter_mut().for_each(|v| *v *= n);
}

/// `m ← m · (I ⊗ H·sqrt(128))`: the ±1 butterflies only.
pub fn cols_unscaled(m: &mut [f64], cols: usize) {
    for chunk in m.chunks_exact_mut(BLOCK) {
        let mut h = 1;
        while h < BLOCK {
            for i in (0..BLOCK).filter(|i| i & h == 0) {
                let (p, q) = (chunk[i] + chunk[i + h], chunk[i] - chunk[i + h]);
                chunk[i] = p;
                chunk[i + h] = q;
            }
            h *= 2;
        }
    }
    debug_assert_eq!(m.len() % cols, 0);
}

/// Sign of `H[a, b]`: `(−1)^popcount(a & b)`.
fn sign(a: usize, b: usize) -> f32 {
    if (a & b).count_ones() % 2 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// `(I ⊗ H) · m` in `f32`, each output a sequential fused multiply-add over k = 0..127 of
/// `±NORM_F32 · m[k]` — the rounding of an `f32` GEMM with H as the left operand, which is what
/// exllamav3's reconstruction reproduces bit for bit.
#[must_use]
pub fn rows_f32_gemm(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for block in (0..rows).step_by(BLOCK) {
        for i in 0..BLOCK {
            let acc = &mut out[(block + i) * cols..(block + i + 1) * cols];
            for k in 0..BLOCK {
                let h = sign(i, k) * NORM_F32;
                let src = &m[(block + k) * cols..(block + k + 1) * cols];
                for (a, &x) in acc.iter_mut().zip(src) {
                    *a = h.mul_add(x, *a);
                }
            }
        }
    }
    out
}

/// `m · (I ⊗ H)` in `f32` with the same sequential fused multiply-add rounding.
#[must_use]
pub fn cols_f32_gemm(m: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; m.len()];
    for (src, dst) in m.chunks_exact(BLOCK).zip(out.chunks_exact_mut(BLOCK)) {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = src.iter().enumerate().fold(0f32, |acc, (k, &x)| x.mul_add(sign(k, j) * NORM_F32, acc));
        }
    }
    debug_assert_eq!(m.len() % cols, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense_h() -> Vec<f64> {
        (0..BLOCK * BLOCK)
            .map(|k| {
                let (a, b) = (k / BLOCK, k % BLOCK);
                if (a & b).count_ones() % 2 == 0 {
                    norm()
                } else {
                    -norm()
                }
            })
            .collect()
    }

    #[test]
    fn butterflies_equal_the_dense_sylvester_matrix_and_are_involutions() {
        let h = dense_h();
        // Identity in → H out, both ways.
        let mut eye: Vec<f64> = (0..BLOCK * BLOCK).map(|k| f64::from(u8::from(k / BLOCK == k % BLOCK))).collect();
        rows_in_place(&mut eye, BLOCK, BLOCK);
        assert!(eye.iter().zip(&h).all(|(a, b)| (a - b).abs() < 1e-15));
        let mut eye2: Vec<f64> = (0..BLOCK * BLOCK).map(|k| f64::from(u8::from(k / BLOCK == k % BLOCK))).collect();
        cols_in_place(&mut eye2, BLOCK);
        assert!(eye2.iter().zip(&h).all(|(a, b)| (a - b).abs() < 1e-15));
        // Two blocks of rows, 3 columns: H·H = I.
        let orig: Vec<f64> = (0..256 * 3).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
        let mut m = orig.clone();
        rows_in_place(&mut m, 256, 3);
        assert!(m.iter().zip(&orig).any(|(a, b)| (a - b).abs() > 1.0));
        rows_in_place(&mut m, 256, 3);
        assert!(m.iter().zip(&orig).all(|(a, b)| (a - b).abs() < 1e-9));
    }
}

//! x86 register kernels of [`super::PackedF32Weight`]: one packed panel (`[k][32]` f32)
//! times up to 64 rows of `x`. AVX-512F: 8 rows × 32 channels in 16 zmm accumulators, each
//! `k` step two weight loads, 8 broadcasts and 16 FMAs. AVX2+FMA: 4 rows × 16 channels in 8
//! ymm accumulators, run twice per panel. Sums run over `k` in order, one FMA per term.

use super::f32_packed::PANEL;
use std::arch::x86_64::*;

/// AVX-512F kernel. Callers check the CPU first (`F32Kernel::detect`).
pub(crate) fn panel_avx512(x: &[f32], rows: usize, k: usize, panel: &[f32], tile: &mut [f32]) {
    assert!(x.len() >= rows * k && panel.len() >= k * PANEL && tile.len() >= rows * PANEL);
    assert!(std::arch::is_x86_feature_detected!("avx512f"));
    let mut r = 0;
    // SAFETY: features checked above; the asserts bound every pointer below.
    unsafe {
        while r + 8 <= rows {
            block512::<8>(
                x.as_ptr().add(r * k),
                k,
                panel.as_ptr(),
                tile.as_mut_ptr().add(r * PANEL),
            );
            r += 8;
        }
        while r < rows {
            block512::<1>(
                x.as_ptr().add(r * k),
                k,
                panel.as_ptr(),
                tile.as_mut_ptr().add(r * PANEL),
            );
            r += 1;
        }
    }
}

/// # Safety
/// AVX-512F present; `x` holds `R` rows of `k`; `w` holds `k * 32`; `t` holds `R * 32`.
#[target_feature(enable = "avx512f")]
unsafe fn block512<const R: usize>(x: *const f32, k: usize, w: *const f32, t: *mut f32) {
    let mut a0 = [_mm512_setzero_ps(); R];
    let mut a1 = [_mm512_setzero_ps(); R];
    for kk in 0..k {
        let w0 = _mm512_loadu_ps(w.add(kk * PANEL));
        let w1 = _mm512_loadu_ps(w.add(kk * PANEL + 16));
        for r in 0..R {
            let xb = _mm512_set1_ps(*x.add(r * k + kk));
            a0[r] = _mm512_fmadd_ps(xb, w0, a0[r]);
            a1[r] = _mm512_fmadd_ps(xb, w1, a1[r]);
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(t.add(r * PANEL), a0[r]);
        _mm512_storeu_ps(t.add(r * PANEL + 16), a1[r]);
    }
}

/// AVX2+FMA kernel. Callers check the CPU first (`F32Kernel::detect`).
pub(crate) fn panel_avx2(x: &[f32], rows: usize, k: usize, panel: &[f32], tile: &mut [f32]) {
    assert!(x.len() >= rows * k && panel.len() >= k * PANEL && tile.len() >= rows * PANEL);
    assert!(
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    );
    for half in [0, 16] {
        let mut r = 0;
        // SAFETY: features checked above; the asserts bound every pointer below.
        unsafe {
            while r + 4 <= rows {
                block256::<4>(
                    x.as_ptr().add(r * k),
                    k,
                    panel.as_ptr().add(half),
                    tile.as_mut_ptr().add(r * PANEL + half),
                );
                r += 4;
            }
            while r < rows {
                block256::<1>(
                    x.as_ptr().add(r * k),
                    k,
                    panel.as_ptr().add(half),
                    tile.as_mut_ptr().add(r * PANEL + half),
                );
                r += 1;
            }
        }
    }
}

/// # Safety
/// AVX2+FMA present; `x` holds `R` rows of `k`; `w` points at 16 channels of a `[k][32]`
/// panel; `t` holds `R` rows of 32 (16 written each).
#[target_feature(enable = "avx2,fma")]
unsafe fn block256<const R: usize>(x: *const f32, k: usize, w: *const f32, t: *mut f32) {
    let mut a0 = [_mm256_setzero_ps(); R];
    let mut a1 = [_mm256_setzero_ps(); R];
    for kk in 0..k {
        let w0 = _mm256_loadu_ps(w.add(kk * PANEL));
        let w1 = _mm256_loadu_ps(w.add(kk * PANEL + 8));
        for r in 0..R {
            let xb = _mm256_set1_ps(*x.add(r * k + kk));
            a0[r] = _mm256_fmadd_ps(xb, w0, a0[r]);
            a1[r] = _mm256_fmadd_ps(xb, w1, a1[r]);
        }
    }
    for r in 0..R {
        _mm256_storeu_ps(t.add(r * PANEL), a0[r]);
        _mm256_storeu_ps(t.add(r * PANEL + 8), a1[r]);
    }
}

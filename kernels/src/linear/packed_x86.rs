//! x86 register kernels of [`super::PackedWeight`]: one packed panel (`[k][32]`, f32 or
//! bf16) times up to 64 rows of `x`. AVX-512F: 8 rows × 32 channels in 16 zmm accumulators,
//! each `k` step two weight loads, 8 broadcasts and 16 FMAs. AVX2+FMA: up to 6 rows × 16
//! channels in 12 ymm accumulators, run twice per panel, fetching the next panel into the
//! cache a line per two `k` steps as it goes (without it the first block of every panel
//! waited on memory: 246M decode b32 +11%). A bf16 panel row is widened to f32 on load
//! (zero-extend to 32 bits, shift left 16: exact). Sums run over `k` in order, one FMA per
//! term, so the two element types give the same sums for the same f32 weight values.

use super::next_panel::NextPanel;
use super::panel::{PanelElement, PANEL};
use std::arch::x86_64::*;

/// AVX-512F kernel. Callers check the CPU first (`PanelKernel::detect`).
pub(crate) fn panel_avx512<E: PanelElement>(
    x: &[f32],
    rows: usize,
    k: usize,
    panel: &[E],
    tile: &mut [f32],
) {
    assert!(x.len() >= rows * k && panel.len() >= k * PANEL && tile.len() >= rows * PANEL);
    assert!(std::arch::is_x86_feature_detected!("avx512f"));
    let w = panel.as_ptr().cast::<u8>();
    // SAFETY: features checked above; the asserts bound every pointer read and written, and
    // `E::BF16` says which element type `w` holds.
    unsafe {
        if E::BF16 {
            rows512::<true>(x, rows, k, w, tile)
        } else {
            rows512::<false>(x, rows, k, w, tile)
        }
    }
}

/// # Safety
/// AVX-512F present; `w` holds a `[k][32]` panel of bf16 (`BF16`) or f32; `x`, `tile` as
/// asserted by the caller.
unsafe fn rows512<const BF16: bool>(x: &[f32], rows: usize, k: usize, w: *const u8, t: &mut [f32]) {
    let mut r = 0;
    while r + 8 <= rows {
        block512::<8, BF16>(x.as_ptr().add(r * k), k, w, t.as_mut_ptr().add(r * PANEL));
        r += 8;
    }
    while r < rows {
        block512::<1, BF16>(x.as_ptr().add(r * k), k, w, t.as_mut_ptr().add(r * PANEL));
        r += 1;
    }
}

/// 16 weights of a panel row at element `i`, as f32.
///
/// # Safety
/// AVX-512F present; `w` holds at least `i + 16` elements of the `BF16` type.
#[target_feature(enable = "avx512f")]
unsafe fn load512<const BF16: bool>(w: *const u8, i: usize) -> __m512 {
    if BF16 {
        let raw = _mm256_loadu_si256(w.cast::<u16>().add(i).cast());
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    } else {
        _mm512_loadu_ps(w.cast::<f32>().add(i))
    }
}

/// # Safety
/// AVX-512F present; `x` holds `R` rows of `k`; `w` holds `k * 32`; `t` holds `R * 32`.
#[target_feature(enable = "avx512f")]
unsafe fn block512<const R: usize, const BF16: bool>(
    x: *const f32,
    k: usize,
    w: *const u8,
    t: *mut f32,
) {
    let mut a0 = [_mm512_setzero_ps(); R];
    let mut a1 = [_mm512_setzero_ps(); R];
    for kk in 0..k {
        let w0 = load512::<BF16>(w, kk * PANEL);
        let w1 = load512::<BF16>(w, kk * PANEL + 16);
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

/// AVX2+FMA kernel. Callers check the CPU first (`PanelKernel::detect`).
pub(crate) fn panel_avx2<E: PanelElement>(
    x: &[f32],
    rows: usize,
    k: usize,
    panel: &[E],
    tile: &mut [f32],
) {
    assert!(x.len() >= rows * k && panel.len() >= k * PANEL && tile.len() >= rows * PANEL);
    assert!(
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    );
    let w = panel.as_ptr().cast::<u8>();
    // SAFETY: features checked above; the asserts bound every pointer read and written, and
    // `E::BF16` says which element type `w` holds.
    unsafe {
        if E::BF16 {
            rows256::<true>(x, rows, k, w, tile)
        } else {
            rows256::<false>(x, rows, k, w, tile)
        }
    }
}

/// # Safety
/// AVX2+FMA present; as [`rows512`].
unsafe fn rows256<const BF16: bool>(x: &[f32], rows: usize, k: usize, w: *const u8, t: &mut [f32]) {
    let mut next = NextPanel::after(w, k * PANEL * if BF16 { 2 } else { 4 });
    for half in [0, 16] {
        let mut r = 0;
        while r < rows {
            let (xr, tr) = (x.as_ptr().add(r * k), t.as_mut_ptr().add(r * PANEL + half));
            // Blocks of 6 rows (12 accumulators, 15 of the 16 ymm registers), the rest in 4,
            // 2 and 1; 8 rows left go as two blocks of 4, not 6 and 2 (a block of 2 loads
            // as many weights per step as one of 6 for a third of the products).
            let block = match rows - r {
                8 => 4,
                6.. => 6,
                4 | 5 => 4,
                2 | 3 => 2,
                _ => 1,
            };
            let step = match block {
                6 => block256::<6, BF16> as BlockFn,
                4 => block256::<4, BF16>,
                2 => block256::<2, BF16>,
                _ => block256::<1, BF16>,
            };
            step(xr, k, w, half, tr, &mut next);
            r += block;
        }
    }
}

/// [`block256`] for one block size.
type BlockFn = unsafe fn(*const f32, usize, *const u8, usize, *mut f32, &mut NextPanel);

/// 8 weights of a panel row at element `i`, as f32.
///
/// # Safety
/// AVX2 present; `w` holds at least `i + 8` elements of the `BF16` type.
#[target_feature(enable = "avx2")]
unsafe fn load256<const BF16: bool>(w: *const u8, i: usize) -> __m256 {
    if BF16 {
        let raw = _mm_loadu_si128(w.cast::<u16>().add(i).cast());
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
    } else {
        _mm256_loadu_ps(w.cast::<f32>().add(i))
    }
}

/// # Safety
/// AVX2+FMA present; `x` holds `R` rows of `k`; `w` holds a `[k][32]` panel whose channels
/// `half..half + 16` are used; `t` holds `R` rows of 32 (16 written each, from `t`).
#[target_feature(enable = "avx2,fma")]
unsafe fn block256<const R: usize, const BF16: bool>(
    x: *const f32,
    k: usize,
    w: *const u8,
    half: usize,
    t: *mut f32,
    next: &mut NextPanel,
) {
    let mut acc = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    // Two steps per iteration, their four weight loads issued first (the loads of the
    // block that takes the panel from memory wait; the next step's are then in flight).
    let mut kk = 0;
    while kk + 2 <= k {
        let w0 = load256::<BF16>(w, kk * PANEL + half);
        let w1 = load256::<BF16>(w, kk * PANEL + half + 8);
        let v0 = load256::<BF16>(w, (kk + 1) * PANEL + half);
        let v1 = load256::<BF16>(w, (kk + 1) * PANEL + half + 8);
        fma_step::<R>(x.add(kk), k, (w0, w1), &mut acc);
        fma_step::<R>(x.add(kk + 1), k, (v0, v1), &mut acc);
        next.fetch_one();
        kk += 2;
    }
    if kk < k {
        let w0 = load256::<BF16>(w, kk * PANEL + half);
        let w1 = load256::<BF16>(w, kk * PANEL + half + 8);
        fma_step::<R>(x.add(kk), k, (w0, w1), &mut acc);
    }
    let (a0, a1) = acc;
    for r in 0..R {
        _mm256_storeu_ps(t.add(r * PANEL), a0[r]);
        _mm256_storeu_ps(t.add(r * PANEL + 8), a1[r]);
    }
}

/// One step of `k` in [`block256`]: `acc[.][r] += x[r * k] · (w0, w1)` for the `R` rows.
///
/// # Safety
/// AVX2+FMA present; `x` holds `R` rows `k` apart.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn fma_step<const R: usize>(
    x: *const f32,
    k: usize,
    (w0, w1): (__m256, __m256),
    (a0, a1): &mut ([__m256; R], [__m256; R]),
) {
    for r in 0..R {
        let xb = _mm256_set1_ps(*x.add(r * k));
        a0[r] = _mm256_fmadd_ps(xb, w0, a0[r]);
        a1[r] = _mm256_fmadd_ps(xb, w1, a1[r]);
    }
}

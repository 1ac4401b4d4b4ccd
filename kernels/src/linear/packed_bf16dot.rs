//! The AVX-512 BF16 register kernel of a bf16 [`super::PackedWeight`]: the activations are
//! rounded to bf16 as well (the numbers of a bf16 model in HF transformers or vLLM, and of
//! the trainer's `bf16_mixed` projections), and `vdpbf16ps` sums two products per f32 lane
//! and instruction, twice the f32 FMA's work.
//!
//! The panel keeps its `[k][32]` layout: each step loads panel rows `k` and `k + 1` and
//! interleaves them into `(k, k + 1)` pairs with 16-bit unpacks, which order the 32 channels
//! within 128-bit lanes; the two accumulators are put back in channel order once, at the end.
//! `x` arrives as pairs `[rows][k / 2]` (`crate::matmul::bf16_row_pairs`).

use std::arch::x86_64::*;

use super::panel::PANEL;

/// Whether this CPU runs the kernel.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// `tile[r][c] = Σ_k bf16(x[r, k]) · panel[k][c]` for `rows ≤ 64` rows given as bf16 pairs
/// `xp` (`[rows][k.div_ceil(2)]`).
///
/// # Panics
/// When the CPU lacks the kernel's features or the slices are shorter than the shapes say.
pub(crate) fn panel_bf16dot(
    xp: &[u32],
    rows: usize,
    k: usize,
    panel: &[half::bf16],
    tile: &mut [f32],
) {
    let pairs = k.div_ceil(2);
    assert!(xp.len() >= rows * pairs && panel.len() >= k * PANEL && tile.len() >= rows * PANEL);
    assert!(available());
    let w = panel.as_ptr().cast::<u16>();
    let mut r = 0;
    // SAFETY: features checked above; the asserts bound every pointer read and written.
    unsafe {
        while r + 8 <= rows {
            block::<8>(
                xp.as_ptr().add(r * pairs),
                k,
                w,
                tile.as_mut_ptr().add(r * PANEL),
            );
            r += 8;
        }
        while r < rows {
            block::<1>(
                xp.as_ptr().add(r * pairs),
                k,
                w,
                tile.as_mut_ptr().add(r * PANEL),
            );
            r += 1;
        }
    }
}

/// Panel rows `2p` and `2p + 1` (zero past `k`) as 16 `(k, k + 1)` pairs each: channels
/// `8L..8L + 4` of 128-bit lane `L` in the first, `8L + 4..8L + 8` in the second.
///
/// # Safety
/// AVX-512F/BW; `w` holds `k` panel rows of [`PANEL`] bf16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn weight_pairs(w: *const u16, p: usize, k: usize) -> (__m512bh, __m512bh) {
    let even = _mm512_loadu_si512(w.add(2 * p * PANEL).cast());
    let odd = match 2 * p + 1 < k {
        true => _mm512_loadu_si512(w.add((2 * p + 1) * PANEL).cast()),
        false => _mm512_setzero_si512(),
    };
    let lo = _mm512_unpacklo_epi16(even, odd);
    let hi = _mm512_unpackhi_epi16(even, odd);
    (
        std::mem::transmute::<__m512i, __m512bh>(lo),
        std::mem::transmute::<__m512i, __m512bh>(hi),
    )
}

/// `R` rows × 32 channels over all of `k`.
///
/// # Safety
/// AVX-512F/BW/BF16; `xp` holds `R` rows of `k.div_ceil(2)` pairs, `w` `k` panel rows, `t`
/// `R` rows of [`PANEL`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn block<const R: usize>(xp: *const u32, k: usize, w: *const u16, t: *mut f32) {
    let pairs = k.div_ceil(2);
    let mut lo = [_mm512_setzero_ps(); R];
    let mut hi = [_mm512_setzero_ps(); R];
    for p in 0..pairs {
        let (wl, wh) = weight_pairs(w, p, k);
        for r in 0..R {
            let xb: __m512bh =
                std::mem::transmute(_mm512_set1_epi32(*xp.add(r * pairs + p) as i32));
            lo[r] = _mm512_dpbf16_ps(lo[r], xb, wl);
            hi[r] = _mm512_dpbf16_ps(hi[r], xb, wh);
        }
    }
    // Channel c = 8L + i sits in lane 4L + i of `lo` (i < 4) or 4L + i - 4 of `hi`.
    let first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    let second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for r in 0..R {
        _mm512_storeu_ps(
            t.add(r * PANEL),
            _mm512_permutex2var_ps(lo[r], first, hi[r]),
        );
        _mm512_storeu_ps(
            t.add(r * PANEL + 16),
            _mm512_permutex2var_ps(lo[r], second, hi[r]),
        );
    }
}

//! The AVX-512 BF16 register tile: 12 rows × 32 columns of f32 sums in 24 zmm registers,
//! each step one broadcast bf16 pair of `A` per row against two registers of `B` pairs
//! (`vdpbf16ps`: two products per lane, summed in f32).

use std::arch::x86_64::*;

use super::bf16_pack::{MR, NR};
use super::bf16_pack_avx512::lane_mask;

/// Whether this CPU has AVX-512F and AVX-512 BF16.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// `C[..live, ..cols] (+)= alpha · A_tile · B_panel` over `pn` pairs: `a` is `[pn][MR]`
/// pairs, `b` `[pn][NR]` pairs, `c` row-major with stride `ldc`; `first` overwrites `C`,
/// otherwise adds.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512 BF16; `a.len() >= pn · MR`, `b.len() >= pn · NR`,
/// and `c` must hold `(live - 1) · ldc + cols` values.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    pn: usize,
    a: &[u32],
    b: &[u32],
    c: &mut [f32],
    ldc: usize,
    live: usize,
    cols: usize,
    (first, alpha): (bool, f32),
) {
    debug_assert!(a.len() >= pn * MR && b.len() >= pn * NR);
    debug_assert!(live >= 1 && cols >= 1 && c.len() >= (live - 1) * ldc + cols);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for p in 0..pn {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR) as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR + 16) as *const _));
        for (i, row) in acc.iter_mut().enumerate() {
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(p * MR + i) as i32));
            row[0] = _mm512_dpbf16_ps(row[0], av, b0);
            row[1] = _mm512_dpbf16_ps(row[1], av, b1);
        }
    }
    let (m0, m1) = (lane_mask(cols), lane_mask(cols.saturating_sub(16)));
    let cp = c.as_mut_ptr();
    if alpha != 1.0 {
        let a = _mm512_set1_ps(alpha);
        for row in acc.iter_mut() {
            row[0] = _mm512_mul_ps(row[0], a);
            row[1] = _mm512_mul_ps(row[1], a);
        }
    }
    for (i, row) in acc.iter().enumerate().take(live) {
        let r0 = cp.add(i * ldc);
        let r1 = r0.wrapping_add(16);
        let (v0, v1) = match first {
            true => (row[0], row[1]),
            false => (
                _mm512_add_ps(row[0], _mm512_maskz_loadu_ps(m0, r0)),
                _mm512_add_ps(row[1], _mm512_maskz_loadu_ps(m1, r1)),
            ),
        };
        _mm512_mask_storeu_ps(r0, m0, v0);
        _mm512_mask_storeu_ps(r1, m1, v1);
    }
}

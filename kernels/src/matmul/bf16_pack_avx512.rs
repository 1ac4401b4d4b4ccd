//! AVX-512 packing of f32 operands into bf16 pairs (the layouts of `bf16_pack.rs`), for the
//! three operand layouts of a linear layer's GEMMs:
//! - pairs along contiguous memory (`x` and `∂y` as `A`, `Wᵀ` as `B`): 32 consecutive
//!   values of one row give 16 pairs at once, which are then written to their lanes;
//! - pairs across two contiguous rows (`W` and `x` as `B`, `∂yᵀ` as `A`): the values of `k`
//!   and `k + 1` for 16 lanes at once, interleaved into 16 pairs.
//!
//! Rounding is done on the integers, exactly as `half::bf16::from_f32` (nearest, ties to
//! even, NaN kept quiet, subnormals kept), so every dispatch path packs the same bits.

use std::arch::x86_64::*;

/// Whether this CPU has the AVX-512 subsets the packing uses.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// The mask of the first `n` of 16 lanes (all 16 for `n >= 16`, none for 0).
#[inline]
pub(super) fn lane_mask(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// 16 f32 values rounded to bf16, each held in the high half of its 32-bit lane (the low
/// half is garbage the caller drops).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn round_high(v: __m512) -> __m512i {
    let bits = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    let rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    let magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fff_ffff));
    let nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7f80_0000));
    let quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x0040_0000));
    _mm512_mask_mov_epi32(rounded, nan, quiet)
}

/// The pairs of up to 32 consecutive values at `src` (`len` of them; zero past `len`): lane
/// `i` holds `(src[2i], src[2i + 1])`.
///
/// # Safety
/// AVX-512F/BW; `src` valid for `len.min(32)` reads.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pairs_of_run(src: *const f32, len: usize) -> __m512i {
    let (m0, m1) = (lane_mask(len), lane_mask(len.saturating_sub(16)));
    let lo = round_high(_mm512_maskz_loadu_ps(m0, src));
    let hi = round_high(_mm512_maskz_loadu_ps(m1, src.wrapping_add(16)));
    // The high 16-bit word of each of the 32 values, in order: word `2i + 1` of `lo:hi`.
    let odd_words = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19,
        17, 15, 13, 11, 9, 7, 5, 3, 1,
    );
    _mm512_permutex2var_epi16(lo, odd_words, hi)
}

/// The pairs of two rows of up to 16 lanes: lane `j` holds `(even[j], odd[j])`, zero past
/// `lanes`; `odd` is `None` past the end of `k`.
///
/// # Safety
/// AVX-512F/BW; `even` (and `odd`) valid for `lanes.min(16)` reads.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pairs_of_rows(even: *const f32, odd: Option<*const f32>, lanes: usize) -> __m512i {
    let m = lane_mask(lanes);
    let lo = _mm512_srli_epi32(round_high(_mm512_maskz_loadu_ps(m, even)), 16);
    match odd {
        Some(odd) => {
            let hi = round_high(_mm512_maskz_loadu_ps(m, odd));
            _mm512_mask_blend_epi16(0xaaaa_aaaa, lo, hi)
        }
        None => lo,
    }
}

/// The transpose of a 16 × 16 block of 32-bit values (`rows[i]` lane `j` → `out[j]` lane
/// `i`): interleaves of 32 and 64 bits within 128-bit lanes, then two rounds of 128-bit lane
/// shuffles.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    let mut a = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // b[4g + c], 128-bit lane L: rows 4g..4g + 4 at column 4L + c.
    let mut b = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        b[4 * g] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
        b[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
        b[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
        b[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..4 {
        let e0 = _mm512_shuffle_i32x4::<0x44>(b[c], b[4 + c]);
        let e1 = _mm512_shuffle_i32x4::<0xee>(b[c], b[4 + c]);
        let f0 = _mm512_shuffle_i32x4::<0x44>(b[8 + c], b[12 + c]);
        let f1 = _mm512_shuffle_i32x4::<0xee>(b[8 + c], b[12 + c]);
        out[c] = _mm512_shuffle_i32x4::<0x88>(e0, f0);
        out[4 + c] = _mm512_shuffle_i32x4::<0xdd>(e0, f0);
        out[8 + c] = _mm512_shuffle_i32x4::<0x88>(e1, f1);
        out[12 + c] = _mm512_shuffle_i32x4::<0xdd>(e1, f1);
    }
    out
}

/// Packs pairs `p0..p0 + pn` of up to 16 runs whose `k` values are contiguous (`runs[i]`,
/// `k_len` values from index 0) as lanes: pair `p` (counted from `p0`) of run `i` goes to
/// `out[p · stride + i]`. Lanes `runs.len()..lanes` are written as zeros.
///
/// # Safety
/// AVX-512F/BW; every run valid for `k_len` reads; `runs.len() <= lanes <= 16`; `out`
/// valid for `(pn - 1) · stride + lanes` writes.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_runs(
    runs: &[*const f32],
    k_len: usize,
    (p0, pn): (usize, usize),
    out: *mut u32,
    (stride, lanes): (usize, usize),
) {
    debug_assert!(runs.len() <= lanes && lanes <= 16);
    let store = lane_mask(lanes);
    let mut p = 0;
    while p < pn {
        let k = 2 * (p0 + p);
        let count = 16.min(pn - p);
        let len = (k_len - k).min(2 * count);
        let mut block = [_mm512_setzero_si512(); 16];
        for (v, &run) in block.iter_mut().zip(runs) {
            *v = pairs_of_run(run.add(k), len);
        }
        let columns = transpose16(&block);
        for (q, v) in columns.iter().enumerate().take(count) {
            _mm512_mask_storeu_epi32(out.add((p + q) * stride) as *mut _, store, *v);
        }
        p += count;
    }
}

/// Packs `lanes` consecutive lanes of the pair `(k, k + 1)` (rows `even` and `odd` of
/// contiguous lanes; `odd` is `None` past the end of `k`) into `out[..lanes]`.
///
/// # Safety
/// AVX-512F/BW; `even` and `odd` valid for `lanes` reads; `out` for `lanes` writes.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_rows(
    even: *const f32,
    odd: Option<*const f32>,
    lanes: usize,
    out: *mut u32,
) {
    let mut j = 0;
    while j < lanes {
        let n = 16.min(lanes - j);
        let v = pairs_of_rows(even.add(j), odd.map(|o| o.add(j)), n);
        let m = lane_mask(n);
        _mm512_mask_storeu_epi32(out.add(j) as *mut _, m, v);
        j += n;
    }
}

/// The pairs of one contiguous run of `k` values, in order: `out[p] = (src[2p], src[2p + 1])`
/// for `p < k.div_ceil(2)`.
///
/// # Safety
/// AVX-512F/BW; `src` valid for `k` reads, `out` for `k.div_ceil(2)` writes.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_row(src: *const f32, k: usize, out: *mut u32) {
    let pairs = k.div_ceil(2);
    let mut p = 0;
    while p < pairs {
        let count = 16.min(pairs - p);
        let v = pairs_of_run(src.add(2 * p), (k - 2 * p).min(32));
        let m = lane_mask(count);
        _mm512_mask_storeu_epi32(out.add(p) as *mut _, m, v);
        p += count;
    }
}

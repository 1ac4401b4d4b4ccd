//! `e^x` over rows in eight AVX2 lanes, bit for bit the arithmetic of
//! [`super::cpu_math::exp_f32`]: the same operations in the same order (no fused
//! multiply-adds, no reassociation), eight floats per instruction. The compiler's own
//! vectorisation of those loops came out 4-wide (SSE registers) even in the AVX-512 builds,
//! and the per-row softmax work of the sampler and the engine's scoring over a
//! 32,000-token vocabulary spent its time there. Two uses: the lane sums of
//! [`super::cpu_math::row_exp_sums`] and the sampler's tempered weights
//! ([`super::rows::tempered_weights`]).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The eight running sums `s[i] = Σ_k e^(row[8k + i] - m)` over the row's whole 8-float
/// chunks (the tail is the caller's), or `None` on a CPU without AVX2.
#[inline]
pub(crate) fn exp_lane_sums(row: &[f32], m: f32) -> Option<[f32; 8]> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        return Some(unsafe { lane_sums_avx2(row, m) });
    }
    let _ = (row, m);
    None
}

/// Writes `out[v] = e^((row[v] - m) · inv_t)`, NaN as 0, over the whole 8-float chunks
/// (the tail is the caller's) and returns true, or false on a CPU without AVX2 (nothing
/// written).
///
/// # Panics
/// When `out` is shorter than `row`.
#[inline]
pub(crate) fn tempered_exp(row: &[f32], m: f32, inv_t: f32, out: &mut [f32]) -> bool {
    assert!(
        out.len() >= row.len(),
        "tempered_exp: output shorter than the row"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        unsafe { tempered_exp_avx2(row, m, inv_t, out) };
        return true;
    }
    let _ = (row, m, inv_t);
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn tempered_exp_avx2(row: &[f32], m: f32, inv_t: f32, out: &mut [f32]) {
    let (shift, scale) = (_mm256_set1_ps(m), _mm256_set1_ps(inv_t));
    for (c, o) in row.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        // SAFETY: `c` and `o` hold exactly 8 floats each.
        let z = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        let w = exp8(_mm256_mul_ps(_mm256_sub_ps(z, shift), scale));
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(w, w);
        let w = _mm256_blendv_ps(w, _mm256_setzero_ps(), nan);
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), w) };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lane_sums_avx2(row: &[f32], m: f32) -> [f32; 8] {
    let shift = _mm256_set1_ps(m);
    let mut acc = _mm256_setzero_ps();
    for c in row.chunks_exact(8) {
        // SAFETY: `c` holds exactly 8 floats.
        let z = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(z, shift)));
    }
    let mut out = [0f32; 8];
    // SAFETY: `out` holds exactly 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// `exp_f32` on eight lanes, operation for operation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp8(x: __m256) -> __m256 {
    const LO: f32 = -87.0;
    const HI: f32 = 88.0;
    const MAGIC: f32 = 12_582_912.0;
    let (lo, hi) = (_mm256_set1_ps(LO), _mm256_set1_ps(HI));
    let magic = _mm256_set1_ps(MAGIC);
    // `x.clamp(LO, HI)`: MAXPS/MINPS return their second operand when either is NaN, so NaN
    // passes through as it does in the scalar clamp.
    let xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
    let t = _mm256_add_ps(
        _mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        magic,
    );
    let n = _mm256_sub_ps(t, magic);
    let r = _mm256_sub_ps(
        _mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(0.693_359_4))),
        _mm256_mul_ps(n, _mm256_set1_ps(-2.121_944_4e-4)),
    );
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let er = _mm256_add_ps(
        _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r),
        _mm256_set1_ps(1.0),
    );
    let ni = _mm256_sub_epi32(
        _mm256_castps_si256(t),
        _mm256_set1_epi32(MAGIC.to_bits() as i32),
    );
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        ni,
        _mm256_set1_epi32(127),
    )));
    let y = _mm256_mul_ps(er, scale);
    let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo));
    _mm256_blendv_ps(
        y,
        _mm256_set1_ps(f32::INFINITY),
        _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi),
    )
}

#[cfg(test)]
mod tests {
    use super::super::cpu_math::exp_f32;
    use super::*;

    /// The tempered weights are the scalar ones to the bit, NaN written as 0.
    #[test]
    fn tempered_weights_are_the_scalar_ones_bit_for_bit() {
        let mut row: Vec<f32> = (0..1003)
            .map(|i| ((i as f32) * 0.377).cos() * 50.0)
            .collect();
        row[17] = f32::NAN;
        row[18] = f32::NEG_INFINITY;
        for (m, inv_t) in [(50.0f32, 1.0f32), (12.0, 1.0 / 0.7), (0.0, 2.0)] {
            let mut got = vec![-1.0f32; row.len()];
            if !tempered_exp(&row, m, inv_t, &mut got) {
                return; // no AVX2 here
            }
            let whole = row.len() - row.len() % 8;
            for (v, (&g, &x)) in got.iter().zip(&row).enumerate().take(whole) {
                let w = exp_f32((x - m) * inv_t);
                let w = if w.is_nan() { 0.0 } else { w };
                assert_eq!(g.to_bits(), w.to_bits(), "m {m} 1/T {inv_t} v {v}");
            }
            assert!(
                got[whole..].iter().all(|&g| g == -1.0),
                "the tail is the caller's"
            );
        }
    }

    /// The lanes are the scalar `exp_f32` sums to the bit, over values across the whole
    /// range, the clamp edges, NaN and the infinities.
    #[test]
    fn lane_sums_are_the_scalar_sums_bit_for_bit() {
        let mut row: Vec<f32> = (0..4001)
            .map(|i| ((i as f32) * 0.618_034).sin() * 60.0 - 20.0)
            .collect();
        for (i, v) in [-87.0, 88.0, -87.5, 88.5, -1e30, 1e30, 0.0, -0.0]
            .into_iter()
            .enumerate()
        {
            row[100 + i] = v;
        }
        for m in [0.0f32, 12.5, -3.0] {
            let Some(got) = exp_lane_sums(&row, m) else {
                return; // no AVX2 here: nothing to compare
            };
            let mut want = [0f32; 8];
            for c in row.chunks_exact(8) {
                for i in 0..8 {
                    want[i] += exp_f32(c[i] - m);
                }
            }
            assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "m = {m}");
        }
        let mut odd = vec![1.0f32; 16];
        odd[3] = f32::NAN;
        odd[9] = f32::NEG_INFINITY;
        odd[10] = f32::INFINITY;
        if let Some(got) = exp_lane_sums(&odd, 0.0) {
            let want: Vec<f32> = (0..8)
                .map(|i| exp_f32(odd[i]) + exp_f32(odd[8 + i]))
                .collect();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{g} vs {w}"
                );
            }
        }
    }
}

//! Scalar building blocks shared by the CPU kernels: a small float trait over f32/f64, a
//! branch-free (auto-vectorisable) `exp`, and row reductions written in 8 lanes.
//! Deliberately tensor-free: everything here sees plain slices; shapes live in the ops.

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};

use candle_core::{CpuStorage, Layout, Result, WithDType};

/// Lanes used by the row reductions (independent accumulators so LLVM can vectorise).
const LANES: usize = 8;

/// Rows handed to one rayon task at least: `ROW_WORK / row_len`, so small rows are batched.
pub(crate) const ROW_WORK: usize = 16 * 1024;

/// The float types the CPU kernels are written for (f32 for training, f64 for tests).
pub(crate) trait Real:
    WithDType
    + Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + AddAssign
    + Sub<Output = Self>
    + Mul<Output = Self>
    + MulAssign
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    /// `e^x`. For f32 a polynomial accurate to a few ulp that vectorises; f64 uses libm.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Conversion from a `usize` count (row length, number of rows).
    fn from_usize(n: usize) -> Self;
    /// `s[i] = Σ_k e^(row[8k + i] - m)` over the whole 8-element chunks, by an explicitly
    /// vectorised kernel with the same bits as the portable loop, or `None` where there is
    /// none (f64, CPUs without AVX2).
    #[inline(always)]
    fn exp_lane_sums(row: &[Self], m: Self) -> Option<[Self; LANES]> {
        let _ = (row, m);
        None
    }
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f32::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn from_usize(n: usize) -> Self {
        n as f32
    }
    #[inline(always)]
    fn exp_lane_sums(row: &[f32], m: f32) -> Option<[f32; LANES]> {
        super::exp_avx2::exp_lane_sums(row, m)
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f64::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn from_usize(n: usize) -> Self {
        n as f64
    }
}

/// `e^x` in f32 without branches or libm calls, so loops over it vectorise.
///
/// Cephes' `expf` scheme: `x = n ln2 + r` with `|r| <= ln2/2`, a degree-6 polynomial for
/// `e^r`, and `2^n` built in the exponent bits. Relative error below 2e-7 on [-87, 88];
/// inputs below -87 give exactly 0 (true values are < 2e-38), above 88 give `+inf`, NaN
/// stays NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const LO: f32 = -87.0;
    const HI: f32 = 88.0;
    // The clamp and the two selects below compile to SSE/AVX blends: no branches, so
    // callers' loops vectorise (an `if / else if` chain here does not). NaN passes through.
    let xc = x.clamp(LO, HI);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    let y = er * scale;
    let y = if x < LO { 0.0 } else { y };
    if x > HI {
        f32::INFINITY
    } else {
        y
    }
}

/// Maximum of a row (`-inf` for an empty row). NaNs are skipped here; they still reach the
/// result through the exponentials that follow.
#[inline(always)]
pub(crate) fn row_max<T: Real>(row: &[T]) -> T {
    let mut acc = [T::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            if c[i] > acc[i] {
                acc[i] = c[i];
            }
        }
    }
    let mut m = T::NEG_INFINITY;
    for &v in acc.iter().chain(rest) {
        if v > m {
            m = v;
        }
    }
    m
}

/// `(sum_v e^(z_v - m), sum_v e^(z_v - m) (z_v - m))` for a row and its maximum `m`.
///
/// The second sum is only accumulated when `with_weighted` (entropy needs it, log-probs not).
#[inline(always)]
pub(crate) fn row_exp_sums<T: Real>(row: &[T], m: T, with_weighted: bool) -> (T, T) {
    let mut s = [T::ZERO; LANES];
    let mut w = [T::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    let explicit = if with_weighted {
        None
    } else {
        T::exp_lane_sums(row, m)
    };
    if let Some(lanes) = explicit {
        s = lanes;
    } else if with_weighted {
        for c in chunks {
            for i in 0..LANES {
                let d = c[i] - m;
                let e = d.exp();
                s[i] += e;
                w[i] += e * d;
            }
        }
    } else {
        for c in chunks {
            for i in 0..LANES {
                s[i] += (c[i] - m).exp();
            }
        }
    }
    let mut s_tot = lane_sum(&s);
    let mut w_tot = lane_sum(&w);
    for &z in rest {
        let d = z - m;
        let e = d.exp();
        s_tot += e;
        if with_weighted {
            w_tot += e * d;
        }
    }
    (s_tot, w_tot)
}

/// `ln sum_v e^(z_v)` of a row, computed stably around its maximum.
///
/// Always inlined, so it runs at the vector width of its caller's build (an AVX-512 clone's
/// closure, say): a separate copy is compiled for the baseline x86-64 (4-wide SSE, no FMA)
/// and ran the engine's and the trainer's per-row log-softmax at a quarter of the width.
#[inline(always)]
pub(crate) fn row_logsumexp<T: Real>(row: &[T]) -> T {
    let m = row_max(row);
    let (s, _) = row_exp_sums(row, m, false);
    m + s.ln()
}

/// Sum of squares of a row, in 8 lanes.
#[inline]
pub(crate) fn row_sum_sq<T: Real>(row: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i] * c[i];
        }
    }
    let mut tot = lane_sum(&acc);
    for &v in rest {
        tot += v * v;
    }
    tot
}

/// Sum of `a_i * b_i * c_i` over a row, in 8 lanes.
#[inline]
pub(crate) fn row_dot3<T: Real>(a: &[T], b: &[T], c: &[T]) -> T {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
    let mut acc = [T::ZERO; LANES];
    let full = n - n % LANES;
    let mut i = 0;
    while i < full {
        for l in 0..LANES {
            acc[l] += a[i + l] * b[i + l] * c[i + l];
        }
        i += LANES;
    }
    let mut tot = lane_sum(&acc);
    for j in full..n {
        tot += a[j] * b[j] * c[j];
    }
    tot
}

/// Dot product `sum_i a_i * b_i` of two rows (the shorter length), in 8 lanes.
#[inline]
pub(crate) fn row_dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [T::ZERO; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tot = lane_sum(&acc);
    for (&x, &y) in ar.iter().zip(br) {
        tot += x * y;
    }
    tot
}

/// `y += alpha * x` elementwise over the shorter length (vectorises: no reduction).
#[inline]
pub(crate) fn axpy<T: Real>(y: &mut [T], alpha: T, x: &[T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// `y += Σ_t a_t x_t` over the `terms` `(a_t, x_t)`, each element's terms added one after
/// another in order (the same bits as one [`axpy`] per term), with `y` held in registers
/// across all the terms 64 elements at a time: one load and store of `y` per block instead of
/// one per term. Every `x_t` is at least `y.len()` long.
#[inline(always)]
pub(crate) fn axpy_terms<'a, T: Real + 'a>(
    y: &mut [T],
    terms: impl Iterator<Item = (T, &'a [T])> + Clone,
) {
    const W: usize = 64;
    let mut blocks = y.chunks_exact_mut(W);
    let mut at = 0;
    for block in &mut blocks {
        let mut acc: [T; W] = std::array::from_fn(|l| block[l]);
        for (a, x) in terms.clone() {
            for (o, &x) in acc.iter_mut().zip(&x[at..at + W]) {
                *o += a * x;
            }
        }
        block.copy_from_slice(&acc);
        at += W;
    }
    let tail = blocks.into_remainder();
    if !tail.is_empty() {
        for (a, x) in terms {
            axpy(tail, a, &x[at..]);
        }
    }
}

/// `y *= alpha` elementwise.
#[inline]
pub(crate) fn scale_in_place<T: Real>(y: &mut [T], alpha: T) {
    for y in y.iter_mut() {
        *y *= alpha;
    }
}

#[inline(always)]
fn lane_sum<T: Real>(acc: &[T; LANES]) -> T {
    // Pairwise, fixed order: deterministic and a little more accurate than a running sum.
    let a = (acc[0] + acc[4]) + (acc[2] + acc[6]);
    let b = (acc[1] + acc[5]) + (acc[3] + acc[7]);
    a + b
}

/// Rows handed to one rayon task for rows of `row_len` elements.
#[inline]
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (ROW_WORK / row_len.max(1)).max(1)
}

/// The contiguous slice a layout covers, or an error naming the op and the argument.
pub(crate) fn contiguous_slice<'a, T: WithDType>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
    arg: &str,
) -> Result<&'a [T]> {
    let data = T::cpu_storage_as_slice(storage)?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!(
            "{op}: `{arg}` must be contiguous (the public wrapper calls .contiguous()), got layout {layout:?}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_matches_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let got = exp_f32(x) as f64;
            let want = (x as f64).exp();
            let rel = ((got - want) / want).abs();
            worst = worst.max(rel);
            x += 0.001_37;
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn row_reductions_match_naive_sums() {
        let row: Vec<f64> = (0..37)
            .map(|i| ((i * 7919) % 101) as f64 / 10.0 - 5.0)
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(row_max(&row), m);
        let s: f64 = row.iter().map(|z| (z - m).exp()).sum();
        let w: f64 = row.iter().map(|z| (z - m).exp() * (z - m)).sum();
        let (gs, gw) = row_exp_sums(&row, m, true);
        assert!((gs - s).abs() < 1e-12 && (gw - w).abs() < 1e-12);
        assert!((row_logsumexp(&row) - (m + s.ln())).abs() < 1e-12);
        let sq: f64 = row.iter().map(|v| v * v).sum();
        assert!((row_sum_sq(&row) - sq).abs() < 1e-9);
        let dot: f64 = row.iter().zip(row.iter().rev()).map(|(a, b)| a * b).sum();
        let rev: Vec<f64> = row.iter().rev().copied().collect();
        assert!((row_dot(&row, &rev) - dot).abs() < 1e-9);
        let mut y = row.clone();
        axpy(&mut y, 2.0, &rev);
        scale_in_place(&mut y, 0.5);
        assert!((y[3] - 0.5 * (row[3] + 2.0 * rev[3])).abs() < 1e-12);
        let d3: f64 = row.iter().map(|v| v * v * v).sum();
        assert!((row_dot3(&row, &row, &row) - d3).abs() < 1e-9);
        assert_eq!(row_max::<f32>(&[]), f32::NEG_INFINITY);
        // A NaN anywhere in a row poisons its log-sum-exp instead of being skipped.
        assert!(row_logsumexp(&[1.0f32, f32::NAN, 2.0]).is_nan());
        // -inf logits (banned tokens) contribute exactly nothing.
        let lse = row_logsumexp(&[0.0f32, f32::NEG_INFINITY]);
        assert_eq!(lse, 0.0);
    }
}

//! Host-slice row math for the inference engine's sampler: log-softmax of one token and the
//! exponentiated, tempered weights of a row. They are the exact arithmetic of the fused
//! training kernels (`token_logprobs` uses the same `row_logsumexp`), so an engine log-prob
//! and a trainer log-prob of the same logits row are bit-identical. No tensors here.

use super::cpu_math::{exp_f32, row_logsumexp, row_max, row_sum_sq};
use super::truncation::{self, Truncation};
use multiversion::multiversion;

/// `log_softmax(row)[index]` in nats, computed exactly as the `token_logprobs` kernel does
/// (f32, stable around the row maximum).
///
/// # Panics
/// When `index >= row.len()`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub fn token_logprob(row: &[f32], index: usize) -> f32 {
    row[index] - row_logsumexp(row)
}

/// The kept threshold `τ` of one row of tempered logits (`logits / T`) under `cut`: the
/// sampler and the fused LM head keep `{j : tempered[j] ≥ τ}` (`-inf`: everything). The
/// same function as the trainer's, so both sides keep the same tokens of the same logits.
#[inline]
pub fn kept_threshold(tempered: &[f32], cut: Truncation) -> f32 {
    truncation::kept_threshold(tempered, cut)
}

/// `log p(index)` under the softmax of `tempered` restricted to the values `≥ tau`, with the
/// fused LM head's arithmetic for a truncated row.
#[inline]
pub fn kept_logprob(tempered: &[f32], tau: f32, index: usize) -> f32 {
    truncation::kept_logprob(tempered, tau, index)
}

/// Largest value of `row`, NaNs skipped (`-inf` when none is left).
#[inline]
pub fn max(row: &[f32]) -> f32 {
    row_max(row)
}

/// Writes `out[v] = e^((row[v] - max) * inv_temperature)` (NaN logits get weight 0) and
/// returns the sum of the weights, accumulated in f64. The loop vectorises: one pass over
/// the row, no allocation.
///
/// # Panics
/// When `out.len() != row.len()`.
#[inline]
pub fn tempered_weights(row: &[f32], max: f32, inv_temperature: f32, out: &mut [f32]) -> f64 {
    assert_eq!(out.len(), row.len(), "weights buffer must match the row");
    let done = if super::exp_avx2::tempered_exp(row, max, inv_temperature, out) {
        row.len() - row.len() % 8
    } else {
        0
    };
    for (o, &x) in out[done..].iter_mut().zip(&row[done..]) {
        let w = exp_f32((x - max) * inv_temperature);
        // NaN logits are never sampled.
        *o = if w.is_nan() { 0.0 } else { w };
    }
    sum_f64(out)
}

/// Sum of f32 values in f64, in 8 running sums added in a fixed order (vectorises): the
/// total [`tempered_weights`] returns, and the block sums of the sampler's draw.
#[inline(always)]
pub fn sum_f64(xs: &[f32]) -> f64 {
    const LANES: usize = 8;
    let mut acc = [0f64; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i] as f64;
        }
    }
    acc.iter().sum::<f64>() + rest.iter().map(|&w| w as f64).sum::<f64>()
}

/// Softmax of one row in place: `e^(x - max)` by [`exp_shifted_in_place`], each then times
/// `1 / sum`. Returns the row's log-sum-exp (`max + ln sum`). The engine's paged attention and
/// the training attention's engine-order forward both normalise scores with it, so their
/// probabilities are the same bits.
#[inline]
pub fn softmax_in_place(xs: &mut [f32]) -> f32 {
    let m = row_max(xs);
    let sum = exp_shifted_in_place(xs, m);
    let inv = 1.0 / sum;
    xs.iter_mut().for_each(|p| *p *= inv);
    m + sum.ln()
}

/// Replaces every `x` of `xs` by `e^(x - shift)` and returns the sum (f32). Vectorises.
#[inline]
pub(crate) fn exp_shifted_in_place(xs: &mut [f32], shift: f32) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0f32; LANES];
    let mut chunks = xs.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            c[i] = exp_f32(c[i] - shift);
            acc[i] += c[i];
        }
    }
    let mut total: f32 = acc.iter().sum();
    for x in chunks.into_remainder() {
        *x = exp_f32(*x - shift);
        total += *x;
    }
    total
}

/// RMSNorm of each `w.len()`-wide row of `x` into `out`: `x · w / sqrt(mean(x²) + eps)`,
/// with the arithmetic of the training kernel (`ops::rms_norm`), so the engine and the
/// trainer normalise identically.
///
/// # Panics
/// When `x.len() != out.len()` or `x.len()` is not a multiple of `w.len()`.
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    let d = w.len();
    assert!(
        x.len() == out.len() && d > 0 && x.len().is_multiple_of(d),
        "rms_norm_rows: bad shapes"
    );
    let eps = eps as f32;
    for (o, row) in out.chunks_mut(d).zip(x.chunks(d)) {
        let r = 1.0 / (row_sum_sq(row) / d as f32 + eps).sqrt();
        for ((o, &xi), &wi) in o.iter_mut().zip(row).zip(w) {
            *o = xi * r * wi;
        }
    }
}

/// SwiGLU of fused `[gate | up]` rows: `out[t, i] = silu(gu[t, i]) · gu[t, inter + i]` with
/// `silu(x) = x / (1 + e^-x)`. `gu`: `[rows, 2 · inter]`, `out`: `[rows, inter]`.
///
/// # Panics
/// When the lengths do not match.
pub fn silu_mul_rows(gu: &[f32], inter: usize, out: &mut [f32]) {
    assert!(
        inter > 0 && gu.len() == 2 * out.len() && out.len().is_multiple_of(inter),
        "silu_mul_rows: bad shapes"
    );
    for (o, row) in out.chunks_mut(inter).zip(gu.chunks(2 * inter)) {
        let (gate, up) = row.split_at(inter);
        for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp_f32(-g)) * u;
        }
    }
}

/// GeGLU of fused `[gate | up]` rows (Gemma): `out[t, i] = gelu(gu[t, i]) · gu[t, inter + i]`
/// with the tanh approximation `gelu(x) = x/2 · (1 + tanh(√(2/π) · x · (1 + 0.044715 x²)))`,
/// the arithmetic of candle's `gelu` (the trainer's). Shapes as [`silu_mul_rows`].
///
/// # Panics
/// When the lengths do not match.
pub fn gelu_tanh_mul_rows(gu: &[f32], inter: usize, out: &mut [f32]) {
    assert!(
        inter > 0 && gu.len() == 2 * out.len() && out.len().is_multiple_of(inter),
        "gelu_tanh_mul_rows: bad shapes"
    );
    const K: f32 = 0.797_884_6; // sqrt(2 / pi), as candle rounds it
    let k = K;
    for (o, row) in out.chunks_mut(inter).zip(gu.chunks(2 * inter)) {
        let (gate, up) = row.split_at(inter);
        for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
            *o = 0.5 * g * (1.0 + (k * g * (1.0 + 0.044715 * g * g)).tanh()) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_logprob_matches_f64_reference() {
        let row: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32) * 0.13 - 5.0)
            .collect();
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        for idx in [0, 17, 999] {
            let want = row[idx] as f64 - lse;
            assert!((token_logprob(&row, idx) as f64 - want).abs() < 1e-5);
        }
    }

    #[test]
    fn tempered_weights_sum_and_nan() {
        let row = [1.0f32, 2.0, f32::NAN, 0.5];
        let mut w = [0f32; 4];
        let m = max(&row);
        assert_eq!(m, 2.0);
        let total = tempered_weights(&row, m, 0.5, &mut w);
        let want: Vec<f64> = [1.0f64, 2.0, f64::NEG_INFINITY, 0.5]
            .iter()
            .map(|x| ((x - 2.0) * 0.5).exp())
            .collect();
        for (a, b) in w.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{a} vs {b}");
        }
        assert!((total - want.iter().sum::<f64>()).abs() < 1e-6);
        assert_eq!(w[2], 0.0);
    }
}

//! Token sampling from one row of logits: greedy (temperature 0), temperature, top-k, top-p,
//! with a seeded RNG per sequence. It also reports the sampled token's log-prob under the
//! distribution it was drawn from (tempered and truncated, see [`TokenDistribution`]). One
//! O(V) pass per row, no sort of the vocabulary. No batching or stopping logic here.

use oxalign_kernels::ops::{rows, TokenDistribution};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;

/// Sampling settings of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0.0` means greedy (argmax, first maximum on ties).
    pub temperature: f32,
    /// Keep only the `top_k` highest logits (0 = off). Ties with the k-th value are kept.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability
    /// (after temperature and top-k) reaches `top_p` (1.0 = off).
    pub top_p: f32,
    /// Seed of this sequence's RNG.
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Plain sampling at temperature 1, seed 0.
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Checks ranges (`temperature >= 0`, `0 < top_p <= 1`, finite values).
    pub fn validate(&self) -> Result<(), crate::error::InvalidSampling> {
        use crate::error::InvalidSampling;
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(InvalidSampling {
                name: "temperature",
                value: self.temperature,
                expected: ">= 0",
            });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(InvalidSampling {
                name: "top_p",
                value: self.top_p,
                expected: "in (0, 1]",
            });
        }
        Ok(())
    }
}

/// A sampler for one sequence: parameters plus its own RNG.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

thread_local! {
    /// Per-thread `[V]` scratch: the weights and the tempered logits of the row being sampled.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl Sampler {
    /// A sampler whose RNG is seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = StdRng::seed_from_u64(params.seed);
        Sampler { params, rng }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The distribution this sampler draws from, the one its log-probs are taken under.
    pub fn distribution(&self) -> TokenDistribution {
        let p = &self.params;
        TokenDistribution::of_sampling(p.temperature as f64, p.top_k, p.top_p as f64)
    }

    /// Picks a token from `logits` (one row, length V) and returns it with its log-prob in
    /// nats under the distribution it was drawn from: `softmax(logits / T)` over the
    /// top-k / top-p kept set ([`TokenDistribution`]), with the trainer kernel's own
    /// arithmetic, so a trainer scoring the token under [`Sampler::distribution`] gets the
    /// same value. Greedy decoding reports the model's own (`T = 1`) log-prob. Non-finite
    /// logits are never chosen unless all are.
    ///
    /// Cost: O(V) with no allocation; top-k selects in O(V), top-p sorts lazily, only as far
    /// as the nucleus reaches.
    #[inline]
    pub fn sample(&mut self, logits: &[f32]) -> (u32, f32) {
        let max = rows::max(logits);
        if self.params.temperature == 0.0 || max == f32::NEG_INFINITY {
            // Greedy, or nothing can be sampled (all NaN or -inf): the first maximum.
            let token = argmax(logits);
            return (token as u32, rows::token_logprob(logits, token));
        }
        SCRATCH.with(|s| {
            let (weights, tempered) = &mut *s.borrow_mut();
            weights.resize(logits.len(), 0.0);
            self.sample_stochastic(logits, max, weights, tempered)
        })
    }

    #[inline]
    fn sample_stochastic(
        &mut self,
        logits: &[f32],
        max: f32,
        weights: &mut [f32],
        tempered: &mut Vec<f32>,
    ) -> (u32, f32) {
        let inv_t = 1.0 / self.params.temperature;
        let total = rows::tempered_weights(logits, max, inv_t, weights);
        let cut = self.distribution().truncation;
        if inv_t == 1.0 && cut.is_off(logits.len()) {
            let u = self.rng.random::<f64>() * total;
            let token = walk_cdf(weights, u);
            return (token as u32, rows::token_logprob(logits, token));
        }
        tempered.clear();
        tempered.extend(logits.iter().map(|&x| x * inv_t));
        let tau = rows::kept_threshold(tempered, cut);
        let token = if tau == f32::NEG_INFINITY {
            self.inverse_cdf(weights, total, |_| true)
        } else {
            let kept = |i: usize| tempered[i] >= tau;
            let kept_total: f64 = (0..logits.len())
                .filter(|&i| kept(i))
                .map(|i| weights[i] as f64)
                .sum();
            self.inverse_cdf(weights, kept_total, kept)
        };
        (token as u32, rows::kept_logprob(tempered, tau, token))
    }

    /// Draws an index with probability `weights[i] / total` among the `kept` ones (`total`
    /// is their sum), walking in vocabulary order.
    #[inline]
    fn inverse_cdf(&mut self, weights: &[f32], total: f64, kept: impl Fn(usize) -> bool) -> usize {
        let u = self.rng.random::<f64>() * total;
        walk_kept(weights, u, kept)
    }
}

/// The index at which the running sum of the `kept` positive `weights`, walked one by one in
/// vocabulary order, first passes `u`; the last kept positive one when rounding leaves `u`
/// unspent.
#[inline]
fn walk_kept(weights: &[f32], mut u: f64, kept: impl Fn(usize) -> bool) -> usize {
    let mut last = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 && kept(i) {
            if u < w as f64 {
                return i;
            }
            u -= w as f64;
            last = i;
        }
    }
    last
}

/// The index at which the running sum of `weights`, in vocabulary order, first passes `u`
/// (`0 <= u < Σ weights`): [`walk_kept`] with every token kept.
/// Blocks whose f64 sum stays at or under what is left of `u` are stepped over whole (a
/// vectorised sum), and only the block where `u` lands is walked weight by weight; the
/// one-weight-at-a-time walk over the whole vocabulary was a dependent chain of f64
/// subtractions, most of the sampler's time. Weight-0 tokens (NaN or underflowed logits)
/// are never returned; when rounding leaves `u` unspent the last positive weight is.
#[inline(always)]
fn walk_cdf(weights: &[f32], mut u: f64) -> usize {
    const BLOCK: usize = 64;
    for (b, block) in weights.chunks(BLOCK).enumerate() {
        let sum = rows::sum_f64(block);
        if u >= sum {
            u -= sum;
            continue;
        }
        for (i, &w) in block.iter().enumerate() {
            if w > 0.0 {
                if u < w as f64 {
                    return b * BLOCK + i;
                }
                u -= w as f64;
            }
        }
    }
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)
}

/// Index of the first maximum (NaN ignored; 0 when every value is NaN or `-inf`).
#[inline]
pub fn argmax(logits: &[f32]) -> usize {
    // A vectorised maximum, then the first position holding it.
    let max = rows::max(logits);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == max).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Draws `n` tokens and returns, per token, (how often it came, its reported log-prob).
    fn draw(params: SamplingParams, logits: &[f32], n: usize) -> BTreeMap<u32, (usize, f32)> {
        let mut s = Sampler::new(params);
        let mut seen = BTreeMap::new();
        for _ in 0..n {
            let (t, lp) = s.sample(logits);
            let e = seen.entry(t).or_insert((0, lp));
            e.0 += 1;
            assert_eq!(e.1, lp, "one log-prob per token");
        }
        seen
    }

    /// The reported log-prob is the log of the probability the token is drawn with: the
    /// frequencies match it and the kept tokens' probabilities sum to 1.
    #[test]
    fn log_probs_are_those_of_the_distribution_sampled() {
        let logits: Vec<f32> = (0..50)
            .map(|i| ((i * 37 % 11) as f32) * 0.4 - 1.0)
            .collect();
        for (t, k, p) in [
            (0.7f32, 20, 1.0f32),
            (0.7, 0, 0.8),
            (1.3, 5, 0.9),
            (0.5, 0, 1.0),
        ] {
            let params = SamplingParams {
                temperature: t,
                top_k: k,
                top_p: p,
                seed: 3,
            };
            let n = 40_000;
            let seen = draw(params, &logits, n);
            let mass: f64 = seen.values().map(|&(_, lp)| (lp as f64).exp()).sum();
            assert!(
                (mass - 1.0).abs() < 1e-4,
                "t {t} k {k} p {p}: kept mass {mass}"
            );
            for (tok, &(count, lp)) in &seen {
                let (freq, prob) = (count as f64 / n as f64, (lp as f64).exp());
                let se = (prob * (1.0 - prob) / n as f64).sqrt();
                assert!(
                    (freq - prob).abs() < 5.0 * se + 1e-3,
                    "t {t} k {k} p {p} token {tok}: freq {freq} vs p {prob}"
                );
            }
        }
    }

    /// The blocked walk picks what the one-weight-at-a-time walk picks: for weights whose f64
    /// sums are exact (multiples of 1/64, zeros among them, a tail shorter than a block) and
    /// `u` at every boundary of the running sum and between.
    #[test]
    fn the_blocked_cdf_walk_is_the_sequential_walk() {
        let weights: Vec<f32> = (0..203)
            .map(|i| {
                if i % 7 == 3 {
                    0.0
                } else {
                    ((i * 13) % 9) as f32 / 64.0
                }
            })
            .collect();
        let total: f64 = weights.iter().map(|&w| w as f64).sum();
        let mut u = 0.0;
        while u < total + 0.5 {
            let got = walk_cdf(&weights, u);
            assert_eq!(got, walk_kept(&weights, u, |_| true), "u = {u}");
            assert!(weights[got] > 0.0, "u = {u}: picked a weight-0 token {got}");
            u += 1.0 / 128.0;
        }
    }

    /// Temperature 1 with no truncation (the blocked walk) over a vocabulary of several
    /// blocks, with `-inf` logits: frequencies match the reported probabilities and the
    /// unsampleable tokens never come.
    #[test]
    fn plain_sampling_over_a_wide_vocabulary_draws_its_softmax() {
        let mut logits: Vec<f32> = (0..300)
            .map(|i| ((i * 31 % 17) as f32) * 0.3 - 6.0)
            .collect();
        logits[5] = 2.0;
        logits[250] = 2.5;
        logits[7] = f32::NEG_INFINITY;
        logits[200] = f32::NEG_INFINITY;
        let n = 40_000;
        let seen = draw(
            SamplingParams {
                seed: 9,
                ..SamplingParams::default()
            },
            &logits,
            n,
        );
        assert!(!seen.contains_key(&7) && !seen.contains_key(&200));
        for (tok, &(count, lp)) in &seen {
            let (freq, prob) = (count as f64 / n as f64, (lp as f64).exp());
            let se = (prob * (1.0 - prob) / n as f64).sqrt();
            assert!(
                (freq - prob).abs() < 5.0 * se + 1e-3,
                "token {tok}: freq {freq} vs p {prob}"
            );
        }
    }

    #[test]
    fn top_k_log_probs_renormalise_over_the_k_kept() {
        let logits = [0.0f32, 3.0, 1.0, 2.9, -1.0];
        let params = SamplingParams {
            temperature: 0.7,
            top_k: 2,
            top_p: 1.0,
            seed: 1,
        };
        let seen = draw(params, &logits, 500);
        assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
        let (z1, z3) = (3.0f64 / 0.7, 2.9f64 / 0.7);
        let lse = (z1.exp() + z3.exp()).ln();
        assert!((seen[&1].1 as f64 - (z1 - lse)).abs() < 1e-5);
    }
}

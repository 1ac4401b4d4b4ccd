//! Token sampling from one row of logits: greedy (temperature 0), temperature, top-k, top-p,
//! with a seeded RNG per sequence. It also reports the sampled token's log-prob under the
//! *unmodified* policy (temperature 1, no truncation). One O(V) pass per row, no sort of
//! the vocabulary. No batching or stopping logic here.

use oxalign_kernels::ops::rows;
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
    /// Per-thread `[V]` scratch for the tempered weights of the row being sampled.
    static WEIGHTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

    /// Picks a token from `logits` (one row, length V) and returns it with its log-prob in
    /// nats under the temperature-1, untruncated softmax of `logits` (the value a trainer
    /// recomputes, with the trainer kernel's own arithmetic). Non-finite logits are never
    /// chosen unless all are.
    ///
    /// Cost: O(V) with no allocation and no sort of the vocabulary; top-k selects in O(V)
    /// and sorts only the k survivors, top-p sorts lazily, only as far as the nucleus
    /// reaches.
    #[inline]
    pub fn sample(&mut self, logits: &[f32]) -> (u32, f32) {
        let token = if self.params.temperature == 0.0 {
            argmax(logits)
        } else {
            WEIGHTS.with(|w| {
                let mut w = w.borrow_mut();
                w.resize(logits.len(), 0.0);
                self.sample_stochastic(logits, &mut w)
            })
        };
        (token as u32, rows::token_logprob(logits, token))
    }

    #[inline]
    fn sample_stochastic(&mut self, logits: &[f32], weights: &mut [f32]) -> usize {
        let max = rows::max(logits);
        if max == f32::NEG_INFINITY {
            // All NaN or -inf: nothing can be sampled; fall back to the first maximum.
            return argmax(logits);
        }
        let inv_t = 1.0 / self.params.temperature;
        let total = rows::tempered_weights(logits, max, inv_t, weights);
        let (top_k, top_p) = (self.params.top_k, self.params.top_p);
        let truncated = (top_k > 0 && top_k < logits.len()) || top_p < 1.0;
        if !truncated {
            // Inverse CDF in vocabulary order: the same distribution as any other order.
            let mut u = self.rng.random::<f64>() * total;
            let mut last = 0;
            for (i, &w) in weights.iter().enumerate() {
                if w > 0.0 {
                    if u < w as f64 {
                        return i;
                    }
                    u -= w as f64;
                    last = i;
                }
            }
            return last;
        }
        let kept = truncate(logits, weights, total, top_k, top_p);
        let kept_total: f64 = kept.iter().map(|&i| weights[i] as f64).sum();
        let mut u = self.rng.random::<f64>() * kept_total;
        for &i in &kept {
            let w = weights[i] as f64;
            if u < w {
                return i;
            }
            u -= w;
        }
        kept[kept.len() - 1]
    }
}

/// The tokens that survive top-k (ties with the k-th logit kept) and then top-p (the
/// smallest most-likely prefix whose probability, renormalised after top-k, reaches
/// `top_p`), in descending logit order (lower id first on ties).
fn truncate(logits: &[f32], weights: &[f32], total: f64, top_k: usize, top_p: f32) -> Vec<usize> {
    let desc = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut cand: Vec<usize> = (0..logits.len()).filter(|&i| weights[i] > 0.0).collect();
    if cand.is_empty() {
        return vec![argmax(logits)];
    }
    let mut mass = total;
    if top_k > 0 && top_k < cand.len() {
        cand.select_nth_unstable_by(top_k - 1, desc);
        let kth = logits[cand[top_k - 1]];
        cand.retain(|&i| logits[i] >= kth);
        mass = cand.iter().map(|&i| weights[i] as f64).sum();
    }
    if top_p >= 1.0 {
        cand.sort_unstable_by(desc);
        return cand;
    }
    // Nucleus: sort lazily in growing chunks until the kept mass reaches top_p.
    let target = top_p as f64 * mass;
    let (mut sorted, mut cum, mut chunk) = (0, 0.0f64, 64usize);
    loop {
        let end = (sorted + chunk).min(cand.len());
        let rest = &mut cand[sorted..];
        if end - sorted < rest.len() {
            rest.select_nth_unstable_by(end - sorted - 1, desc);
        }
        rest[..end - sorted].sort_unstable_by(desc);
        for n in sorted..end {
            cum += weights[cand[n]] as f64;
            if cum >= target {
                cand.truncate(n + 1);
                return cand;
            }
        }
        if end == cand.len() {
            return cand;
        }
        sorted = end;
        chunk *= 4;
    }
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

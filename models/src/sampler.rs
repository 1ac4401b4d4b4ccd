//! Token sampling from one row of logits: greedy (temperature 0), temperature, top-k, top-p,
//! with a seeded RNG per sequence. It also reports the sampled token's log-prob under the
//! *unmodified* policy (temperature 1, no truncation). No batching or stopping logic here.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
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
    /// recomputes). Non-finite logits are never chosen unless all are.
    pub fn sample(&mut self, logits: &[f32]) -> (u32, f32) {
        let token = if self.params.temperature == 0.0 {
            argmax(logits)
        } else {
            self.sample_stochastic(logits)
        };
        (token as u32, log_softmax_at(logits, token))
    }

    fn sample_stochastic(&mut self, logits: &[f32]) -> usize {
        let inv_t = 1.0 / self.params.temperature as f64;
        // Candidates sorted by logit, descending (stable: lower id first on ties).
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        if order.is_empty() {
            return 0;
        }
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if self.params.top_k > 0 && self.params.top_k < order.len() {
            let kth = logits[order[self.params.top_k - 1]];
            order.retain(|&i| logits[i] >= kth);
        }
        let max = logits[order[0]] as f64;
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] as f64 - max) * inv_t).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.params.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (n, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= self.params.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
            order.truncate(keep);
            probs.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut u = self.rng.random::<f64>() * total;
        for (n, p) in probs.iter().enumerate() {
            if u < *p {
                return order[n];
            }
            u -= p;
        }
        order[order.len() - 1]
    }
}

/// Index of the first maximum (NaN ignored).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// `log_softmax(logits)[index]` in nats, computed in f64.
pub fn log_softmax_at(logits: &[f32], index: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    (logits[index] as f64 - lse) as f32
}

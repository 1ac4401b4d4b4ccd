//! The token distribution a rollout samples from, and the one every log-prob is taken under:
//! `softmax(logits / T)` restricted to a kept set and renormalised.
//!
//! The kept set is a threshold on the tempered logits, `{j : z_j / T ≥ τ}`:
//! * top-k keeps the `k` largest (all ties with the k-th kept);
//! * top-p then keeps the smallest most-likely prefix whose renormalised probability reaches
//!   `p` (all ties with its last member kept);
//! * to score a token `y` (in the trainer, after the policy moved), `τ` is lowered to `z_y / T`
//!   when `y` fell below it, so the log-prob stays finite. At sampling time `y` is always
//!   kept, so the sampled distribution and the scored one are the same.
//!
//! One function, [`kept_threshold`], decides the set for the engine's sampler and for the
//! trainer's fused LM head, so both sides keep the same tokens of the same logits.
//!
//! Every log-prob of an RL step is taken under this distribution: the engine's sampling
//! log-probs, π_old, π_θ in the update, the reference's, and the entropy. The fused head
//! builds a block of whole rows when a truncation is on and holds the kept set fixed in
//! backward (the gradient almost everywhere). Greedy decoding and SFT use the model's own
//! distribution (T = 1, nothing cut). veRL, TRL and OpenRLHF temper but do not truncate; with
//! top-k or top-p they compute the ratio under a different distribution from the one sampled.

use super::cpu_math::{row_logsumexp, Real};

/// Top-k / top-p truncation of a tempered distribution. `OFF` keeps every token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Truncation {
    /// Keep the `top_k` largest logits (ties kept); 0 = off.
    pub top_k: usize,
    /// Keep the smallest most-likely prefix reaching probability `top_p`; 1 = off.
    pub top_p: f64,
}

impl Truncation {
    /// No truncation.
    pub const OFF: Truncation = Truncation {
        top_k: 0,
        top_p: 1.0,
    };

    /// True when the truncation keeps every token of a `vocab`-sized row.
    pub fn is_off(&self, vocab: usize) -> bool {
        (self.top_k == 0 || self.top_k >= vocab) && self.top_p >= 1.0
    }
}

/// The distribution a log-prob is taken under: temperature `T > 0` and a truncation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenDistribution {
    /// Softmax temperature (> 0).
    pub temperature: f64,
    /// Kept set.
    pub truncation: Truncation,
}

impl TokenDistribution {
    /// The model's own distribution: `T = 1`, nothing truncated.
    pub const MODEL: TokenDistribution = TokenDistribution {
        temperature: 1.0,
        truncation: Truncation::OFF,
    };

    /// The distribution a sampler with these settings draws from. Greedy decoding
    /// (`temperature == 0`) has no distribution to correct for and maps to [`Self::MODEL`].
    pub fn of_sampling(temperature: f64, top_k: usize, top_p: f64) -> TokenDistribution {
        if temperature == 0.0 {
            return Self::MODEL;
        }
        TokenDistribution {
            temperature,
            truncation: Truncation { top_k, top_p },
        }
    }
}

/// The smallest kept tempered logit `τ` of `tempered` (one row of `logits / T`): the kept
/// set is `{j : tempered[j] ≥ τ}`. `-inf` when nothing is cut (or every value is `-inf` or
/// NaN). NaN entries are never kept.
///
/// Cost: O(V) for top-k (selection); top-p sorts lazily, only as far as the nucleus reaches.
pub(crate) fn kept_threshold<T: Real>(tempered: &[T], cut: Truncation) -> T {
    if cut.is_off(tempered.len()) {
        return T::NEG_INFINITY;
    }
    let mut cand: Vec<T> = tempered
        .iter()
        .copied()
        .filter(|&x| x > T::NEG_INFINITY)
        .collect();
    if cand.is_empty() {
        return T::NEG_INFINITY;
    }
    let desc = |a: &T, b: &T| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal);
    let mut tau = T::NEG_INFINITY;
    if cut.top_k > 0 && cut.top_k < cand.len() {
        cand.select_nth_unstable_by(cut.top_k - 1, desc);
        tau = cand[cut.top_k - 1];
        cand.retain(|&x| x >= tau);
    }
    if cut.top_p < 1.0 {
        tau = nucleus_floor(&mut cand, cut.top_p);
    }
    tau
}

/// The last value of the most-likely prefix of `cand` (sorted in place, lazily) whose
/// share of `Σ e^cand` reaches `top_p`.
fn nucleus_floor<T: Real>(cand: &mut [T], top_p: f64) -> T {
    let desc = |a: &T, b: &T| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal);
    let max = cand
        .iter()
        .copied()
        .fold(T::NEG_INFINITY, |m, x| if x > m { x } else { m });
    let mass: f64 = cand.iter().map(|&x| (x - max).exp().to_f64()).sum();
    let target = top_p * mass;
    let (mut sorted, mut cum, mut chunk) = (0, 0.0f64, 64usize);
    loop {
        let end = (sorted + chunk).min(cand.len());
        let rest = &mut cand[sorted..];
        if end - sorted < rest.len() {
            rest.select_nth_unstable_by(end - sorted - 1, desc);
        }
        rest[..end - sorted].sort_unstable_by(desc);
        for &x in &cand[sorted..end] {
            cum += (x - max).exp().to_f64();
            if cum >= target {
                return x;
            }
        }
        if end == cand.len() {
            return cand[end - 1];
        }
        sorted = end;
        chunk *= 4;
    }
}

/// `log p(index)` in nats under the softmax of `tempered` restricted to `{j : tempered[j] ≥
/// tau}` (`tau = -inf`: the whole row), with the fused LM head's arithmetic for a truncated
/// row (one log-sum-exp over the kept values in vocabulary order). `index` must be kept.
pub(crate) fn kept_logprob<T: Real>(tempered: &[T], tau: T, index: usize) -> T {
    let kept: Vec<T> = tempered.iter().copied().filter(|&x| x >= tau).collect();
    tempered[index] - row_logsumexp(&kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(top_k: usize, top_p: f64) -> Truncation {
        Truncation { top_k, top_p }
    }

    #[test]
    fn top_k_keeps_ties_with_the_kth_value() {
        let z = [0.0f64, 3.0, 1.0, 3.0, -1.0, 2.0];
        assert_eq!(kept_threshold(&z, cut(2, 1.0)), 3.0);
        assert_eq!(kept_threshold(&z, cut(3, 1.0)), 2.0);
        assert_eq!(kept_threshold(&z, cut(6, 1.0)), f64::NEG_INFINITY);
        assert_eq!(kept_threshold(&z, cut(0, 1.0)), f64::NEG_INFINITY);
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_p() {
        // p ∝ e^z: 0.6439, 0.2369, 0.0871, 0.0321 for z = 3, 2, 1, 0.
        let z = [3.0f64, 0.0, 2.0, 1.0];
        assert_eq!(kept_threshold(&z, cut(0, 0.5)), 3.0);
        assert_eq!(kept_threshold(&z, cut(0, 0.7)), 2.0);
        assert_eq!(kept_threshold(&z, cut(0, 0.9)), 1.0);
        // top-k first, then top-p renormalised over the k survivors: 0.731, 0.269.
        assert_eq!(kept_threshold(&z, cut(2, 0.7)), 3.0);
        assert_eq!(kept_threshold(&z, cut(2, 0.75)), 2.0);
    }

    #[test]
    fn nan_and_neg_infinity_are_never_kept() {
        let z = [f32::NAN, 1.0, f32::NEG_INFINITY, 0.5];
        assert_eq!(kept_threshold(&z, cut(1, 1.0)), 1.0);
        assert_eq!(
            kept_threshold(&[f32::NAN; 3], cut(1, 1.0)),
            f32::NEG_INFINITY
        );
    }

    #[test]
    fn kept_logprob_renormalises_over_the_kept_set() {
        let z = [3.0f64, 0.0, 2.0, 1.0];
        let lp = kept_logprob(&z, 2.0, 2);
        let want = (2.0f64.exp() / (3.0f64.exp() + 2.0f64.exp())).ln();
        assert!((lp - want).abs() < 1e-12);
        let full = kept_logprob(&z, f64::NEG_INFINITY, 0);
        let lse = z.iter().map(|x| x.exp()).sum::<f64>().ln();
        assert!((full - (3.0 - lse)).abs() < 1e-12);
    }

    #[test]
    fn greedy_sampling_maps_to_the_model_distribution() {
        assert_eq!(
            TokenDistribution::of_sampling(0.0, 20, 0.9),
            TokenDistribution::MODEL
        );
        let d = TokenDistribution::of_sampling(0.7, 20, 0.9);
        assert_eq!(d.truncation, cut(20, 0.9));
    }
}

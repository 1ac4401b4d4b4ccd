//! Held-out numbers of the data-file runs, from roles' scores: summed response log-probs of
//! a set of pairs (policy or reference), the mean NLL per response token, and the pairwise
//! accuracy and margin of two score lists. Scoring goes out in chunks; the arithmetic here
//! is a few sums on the host.

use super::pairs::sequences;
use super::pairs::TokenPair;
use crate::batch::{Sequences, TokenArray};
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::roles::{PolicyRole, ReferenceRole};

/// Rows per scoring call.
const CHUNK: usize = 64;

/// Which role scores.
pub(crate) enum Scorer<'a> {
    /// The trained policy (current weights).
    Policy(&'a dyn PolicyRole),
    /// The frozen reference.
    Reference(&'a dyn ReferenceRole),
}

/// Per row: the sum and the count of the response tokens' log-probs (nats).
pub(crate) async fn response_logprobs(
    ctx: &Ctx<'_>,
    scorer: &Scorer<'_>,
    at: At,
    pairs: &[TokenPair],
) -> Result<Vec<(f64, usize)>, RunError> {
    let mut out = Vec::with_capacity(pairs.len());
    for chunk in pairs.chunks(CHUNK) {
        let seqs = sequences(ctx, chunk.to_vec());
        let lp = match scorer {
            Scorer::Policy(p) => p.logprobs("logprobs", seqs.clone()).await,
            Scorer::Reference(r) => r.logprobs("reference_logprobs", seqs.clone()).await,
        }
        .map_err(RunError::at(at))?;
        out.extend(sum_responses(&lp, &seqs));
    }
    Ok(out)
}

/// Sum and count of each row's response log-probs in `lp` `[B, T-1]` (position `t` predicts
/// token `t + 1`, so a response at tokens `p..p+r` is at positions `p-1..p+r-1`).
fn sum_responses(lp: &TokenArray, seqs: &Sequences) -> Vec<(f64, usize)> {
    let cols = lp.cols();
    seqs.pairs
        .iter()
        .enumerate()
        .map(|(b, (p, r))| {
            let row = &lp.data()[b * cols..(b + 1) * cols];
            let start = p.len().saturating_sub(1);
            let end = (start + r.len()).min(cols);
            let sum: f64 = row[start..end].iter().map(|&x| x as f64).sum();
            (sum, end - start)
        })
        .collect()
}

/// Mean NLL per response token (nats) of `pairs` under the policy.
pub(crate) async fn mean_nll(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
    at: At,
    pairs: &[TokenPair],
) -> Result<f64, RunError> {
    let rows = response_logprobs(ctx, &Scorer::Policy(policy), at, pairs).await?;
    let (sum, n) = rows
        .iter()
        .fold((0.0, 0usize), |(s, n), &(x, k)| (s + x, n + k));
    Ok(-sum / n.max(1) as f64)
}

/// Fraction of pairs with `chosen > rejected`, and the mean of `chosen − rejected`.
pub(crate) fn pairwise(chosen: &[f64], rejected: &[f64]) -> (f64, f64) {
    let n = chosen.len().max(1) as f64;
    let wins = chosen.iter().zip(rejected).filter(|(c, r)| c > r).count();
    let margin: f64 = chosen.iter().zip(rejected).map(|(c, r)| c - r).sum();
    (wins as f64 / n, margin / n)
}

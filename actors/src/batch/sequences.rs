//! [`Sequences`]: a batch's token ids as they travel between roles — prompt and response ids
//! per row, plus the pad id. Plain data; each role packs them into tensors on its own device
//! ([`Sequences::batch`]) inside its executor job.

use super::TokenArray;
use crate::error::Cause;
use oxalign_models::engine::Engine;
use oxalign_models::moe::routing::ExpertChoices;
use oxalign_models::TokenDistribution;
use oxalign_rlhf::trainer::TokenBatch;
use oxalign_rlhf::RlhfError;
use std::ops::Range;

/// `(prompt, response)` token ids per row.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sequences {
    /// One pair per row.
    pub pairs: Vec<(Vec<u32>, Vec<u32>)>,
    /// Padding token id.
    pub pad_id: u32,
    /// Rollout routing replay: per row, the experts the engine routed each token to (see
    /// `TokenBatch::routing`). Only the policy's trainer uses them; None without replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<Vec<ExpertChoices>>,
    /// Multi-turn episodes: per row, the ranges of response positions an environment wrote
    /// (tool results, later user turns). They stay in the sequence but leave the response
    /// mask: nothing trains on them. None for single-turn batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observations: Option<Vec<Vec<Range<usize>>>>,
}

impl Sequences {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True with no rows.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `T` of the packed batch: the longest prompt + response, at least 2 (so next-token
    /// arrays `[B, T-1]` are never empty), as [`TokenBatch::new`] pads.
    pub fn padded_len(&self) -> usize {
        self.pairs
            .iter()
            .map(|(p, r)| p.len() + r.len())
            .max()
            .unwrap_or(0)
            .max(2)
    }

    /// Packs all rows on `device`.
    pub fn batch(&self, device: &candle_core::Device) -> Result<TokenBatch, RlhfError> {
        let refs: Vec<(&[u32], &[u32])> = self
            .pairs
            .iter()
            .map(|(p, r)| (p.as_slice(), r.as_slice()))
            .collect();
        let mut batch = TokenBatch::new(&refs, self.pad_id, device)?;
        if let Some(spans) = &self.observations {
            batch = batch.without_observations(spans)?;
        }
        match &self.routing {
            Some(r) => batch.with_routing(r.clone()),
            None => Ok(batch),
        }
    }

    /// Packs rows `range` on `device` with the whole batch's length `T`, so the shards of
    /// one batch line up column for column.
    pub fn batch_rows(
        &self,
        range: Range<usize>,
        device: &candle_core::Device,
    ) -> Result<TokenBatch, RlhfError> {
        let rows: Vec<usize> = range.collect();
        self.batch(device)?.select_rows(&rows)
    }

    /// Next-token log-probs `[rows, T-1]` of the response tokens of rows `range` under `dist`,
    /// scored by `engine` (batched prefill forwards, no `[B, T, V]` logits), laid out like the
    /// trainer's `next_token_logprobs` of [`Sequences::batch_rows`] (`T` is the whole batch's
    /// longest sequence) at the response positions, zeros at the prompt's and the padding's
    /// (as [`Sequences::place_response_values`]): every consumer masks them by the response
    /// mask, and the LM head skips the prompt rows.
    pub fn engine_logprobs(
        &self,
        engine: &mut Engine,
        range: Range<usize>,
        dist: TokenDistribution,
    ) -> Result<TokenArray, Cause> {
        let pairs = &self.pairs[range];
        let seqs: Vec<Vec<u32>> = pairs
            .iter()
            .map(|(p, r)| p.iter().chain(r).copied().collect())
            .collect();
        let from: Vec<usize> = pairs
            .iter()
            .map(|(p, _)| p.len().saturating_sub(1))
            .collect();
        let scores = engine.score_from(&seqs, &from, dist)?;
        let mut out = TokenArray::zeros(seqs.len(), self.padded_len() - 1);
        for ((i, lp), &at) in scores.iter().enumerate().zip(&from) {
            out.row_mut(i)[at..at + lp.len()].copy_from_slice(lp);
        }
        Ok(out)
    }

    /// `[B, T-1]` values placed at each row's response positions (zeros elsewhere):
    /// `values[b][j]` predicts response token `j` of row `b`, like the trainer's next-token
    /// arrays of [`Sequences::batch`].
    pub fn place_response_values(&self, values: &[Vec<f32>]) -> TokenArray {
        let t = self.padded_len();
        let mut out = TokenArray::zeros(self.len(), t - 1);
        for (row, ((p, _), v)) in self.pairs.iter().zip(values).enumerate() {
            let start = p.len() - 1;
            out.row_mut(row)[start..start + v.len()].copy_from_slice(v);
        }
        out
    }
}

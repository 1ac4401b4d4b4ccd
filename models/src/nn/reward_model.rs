//! `RewardModel`: a sequence scorer in HF `*ForSequenceClassification` layout: the backbone
//! plus `score.weight` `[1, H]` (no bias), read at the last real token of each row.
//! Constructors, load/save and weight access are shared (`model.rs`); this file is the head's
//! forward. Trainable (for Bradley–Terry training); the loss lives in `oxalign-rlhf`.

use crate::nn::head::RewardHead;
use crate::nn::layers::linear;
use crate::nn::mask::mask_to_host;
use crate::nn::model::Model;
use candle_core::{Tensor, D};

/// Decoder + scalar sequence score (`score.weight` `[1, H]`, no bias): the shared [`Model`]
/// wearing the [`RewardHead`].
pub type RewardModel = Model<RewardHead>;

impl RewardModel {
    /// Score of every position `[B, T]` (before pooling). Differentiable.
    pub fn token_scores(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let h = self.decoder().forward(input_ids, attention_mask, None)?;
        linear(&h, &self.head.weight, None)?.squeeze(D::Minus1)
    }

    /// Sequence scores `[B]`: the score at the last position whose `attention_mask` is 1
    /// (the last position when no mask is given). Works for left and right padding.
    /// Differentiable.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let scores = self.token_scores(input_ids, attention_mask)?;
        let last: Vec<u32> = match attention_mask {
            None => vec![(t - 1) as u32; b],
            Some(m) => {
                let m = mask_to_host(m, b, t)?;
                (0..b)
                    .map(|r| {
                        let row = &m[r * t..(r + 1) * t];
                        row.iter().rposition(|&x| x != 0).unwrap_or(t - 1) as u32
                    })
                    .collect()
            }
        };
        let idx = Tensor::from_vec(last, (b, 1), scores.device())?;
        scores.gather(&idx, 1)?.squeeze(1)
    }
}

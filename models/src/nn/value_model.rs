//! `ValueModel`: the critic: the backbone with a per-token `score` Linear(H, 1) with bias,
//! stored like HF `*ForTokenClassification` with `num_labels = 1`. Constructors, load/save and
//! weight access are shared (`model.rs`); this file is the head's forward. It does not
//! compute returns or value losses (that is `oxalign-rlhf`).

use crate::nn::head::ValueHead;
use crate::nn::layers::linear;
use crate::nn::model::Model;
use candle_core::{Tensor, D};

/// Decoder + per-token scalar value head (`score.weight` `[1, H]`, `score.bias` `[1]`): the
/// shared [`Model`] wearing the [`ValueHead`].
pub type ValueModel = Model<ValueHead>;

impl ValueModel {
    /// Values `[B, T]` (one scalar per token; same masking/positions as
    /// `CausalLm::forward`). Differentiable.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let h = self.decoder().forward(input_ids, attention_mask, None)?;
        linear(&h, &self.head.weight, Some(&self.head.bias))?.squeeze(D::Minus1)
    }

    /// Values `[B, T]` of packed rows (`segments`: row-major `[B, T]` segment ids; see
    /// `Decoder::forward_packed`): each segment's values equal those of its sequence alone.
    pub fn forward_packed(
        &self,
        input_ids: &Tensor,
        segments: &[u32],
    ) -> candle_core::Result<Tensor> {
        let h = self.decoder().forward_packed(input_ids, segments)?;
        linear(&h, &self.head.weight, Some(&self.head.bias))?.squeeze(D::Minus1)
    }
}

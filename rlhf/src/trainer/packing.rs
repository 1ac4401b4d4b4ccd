//! Sequence packing for the training steps: the sequences of a right-padded [`TokenBatch`]
//! placed first-fit-decreasing into rows as long as its longest sequence, with a segment id per
//! token, and the map that brings per-target outputs of the packed rows (log-probs, entropies,
//! values) back to the batch's `[B, T-1]` layout.
//!
//! With `sft.packing` or `rl.packing` (both default `false`), the SFT steps, or the PPO policy
//! and critic minibatch updates, run on packed rows instead of the padded batch:
//! * [`PackedRows`] places the batch's sequences longest first, ties by index (so
//!   deterministic), and gives each token a segment id; the padding after a row's last sequence
//!   is a segment of its own.
//! * The model's packed forward (`Decoder::forward_packed`,
//!   `CausalLm::next_token_outputs_packed`, `ValueModel::forward_packed`) restarts position ids
//!   at every segment start, and attention (`causal_attention_segmented`) lets a token see only
//!   the earlier tokens of its own segment: the fused CPU kernel narrows each query's key range
//!   to `[max(segment start, window start), t]` and skips other segments' tiles; the composed
//!   path (other devices, bf16, the models' fallback) hides them in its mask. With rollout
//!   routing replay each row's recorded experts are laid onto the packed rows too
//!   (`PackedRows::routing`).
//! * Per-target outputs are unpacked to the batch's layout before any loss. A target at a
//!   segment's last token, which would predict the next segment's first token, is never read.
//!
//! Losses never see packed rows: they run on the unpacked tensors, so the losses, every
//! aggregation (`loss_agg`: token mean and both sequence means) included, and the gradients are
//! the padded path's, to f32 rounding (`rlhf/tests/packing.rs`); only the compute spent on
//! padding goes. Nothing here runs a model. `oxalign bench train --lengths uniform [--packing]`
//! measures padded against packed on the same variable-length sequences.

use candle_core::{DType, Tensor};

use super::TokenBatch;
use crate::{Result, RlhfError};
use oxalign_models::moe::routing::ExpertChoices;

/// Which training steps run on packed rows instead of padded ones. Default: neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Packing {
    /// Pack the SFT steps' batches.
    pub sft: bool,
    /// Pack the RL minibatches (PPO policy and critic updates).
    pub rl: bool,
}

/// Segment id of the padding run at the end of a packed row (real segments are `0, 1, ...`).
pub const PAD_SEGMENT: u32 = u32::MAX;

/// The sequences of one [`TokenBatch`] packed into rows.
#[derive(Debug, Clone)]
pub struct PackedRows {
    /// `[R, L]` u32 token ids, sequences back to back, padded at the end of a row with 0.
    pub ids: Tensor,
    /// `[R, L]` row-major segment ids: `k` for the `k`-th sequence of a row, [`PAD_SEGMENT`]
    /// for the padding after the last one.
    pub segments: Vec<u32>,
    /// Sequences of each packed row, as row indices of the batch, in placement order.
    pub rows: Vec<Vec<usize>>,
    /// `[B * (T-1)]` u32: for each target of the batch, its index in the flattened packed
    /// targets `[R * (L-1)]`, or `R * (L-1)` (a zero appended by [`Self::unpack`]) for the
    /// targets past a sequence's end.
    unpack: Tensor,
    /// `(B, T-1)` of the batch.
    targets: (usize, usize),
    /// Real tokens of each row of the batch.
    lens: Vec<usize>,
    /// The packed rows' width `L`.
    width: usize,
}

impl PackedRows {
    /// Packs the rows of `batch` (right-padded, as [`TokenBatch::new`] makes them) into rows of
    /// the batch's own width `T`, so no sequence is split; deterministic.
    pub fn new(batch: &TokenBatch) -> Result<Self> {
        let (b, t) = batch.ids.dims2()?;
        let lens = sequence_lengths(&batch.attention_mask, b, t)?;
        let plan = first_fit_decreasing(&lens, t);
        let ids = batch.ids.to_dtype(DType::U32)?.to_vec2::<u32>()?;
        let (r, l) = (plan.len(), t);
        let mut packed = vec![0u32; r * l];
        let mut segments = vec![PAD_SEGMENT; r * l];
        let zero_slot = (r * (l - 1)) as u32;
        let mut unpack = vec![zero_slot; b * (t - 1)];
        for (row, members) in plan.iter().enumerate() {
            let mut start = 0;
            for (k, &s) in members.iter().enumerate() {
                let n = lens[s];
                let at = row * l + start;
                packed[at..at + n].copy_from_slice(&ids[s][..n]);
                segments[at..at + n].fill(k as u32);
                // Target j of sequence s (predicting token j + 1) sits at start + j.
                for j in 0..n.saturating_sub(1) {
                    unpack[s * (t - 1) + j] = (row * (l - 1) + start + j) as u32;
                }
                start += n;
            }
        }
        let dev = batch.ids.device();
        Ok(Self {
            ids: Tensor::from_vec(packed, (r, l), dev)?,
            segments,
            rows: plan,
            unpack: Tensor::from_vec(unpack, b * (t - 1), dev)?,
            targets: (b, t - 1),
            lens,
            width: l,
        })
    }

    /// The batch rows' expert-choice records (one per batch row) laid out over the packed
    /// rows, for a replaying forward of [`Self::ids`].
    pub fn routing(&self, records: &[ExpertChoices]) -> ExpertChoices {
        let rows: Vec<Vec<(&ExpertChoices, usize)>> = self
            .rows
            .iter()
            .map(|members| {
                members
                    .iter()
                    .map(|&s| (&records[s], self.lens[s]))
                    .collect()
            })
            .collect();
        ExpertChoices::for_packed(&rows, self.width)
    }

    /// Number of packed rows `R`.
    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    /// `[R, L]` f32 mask of the packed rows: 1 on a sequence's tokens, 0 on the padding after
    /// a row's last sequence.
    pub fn real_tokens(&self) -> Result<Tensor> {
        let mask: Vec<f32> = self
            .segments
            .iter()
            .map(|&s| f32::from(u8::from(s != PAD_SEGMENT)))
            .collect();
        Ok(Tensor::from_vec(
            mask,
            self.ids.dims2()?,
            self.ids.device(),
        )?)
    }

    /// A per-target tensor of the packed rows `[R, L-1]` in the batch's layout `[B, T-1]`
    /// (differentiable): each sequence's targets where the padded batch has them, 0 past its
    /// end. Targets that would cross from one segment into the next are never read.
    pub fn unpack(&self, packed: &Tensor) -> Result<Tensor> {
        let flat = packed.flatten_all()?;
        let zero = Tensor::zeros(1, flat.dtype(), flat.device())?;
        let flat = Tensor::cat(&[&flat, &zero], 0)?;
        Ok(flat.index_select(&self.unpack, 0)?.reshape(self.targets)?)
    }
}

/// Real tokens of each row of a right-padded `[b, t]` attention mask; a mask that is not a
/// prefix of ones is refused (packing keeps tokens `0..len` of each row).
fn sequence_lengths(mask: &Tensor, b: usize, t: usize) -> Result<Vec<usize>> {
    let mask = mask.to_dtype(DType::U32)?.to_vec2::<u32>()?;
    let mut lens = Vec::with_capacity(b);
    for (row, m) in mask.iter().enumerate() {
        let n = m.iter().take_while(|&&x| x != 0).count();
        if m[n..].iter().any(|&x| x != 0) || m.len() != t {
            return Err(RlhfError::invalid(
                "attention_mask",
                format!("row {row}"),
                "packing needs right-padded rows (real tokens first, then padding)",
            ));
        }
        lens.push(n);
    }
    Ok(lens)
}

/// First-fit decreasing: sequences by decreasing length (ties by index), each into the first
/// row with room for it; a new row when none has. Rows are at least as wide as the longest
/// sequence. Returns the sequence indices of each row in placement order.
pub fn first_fit_decreasing(lens: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let capacity = lens.iter().copied().max().unwrap_or(0).max(capacity);
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by(|&a, &b| lens[b].cmp(&lens[a]).then(a.cmp(&b)));
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut used: Vec<usize> = Vec::new();
    for s in order {
        match used.iter().position(|&u| u + lens[s] <= capacity) {
            Some(r) => {
                rows[r].push(s);
                used[r] += lens[s];
            }
            None => {
                rows.push(vec![s]);
                used.push(lens[s]);
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn first_fit_decreasing_is_deterministic_and_fits() {
        let lens = [3, 8, 5, 2, 5, 1];
        let rows = first_fit_decreasing(&lens, 8);
        assert_eq!(rows, vec![vec![1], vec![2, 0], vec![4, 3, 5]]);
        for r in &rows {
            assert!(r.iter().map(|&s| lens[s]).sum::<usize>() <= 8);
        }
        // A capacity below the longest sequence grows to it.
        assert_eq!(first_fit_decreasing(&[4, 2], 1), vec![vec![0], vec![1]]);
    }

    #[test]
    fn packs_and_unpacks_to_the_padded_layout() -> Result<()> {
        let pairs: [(&[u32], &[u32]); 3] = [(&[1, 2], &[3]), (&[4, 5, 6], &[7, 8]), (&[9], &[])];
        let batch = TokenBatch::new(&pairs, 0, &Device::Cpu)?;
        let packed = PackedRows::new(&batch)?;
        // Lengths 3, 5, 1 into rows of 5: [seq 1], [seq 0 | seq 2 | pad].
        assert_eq!(packed.rows, vec![vec![1], vec![0, 2]]);
        assert_eq!(
            packed.ids.to_vec2::<u32>()?,
            vec![vec![4, 5, 6, 7, 8], vec![1, 2, 3, 9, 0]]
        );
        assert_eq!(
            packed.segments,
            vec![0, 0, 0, 0, 0, 0, 0, 0, 1, PAD_SEGMENT]
        );
        // Packed per-target values: 10 * row + position.
        let x: Vec<f32> = (0..2)
            .flat_map(|r| (0..4).map(move |j| (10 * r + j) as f32))
            .collect();
        let x = Tensor::from_vec(x, (2, 4), &Device::Cpu)?;
        assert_eq!(
            packed.unpack(&x)?.to_vec2::<f32>()?,
            vec![
                vec![10., 11., 0., 0.],
                vec![0., 1., 2., 3.],
                vec![0., 0., 0., 0.]
            ]
        );
        Ok(())
    }

    #[test]
    fn left_padded_masks_are_refused() -> Result<()> {
        let pairs: [(&[u32], &[u32]); 2] = [(&[1, 2], &[3]), (&[4], &[])];
        let mut batch = TokenBatch::new(&pairs, 0, &Device::Cpu)?;
        batch.attention_mask = Tensor::new(&[[1u32, 1, 1], [0, 1, 0]], &Device::Cpu)?;
        let err = PackedRows::new(&batch).unwrap_err().to_string();
        assert!(err.contains("right-padded"), "{err}");
        Ok(())
    }
}

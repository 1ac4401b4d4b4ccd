//! The token batch of `oxalign bench train`: seeded random sequences of a fixed length or of
//! lengths drawn uniformly in `[seq/4, seq]`, the loss every position is trained on, and the
//! padded or packed way of running it. No timing here; `bench_train.rs` measures.

use candle_core::{Device, Tensor};
use clap::ValueEnum;
use oxalign_models::CausalLm;
use oxalign_rlhf::losses::sft_loss;
use oxalign_rlhf::trainer::{PackedRows, TokenBatch};

/// How long the benchmark's sequences are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lengths {
    /// Every sequence has `--seq` tokens (no padding).
    Fixed,
    /// Each sequence's length is drawn uniformly in `[max(2, seq/4), seq]` (seeded), and the
    /// batch is right-padded to the longest one, as RL rollouts and SFT data are.
    Uniform,
}

impl Lengths {
    /// The name printed in the report.
    pub fn name(self) -> &'static str {
        match self {
            Lengths::Fixed => "fixed",
            Lengths::Uniform => "uniform",
        }
    }
}

/// The benchmark's sequences: their lengths and the padded batch holding them.
pub struct BenchBatch {
    /// Tokens of each sequence.
    pub lens: Vec<usize>,
    /// The right-padded batch; every target of every sequence is trained on.
    pub batch: TokenBatch,
}

impl BenchBatch {
    /// `batch` sequences of `seq` tokens at most, token ids uniform in `0..vocab`.
    pub fn new(
        batch: usize,
        seq: usize,
        vocab: usize,
        lengths: Lengths,
        seed: u64,
        device: &Device,
    ) -> anyhow::Result<BenchBatch> {
        let ids = random_tokens(batch, seq, vocab, seed);
        let lens: Vec<usize> = match lengths {
            Lengths::Fixed => vec![seq; batch],
            Lengths::Uniform => {
                let lo = (seq / 4).max(2).min(seq);
                let mut rng = SplitMix64(seed ^ 0x5EED_1E45);
                (0..batch)
                    .map(|_| lo + (rng.next() % (seq - lo + 1) as u64) as usize)
                    .collect()
            }
        };
        // A one-token "prompt" then the rest as "response": the loss covers every target.
        let pairs: Vec<(&[u32], &[u32])> = ids
            .chunks(seq)
            .zip(&lens)
            .map(|(row, &n)| (&row[..1], &row[1..n]))
            .collect();
        let batch = TokenBatch::new(&pairs, 0, device)?;
        Ok(BenchBatch { lens, batch })
    }

    /// Rows the model runs on: the batch's rows, or its packed rows when `packed`.
    pub fn rows(&self, packed: bool) -> anyhow::Result<usize> {
        Ok(if packed {
            PackedRows::new(&self.batch)?.num_rows()
        } else {
            self.batch.rows()
        })
    }

    /// Mean next-token NLL over every target of every sequence through the fused LM head (no
    /// `[B, T, V]` logits), as the SFT trainer computes it; on packed rows when `packed`
    /// (the packing itself is part of the work).
    pub fn loss(&self, model: &CausalLm, packed: bool) -> anyhow::Result<Tensor> {
        let b = &self.batch;
        let lp = if packed {
            let rows = PackedRows::new(b)?;
            let out = model.next_token_outputs_packed(
                &rows.ids,
                &rows.segments,
                oxalign_models::TokenDistribution::MODEL,
            )?;
            rows.unpack(&out.logprobs)?
        } else {
            model.next_token_logprobs(&b.ids, Some(&b.attention_mask))?
        };
        Ok(sft_loss(&lp, &b.response_mask)?.0)
    }
}

/// SplitMix64, the benchmark's seeded stream.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// `[batch · seq]` token ids uniform in `0..vocab`, from a SplitMix64 stream seeded by `seed`.
pub fn random_tokens(batch: usize, seq: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64(seed);
    (0..batch * seq)
        .map(|_| (rng.next() % vocab as u64) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_are_seeded_and_in_range() {
        let a = random_tokens(2, 7, 11, 5);
        assert_eq!(a, random_tokens(2, 7, 11, 5));
        assert_ne!(a, random_tokens(2, 7, 11, 6));
        assert!(a.iter().all(|&t| t < 11));
    }

    #[test]
    fn uniform_lengths_stay_in_range_and_fixed_ones_fill_the_row() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let u = BenchBatch::new(16, 40, 50, Lengths::Uniform, 3, &dev)?;
        assert!(
            u.lens.iter().all(|&n| (10..=40).contains(&n)),
            "{:?}",
            u.lens
        );
        assert!(u.lens.iter().any(|&n| n != u.lens[0]));
        let targets: usize = u.lens.iter().map(|n| n - 1).sum();
        assert_eq!(u.batch.response_tokens(), targets);
        assert!(u.rows(true)? < 16);
        let f = BenchBatch::new(3, 8, 50, Lengths::Fixed, 3, &dev)?;
        assert_eq!((f.lens, f.batch.ids.dims()), (vec![8; 3], &[3usize, 8][..]));
        Ok(())
    }
}

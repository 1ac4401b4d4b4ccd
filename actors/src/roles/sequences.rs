//! A rollout's token sequences as they travel between roles: prompt and response ids per
//! row, plus the pad id. Each role packs them into tensors on its own device.

use oxalign_rlhf::trainer::TokenBatch;
use std::ops::Range;

/// `(prompt, response)` token ids per row.
#[derive(Debug, Clone, Default)]
pub struct Sequences {
    /// One pair per row.
    pub pairs: Vec<(Vec<u32>, Vec<u32>)>,
    /// Padding token id.
    pub pad_id: u32,
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

    /// Packs all rows on `device`.
    pub fn batch(&self, device: &candle_core::Device) -> Result<TokenBatch, String> {
        let refs: Vec<(&[u32], &[u32])> = self
            .pairs
            .iter()
            .map(|(p, r)| (p.as_slice(), r.as_slice()))
            .collect();
        TokenBatch::new(&refs, self.pad_id, device).map_err(|e| e.to_string())
    }

    /// Packs rows `range` on `device` with the whole batch's length `T`, so the shards of
    /// one batch line up column for column.
    pub fn batch_rows(
        &self,
        range: Range<usize>,
        device: &candle_core::Device,
    ) -> Result<TokenBatch, String> {
        let rows: Vec<usize> = range.collect();
        self.batch(device)?
            .select_rows(&rows)
            .map_err(|e| e.to_string())
    }
}

//! `KvCache`: a contiguous per-layer key/value cache for incremental decoding, plus the per-row
//! key-padding mask and real-token counts needed for HF-style position ids. It grows by
//! concatenation; the paged cache of the generation engine is a separate type.

use candle_core::{Result, Tensor};

/// Keys/values of every layer for a batch of sequences decoded together.
///
/// Layout per layer: keys and values `[B, kv_heads, S, head_dim]` after RoPE. `S` grows with
/// every `forward_cached` call. Rows may be dropped with [`KvCache::select_rows`].
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Key mask `[B][S]`: 1 = real token, 0 = padding.
    key_mask: Vec<Vec<u32>>,
    /// Real tokens seen so far per row (drives position ids).
    seen: Vec<u32>,
    len: usize,
}

impl KvCache {
    /// An empty cache for a model with `num_layers` decoder layers.
    pub fn new(num_layers: usize) -> KvCache {
        KvCache {
            layers: vec![None; num_layers],
            key_mask: vec![],
            seen: vec![],
            len: 0,
        }
    }

    /// Number of cached positions `S` (including padding).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Batch size fixed by the first call (`None` while empty).
    pub fn batch_size(&self) -> Option<usize> {
        (!self.is_empty()).then_some(self.key_mask.len())
    }

    /// Empties the cache (keeps the layer count).
    pub fn reset(&mut self) {
        let n = self.layers.len();
        *self = KvCache::new(n);
    }

    /// Number of layers this cache was made for.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Keeps only the batch rows `rows` (in that order), e.g. to drop finished sequences.
    pub fn select_rows(&mut self, rows: &[usize]) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        if let Some(&bad) = rows.iter().find(|&&r| r >= self.key_mask.len()) {
            candle_core::bail!("KvCache::select_rows: row {bad} out of range")
        }
        let device = match self.layers.iter().flatten().next() {
            Some((k, _)) => k.device().clone(),
            None => candle_core::Device::Cpu,
        };
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::new(idx.as_slice(), &device)?;
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.index_select(&idx, 0)?;
            *v = v.index_select(&idx, 0)?;
        }
        self.key_mask = rows.iter().map(|&r| self.key_mask[r].clone()).collect();
        self.seen = rows.iter().map(|&r| self.seen[r]).collect();
        Ok(())
    }

    /// Starts a step of `t` new tokens with mask `new_mask` (row-major `[B, t]`): returns
    /// the position ids of the new tokens and the full key mask `[B, S + t]`, and records
    /// them. The layer tensors are appended by [`KvCache::append`].
    pub(crate) fn begin_step(
        &mut self,
        batch: usize,
        t: usize,
        new_mask: &[u32],
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        if self.is_empty() {
            self.key_mask = vec![vec![]; batch];
            self.seen = vec![0; batch];
        } else if self.key_mask.len() != batch {
            candle_core::bail!(
                "KvCache holds {} rows but the input has batch size {batch}",
                self.key_mask.len()
            )
        }
        let positions = crate::nn::mask::position_ids(new_mask, batch, t, &self.seen);
        for b in 0..batch {
            let row = &new_mask[b * t..(b + 1) * t];
            self.key_mask[b].extend_from_slice(row);
            self.seen[b] += row.iter().sum::<u32>();
        }
        self.len += t;
        let full = self.key_mask.iter().flatten().copied().collect();
        Ok((positions, full))
    }

    /// Appends new keys/values `[B, kv_heads, t, head_dim]` for `layer` and returns the full
    /// cached keys/values `[B, kv_heads, S, head_dim]`.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let slot = &mut self.layers[layer];
        // Detached: the cache must not keep the autograd graph of earlier steps alive.
        let (k, v) = (k.detach(), v.detach());
        let (k, v) = match slot.take() {
            None => (k, v),
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
        };
        *slot = Some((k.clone(), v.clone()));
        Ok((k, v))
    }
}

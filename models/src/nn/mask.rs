//! Attention masking and position ids: the causal / key-padding / sliding-window / packed
//! segment visibility rule (as a host key mask, segment ids and window, and as a mask tensor
//! built on demand), HF-generate-style position ids (`cumsum(mask) - 1`, clamped at 0) and
//! per-segment position ids for packed rows. Pure index bookkeeping on the host; no model
//! weights.

use std::cell::OnceCell;

use candle_core::{DType, Device, Result, Tensor};

/// Score given to a hidden key (it replaces the score, it is not added): large and finite
/// (not `-inf`), so a query row whose keys are all hidden (a left-pad position) gives a uniform
/// softmax instead of NaN.
pub const MASKED_SCORE: f32 = -1e9;

/// Position ids `[B, T]` (row-major) for new tokens with key mask `mask` (`[B, T]`, 1 = real,
/// 0 = pad), continuing from `seen[b]` real tokens already in the cache:
/// `max(seen[b] + cumsum(mask[b])[t] - 1, 0)`. Pad positions get the (clamped) id of the
/// previous real token; they are never attended to.
pub(crate) fn position_ids(mask: &[u32], batch: usize, seq: usize, seen: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(batch * seq);
    for b in 0..batch {
        let mut count = seen[b] as i64;
        for t in 0..seq {
            count += mask[b * seq + t] as i64;
            out.push((count - 1).max(0) as u32);
        }
    }
    out
}

/// Position ids `[B, T]` of packed rows: `segments` (row-major `[B, T]`) holds a segment id
/// per token and positions count `0, 1, ...` from the start of each segment (a maximal run of
/// equal ids), so every packed sequence sees the positions it would have alone.
pub(crate) fn segment_position_ids(segments: &[u32], seq: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(segments.len());
    for row in segments.chunks(seq.max(1)) {
        let mut p = 0u32;
        for (t, &id) in row.iter().enumerate() {
            p = if t > 0 && id == row[t - 1] { p + 1 } else { 0 };
            out.push(p);
        }
    }
    out
}

/// Visibility mask `[B, 1, T, S]` u8 (or `[1, 1, T, S]` without a key mask; 1 = visible) for
/// `t` new queries at absolute indices `offset..offset + t` over `s` keys (`s = offset + t`).
///
/// Key `j` is visible to query `i` iff `j <= i`, `key_mask[b][j] == 1` (when given, row-major
/// `[B, S]`) and, with a `window`, `i - j < window`. Returns `None` when nothing is hidden.
pub fn attention_visibility(
    key_mask: Option<&[u32]>,
    batch: usize,
    t: usize,
    s: usize,
    offset: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    segmented_visibility((key_mask, None), (batch, t, s, offset), window, device)
}

/// [`attention_visibility`] with packed segments: `segments` (row-major `[B, S]` ids, self
/// attention only) also hides key `j` from query `i` when they lie in different runs of
/// equal ids.
fn segmented_visibility(
    (key_mask, segments): (Option<&[u32]>, Option<&[u32]>),
    (batch, t, s, offset): (usize, usize, usize, usize),
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let rows = if key_mask.is_some() || segments.is_some() {
        batch
    } else {
        1
    };
    // Segment start of each key position (`0` without segments).
    let starts: Option<Vec<usize>> = segments.map(|seg| {
        let mut out = Vec::with_capacity(seg.len());
        for row in seg.chunks(s.max(1)) {
            let mut lo = 0;
            for (j, &id) in row.iter().enumerate() {
                if j > 0 && id != row[j - 1] {
                    lo = j;
                }
                out.push(lo);
            }
        }
        out
    });
    let mut visible = vec![1u8; rows * t * s];
    let mut any_hidden = false;
    for b in 0..rows {
        for q in 0..t {
            let i = offset + q;
            for j in 0..s {
                let causal_ok = j <= i;
                let window_ok = window.is_none_or(|w| i - j.min(i) < w);
                let pad_ok = key_mask.is_none_or(|m| m[b * s + j] != 0);
                let seg_ok = starts
                    .as_ref()
                    .is_none_or(|st| j >= st[b * s + i.min(s - 1)]);
                if !(causal_ok && window_ok && pad_ok && seg_ok) {
                    visible[(b * t + q) * s + j] = 0;
                    any_hidden = true;
                }
            }
        }
    }
    if !any_hidden {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(visible, (rows, 1, t, s), device)?))
}

/// The visibility rule of one attention call (see [`attention_visibility`]) in the two forms
/// attention uses: the host key mask and window (the fused kernel takes these) and the
/// `[B|1, 1, T, S]` mask tensor (the composed path), built on first use and then shared by
/// every layer that gets this value.
#[derive(Debug)]
pub struct Visibility<'a> {
    key_mask: Option<&'a [u32]>,
    segments: Option<&'a [u32]>,
    batch: usize,
    t: usize,
    s: usize,
    offset: usize,
    window: Option<usize>,
    device: Device,
    mask: OnceCell<Option<Tensor>>,
}

impl<'a> Visibility<'a> {
    /// `t` new queries at absolute indices `offset..offset + t` over `s = offset + t` keys;
    /// `key_mask` row-major `[batch, s]` (1 = real, `None` = no padding); optional `window`.
    pub fn new(
        key_mask: Option<&'a [u32]>,
        (batch, t, s, offset): (usize, usize, usize, usize),
        window: Option<usize>,
        device: &Device,
    ) -> Visibility<'a> {
        Visibility {
            key_mask,
            segments: None,
            batch,
            t,
            s,
            offset,
            window,
            device: device.clone(),
            mask: OnceCell::new(),
        }
    }

    /// The same rule over packed rows: `segments` row-major `[batch, s]` segment ids; a query
    /// sees only the keys of its own run of equal ids. Self-attention only (no cache).
    pub fn with_segments(mut self, segments: Option<&'a [u32]>) -> Visibility<'a> {
        self.segments = segments;
        self.mask = OnceCell::new();
        self
    }

    /// The mask tensor `[B|1, 1, T, S]` (u8, 1 = visible), or `None` when nothing is hidden.
    pub fn mask(&self) -> Result<Option<&Tensor>> {
        if self.mask.get().is_none() {
            let m = segmented_visibility(
                (self.key_mask, self.segments),
                (self.batch, self.t, self.s, self.offset),
                self.window,
                &self.device,
            )?;
            // Cannot be set already: this value is not shared across threads (OnceCell).
            let _ = self.mask.set(m);
        }
        Ok(self.mask.get().and_then(Option::as_ref))
    }

    /// Key mask `[B, S]` row-major (1 = real), `None` when no key is padding.
    pub fn key_mask(&self) -> Option<&'a [u32]> {
        self.key_mask
    }

    /// Segment ids `[B, S]` row-major of packed rows, `None` for one sequence per row.
    pub fn segments(&self) -> Option<&'a [u32]> {
        self.segments
    }

    /// Sliding window in tokens (`None` = full causal attention).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Whether queries and keys are the same positions (no cached keys before the queries).
    pub fn is_self_attention(&self) -> bool {
        self.offset == 0 && self.s == self.t
    }
}

/// Applies a visibility mask `[B|1, 1, T, S]` (u8, 1 = visible) to attention scores
/// `[B, heads, T, S]`: hidden entries are replaced by [`MASKED_SCORE`]. Differentiable w.r.t.
/// the visible scores.
pub(crate) fn mask_scores(scores: &Tensor, visible: &Tensor) -> Result<Tensor> {
    let shape = scores.shape();
    let visible = visible.broadcast_as(shape)?;
    let hidden = Tensor::new(MASKED_SCORE, scores.device())?
        .to_dtype(scores.dtype())?
        .broadcast_as(shape)?;
    visible.where_cond(scores, &hidden)
}

/// Reads an attention mask tensor `[B, T]` (any integer or float dtype, 1 = real, 0 = pad)
/// into a row-major `Vec<u32>` of 0/1, checking its shape.
pub(crate) fn mask_to_host(mask: &Tensor, batch: usize, seq: usize) -> Result<Vec<u32>> {
    let dims = mask.dims();
    if dims != [batch, seq] {
        candle_core::bail!(
            "attention_mask has shape {dims:?}, expected [{batch}, {seq}] like input_ids"
        )
    }
    let v = mask.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(v.into_iter().map(|x| u32::from(x != 0.0)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_positions_restart_at_each_run() {
        let seg = [0, 0, 0, 5, 5, 1, 1, 1, 1, 1];
        let got = segment_position_ids(&seg, 5);
        assert_eq!(got, vec![0, 1, 2, 0, 1, 0, 1, 2, 3, 4]);
    }

    /// The composed path's mask over packed rows: causal, window and same-run rules per pair.
    #[test]
    fn segmented_mask_hides_other_segments() -> Result<()> {
        let (b, t) = (2, 7);
        let seg = [0u32, 0, 0, 1, 1, 9, 9, 3, 3, 3, 3, 3, 3, 3];
        let run = |r: usize, k: usize| {
            (1..=k)
                .filter(|&x| seg[r * t + x] != seg[r * t + x - 1])
                .count()
        };
        for window in [None, Some(2)] {
            let vis =
                Visibility::new(None, (b, t, t, 0), window, &Device::Cpu).with_segments(Some(&seg));
            let mask = vis.mask()?.expect("something is hidden");
            assert_eq!(mask.dims(), [b, 1, t, t]);
            let m = mask.flatten_all()?.to_vec1::<u8>()?;
            for r in 0..b {
                for i in 0..t {
                    for j in 0..t {
                        let want =
                            j <= i && window.is_none_or(|w| i - j < w) && run(r, i) == run(r, j);
                        assert_eq!(m[(r * t + i) * t + j] == 1, want, "row {r} i {i} j {j}");
                    }
                }
            }
        }
        Ok(())
    }
}

//! Prompt + response token sequences packed into right-padded tensors for the trainer.
//!
//! Positions of real tokens are `0..len` (the padding mask keeps them so), exactly as the
//! generation engine saw them, which is what makes trainer and engine log-probs agree.

use crate::{Result, RlhfError};
use candle_core::{Device, Tensor};
use oxalign_models::moe::routing::ExpertChoices;

/// A batch of `prompt ++ response` sequences.
#[derive(Debug, Clone)]
pub struct TokenBatch {
    /// `[B, T]` u32 token ids, right-padded with the pad id.
    pub ids: Tensor,
    /// `[B, T]` u32, 1 for real tokens, 0 for padding.
    pub attention_mask: Tensor,
    /// `[B, T-1]` f32, 1 where the *target* `ids[b, t+1]` is a response token (the tokens the
    /// policy chose); aligned with next-token log-probs.
    pub response_mask: Tensor,
    /// Response length of each row.
    pub response_lens: Vec<usize>,
    /// Index (in `[0, T-1)`) of each row's last response target, if it has one.
    pub last_response_pos: Vec<Option<usize>>,
    /// Rollout routing replay: per row, the experts the rollout engine routed each token
    /// of `prompt ++ response` to (positions from 0). When set, the policy's forward sends
    /// every token to these experts instead of its own top-k. None: the routers choose.
    pub routing: Option<Vec<ExpertChoices>>,
}

impl TokenBatch {
    /// Packs `(prompt, response)` pairs. Every prompt must be non-empty.
    pub fn new(pairs: &[(&[u32], &[u32])], pad_id: u32, device: &Device) -> Result<Self> {
        if pairs.is_empty() {
            return Err(RlhfError::invalid(
                "pairs",
                0,
                "a batch needs at least one sequence",
            ));
        }
        let t = pairs
            .iter()
            .map(|(p, r)| p.len() + r.len())
            .max()
            .unwrap_or(0)
            .max(2);
        let b = pairs.len();
        let mut ids = vec![pad_id; b * t];
        let mut mask = vec![0u32; b * t];
        let mut resp = vec![0f32; b * (t - 1)];
        let mut last = Vec::with_capacity(b);
        for (row, (p, r)) in pairs.iter().enumerate() {
            if p.is_empty() {
                return Err(RlhfError::invalid(
                    "prompt",
                    row,
                    "every prompt needs at least one token",
                ));
            }
            let n = p.len() + r.len();
            for (j, &tok) in p.iter().chain(r.iter()).enumerate() {
                ids[row * t + j] = tok;
                mask[row * t + j] = 1;
            }
            // Target position j predicts token j+1; response tokens sit at p.len()..n.
            for j in p.len() - 1..n - 1 {
                resp[row * (t - 1) + j] = 1.0;
            }
            last.push(if r.is_empty() { None } else { Some(n - 2) });
        }
        Ok(Self {
            ids: Tensor::from_vec(ids, (b, t), device)?,
            attention_mask: Tensor::from_vec(mask, (b, t), device)?,
            response_mask: Tensor::from_vec(resp, (b, t - 1), device)?,
            response_lens: pairs.iter().map(|(_, r)| r.len()).collect(),
            last_response_pos: last,
            routing: None,
        })
    }

    /// This batch with the rollout's expert choices of every row (see [`Self::routing`]).
    /// Errors unless there is one record per row, none longer than its row.
    pub fn with_routing(mut self, routing: Vec<ExpertChoices>) -> Result<Self> {
        if routing.len() != self.rows() {
            return Err(RlhfError::invalid(
                "routing",
                format!("{} records", routing.len()),
                format!("one expert-choice record per row ({} rows)", self.rows()),
            ));
        }
        let lens = self.attention_mask.sum(1)?.to_vec1::<u32>()?;
        for (row, (r, &len)) in routing.iter().zip(&lens).enumerate() {
            if r.num_tokens() > len as usize {
                return Err(RlhfError::invalid(
                    "routing",
                    format!("row {row}"),
                    format!(
                        "at most {len} routed positions (the row's tokens), got {}",
                        r.num_tokens()
                    ),
                ));
            }
        }
        self.routing = Some(routing);
        Ok(self)
    }

    /// This batch with the tokens an environment wrote into each row's response (multi-turn
    /// episodes: tool results, the next user turn) taken out of the response mask, so no loss,
    /// advantage or KL reads them. `spans[row]` holds ranges of response positions (`0` is
    /// the first response token). Afterwards `response_lens` counts each row's model tokens
    /// and `last_response_pos` is its last model token. Errors unless there is one list per
    /// row and every range lies inside its row's response.
    pub fn without_observations(mut self, spans: &[Vec<std::ops::Range<usize>>]) -> Result<Self> {
        if spans.len() != self.rows() {
            return Err(RlhfError::invalid(
                "observations",
                format!("{} rows", spans.len()),
                format!("one list of spans per row ({} rows)", self.rows()),
            ));
        }
        let (b, t1) = self.response_mask.dims2()?;
        let mut mask = self.response_mask.flatten_all()?.to_vec1::<f32>()?;
        for (row, row_spans) in spans.iter().enumerate() {
            let len = self.response_lens[row];
            let Some(last) = self.last_response_pos[row] else {
                if let Some(s) = row_spans.iter().find(|s| !s.is_empty()) {
                    return Err(span_error(row, s, 0));
                }
                continue;
            };
            let first = last + 1 - len;
            for s in row_spans {
                if s.start > s.end || s.end > len {
                    return Err(span_error(row, s, len));
                }
                mask[row * t1 + first + s.start..row * t1 + first + s.end].fill(0.0);
            }
            let kept = &mask[row * t1 + first..=row * t1 + last];
            self.response_lens[row] = kept.iter().filter(|&&m| m > 0.0).count();
            self.last_response_pos[row] = kept.iter().rposition(|&m| m > 0.0).map(|j| first + j);
        }
        self.response_mask = Tensor::from_vec(mask, (b, t1), self.response_mask.device())?;
        Ok(self)
    }

    /// The rows `rows` (in that order) as a new batch with the same `T`.
    pub fn select_rows(&self, rows: &[usize]) -> Result<Self> {
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), self.ids.device())?;
        Ok(Self {
            ids: self.ids.index_select(&idx, 0)?,
            attention_mask: self.attention_mask.index_select(&idx, 0)?,
            response_mask: self.response_mask.index_select(&idx, 0)?,
            response_lens: rows.iter().map(|&r| self.response_lens[r]).collect(),
            last_response_pos: rows.iter().map(|&r| self.last_response_pos[r]).collect(),
            routing: self
                .routing
                .as_ref()
                .map(|all| rows.iter().map(|&r| all[r].clone()).collect()),
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.response_lens.len()
    }

    /// Total response tokens.
    pub fn response_tokens(&self) -> usize {
        self.response_lens.iter().sum()
    }
}

fn span_error(row: usize, span: &std::ops::Range<usize>, len: usize) -> RlhfError {
    RlhfError::invalid(
        "observations",
        format!("row {row}: {span:?}"),
        format!("a range of response positions within 0..{len}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_line_up_with_next_token_targets() {
        let b = TokenBatch::new(&[(&[1, 2, 3], &[4, 5]), (&[7], &[8])], 0, &Device::Cpu).unwrap();
        assert_eq!(
            b.ids.to_vec2::<u32>().unwrap(),
            vec![vec![1, 2, 3, 4, 5], vec![7, 8, 0, 0, 0]]
        );
        assert_eq!(
            b.attention_mask.to_vec2::<u32>().unwrap(),
            vec![vec![1, 1, 1, 1, 1], vec![1, 1, 0, 0, 0]]
        );
        assert_eq!(
            b.response_mask.to_vec2::<f32>().unwrap(),
            vec![vec![0., 0., 1., 1.], vec![1., 0., 0., 0.]]
        );
        assert_eq!(b.last_response_pos, vec![Some(3), Some(0)]);
        assert_eq!(b.response_tokens(), 3);
    }

    #[test]
    fn observations_leave_the_response_mask_and_the_counts() {
        // Row 0: prompt [1, 2], response [3, 4, 5, 6, 7] where 5, 6 came from the environment.
        let pairs: [(&[u32], &[u32]); 2] = [(&[1, 2], &[3, 4, 5, 6, 7]), (&[8], &[9, 10])];
        let b = TokenBatch::new(&pairs, 0, &Device::Cpu).unwrap();
        let b = b
            .without_observations(&[
                std::iter::once(2..4).collect(),
                std::iter::once(1..2).collect(),
            ])
            .unwrap();
        assert_eq!(
            b.response_mask.to_vec2::<f32>().unwrap(),
            vec![vec![0., 1., 1., 0., 0., 1.], vec![1., 0., 0., 0., 0., 0.]]
        );
        assert_eq!(b.response_lens, vec![3, 1]);
        assert_eq!(b.last_response_pos, vec![Some(5), Some(0)]);
        let bad = TokenBatch::new(&pairs, 0, &Device::Cpu).unwrap();
        let err = bad
            .without_observations(&[std::iter::once(4..6).collect(), vec![]])
            .unwrap_err();
        assert!(err.to_string().contains("0..5"), "{err}");
    }
}

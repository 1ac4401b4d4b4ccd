//! What one forward's routers did: the experts each token was sent to and, on the training
//! path, the router logits (still in the autograd graph, for the load-balancing loss). A
//! trace can also be built from recorded choices to *replay* them: the forward then sends
//! every token to the recorded experts instead of its own top-k (rollout routing replay),
//! while the routing weights are still the forward's own softmax, so the router learns.
//! Dense models leave a trace empty. The routing math is `router.rs`.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// A replayed token whose `top_k` entries are all `FREE` is routed by its own router (a
/// position the record does not cover: padding, or the last sampled token).
pub const FREE: u32 = u32::MAX;

/// The experts chosen by every sparse layer of one forward: `layers[l]` holds
/// `tokens * top_k` expert ids, token-major (the `top_k` choices of token 0, then token 1, ...)
/// over the forward's tokens in row-major `[B, T]` order; `l` counts sparse layers only, in
/// layer order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertChoices {
    /// Experts per token.
    pub top_k: usize,
    /// Per sparse layer, `tokens * top_k` expert ids.
    pub layers: Vec<Vec<u32>>,
}

impl ExpertChoices {
    /// Number of tokens the choices cover (0 when empty).
    pub fn num_tokens(&self) -> usize {
        match (self.layers.first(), self.top_k) {
            (Some(l), k) if k > 0 => l.len() / k,
            _ => 0,
        }
    }

    /// The replay for a `[B, T]` batch of left-padded rows: row `b` holds the record
    /// `rows[b].0` (positions from 0) after `rows[b].1` padding tokens; padding and positions
    /// past a record are [`FREE`]. Every record needs the same `top_k` and layer count (an
    /// empty record, from a dense model, is all `FREE`).
    pub fn for_batch(rows: &[(&ExpertChoices, usize)], t: usize) -> ExpertChoices {
        let top_k = rows.iter().map(|(r, _)| r.top_k).max().unwrap_or(0);
        let layers = rows.iter().map(|(r, _)| r.layers.len()).max().unwrap_or(0);
        let mut out = vec![Vec::with_capacity(rows.len() * t * top_k); layers];
        for (record, pad) in rows {
            let n = record.num_tokens();
            for (l, layer) in out.iter_mut().enumerate() {
                for pos in 0..t {
                    let at = pos.checked_sub(*pad).filter(|&p| p < n);
                    match (at, record.layers.get(l)) {
                        (Some(p), Some(r)) => {
                            layer.extend_from_slice(&r[p * top_k..(p + 1) * top_k])
                        }
                        _ => layer.extend(std::iter::repeat_n(FREE, top_k)),
                    }
                }
            }
        }
        ExpertChoices { top_k, layers: out }
    }

    /// The replay for packed rows `[B, T]`: row `b` holds the sequences `rows[b]` back to
    /// back, each `(record, length)` taking `length` positions from 0, then padding to `T`.
    /// Positions past a record and the padding are [`FREE`].
    pub fn for_packed(rows: &[Vec<(&ExpertChoices, usize)>], t: usize) -> ExpertChoices {
        let records = || rows.iter().flatten().map(|(r, _)| *r);
        let top_k = records().map(|r| r.top_k).max().unwrap_or(0);
        let layers = records().map(|r| r.layers.len()).max().unwrap_or(0);
        let mut out = vec![Vec::with_capacity(rows.len() * t * top_k); layers];
        for row in rows {
            let used: usize = row.iter().map(|(_, len)| len).sum();
            for (l, layer) in out.iter_mut().enumerate() {
                for (record, len) in row {
                    let n = record.num_tokens();
                    for pos in 0..*len {
                        match record.layers.get(l).filter(|_| pos < n) {
                            Some(r) => layer.extend_from_slice(&r[pos * top_k..(pos + 1) * top_k]),
                            None => layer.extend(std::iter::repeat_n(FREE, top_k)),
                        }
                    }
                }
                layer.extend(std::iter::repeat_n(FREE, t.saturating_sub(used) * top_k));
            }
        }
        ExpertChoices { top_k, layers: out }
    }

    /// The choices of one token of every layer: `[layers][top_k]`.
    pub fn token(&self, token: usize) -> Vec<&[u32]> {
        let k = self.top_k;
        self.layers
            .iter()
            .map(|l| &l[token * k..(token + 1) * k])
            .collect()
    }

    /// Fraction of (token, layer) pairs whose expert *sets* differ between `self` and
    /// `other` (same shape required; `None` otherwise or when empty).
    pub fn disagreement(&self, other: &ExpertChoices) -> Option<f64> {
        let same_shape = self.top_k == other.top_k
            && self.layers.len() == other.layers.len()
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|(a, b)| a.len() == b.len());
        if !same_shape || self.num_tokens() == 0 {
            return None;
        }
        let k = self.top_k;
        let (mut differ, mut total) = (0usize, 0usize);
        for (a, b) in self.layers.iter().zip(&other.layers) {
            for (x, y) in a.chunks(k).zip(b.chunks(k)) {
                if x.contains(&FREE) || y.contains(&FREE) {
                    continue;
                }
                let (mut x, mut y) = (x.to_vec(), y.to_vec());
                x.sort_unstable();
                y.sort_unstable();
                differ += usize::from(x != y);
                total += 1;
            }
        }
        Some(differ as f64 / total as f64)
    }
}

/// The routing record of one forward, filled layer by layer as the forward runs.
#[derive(Clone, Debug, Default)]
pub struct RouterTrace {
    replay: Option<ExpertChoices>,
    /// Router logits `[tokens, E]` of each sparse layer, in layer order (differentiable on
    /// the training path).
    pub logits: Vec<Tensor>,
    /// The experts each sparse layer used (the replayed ones when replaying).
    pub chosen: ExpertChoices,
    /// When replaying, over all sparse layers: the (token, layer) pairs whose replayed
    /// expert set differs from the router's own top-k, and the pairs replayed. The fraction
    /// is how often the trainer would have routed differently from the rollout.
    pub overridden: (usize, usize),
}

impl RouterTrace {
    /// A trace that lets every router choose its own top-k.
    pub fn new() -> RouterTrace {
        RouterTrace::default()
    }

    /// A trace that makes sparse layer `l` send token `n` to `choices.layers[l][n*k..(n+1)*k]`.
    pub fn replaying(choices: ExpertChoices) -> RouterTrace {
        RouterTrace {
            replay: Some(choices),
            ..RouterTrace::default()
        }
    }

    /// The recorded choices for the next sparse layer, when replaying.
    pub(crate) fn next_replay(&self) -> Option<&[u32]> {
        let l = self.chosen.layers.len();
        self.replay
            .as_ref()
            .map(|r| r.layers.get(l).map_or(&[][..], |v| v.as_slice()))
    }

    /// A trace for the next sparse layer alone: replaying that layer's recorded choices
    /// when this trace replays, else letting its router choose (used to run one layer
    /// apart from the rest of the forward, `streamed_layer.rs`).
    pub(crate) fn next_layer_alone(&self) -> RouterTrace {
        match (&self.replay, self.next_replay()) {
            (Some(r), Some(choices)) => RouterTrace::replaying(ExpertChoices {
                top_k: r.top_k,
                layers: vec![choices.to_vec()],
            }),
            _ => RouterTrace::new(),
        }
    }

    /// True when the choices come from a record.
    pub fn is_replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// Records one sparse layer's logits and choices, and how many of its replayed tokens
    /// the record overrode (see [`RouterTrace::overridden`]).
    pub(crate) fn push(
        &mut self,
        logits: Tensor,
        chosen: Vec<u32>,
        top_k: usize,
        overridden: (usize, usize),
    ) {
        self.overridden.0 += overridden.0;
        self.overridden.1 += overridden.1;
        self.logits.push(logits);
        self.chosen.top_k = top_k;
        self.chosen.layers.push(chosen);
    }
}

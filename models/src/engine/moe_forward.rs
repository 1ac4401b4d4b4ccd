//! The engine's sparse MoE block on host buffers: router logits (f32, never quantized),
//! softmax, top-k per token (`router::choose`, the trainer's rule) or the replayed choices,
//! then every expert once over the rows sent to it (fused gate/up, SwiGLU, down, in the
//! engine's precision), scaled by the routing weights and summed per token; plus the gated
//! shared expert. It records each token's choices when asked (rollout routing replay). The
//! trainer's version is `moe/block.rs`.
//!
//! Expert-parallel engines (`ep`): each rank holds only its experts (`moe/expert_parallel.rs`)
//! and runs its own tokens; the routed rows travel to the experts' owners and back
//! (`moe_dispatch.rs`). Router and shared expert run on each rank for its own tokens.

use super::moe_dispatch::dispatch_experts;
use crate::engine::expert::ExpertWeights;
use crate::engine::linear::Linear;
use crate::moe::expert_parallel::ExpertParallel;
use crate::moe::router::choose;
use candle_core::Result;

/// The weights of one sparse block.
#[derive(Clone, Debug)]
pub(crate) struct MoeWeights {
    /// Router `[E, H]` (f32).
    pub router: Linear,
    /// Expert `e`, or `None` when another expert-parallel rank holds it.
    pub experts: Vec<Option<ExpertWeights>>,
    /// The shared expert and its gate `[1, H]` (f32).
    pub shared: Option<(ExpertWeights, Linear)>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    /// Model width H.
    pub hidden: usize,
    /// The engine's expert-parallel group, when its experts are spread over one.
    pub ep: Option<ExpertParallel>,
}

impl MoeWeights {
    /// `h` `[n, H]` -> `[n, H]`. With `replay`, token `t` goes to `replay[t*k..(t+1)*k]`;
    /// the choices used are appended to `record` when given.
    pub(crate) fn forward(
        &self,
        h: &[f32],
        n: usize,
        replay: Option<&[u32]>,
        record: Option<&mut Vec<u32>>,
    ) -> Result<Vec<f32>> {
        let (hidden, k) = (self.hidden, self.top_k);
        let (chosen, weights) = match n {
            0 => (Vec::new(), Vec::new()),
            _ => {
                let logits = self.router.forward_host(h, n)?;
                let e = logits.len() / n;
                let probs: Vec<Vec<f32>> = logits.chunks(e).map(softmax).collect();
                let chosen = choose(&probs, e, k, replay)?;
                let weights = self.routing_weights(&probs, &chosen);
                (chosen, weights)
            }
        };
        let mut out = match &self.ep {
            Some(ep) => dispatch_experts(ep, &self.experts, h, (n, hidden, k), &chosen, &weights)?,
            None => self.local_experts(h, n, &chosen, &weights)?,
        };
        if let Some((expert, gate)) = self.shared.as_ref().filter(|_| n > 0) {
            let g = gate.forward_host(h, n)?;
            let y = expert.forward(h, n)?;
            for ((o, row), &g) in out.chunks_mut(hidden).zip(y.chunks(hidden)).zip(&g) {
                let s = 1.0 / (1.0 + (-g).exp());
                for (o, &v) in o.iter_mut().zip(row) {
                    *o += v * s;
                }
            }
        }
        if let Some(rec) = record {
            rec.extend_from_slice(&chosen);
        }
        Ok(out)
    }

    /// Every expert once over the rows sent to it, on this device, summed per token with
    /// the routing weights (expert by expert, ascending).
    fn local_experts(
        &self,
        h: &[f32],
        n: usize,
        chosen: &[u32],
        weights: &[f32],
    ) -> Result<Vec<f32>> {
        let (hidden, k) = (self.hidden, self.top_k);
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); self.experts.len()];
        for (s, &c) in chosen.iter().enumerate() {
            by_expert[c as usize].push(s);
        }
        let mut out = vec![0f32; n * hidden];
        for (expert, slots) in self.experts.iter().zip(&by_expert) {
            let Some(expert) = expert.as_ref().filter(|_| !slots.is_empty()) else {
                continue;
            };
            let mut x = Vec::with_capacity(slots.len() * hidden);
            for &s in slots {
                let t = s / k;
                x.extend_from_slice(&h[t * hidden..(t + 1) * hidden]);
            }
            let y = expert.forward(&x, slots.len())?;
            for (row, &s) in y.chunks(hidden).zip(slots) {
                let t = s / k;
                let w = weights[s];
                for (o, &v) in out[t * hidden..(t + 1) * hidden].iter_mut().zip(row) {
                    *o += v * w;
                }
            }
        }
        Ok(out)
    }

    /// The weight of each choice: its softmax probability, renormalised over the token's k
    /// choices when `norm_topk_prob`.
    fn routing_weights(&self, probs: &[Vec<f32>], chosen: &[u32]) -> Vec<f32> {
        let k = self.top_k;
        let mut out = Vec::with_capacity(chosen.len());
        for (p, picks) in probs.iter().zip(chosen.chunks(k)) {
            let w: Vec<f32> = picks.iter().map(|&c| p[c as usize]).collect();
            let sum: f32 = w.iter().sum();
            out.extend(
                w.iter()
                    .map(|&x| if self.norm_topk_prob { x / sum } else { x }),
            );
        }
        out
    }

    /// Bytes of all expert, router and shared-expert weights.
    pub(crate) fn bytes(&self) -> usize {
        let shared = self
            .shared
            .as_ref()
            .map_or(0, |(x, g)| x.gate_up.bytes() + x.down.bytes() + g.bytes());
        self.router.bytes()
            + shared
            + self
                .experts
                .iter()
                .flatten()
                .map(|x| x.gate_up.bytes() + x.down.bytes())
                .sum::<usize>()
    }
}

/// `exp(x - max) / Σ exp(x - max)` of one row (the trainer's composed softmax).
fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = row.iter().map(|&x| (x - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.iter().map(|&x| x / sum).collect()
}

//! The sparse mixture-of-experts block of the training forward (and the KV-cached inference
//! forward): route each token (`router.rs`), run every expert once over the tokens sent to it,
//! scale each output by its routing weight and sum them back per token; plus, for Qwen2-MoE,
//! the shared expert scaled by `sigmoid(shared_expert_gate(x))`. Differentiable in every
//! weight, router included. The engine's host version is `engine/moe_forward.rs`. With
//! expert parallelism a block holds only its rank's experts and exchanges token rows with
//! the other ranks (`parallel.rs`).

use crate::config::layout::MoeParams;
use crate::config::model_config::ModelConfig;
use crate::io::param_store::ParamStore;
use crate::moe::expert_parallel::ExpertParallel;
use crate::moe::router::{route, Routed};
use crate::moe::routing::RouterTrace;
use crate::nn::f32_linear::f32_linear;
use crate::nn::mlp::Mlp;
use crate::nn::precision::Precision;
use candle_core::{Result, Tensor};

/// The always-on expert and its scalar gate `[1, H]`.
#[derive(Clone, Debug)]
pub(crate) struct SharedExpert {
    pub(crate) mlp: Mlp,
    pub(crate) gate: Tensor,
}

/// Weights of one sparse block (the tensors of a [`MoeParams`]).
#[derive(Clone, Debug)]
pub(crate) struct SparseMoe {
    pub(crate) router: Tensor,
    /// Expert `e`'s MLP, or `None` when another expert-parallel rank holds it.
    pub(crate) experts: Vec<Option<Mlp>>,
    pub(crate) shared: Option<SharedExpert>,
    pub(crate) top_k: usize,
    pub(crate) norm_topk_prob: bool,
    /// The expert-parallel group, when the experts are spread over one.
    pub(crate) ep: Option<ExpertParallel>,
    /// The numbers the block computes in (the router and the shared gate stay f32, with the
    /// engine's f32 kernel under fake int8).
    pub(crate) precision: Precision,
}

impl SparseMoe {
    /// Picks up the tensors `decl` names from `params`; `cfg.moe` gives top-k and the
    /// renormalisation rule. With `ep`, only the experts this rank owns are looked up.
    pub fn new(
        cfg: &ModelConfig,
        params: &ParamStore,
        decl: &MoeParams,
        ep: Option<&ExpertParallel>,
    ) -> Result<SparseMoe> {
        let Some(moe) = &cfg.moe else {
            candle_core::bail!("a sparse layer needs the config's MoE keys")
        };
        let shared = match &decl.shared {
            Some(s) => Some(SharedExpert {
                mlp: Mlp::new(params, &s.mlp, cfg.style.activation)?,
                gate: params.get(&s.gate.weight.name)?,
            }),
            None => None,
        };
        Ok(SparseMoe {
            router: params.get(&decl.router.weight.name)?,
            experts: decl
                .experts
                .iter()
                .enumerate()
                .map(|(i, e)| match ep.is_none_or(|p| p.owns(i)) {
                    true => Mlp::new(params, e, cfg.style.activation).map(Some),
                    false => Ok(None),
                })
                .collect::<Result<_>>()?,
            shared,
            top_k: moe.num_experts_per_tok,
            norm_topk_prob: moe.norm_topk_prob,
            ep: ep.cloned(),
            precision: Precision::F32,
        })
    }

    /// `x` `[B, T, H]` as rows `[B·T, H]`, and their routing (the choices `trace` replays,
    /// when it replays). Shared by the one-device and the expert-parallel forwards.
    pub(crate) fn route_rows(&self, x: &Tensor, trace: &RouterTrace) -> Result<(Tensor, Routed)> {
        let (b, t, h) = x.dims3()?;
        let flat = x.reshape((b * t, h))?;
        let replay = trace.next_replay();
        let rule = (self.top_k, self.norm_topk_prob);
        let routed = route(&flat, &self.router, rule, replay, self.precision)?;
        Ok((flat, routed))
    }

    /// `x`: `[B, T, H]` -> `[B, T, H]`. Appends this layer's router logits and choices to
    /// `trace` (and takes its choices from it when it replays).
    pub fn forward(&self, x: &Tensor, trace: &mut RouterTrace) -> Result<Tensor> {
        if let Some(ep) = &self.ep {
            return self.forward_parallel(ep, x, trace);
        }
        let (b, t, h) = x.dims3()?;
        let n = b * t;
        let (flat, routed) = self.route_rows(x, trace)?;
        let k = self.top_k;
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); self.experts.len()];
        let mut slots: Vec<Vec<u32>> = vec![Vec::new(); self.experts.len()];
        for (slot, &e) in routed.experts.iter().enumerate() {
            tokens[e as usize].push((slot / k) as u32);
            slots[e as usize].push(slot as u32);
        }
        let weights = routed.weights.flatten_all()?;
        let device = x.device();
        let mut outs = Vec::new();
        let mut rows = Vec::with_capacity(n * k);
        for (e, expert) in self.experts.iter().enumerate() {
            let Some(expert) = expert.as_ref().filter(|_| !tokens[e].is_empty()) else {
                continue;
            };
            let idx = Tensor::from_slice(&tokens[e], tokens[e].len(), device)?;
            let slot = Tensor::from_slice(&slots[e], slots[e].len(), device)?;
            let y = expert.forward(&flat.index_select(&idx, 0)?)?;
            let w = weights.index_select(&slot, 0)?.unsqueeze(1)?;
            outs.push(y.broadcast_mul(&w)?);
            rows.extend_from_slice(&tokens[e]);
        }
        let mut out = Tensor::zeros((n, h), x.dtype(), device)?;
        if !outs.is_empty() {
            let rows = Tensor::from_vec(rows, n * k, device)?;
            out = out.index_add(&rows, &Tensor::cat(&outs, 0)?, 0)?;
        }
        out = self.add_shared(&flat, out)?;
        trace.push(routed.logits, routed.experts, k, routed.overridden);
        out.reshape((b, t, h))
    }

    /// Makes the experts (this rank's) and the shared expert compute in `precision`; the
    /// router and the shared expert's gate stay f32, as in the engine (with the engine's f32
    /// kernel under fake int8).
    pub(crate) fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
        for e in self.experts.iter_mut().flatten() {
            e.set_precision(precision);
        }
        if let Some(s) = &mut self.shared {
            s.mlp.set_precision(precision);
        }
    }

    /// `out + sigmoid(shared_expert_gate(flat)) · shared_expert(flat)` when the block has a
    /// shared expert, else `out` (`flat`, `out`: `[N, H]`).
    pub(crate) fn add_shared(&self, flat: &Tensor, out: Tensor) -> Result<Tensor> {
        match &self.shared {
            Some(s) => {
                let gate = sigmoid(&f32_linear(flat, &s.gate, self.precision)?)?;
                out + s.mlp.forward(flat)?.broadcast_mul(&gate)?
            }
            None => Ok(out),
        }
    }
}

/// `1 / (1 + exp(-x))`, composed (differentiable).
fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

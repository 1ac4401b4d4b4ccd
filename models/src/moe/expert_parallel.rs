//! Expert parallelism: which rank of a group holds which routed expert, and the names of the
//! tensors that come with it. With `placement.expert_parallel = N` (N > 1) the policy's N CPU
//! devices each hold 1/N of the routed experts of every sparse layer. Rank `r` of `N` owns the
//! experts `{e : e mod N == r}` of every sparse layer (round-robin, so each rank holds `E / N`
//! experts of each layer and the ranks' expert tensors line up position by position for a
//! gather). Everything else (the embedding, attention, norms, routers, Qwen2-MoE's shared
//! expert, the head) stays on every rank.
//!
//! The parts:
//! * here: [`ExpertParallel`] (a rank's handle: an `Arc<dyn Collective>`, the ownership rule),
//!   [`ExpertNames`] (each routed expert's tensor names, from the declaration),
//!   [`gather_experts`] (all-gather of every rank's experts);
//! * `expert_exchange.rs`: the row exchange as a candle custom op: forward an all-to-all of row
//!   blocks (`Collective::all_to_all_f32`), backward the reverse all-to-all of their gradients;
//! * `parallel.rs`: `SparseMoe::forward_parallel`: each rank routes its own tokens
//!   (differentiable local routing weights), tells each owner which expert each of its rows is
//!   for (one all-to-all of expert ids, whose lengths are also the row counts), dispatches each
//!   (token, choice) row to the owner of its expert, the owner runs its experts over what
//!   arrives, combine sends the outputs back, and each rank sums them per token with its
//!   routing weights;
//! * `rlhf/src/trainer/spread_experts.rs` (`PolicyTrainer::spread_experts`: the model keeps its
//!   rank's experts, AdamW is rebuilt over what it keeps) and
//!   `rlhf/src/trainer/expert_parallel.rs` (the step: dense gradients all-reduced, an expert's
//!   gradient on its owner divided by N, so EP = N with each rank on its own rows equals the
//!   data-parallel mean; the clip norm is global; the weight check is collective);
//! * the engine's version: `engine/moe_forward.rs` and `engine/moe_dispatch.rs`.
//!
//! `Model::with_expert_parallel(ep)` builds a rank's model (a new `ParamStore` without the
//! other ranks' experts); `Model::full_weights` gathers the whole model; `Model::save` gathers
//! and rank 0 writes whole HF-layout weights. Every rank runs the same layer sequence, so the
//! exchanges line up: both exchanges run in every sparse layer, also on a rank with no rows to
//! send or receive (then the combine's input is the empty dispatch output, so backward still
//! reaches both on every rank). Each exchange sits on the chain from one layer to the next, so
//! candle's backward reaches them in the same order on every rank.
//!
//! **The engine** dispatches tokens (`engine/moe_dispatch.rs`). Each engine rank holds the same
//! experts as its trainer rank (`Engine::with_experts`) and the policy role gives each rank its
//! own contiguous share of the requests, as data-parallel engines get. In every sparse layer a
//! rank routes its own tokens, sends each (token, choice) row with its expert id to the
//! expert's owner (one `all_to_all_f32`), serves the rows that arrived for its own experts,
//! sends the outputs back (a second all-to-all), and sums each token's outputs with its routing
//! weights expert by expert in ascending order, the one-device order (so the result equals EP =
//! 1's bit for bit). Router, attention, shared expert and sampling run on each rank for its own
//! tokens only. The ranks step together: each engine step starts with one all-reduce of "this
//! rank is done", and a rank that is done (or had no requests) keeps serving its experts with
//! empty steps (`EngineWeights::serve_experts_idle`) until every rank is. Scoring (the refit
//! probe) runs the same sequences on every rank. The engines have their own collective group,
//! apart from the trainers', so a generation ahead never interleaves with a training step's
//! exchanges (`actors/src/controller/expert_setup.rs`). A refit gives engine rank r trainer
//! rank r's weights (its experts only), verified by the same checksums and log-prob probe (both
//! sides run their group's collectives).
//!
//! **In the roles.** A trainer rank with no rows to score still runs one stand-in row; saving
//! runs on every rank (gather; rank 0 writes the weights) and each rank writes its AdamW state
//! to `optimizer/expert_rank_<r>/`, which resume reads back on the same rank
//! (`actors/src/controller/run/resume_point.rs`). The recipe check
//! (`actors/src/recipe/expert_parallel_check.rs`) refuses N = 0, a dense fresh policy, an
//! expert count N does not divide, a policy group that is not N CPU devices, FSDP sharding, a
//! quantized engine, DPO and reward-model runs, and minibatches that would leave a rank without
//! rows (exit 2), and `actors/src/recipe/engine_placement_check.rs` a separate engine role; a
//! `model.path` policy that cannot be spread is refused when the policy is built (bad input,
//! exit 2).
//!
//! **Tests.** `models/tests/expert_parallel.rs` (EP = 2 against EP = 1: log-probs, the gradient
//! of every parameter, the engine's greedy tokens and scores, a verified refit, half the expert
//! bytes per rank, gather and save), `rlhf/tests/expert_parallel.rs` (three AdamW steps),
//! `tests/train_algorithms.rs`
//! (`a_moe_policy_with_experts_over_two_devices_trains_like_data_parallel`:
//! `configs/moe-grpo-ep2.toml` against the same seed data-parallel over the same two devices),
//! `tests/train_resume.rs` (`an_expert_parallel_run_resumes_to_the_uninterrupted_run`).

use crate::config::layout::{FeedForwardParams, MlpParams};
use crate::config::model_config::ModelConfig;
use candle_core::Tensor;
use oxalign_kernels::collective::Collective;
use std::collections::HashMap;
use std::sync::Arc;

/// One rank's handle on an expert-parallel group.
#[derive(Clone)]
pub struct ExpertParallel {
    comm: Arc<dyn Collective>,
}

impl ExpertParallel {
    /// Rank `comm.rank()` of a group of `comm.world_size()`; every rank exchanges token rows
    /// over `comm` in each sparse layer.
    pub fn new(comm: Arc<dyn Collective>) -> Self {
        Self { comm }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks in the group.
    pub fn world(&self) -> usize {
        self.comm.world_size()
    }

    /// The collective the exchanges run over.
    pub fn comm(&self) -> &Arc<dyn Collective> {
        &self.comm
    }

    /// The rank that holds expert `e`: `e mod world`.
    pub fn owner(&self, e: usize) -> usize {
        e % self.world()
    }

    /// True when this rank holds expert `e`.
    pub fn owns(&self, e: usize) -> bool {
        self.owner(e) == self.rank()
    }

    /// True when this rank keeps parameter `name` (`experts`: the model's expert tensors):
    /// every parameter that is not a routed expert's, and the tensors of the experts it owns.
    pub fn keeps(&self, experts: &ExpertNames, name: &str) -> bool {
        experts.expert_of(name).is_none_or(|e| self.owns(e))
    }
}

impl std::fmt::Debug for ExpertParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertParallel")
            .field("rank", &self.rank())
            .field("world", &self.world())
            .finish()
    }
}

/// The routed experts' tensor names of a model, by layer and expert.
#[derive(Clone, Debug)]
pub struct ExpertNames {
    /// `[sparse layer][expert]` -> that expert's tensor names, in declaration order.
    by_layer: Vec<Vec<Vec<String>>>,
    owner: HashMap<String, usize>,
}

impl ExpertNames {
    /// The routed experts of `cfg`'s declaration (empty for a dense model).
    pub fn of(cfg: &ModelConfig) -> Self {
        let mut by_layer = Vec::new();
        let mut owner = HashMap::new();
        for layer in cfg.backbone_params().layers {
            let FeedForwardParams::Sparse(moe) = layer.ffn else {
                continue;
            };
            let experts: Vec<Vec<String>> = moe.experts.iter().map(mlp_names).collect();
            for (e, names) in experts.iter().enumerate() {
                for n in names {
                    owner.insert(n.clone(), e);
                }
            }
            by_layer.push(experts);
        }
        Self { by_layer, owner }
    }

    /// The expert whose tensor `name` is, or `None` for any other parameter.
    pub fn expert_of(&self, name: &str) -> Option<usize> {
        self.owner.get(name).copied()
    }

    /// Every routed expert's tensor names, grouped so that slot `p` holds, for each rank
    /// `r` of `world`, the name rank `r` holds at position `p` (expert `j · world + r` of a
    /// layer for its local expert `j`). Ranks gather their tensors slot by slot.
    pub fn slots(&self, world: usize) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for experts in &self.by_layer {
            // Block `j` holds experts `j·world .. (j+1)·world`: position `j` of each rank.
            for block in experts.chunks_exact(world.max(1)) {
                let parts = block.first().map_or(0, Vec::len);
                out.extend((0..parts).map(|p| block.iter().map(|n| n[p].clone()).collect()));
            }
        }
        out
    }

    /// True when the model has no routed experts.
    pub fn is_empty(&self) -> bool {
        self.by_layer.is_empty()
    }
}

/// The tensor names of one expert MLP: gate, up, down (weights, then biases if any).
fn mlp_names(m: &MlpParams) -> Vec<String> {
    let mut out = vec![
        m.gate.weight.name.clone(),
        m.up.weight.name.clone(),
        m.down.weight.name.clone(),
    ];
    for b in [&m.gate.bias, &m.up.bias, &m.down.bias]
        .into_iter()
        .flatten()
    {
        out.push(b.name.clone());
    }
    out
}

/// Every rank's routed-expert tensors, gathered: `local` holds this rank's (HF names);
/// returns all experts' tensors (same dtype and device). Every rank of `ep` must call it.
pub(crate) fn gather_experts(
    ep: &ExpertParallel,
    names: &ExpertNames,
    local: &HashMap<String, Tensor>,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let (rank, world) = (ep.rank(), ep.world());
    let slots = names.slots(world);
    let mine: Vec<Tensor> = slots
        .iter()
        .map(|s| {
            local.get(&s[rank]).cloned().ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "expert gather: rank {rank} does not hold {}",
                    s[rank]
                ))
            })
        })
        .collect::<candle_core::Result<_>>()?;
    let gathered = ep
        .comm()
        .all_gather(&mine)
        .map_err(candle_core::Error::wrap)?;
    let mut out = HashMap::new();
    for ((slot, flat), like) in slots.iter().zip(gathered).zip(&mine) {
        let n = like.elem_count();
        for (r, name) in slot.iter().enumerate() {
            let t = flat.narrow(0, r * n, n)?.reshape(like.dims())?;
            out.insert(name.clone(), t);
        }
    }
    Ok(out)
}

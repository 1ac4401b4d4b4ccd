//! Expert parallelism: which rank of a group holds which routed expert, and the names of the
//! tensors that come with it. Rank `r` of `N` owns the experts `{e : e mod N == r}` of every
//! sparse layer (round-robin, so each rank holds `E / N` experts of each layer and the
//! ranks' expert tensors line up position by position for a gather). Everything else (the
//! embedding, attention, norms, routers, shared experts, the head) stays on every rank.
//!
//! The exchange of token rows is `expert_exchange.rs`; the sparse block that uses it is
//! `moe_parallel.rs`; the engine's version is `engine/moe_forward.rs`.

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
pub fn gather_experts(
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

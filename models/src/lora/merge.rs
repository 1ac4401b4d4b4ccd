//! Merged weights: `W + scale · B·A` for every adapted linear layer, the model's function
//! as one plain set of weights (what the engine serves and an HF folder holds; PEFT's
//! `merge_and_unload`).

use crate::lora::targets::adapter_names;
use candle_core::{DType, Tensor};
use std::collections::HashMap;

/// LoRA adapters to merge into a set of base weights one weight at a time, as a reader
/// asks for each (an engine refit: no merged copy of every adapted layer at once).
#[derive(Clone, Debug)]
pub struct AdapterMerge {
    adapters: HashMap<String, Tensor>,
    scale: f64,
}

impl AdapterMerge {
    /// The merge of `adapters` (PEFT names, and modules trained whole under their own
    /// names) at `scale` (α/r) into the weights of `base`, which takes the modules trained
    /// whole now (they are values, not deltas).
    pub(crate) fn new(
        base: &mut HashMap<String, Tensor>,
        mut adapters: HashMap<String, Tensor>,
        scale: f64,
    ) -> AdapterMerge {
        let whole: Vec<String> = adapters
            .keys()
            .filter(|n| base.contains_key(*n))
            .cloned()
            .collect();
        for name in whole {
            if let Some(t) = adapters.remove(&name) {
                base.insert(name, t);
            }
        }
        AdapterMerge { adapters, scale }
    }

    /// Every weight of `weights` (the base this merge was made on) replaced by its merged
    /// value ([`AdapterMerge::weight`]).
    pub(crate) fn merge_all(
        &self,
        weights: &mut HashMap<String, Tensor>,
    ) -> candle_core::Result<()> {
        for (name, w) in weights.iter_mut() {
            *w = self.weight(name, w)?;
        }
        Ok(())
    }

    /// Whether the weight `name` has an adapter (its merged value is not its base value).
    pub fn adapts(&self, name: &str) -> bool {
        let (a_name, b_name) = adapter_names(name);
        self.adapters.contains_key(&a_name) && self.adapters.contains_key(&b_name)
    }

    /// The weight `name` whose base value is `w`: `W + scale · B·A` when it has an adapter
    /// (computed in f32, stored in `W`'s dtype, or f32 for a bf16 `W`: the update of a
    /// bf16 base must not be rounded away), `w` itself otherwise.
    pub fn weight(&self, name: &str, w: &Tensor) -> candle_core::Result<Tensor> {
        let (a_name, b_name) = adapter_names(name);
        let (Some(a), Some(b)) = (self.adapters.get(&a_name), self.adapters.get(&b_name)) else {
            return Ok(w.clone());
        };
        let delta = b.to_dtype(DType::F32)?.matmul(&a.to_dtype(DType::F32)?)?;
        let dtype = match w.dtype() {
            DType::BF16 => DType::F32,
            d => d,
        };
        (w.to_dtype(DType::F32)? + (delta * self.scale)?)?.to_dtype(dtype)
    }
}

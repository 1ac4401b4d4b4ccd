//! Merged weights: `W + scale · B·A` for every adapted linear layer, the model's function
//! as one plain set of weights (what the engine serves and an HF folder holds; PEFT's
//! `merge_and_unload`).

use crate::lora::targets::adapter_names;
use candle_core::{DType, Tensor};
use std::collections::HashMap;

/// `base` with every weight that has an adapter in `adapters` replaced by
/// `W + scale · B·A` (computed in f32, stored in `W`'s dtype, or f32 for a bf16 `W`: the
/// update of a bf16 base must not be rounded away), and every other tensor of
/// `adapters` that `base` names (modules trained whole) taking the adapter set's value.
pub(crate) fn merge_into(
    base: &mut HashMap<String, Tensor>,
    adapters: &HashMap<String, Tensor>,
    scale: f64,
) -> candle_core::Result<()> {
    let weights: Vec<String> = base.keys().cloned().collect();
    for name in weights {
        let (a_name, b_name) = adapter_names(&name);
        if let (Some(a), Some(b)) = (adapters.get(&a_name), adapters.get(&b_name)) {
            let w = &base[&name];
            let delta = b.to_dtype(DType::F32)?.matmul(&a.to_dtype(DType::F32)?)?;
            let dtype = match w.dtype() {
                DType::BF16 => DType::F32,
                d => d,
            };
            let merged = (w.to_dtype(DType::F32)? + (delta * scale)?)?.to_dtype(dtype)?;
            base.insert(name, merged);
        } else if let Some(whole) = adapters.get(&name) {
            base.insert(name, whole.clone());
        }
    }
    Ok(())
}

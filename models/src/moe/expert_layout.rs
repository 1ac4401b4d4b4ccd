//! The two checkpoint layouts of MoE experts. The declaration (`moe/layout.rs`) names every
//! expert's projections separately (`experts.{e}.gate_proj` / Mixtral `experts.{e}.w1`), which
//! is what transformers reads and writes; newer transformers keeps, and some checkpoints
//! store, each layer's experts packed (`experts.gate_up_proj` `[E, 2I, H]`,
//! `experts.down_proj` `[E, H, I]`, router `mlp.gate.weight`). [`unpack_experts`] turns the
//! packed tensors of a loaded checkpoint into the declared names, so everything after loading
//! sees one layout. Saving always writes the per-expert names.

use crate::config::layout::{FeedForwardParams, MoeParams};
use crate::config::model_config::ModelConfig;
use crate::error::{ModelError, Result};
use candle_core::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// Replaces the packed expert tensors in `tensors` (if any) by the per-expert tensors `cfg`
/// declares, and renames a packed-layout router to the declared name. Tensors already in the
/// declared layout are left alone. Errors name the tensor and `source`.
pub(crate) fn unpack_experts(
    cfg: &ModelConfig,
    tensors: &mut HashMap<String, Tensor>,
    source: &Path,
) -> Result<()> {
    for layer in cfg.backbone_params().layers {
        if let FeedForwardParams::Sparse(moe) = &layer.ffn {
            unpack_layer(moe, tensors, source)?;
        }
    }
    Ok(())
}

fn unpack_layer(
    moe: &MoeParams,
    tensors: &mut HashMap<String, Tensor>,
    source: &Path,
) -> Result<()> {
    let router = &moe.router.weight.name;
    if !tensors.contains_key(router) {
        if let Some(t) = tensors.remove(&moe.packed.router) {
            tensors.insert(router.clone(), t);
        }
    }
    let n = moe.experts.len();
    let Some(first) = moe.experts.first() else {
        return Ok(());
    };
    let (i_dim, h) = (first.gate.weight.shape[0], first.gate.weight.shape[1]);
    if let Some(gate_up) = tensors.remove(&moe.packed.gate_up) {
        check_shape(&moe.packed.gate_up, &gate_up, &[n, 2 * i_dim, h], source)?;
        for (e, expert) in moe.experts.iter().enumerate() {
            let rows = gate_up.get(e)?;
            tensors.insert(
                expert.gate.weight.name.clone(),
                rows.narrow(0, 0, i_dim)?.contiguous()?,
            );
            tensors.insert(
                expert.up.weight.name.clone(),
                rows.narrow(0, i_dim, i_dim)?.contiguous()?,
            );
        }
    }
    if let Some(down) = tensors.remove(&moe.packed.down) {
        check_shape(&moe.packed.down, &down, &[n, h, i_dim], source)?;
        for (e, expert) in moe.experts.iter().enumerate() {
            tensors.insert(expert.down.weight.name.clone(), down.get(e)?.contiguous()?);
        }
    }
    Ok(())
}

fn check_shape(name: &str, t: &Tensor, expected: &[usize], source: &Path) -> Result<()> {
    if t.dims() == expected {
        return Ok(());
    }
    Err(ModelError::ShapeMismatch {
        name: name.to_string(),
        expected: expected.to_vec(),
        found: t.dims().to_vec(),
        path: source.to_path_buf(),
    })
}

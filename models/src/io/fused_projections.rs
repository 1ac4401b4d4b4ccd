//! The fused projections of Phi-3 checkpoints: `self_attn.qkv_proj.weight` (the q, k and v
//! rows stacked) and `mlp.gate_up_proj.weight` (gate rows, then up rows). The declaration
//! names the separate projections (`config/family/phi3.rs`); [`unfuse`] splits a loaded
//! checkpoint's fused tensors into them and [`fuse`] joins them again for writing, so a
//! saved folder is what transformers' `Phi3ForCausalLM` reads.

use crate::config::layout::{FeedForwardParams, LinearParams};
use crate::config::model_config::ModelConfig;
use crate::error::{ModelError, Result};
use candle_core::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// One fused tensor: its checkpoint name and the declared weights it stacks, in row order.
struct Fused<'a> {
    name: String,
    parts: Vec<&'a LinearParams>,
}

/// `prefix.a_proj.weight` of `part` renamed to the fused module `fused`.
fn fused_name(part: &LinearParams, module: &str, fused: &str) -> String {
    part.weight.name.replace(module, fused)
}

/// The fused tensors of `cfg`'s checkpoints (none unless its family fuses).
fn fused_tensors(params: &crate::config::layout::BackboneParams) -> Vec<Fused<'_>> {
    let mut out = Vec::new();
    for layer in &params.layers {
        let a = &layer.attn;
        out.push(Fused {
            name: fused_name(&a.q, "q_proj", "qkv_proj"),
            parts: vec![&a.q, &a.k, &a.v],
        });
        if let FeedForwardParams::Dense(mlp) = &layer.ffn {
            out.push(Fused {
                name: fused_name(&mlp.gate, "gate_proj", "gate_up_proj"),
                parts: vec![&mlp.gate, &mlp.up],
            });
        }
    }
    out
}

/// Replaces each fused tensor in `tensors` by its declared parts (rows split in order).
/// Errors name the tensor, the rows expected and `source`.
pub(crate) fn unfuse(
    cfg: &ModelConfig,
    tensors: &mut HashMap<String, Tensor>,
    source: &Path,
) -> Result<()> {
    if !cfg.family.decl().fused_projections() {
        return Ok(());
    }
    let params = cfg.backbone_params();
    for fused in fused_tensors(&params) {
        let Some(t) = tensors.remove(&fused.name) else {
            continue;
        };
        let rows: usize = fused.parts.iter().map(|p| p.weight.shape[0]).sum();
        let cols = fused.parts[0].weight.shape[1];
        if t.dims() != [rows, cols] {
            return Err(ModelError::ShapeMismatch {
                name: fused.name,
                expected: vec![rows, cols],
                found: t.dims().to_vec(),
                path: source.to_path_buf(),
            });
        }
        let mut at = 0;
        for part in &fused.parts {
            let n = part.weight.shape[0];
            tensors.insert(part.weight.name.clone(), t.narrow(0, at, n)?.contiguous()?);
            at += n;
        }
    }
    Ok(())
}

/// `tensors` with each group of declared parts joined into its fused checkpoint tensor
/// (in the place of its first part), for a family that fuses; unchanged otherwise.
pub(crate) fn fuse(
    cfg: &ModelConfig,
    tensors: Vec<(String, Tensor)>,
) -> Result<Vec<(String, Tensor)>> {
    if !cfg.family.decl().fused_projections() {
        return Ok(tensors);
    }
    let params = cfg.backbone_params();
    let groups = fused_tensors(&params);
    let mut owner: HashMap<&str, (usize, usize)> = HashMap::new();
    for (g, fused) in groups.iter().enumerate() {
        for (i, part) in fused.parts.iter().enumerate() {
            owner.insert(part.weight.name.as_str(), (g, i));
        }
    }
    let mut pending: Vec<Vec<Option<Tensor>>> =
        groups.iter().map(|f| vec![None; f.parts.len()]).collect();
    let mut out = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let Some(&(g, i)) = owner.get(name.as_str()) else {
            out.push((name, t));
            continue;
        };
        pending[g][i] = Some(t);
        if let Some(parts) = pending[g].iter().cloned().collect::<Option<Vec<Tensor>>>() {
            out.push((groups[g].name.clone(), Tensor::cat(&parts, 0)?));
            pending[g].clear();
        }
    }
    // a group given only in part stays under its declared names
    for (g, parts) in pending.into_iter().enumerate() {
        for (i, t) in parts.into_iter().enumerate() {
            if let Some(t) = t {
                out.push((groups[g].parts[i].weight.name.clone(), t));
            }
        }
    }
    Ok(out)
}

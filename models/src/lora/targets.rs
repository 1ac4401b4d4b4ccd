//! Which parameters of a model a [`LoraConfig`] touches: the linear layers that carry an
//! adapter (attention and dense MLP projections, by PEFT module name) and the head
//! parameters trained whole (`modules_to_save`), with the adapters' declarations.

use crate::config::layout::{FeedForwardParams, LinearParams};
use crate::config::model_config::ModelConfig;
use crate::config::param_spec::{ParamKind, ParamSpec};
use crate::lora::config::{LoraConfig, LoraError, ALL_LINEAR};

/// The module name of a linear weight (`model.layers.0.self_attn.q_proj.weight` -> `q_proj`).
fn module_of(weight_name: &str) -> &str {
    let prefix = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
    prefix.rsplit('.').next().unwrap_or(prefix)
}

/// The linear layers of `model` that `lora` puts an adapter on, in layer order. Routed
/// experts carry none: naming an MLP module explicitly on a model with sparse layers is
/// refused (`all-linear` then means the attention projections and dense layers' MLPs).
pub(crate) fn targeted_linears(
    model: &ModelConfig,
    lora: &LoraConfig,
) -> Result<Vec<LinearParams>, LoraError> {
    lora.check()?;
    if model.family.decl().fused_projections() {
        return Err(LoraError::Setting {
            key: "target_modules",
            message: format!(
                "adapters on {}'s fused qkv_proj / gate_up_proj are not supported yet \
                 (PEFT names them as one module each): train every weight instead",
                model.family
            ),
        });
    }
    let explicit_mlp = lora
        .target_modules
        .iter()
        .any(|t| t != ALL_LINEAR && ["gate_proj", "up_proj", "down_proj"].contains(&t.as_str()));
    let mut out = vec![];
    for layer in model.backbone_params().layers {
        let a = &layer.attn;
        let mut linears = vec![a.q.clone(), a.k.clone(), a.v.clone(), a.o.clone()];
        match &layer.ffn {
            FeedForwardParams::Dense(m) => {
                linears.extend([m.gate.clone(), m.up.clone(), m.down.clone()])
            }
            FeedForwardParams::Sparse(_) if explicit_mlp => {
                return Err(LoraError::Setting {
                    key: "target_modules",
                    message: "adapters on routed experts are not supported: target the \
                              attention projections (or all-linear) on a mixture-of-experts model"
                        .into(),
                })
            }
            FeedForwardParams::Sparse(_) => {}
        }
        out.extend(
            linears
                .into_iter()
                .filter(|l| lora.targets(module_of(&l.weight.name))),
        );
    }
    Ok(out)
}

/// The adapter names of the linear layer whose weight is `weight_name`: `(A, B)`.
pub(crate) fn adapter_names(weight_name: &str) -> (String, String) {
    let prefix = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
    (
        format!("{prefix}.lora_A.weight"),
        format!("{prefix}.lora_B.weight"),
    )
}

/// The declarations of the adapters of `linears`: `A` `[r, in]`, `B` `[out, r]`.
pub(crate) fn adapter_specs(linears: &[LinearParams], r: usize) -> Vec<ParamSpec> {
    let mut specs = Vec::with_capacity(2 * linears.len());
    for l in linears {
        let (out_dim, in_dim) = (l.weight.shape[0], l.weight.shape[1]);
        let (a, b) = adapter_names(&l.weight.name);
        specs.push(ParamSpec::new(a, vec![r, in_dim], ParamKind::Linear));
        specs.push(ParamSpec::new(b, vec![out_dim, r], ParamKind::Linear));
    }
    specs
}

/// The parameters among `candidates` (a model's own declarations) that `modules_to_save`
/// trains whole: those whose module path is or ends with a listed name (`score` ->
/// `score.weight`, `score.bias`). A listed name that matches nothing is refused.
pub(crate) fn saved_modules(
    lora: &LoraConfig,
    candidates: &[ParamSpec],
) -> Result<Vec<ParamSpec>, LoraError> {
    let mut out = vec![];
    for m in &lora.modules_to_save {
        let matches: Vec<&ParamSpec> = candidates
            .iter()
            .filter(|s| {
                let module = s.name.rsplit_once('.').map_or("", |(m, _)| m);
                module == m || module.ends_with(&format!(".{m}"))
            })
            .collect();
        if matches.is_empty() {
            let names: Vec<&str> = candidates.iter().map(|s| s.name.as_str()).collect();
            return Err(LoraError::Setting {
                key: "modules_to_save",
                message: format!(
                    "{m:?} names no parameter of this model (its heads: {})",
                    names.join(", ")
                ),
            });
        }
        out.extend(matches.into_iter().cloned());
    }
    Ok(out)
}

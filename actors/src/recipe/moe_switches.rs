//! The checks of the switches that only a mixture-of-experts policy has:
//! `rl.routing_replay` (replaying the rollout's expert choices needs routers, and a run that
//! rolls out, `run.kind = "rl"`) and `model.router_aux_loss_coef` (the weight of the routers'
//! load-balancing loss: finite, not negative, and only for a policy with routers). A dense
//! policy would silently ignore either. The policy's kind comes from its `config.json` when
//! the recipe names a folder, else from `model.init_family`.

use super::{Recipe, RecipeError, RunKind};
use oxalign_models::{Family, ModelConfig};
use std::path::Path;

/// Refuses the MoE-only switches for a dense policy, and `rl.routing_replay` for a run
/// without rollouts.
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if let Some(coef) = r.model.router_aux_loss_coef {
        let key = "model.router_aux_loss_coef";
        if !coef.is_finite() || coef < 0.0 {
            return Err(bad(
                key,
                format!("expected a finite number >= 0, found {coef}"),
            ));
        }
        dense_refused(r, key, "weights the routers' load-balancing loss", bad)?;
    }
    if !r.rl.routing_replay {
        return Ok(());
    }
    let key = "rl.routing_replay";
    if r.run.kind != RunKind::Rl {
        return Err(bad(
            key,
            format!(
                "replays the rollout engine's expert choices, so it needs run.kind = \"rl\", \
                 not {:?}",
                r.run.kind
            ),
        ));
    }
    dense_refused(r, key, "replays expert choices", bad)
}

/// Fails `key` (which `does` something to routers) when the policy is dense.
fn dense_refused(
    r: &Recipe,
    key: &str,
    does: &str,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let (moe, what) = match &r.model.path {
        Some(p) => {
            let config = ModelConfig::from_file(&Path::new(p).join("config.json"))
                .map_err(|e| bad("model.path", format!("{p:?}: {e}")))?;
            (config.moe.is_some(), format!("model.path = {p:?}"))
        }
        None => {
            let family = r
                .model
                .init_family
                .parse::<Family>()
                .map_err(|e| bad("model.init_family", e.to_string()))?;
            (
                family.is_moe(),
                format!("model.init_family = {:?}", r.model.init_family),
            )
        }
    };
    if moe {
        return Ok(());
    }
    Err(bad(
        key,
        format!(
            "{does}, but the policy ({what}) is a dense model without routers; expected a \
             mixture-of-experts policy (Qwen3-MoE, Qwen2-MoE, Mixtral) or no {key}"
        ),
    ))
}

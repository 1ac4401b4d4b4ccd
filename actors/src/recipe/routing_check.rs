//! The check of `rl.routing_replay`: replaying the rollout's expert choices needs a
//! mixture-of-experts policy (a dense one has no routers, and the switch would silently do
//! nothing) and a run that rolls out (`run.kind = "rl"`). It reads the policy's
//! `config.json` when the recipe names a folder, else `model.init_family`.

use super::{Recipe, RecipeError, RunKind};
use oxalign_models::{Family, ModelConfig};
use std::path::Path;

/// Refuses `rl.routing_replay = true` for a dense policy or a run without rollouts.
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
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
    if !moe {
        return Err(bad(
            key,
            format!(
                "replays expert choices, but the policy ({what}) is a dense model without \
                 routers; expected a mixture-of-experts policy (Qwen3-MoE, Qwen2-MoE, \
                 Mixtral) or routing_replay = false"
            ),
        ));
    }
    Ok(())
}

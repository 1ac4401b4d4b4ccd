//! The check of `placement.sharding = "sharded"`: what sharded (FSDP) training supports
//! today. It reads the recipe only; the sharding itself is `oxalign_rlhf::fsdp`.

use super::{EngineQuant, Recipe, RecipeError, RunKind, Sharding};

/// Refuses a sharded recipe on non-CPU devices (the shards are freed and refilled in CPU
/// memory), with a quantized engine (the policy would have to score rollouts between steps),
/// or for DPO and reward-model runs (their trainers are not sharded).
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if r.placement.sharding != Sharding::Sharded {
        return Ok(());
    }
    let key = "placement.sharding";
    for (role, spec) in [
        ("policy", &r.placement.policy),
        ("critic", &r.placement.critic),
    ] {
        if spec.split(',').any(|d| !d.trim().starts_with("cpu")) {
            return Err(bad(
                key,
                format!(
                    "\"sharded\" needs CPU devices, but placement.{role} is {spec:?}; use \
                     \"replicated\" on other devices"
                ),
            ));
        }
    }
    if r.engine.quant != EngineQuant::None {
        return Err(bad(
            key,
            "\"sharded\" needs engine.quant = \"none\" (a quantized engine has the trainer \
             score each rollout, which sharded training does not do yet)"
                .into(),
        ));
    }
    if matches!(r.run.kind, RunKind::Dpo | RunKind::Rm) {
        return Err(bad(
            key,
            format!(
                "\"sharded\" supports run.kind = \"rl\" and \"sft\", not {:?}",
                r.run.kind
            ),
        ));
    }
    Ok(())
}

//! The check of `placement.sharding = "sharded"`: what sharded (FSDP) training supports
//! today. It reads the recipe only; the sharding itself is `oxalign_rlhf::fsdp`.

use super::{Recipe, RecipeError, RunKind, Sharding};
use oxalign_models::engine::QuantMode;

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
        let devices = crate::placement::RolePlacement::parse(spec).devices;
        if devices.split(',').any(|d| !d.trim().starts_with("cpu")) {
            return Err(bad(
                key,
                format!(
                    "\"sharded\" needs CPU devices, but placement.{role} is {spec:?}; use \
                     \"replicated\" on other devices"
                ),
            ));
        }
    }
    if r.engine.quant != QuantMode::None {
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

#[cfg(test)]
mod tests {
    use crate::recipe::{validate, Recipe, RecipeError, Sharding};
    use std::path::Path;

    fn check(text: &str) -> Result<Recipe, RecipeError> {
        let r = Recipe::parse(text, Path::new("r.toml"), &[])?;
        validate(&r, Path::new("r.toml"))?;
        Ok(r)
    }

    #[test]
    fn sharded_is_accepted_on_cpu_groups_and_defaults_to_replicated() {
        assert_eq!(check("").unwrap().placement.sharding, Sharding::Replicated);
        let r = check("[placement]\npolicy = \"cpu:0,cpu:1\"\nsharding = \"sharded\"\n").unwrap();
        assert_eq!(r.placement.sharding, Sharding::Sharded);
    }

    #[test]
    fn unsupported_sharded_recipes_name_the_key_and_the_reason() {
        let e = check("[placement]\nsharding = \"zero3\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sharding") && e.contains("sharded"), "{e}");
        let e = check("[placement]\nsharding = \"sharded\"\n[engine]\nquant = \"int8\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("placement.sharding") && e.contains("engine.quant"),
            "{e}"
        );
        let text = "[run]\nkind = \"dpo\"\n[placement]\nsharding = \"sharded\"\n";
        let r = Recipe::parse(text, Path::new("r.toml"), &[]).unwrap();
        let bad = |k: &str, m: String| crate::recipe::RecipeError::Invalid {
            path: "r.toml".into(),
            key: k.into(),
            message: m,
        };
        let e = super::validate(&r, &bad).unwrap_err().to_string();
        assert!(e.contains("placement.sharding") && e.contains("Dpo"), "{e}");
    }
}

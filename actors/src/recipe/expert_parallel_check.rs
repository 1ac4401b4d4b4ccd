//! The check of `placement.expert_parallel = N`: what expert-parallel training supports
//! today. It reads the recipe only (a fresh policy's family and preset; a `model.path`
//! folder's experts are checked when the policy is built); the parallelism itself is
//! `oxalign_models::ExpertParallel` and `PolicyTrainer::spread_experts`.

use super::{Recipe, RecipeError, RunKind, Sharding};
use oxalign_models::engine::QuantMode;
use oxalign_models::{Family, ModelConfig, Preset};

/// Refuses `N = 0`, and for `N > 1`: a dense fresh policy or one whose `num_experts` `N`
/// does not divide, a policy group that is not `N` CPU devices, FSDP sharding, a quantized
/// engine, DPO and reward-model runs, and batches that leave a rank
/// without rows.
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let n = r.placement.expert_parallel;
    let key = "placement.expert_parallel";
    if n == 0 {
        return Err(bad(
            key,
            "must be at least 1 (1 = experts on every device)".into(),
        ));
    }
    if n == 1 {
        return Ok(());
    }
    let devices: Vec<&str> = r.placement.policy.split(',').map(str::trim).collect();
    if devices.len() != n || devices.iter().any(|d| !d.starts_with("cpu")) {
        return Err(bad(
            key,
            format!(
                "{n} needs placement.policy to be {n} CPU devices (e.g. \"cpu:0,cpu:1\"), \
                 got {:?}",
                r.placement.policy
            ),
        ));
    }
    if r.model.path.is_none() {
        fresh_policy(r, n, bad)?;
    }
    let refuse = |what: String| Err(bad(key, format!("{n} is not supported with {what}")));
    if r.placement.sharding == Sharding::Sharded {
        return refuse("placement.sharding = \"sharded\" (use one or the other)".into());
    }
    if r.engine.quant != QuantMode::None {
        return refuse("a quantized engine (engine.quant must be \"none\")".into());
    }
    if matches!(r.run.kind, RunKind::Dpo | RunKind::Rm) {
        return refuse(format!(
            "run.kind = {:?} (only \"rl\" and \"sft\")",
            r.run.kind
        ));
    }
    let batch = r.rl.prompts_per_step * r.rl.samples_per_prompt;
    let mb = r.rl.minibatch_size;
    if mb < n || !batch.is_multiple_of(mb) {
        return refuse(format!(
            "rl.minibatch_size = {mb} for a batch of {batch} (every minibatch must be whole \
             and hold at least {n} rows, one per rank)"
        ));
    }
    if r.sft.steps > 0 && r.sft.batch_size < n {
        return refuse(format!(
            "sft.batch_size = {} (< {n} ranks)",
            r.sft.batch_size
        ));
    }
    Ok(())
}

/// A fresh policy (`model.init_family`, `model.init_preset`) must be a MoE family whose
/// preset's experts `n` divides.
fn fresh_policy(
    r: &Recipe,
    n: usize,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let key = "placement.expert_parallel";
    let (Ok(family), Ok(preset)) = (
        r.model.init_family.parse::<Family>(),
        r.model.init_preset.parse::<Preset>(),
    ) else {
        return Ok(()); // The model section's own check names the bad value.
    };
    let Some(moe) = ModelConfig::preset(family, preset, 64).moe else {
        return Err(bad(
            key,
            format!(
                "{n} needs a mixture-of-experts policy; model.init_family = {:?} is dense",
                r.model.init_family
            ),
        ));
    };
    if !moe.num_experts.is_multiple_of(n) {
        return Err(bad(
            key,
            format!(
                "{n} does not divide the {} experts of {} {}",
                moe.num_experts, r.model.init_family, r.model.init_preset
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::recipe::{validate, Recipe, RecipeError};
    use std::path::Path;

    fn check(text: &str) -> Result<Recipe, RecipeError> {
        let r = Recipe::parse(text, Path::new("r.toml"), &[])?;
        validate(&r, Path::new("r.toml"))?;
        Ok(r)
    }

    const MOE: &str = "[model]\ninit_family = \"qwen3_moe\"\n[rl]\nprompts_per_step = 4\n\
                       samples_per_prompt = 4\nminibatch_size = 8\n";

    fn err(text: &str) -> String {
        check(text).unwrap_err().to_string()
    }

    #[test]
    fn expert_parallel_defaults_to_1_and_accepts_a_moe_policy_on_two_cpus() {
        assert_eq!(check("").unwrap().placement.expert_parallel, 1);
        let text = format!("{MOE}[placement]\npolicy = \"cpu:0,cpu:1\"\nexpert_parallel = 2\n");
        assert_eq!(check(&text).unwrap().placement.expert_parallel, 2);
    }

    #[test]
    fn expert_parallel_refusals_name_the_key_and_the_reason() {
        let ep2 = "[placement]\npolicy = \"cpu:0,cpu:1\"\nexpert_parallel = 2\n";
        let cases = [
            (
                format!("{MOE}[placement]\nexpert_parallel = 0\n"),
                "at least 1",
            ),
            (
                format!("{MOE}[placement]\nexpert_parallel = 2\n"),
                "2 CPU devices",
            ),
            (
                format!("{MOE}[placement]\npolicy = \"cpu:0,cpu:1\"\nexpert_parallel = 3\n"),
                "3 CPU",
            ),
            (ep2.to_string(), "dense"),
            (format!("{MOE}{ep2}sharding = \"sharded\"\n"), "sharded"),
            (
                format!("{MOE}{ep2}[engine]\nquant = \"int8\"\n"),
                "quantized",
            ),
            (
                format!("{MOE}{ep2}").replace("minibatch_size = 8", "minibatch_size = 1"),
                "minibatch_size = 1",
            ),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(
                e.contains("placement.expert_parallel") && e.contains(want),
                "{want}: {e}"
            );
        }
        let e = err(&format!(
            "{MOE}[placement]\npolicy = \"cpu:0,cpu:1,cpu:2\"\nexpert_parallel = 3\n"
        ));
        assert!(e.contains("does not divide"), "{e}");
    }
}

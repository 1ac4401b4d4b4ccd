//! Checks a typed recipe against the machine and the filesystem before anything runs.
//!
//! `oxalign train --check` stops after this and the first rows of the data files
//! (`controller/data_check.rs`). It does not load models or data; it only makes sure they
//! are there and that the numbers make sense together.

use super::{Algorithm, Recipe, RecipeError, RewardKind, RunKind, TaskKind, MAX_STALENESS};
use std::path::Path;

/// Returns the first problem found, naming the key and what was expected.
pub fn validate(recipe: &Recipe, file: &Path) -> Result<(), RecipeError> {
    let bad = |key: &str, message: String| RecipeError::Invalid {
        path: file.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let r = recipe;
    if r.run.name.is_empty() || r.run.name.contains(['/', '\\']) {
        return Err(bad(
            "run.name",
            format!("{:?} must be a plain, non-empty folder name", r.run.name),
        ));
    }
    match &r.model.path {
        Some(p) => need_model_dir("model.path", p, &bad)?,
        None => {
            if let Err(e) = r.model.init_family.parse::<oxalign_models::Family>() {
                return Err(bad("model.init_family", e.to_string()));
            }
            if !["tiny", "small"].contains(&r.model.init_preset.as_str()) {
                return Err(bad(
                    "model.init_preset",
                    format!("{:?}: expected \"tiny\" or \"small\"", r.model.init_preset),
                ));
            }
        }
    }
    if let Some(p) = &r.model.critic_path {
        need_model_dir("model.critic_path", p, &bad)?;
        super::head_check::critic_source("model.critic_path", p, &bad)?;
    }
    if let Some(t) = &r.model.teacher_path {
        need_model_dir("model.teacher_path", t, &bad)?;
        if let Some(p) = &r.model.path {
            super::same_vocabulary(Path::new(p), Path::new(t))
                .map_err(|e| bad("model.teacher_path", e.to_string()))?;
        }
    }
    match (r.reward.kind, &r.model.reward_path) {
        (RewardKind::Model, None) => {
            return Err(bad(
                "model.reward_path",
                "reward.kind = \"model\" needs a reward model folder".into(),
            ))
        }
        (RewardKind::Model, Some(p)) => {
            need_model_dir("model.reward_path", p, &bad)?;
            super::head_check::reward_model("model.reward_path", p, &bad)?;
        }
        _ => {}
    }
    super::head_check::offline_kind(r, &bad)?;
    data_keys(r, &bad)?;
    positive("run.steps", r.run.steps as f64, &bad)?;
    positive("rl.prompts_per_step", r.rl.prompts_per_step as f64, &bad)?;
    positive(
        "rl.samples_per_prompt",
        r.rl.samples_per_prompt as f64,
        &bad,
    )?;
    positive("rl.minibatch_size", r.rl.minibatch_size as f64, &bad)?;
    positive("rl.ppo_epochs", r.rl.ppo_epochs as f64, &bad)?;
    positive("rl.max_new_tokens", r.rl.max_new_tokens as f64, &bad)?;
    positive("rl.lr", r.rl.lr, &bad)?;
    positive("guard.max_sft_loss", r.guard.max_sft_loss, &bad)?;
    positive("guard.max_policy_loss", r.guard.max_policy_loss, &bad)?;
    positive("guard.max_value_loss", r.guard.max_value_loss, &bad)?;
    positive("guard.max_kl", r.guard.max_kl, &bad)?;
    positive("guard.max_update_kl", r.guard.max_update_kl, &bad)?;
    positive("rl.clip_eps", r.rl.clip_eps, &bad)?;
    if let Some(high) = r.rl.clip_eps_high {
        positive("rl.clip_eps_high", high, &bad)?;
    }
    positive("rl.max_grad_norm", r.rl.max_grad_norm, &bad)?;
    if r.sft.steps > 0 {
        positive("sft.batch_size", r.sft.batch_size as f64, &bad)?;
        positive("sft.lr", r.sft.lr, &bad)?;
    }
    let memory = oxalign_models::io::machine_memory::total_memory_bytes();
    super::numbers::validate(r, memory, &bad)?;
    // Fits: `numbers::validate` bounds the product.
    let batch =
        r.rl.prompts_per_step
            .saturating_mul(r.rl.samples_per_prompt);
    if !batch.is_multiple_of(r.rl.minibatch_size) {
        return Err(bad(
            "rl.minibatch_size",
            format!(
            "{} must divide the rollout batch (prompts_per_step × samples_per_prompt = {batch})",
            r.rl.minibatch_size
        ),
        ));
    }
    let grouped = matches!(
        r.rl.algorithm,
        Algorithm::Grpo | Algorithm::DrGrpo | Algorithm::Rloo
    );
    if grouped && r.rl.samples_per_prompt < 2 {
        return Err(bad(
            "rl.samples_per_prompt",
            format!(
                "{:?} compares samples of the same prompt: expected at least 2, found {}",
                r.rl.algorithm, r.rl.samples_per_prompt
            ),
        ));
    }
    if !(0.0..=1.0).contains(&r.rl.gamma) || !(0.0..=1.0).contains(&r.rl.lam) {
        return Err(bad("rl.gamma", "gamma and lam must lie in [0, 1]".into()));
    }
    if r.rl.temperature < 0.0 || !(r.rl.top_p > 0.0 && r.rl.top_p <= 1.0) {
        return Err(bad(
            "rl.temperature",
            "temperature must be >= 0 and top_p in (0, 1]".into(),
        ));
    }
    if r.rl.max_staleness > MAX_STALENESS {
        return Err(bad(
            "rl.max_staleness",
            format!(
                "{}: expected 0 (on-policy) to {MAX_STALENESS} versions of lag (each one more \
                 batch held in memory)",
                r.rl.max_staleness
            ),
        ));
    }
    if let Some(c) = r.rl.dual_clip {
        if c <= 1.0 {
            return Err(bad(
                "rl.dual_clip",
                format!("{c}: the dual-clip constant must be > 1"),
            ));
        }
    }
    positive("engine.block_size", r.engine.block_size as f64, &bad)?;
    positive("engine.kv_memory_mb", r.engine.kv_memory_mb as f64, &bad)?;
    positive(
        "engine.max_batched_tokens",
        r.engine.max_batched_tokens as f64,
        &bad,
    )?;
    positive("engine.max_running", r.engine.max_running as f64, &bad)?;
    positive("engine.refit_tolerance", r.engine.refit_tolerance, &bad)?;
    for (key, spec) in [
        ("placement.policy", &r.placement.policy),
        ("placement.reference", &r.placement.reference),
        ("placement.reward", &r.placement.reward),
        ("placement.critic", &r.placement.critic),
    ] {
        let placed = crate::placement::RolePlacement::parse(spec);
        placed.device_group().map_err(|e| bad(key, e.to_string()))?;
    }
    super::cluster::validate(r, &bad)?;
    super::engine_placement_check::validate(r, &bad)?;
    super::sharding_check::validate(r, &bad)?;
    super::expert_parallel_check::validate(r, &bad)?;
    super::moe_switches::validate(r, &bad)?;
    super::validate_rl::validate_rl(r, &bad)?;
    super::reward::validate(r, &bad)?;
    super::supervision::validate(r, &bad)
}

/// The `[data]` keys: the file a run reads exists; the answer column is a column name.
fn data_keys(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    if r.data.task != TaskKind::Arithmetic || r.run.kind != RunKind::Rl {
        let p = r.data.path.as_deref().ok_or_else(|| {
            bad(
                "data.path",
                "data.task = \"jsonl\" needs a prompts file".into(),
            )
        })?;
        if !Path::new(p).is_file() {
            return Err(bad(
            "data.path",
            format!("{p}: no such file (expected a JSONL or Parquet file in the {:?} schema, see docs/RECIPES.md)", r.run.kind),
        ));
        }
    }
    let field = r.data.answer_field.as_str();
    if field.is_empty() || ["prompt", "messages"].contains(&field) {
        return Err(bad(
            "data.answer_field",
            format!("{field:?}: expected the name of the column holding the reference answer"),
        ));
    }
    if r.data.task == TaskKind::Arithmetic && r.data.max_operand == 0 {
        return Err(bad("data.max_operand", "must be at least 1".into()));
    }
    Ok(())
}

fn positive(
    key: &str,
    v: f64,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(key, format!("{v}: expected a positive number")))
    }
}

fn need_model_dir(
    key: &str,
    dir: &str,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let p = Path::new(dir);
    if !p.is_dir() {
        return Err(bad(
            key,
            format!("{dir}: no such folder (expected an HF model folder with config.json)"),
        ));
    }
    if !p.join("config.json").is_file() {
        return Err(bad(
            key,
            format!("{dir}: has no config.json (expected an HF model folder)"),
        ));
    }
    Ok(())
}

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
    run_name(r, &bad)?;
    policy_source(r, &bad)?;
    critic_and_teacher_folders(r, &bad)?;
    reward_model(r, &bad)?;
    super::head_check::offline_kind(r, &bad)?;
    data_keys(r, &bad)?;
    positive_numbers(r, &bad)?;
    let memory = oxalign_models::io::machine_memory::total_memory_bytes();
    super::numbers::validate(r, memory, &bad)?;
    rollout_batch(r, &bad)?;
    rl_ranges(r, &bad)?;
    engine_sizes(r, &bad)?;
    placement_devices(r, &bad)?;
    super::cluster::validate(r, &bad)?;
    super::engine_placement_check::validate(r, &bad)?;
    super::sharding_check::validate(r, &bad)?;
    super::lora::validate(r, &bad)?;
    super::log::validate(r, &bad)?;
    super::env::validate(r, &bad)?;
    super::expert_parallel_check::validate(r, &bad)?;
    super::moe_switches::validate(r, &bad)?;
    super::precision::validate(r, &bad)?;
    super::validate_rl::validate_rl(r, &bad)?;
    super::reward::validate(r, &bad)?;
    super::supervision::validate(r, &bad)
}

/// Refuses a `run.name` that is empty or not a plain folder name (it holds `/` or `\`).
fn run_name(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    if r.run.name.is_empty() || r.run.name.contains(['/', '\\']) {
        return Err(bad(
            "run.name",
            format!("{:?} must be a plain, non-empty folder name", r.run.name),
        ));
    }
    Ok(())
}

/// Refuses a `model.path` that is not an HF model folder, or, without one, an
/// `init_family` that is no known family or an `init_preset` other than `tiny` / `small`.
fn policy_source(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if let Some(p) = &r.model.path {
        return need_model_dir("model.path", p, bad);
    }
    if let Err(e) = r.model.init_family.parse::<oxalign_models::Family>() {
        return Err(bad("model.init_family", e.to_string()));
    }
    if !["tiny", "small"].contains(&r.model.init_preset.as_str()) {
        return Err(bad(
            "model.init_preset",
            format!("{:?}: expected \"tiny\" or \"small\"", r.model.init_preset),
        ));
    }
    Ok(())
}

/// Refuses a `model.critic_path` that is not a model folder a critic can start from, and a
/// `model.teacher_path` that is not a model folder or (with `model.path`) whose vocabulary
/// differs from the policy's.
fn critic_and_teacher_folders(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if let Some(p) = &r.model.critic_path {
        need_model_dir("model.critic_path", p, bad)?;
        super::head_check::critic_source("model.critic_path", p, bad)?;
    }
    if let Some(t) = &r.model.teacher_path {
        need_model_dir("model.teacher_path", t, bad)?;
        if let Some(p) = &r.model.path {
            super::same_vocabulary(Path::new(p), Path::new(t))
                .map_err(|e| bad("model.teacher_path", e.to_string()))?;
        }
    }
    Ok(())
}

/// Refuses `reward.kind = "model"` without a `model.reward_path`, or with one that is not an
/// HF sequence-classification model folder.
fn reward_model(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    match (r.reward.kind, &r.model.reward_path) {
        (RewardKind::Model, None) => Err(bad(
            "model.reward_path",
            "reward.kind = \"model\" needs a reward model folder".into(),
        )),
        (RewardKind::Model, Some(p)) => {
            need_model_dir("model.reward_path", p, bad)?;
            super::head_check::reward_model("model.reward_path", p, bad)
        }
        _ => Ok(()),
    }
}

/// Refuses a count, learning rate, clip range, gradient norm or guard limit that is not a
/// positive number (the `[sft]` ones only when SFT runs).
fn positive_numbers(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let (run, rl, guard) = (&r.run, &r.rl, &r.guard);
    let mut numbers = vec![
        ("run.steps", run.steps as f64),
        ("rl.prompts_per_step", rl.prompts_per_step as f64),
        ("rl.samples_per_prompt", rl.samples_per_prompt as f64),
        ("rl.minibatch_size", rl.minibatch_size as f64),
        ("rl.ppo_epochs", rl.ppo_epochs as f64),
        ("rl.max_new_tokens", rl.max_new_tokens as f64),
        ("rl.lr", rl.lr),
        ("guard.max_sft_loss", guard.max_sft_loss),
        ("guard.max_policy_loss", guard.max_policy_loss),
        ("guard.max_value_loss", guard.max_value_loss),
        ("guard.max_kl", guard.max_kl),
        ("guard.max_update_kl", guard.max_update_kl),
        ("rl.clip_eps", rl.clip_eps),
    ];
    numbers.extend(rl.clip_eps_high.map(|high| ("rl.clip_eps_high", high)));
    numbers.push(("rl.max_grad_norm", rl.max_grad_norm));
    if r.sft.steps > 0 {
        numbers.push(("sft.batch_size", r.sft.batch_size as f64));
        numbers.push(("sft.lr", r.sft.lr));
    }
    numbers
        .into_iter()
        .try_for_each(|(key, v)| positive(key, v, bad))
}

/// Refuses an `rl.minibatch_size` that does not divide the rollout batch, and a group
/// algorithm (`grpo`, `dr_grpo`, `rloo`) with fewer than 2 samples per prompt.
fn rollout_batch(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    // Fits: `numbers::validate` bounds the product.
    let batch =
        r.rl.prompts_per_step
            .saturating_mul(r.rl.samples_per_prompt);
    if !batch.is_multiple_of(r.rl.minibatch_size) {
        return Err(bad(
            "rl.minibatch_size",
            format!(
                "{} must divide the rollout batch (prompts_per_step × samples_per_prompt = \
                 {batch})",
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
    Ok(())
}

/// Refuses `rl.gamma` or `rl.lam` outside `[0, 1]`, a negative `rl.temperature`, an
/// `rl.top_p` outside `(0, 1]`, an `rl.max_staleness` above [`MAX_STALENESS`], and an
/// `rl.dual_clip` of 1 or less.
fn rl_ranges(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    let rl = &r.rl;
    if !(0.0..=1.0).contains(&rl.gamma) || !(0.0..=1.0).contains(&rl.lam) {
        return Err(bad("rl.gamma", "gamma and lam must lie in [0, 1]".into()));
    }
    if rl.temperature < 0.0 || !(rl.top_p > 0.0 && rl.top_p <= 1.0) {
        return Err(bad(
            "rl.temperature",
            "temperature must be >= 0 and top_p in (0, 1]".into(),
        ));
    }
    if rl.max_staleness > MAX_STALENESS {
        return Err(bad(
            "rl.max_staleness",
            format!(
                "{}: expected 0 (on-policy) to {MAX_STALENESS} versions of lag (each one more \
                 batch held in memory)",
                rl.max_staleness
            ),
        ));
    }
    match rl.dual_clip {
        Some(c) if c <= 1.0 => Err(bad(
            "rl.dual_clip",
            format!("{c}: the dual-clip constant must be > 1"),
        )),
        _ => Ok(()),
    }
}

/// Refuses an `[engine]` size, budget or refit tolerance that is not a positive number.
fn engine_sizes(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    let e = &r.engine;
    [
        ("engine.block_size", e.block_size as f64),
        ("engine.kv_memory_mb", e.kv_memory_mb as f64),
        ("engine.max_batched_tokens", e.max_batched_tokens as f64),
        ("engine.max_running", e.max_running as f64),
        ("engine.refit_tolerance", e.refit_tolerance),
    ]
    .into_iter()
    .try_for_each(|(key, v)| positive(key, v, bad))
}

/// Refuses a `[placement]` role whose device group does not parse, or, for a role in this
/// process, names a device this machine cannot open (a node's devices are only parsed).
fn placement_devices(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let p = &r.placement;
    for (key, spec) in [
        ("placement.policy", &p.policy),
        ("placement.reference", &p.reference),
        ("placement.reward", &p.reward),
        ("placement.critic", &p.critic),
    ] {
        let placed = crate::placement::RolePlacement::parse(spec);
        placed.device_group().map_err(|e| bad(key, e.to_string()))?;
    }
    Ok(())
}

/// Refuses a run that reads `data.path` (a file task, or an SFT, RM or DPO run) without an
/// existing file or folder (of Parquet shards) there, an empty `answer_field` or one naming the prompt column, and an arithmetic
/// task whose operands would all be 0.
fn data_keys(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    if r.data.task != TaskKind::Arithmetic || r.run.kind != RunKind::Rl {
        let p = r.data.path.as_deref().ok_or_else(|| {
            bad(
                "data.path",
                "data.task = \"jsonl\" needs a prompts file".into(),
            )
        })?;
        if !Path::new(p).exists() {
            return Err(bad(
            "data.path",
            format!("{p}: no such file or folder (expected a JSONL or Parquet file, or a folder of Parquet shards, in the {:?} schema, see docs/RECIPES.md)", r.run.kind),
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
    if r.sft.examples > 0 && (r.run.kind != RunKind::Rl || r.sft.steps == 0) {
        return Err(bad(
            "sft.examples",
            format!(
                "{}: only the SFT warm-up before RL reads it (run.kind = \"rl\" with \
                 sft.steps > 0), and this recipe has run.kind = {:?}, sft.steps = {}",
                r.sft.examples, r.run.kind, r.sft.steps
            ),
        ));
    }
    Ok(())
}

/// Refuses `v` unless it is a finite number above 0.
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

/// Refuses a `dir` that is not a folder with a `config.json`.
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

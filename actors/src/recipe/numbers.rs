//! Numbers checked at the door: every rate, coefficient and size of a recipe is refused
//! here, naming the key, when it is not finite, out of its range, or larger than the machine
//! can hold, so that a run never fails after its SFT warm-up (or aborts allocating) on a value
//! `--check` could have seen. Size arithmetic is done in checked or 128-bit integers. The
//! model-dependent checks (context, vocabulary) live elsewhere; this reads only
//! `/proc/meminfo`.

use super::{Recipe, RecipeError};

/// Most sequences one step may hold (`sft.batch_size`, `rm.batch_size`, `dpo.batch_size`,
/// `rl.prompts_per_step × rl.samples_per_prompt`, `engine.max_running`).
pub(crate) const MAX_SEQUENCES_PER_STEP: u64 = 1 << 16;
/// Most tokens of one length or budget (`rl.max_new_tokens`, `engine.max_batched_tokens`,
/// `engine.block_size`).
pub(crate) const MAX_TOKENS: u64 = 1 << 24;
/// Most held-out prompts (`data.eval_size`).
pub(crate) const MAX_EVAL_SIZE: u64 = 1 << 20;

type Bad<'a> = &'a dyn Fn(&str, String) -> RecipeError;

/// The first number of `r` out of its range (see the module doc); `total_memory` is the
/// machine's memory in bytes, when known.
pub(super) fn validate(r: &Recipe, total_memory: Option<u64>, bad: Bad) -> Result<(), RecipeError> {
    rates(r, bad)?;
    rewards(r, bad)?;
    sizes(r, bad)?;
    kv_memory(r, total_memory, bad)
}

/// Learning rates, coefficients and sampling settings: finite, in range.
fn rates(r: &Recipe, bad: Bad) -> Result<(), RecipeError> {
    let rl = &r.rl;
    positive("rl.critic_lr", rl.critic_lr, bad)?;
    positive("rl.kl_horizon", rl.kl_horizon, bad)?;
    positive("rl.value_clip", rl.value_clip, bad)?;
    non_negative("rl.kl_coef", rl.kl_coef, bad)?;
    finite("rl.entropy_coef", rl.entropy_coef, bad)?;
    non_negative("rl.temperature", rl.temperature, bad)?;
    non_negative("sft.weight_decay", r.sft.weight_decay, bad)?;
    // Positive where the run kind uses them (head_check.rs); never infinite or negative.
    for (key, v) in [
        ("sft.lr", r.sft.lr),
        ("rm.lr", r.rm.lr),
        ("dpo.lr", r.dpo.lr),
        ("dpo.beta", r.dpo.beta),
    ] {
        non_negative(key, v, bad)?;
    }
    Ok(())
}

/// Rewards are summed and trained on in f32: each one must be a finite f32.
fn rewards(r: &Recipe, bad: Bad) -> Result<(), RecipeError> {
    let w = &r.reward;
    let weights = w
        .verifiers
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("reward.verifiers[{i}].weight"), v.weight));
    let fixed = [
        ("reward.correct".to_string(), w.correct),
        ("reward.incorrect".to_string(), w.incorrect),
    ];
    for (key, v) in fixed.into_iter().chain(weights) {
        if !(v.is_finite() && v.abs() <= f32::MAX as f64) {
            return Err(bad(
                &key,
                format!(
                    "{v}: expected a finite number within the f32 range (±{:e})",
                    f32::MAX
                ),
            ));
        }
    }
    Ok(())
}

/// Sizes that allocate: batches, token budgets, held-out sets.
fn sizes(r: &Recipe, bad: Bad) -> Result<(), RecipeError> {
    let rollout = (r.rl.prompts_per_step as u128) * (r.rl.samples_per_prompt as u128);
    let counts = [
        (
            "sft.batch_size",
            r.sft.batch_size as u128,
            MAX_SEQUENCES_PER_STEP,
        ),
        (
            "rm.batch_size",
            r.rm.batch_size as u128,
            MAX_SEQUENCES_PER_STEP,
        ),
        (
            "dpo.batch_size",
            r.dpo.batch_size as u128,
            MAX_SEQUENCES_PER_STEP,
        ),
        ("rl.prompts_per_step", rollout, MAX_SEQUENCES_PER_STEP),
        (
            "engine.max_running",
            r.engine.max_running as u128,
            MAX_SEQUENCES_PER_STEP,
        ),
        ("rl.max_new_tokens", r.rl.max_new_tokens as u128, MAX_TOKENS),
        (
            "engine.max_batched_tokens",
            r.engine.max_batched_tokens as u128,
            MAX_TOKENS,
        ),
        ("engine.block_size", r.engine.block_size as u128, MAX_TOKENS),
        ("data.eval_size", r.data.eval_size as u128, MAX_EVAL_SIZE),
    ];
    for (key, v, max) in counts {
        if v > max as u128 {
            let what = if key == "rl.prompts_per_step" {
                format!(
                    "{} prompts × {} samples (rl.samples_per_prompt) = {v}",
                    r.rl.prompts_per_step, r.rl.samples_per_prompt
                )
            } else {
                v.to_string()
            };
            return Err(bad(key, format!("{what}: expected at most {max}")));
        }
    }
    Ok(())
}

/// The KV caches of the policy's engines (`engine.kv_memory_mb` per replica) must fit in
/// the machine's memory; the bytes are computed in 128-bit integers.
fn kv_memory(r: &Recipe, total_memory: Option<u64>, bad: Bad) -> Result<(), RecipeError> {
    let Some(total) = total_memory else {
        return Ok(());
    };
    let engines = r.placement.engine.as_deref().unwrap_or(&r.placement.policy);
    let replicas = engines
        .split(',')
        .filter(|d| !d.trim().is_empty())
        .count()
        .max(1);
    let bytes = (r.engine.kv_memory_mb as u128) * (1 << 20) * replicas as u128;
    if bytes <= total as u128 {
        return Ok(());
    }
    Err(bad(
        "engine.kv_memory_mb",
        format!(
            "{} MiB per engine replica × {replicas} replica(s) = {bytes} bytes of KV cache, more \
             than this machine's {total} bytes of memory (MemTotal in /proc/meminfo)",
            r.engine.kv_memory_mb
        ),
    ))
}

fn positive(key: &str, v: f64, bad: Bad) -> Result<(), RecipeError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(key, format!("{v}: expected a finite number > 0")))
    }
}

fn finite(key: &str, v: f64, bad: Bad) -> Result<(), RecipeError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(bad(key, format!("{v}: expected a finite number")))
    }
}

fn non_negative(key: &str, v: f64, bad: Bad) -> Result<(), RecipeError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(bad(key, format!("{v}: expected a finite number >= 0")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The message of `validate` on the default recipe with `sets`, with `memory` bytes.
    fn refused(sets: &[&str], memory: Option<u64>) -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let r = Recipe::parse("", Path::new("r.toml"), &sets).unwrap();
        let bad = |key: &str, message: String| RecipeError::Invalid {
            path: "r.toml".into(),
            key: key.into(),
            message,
        };
        validate(&r, memory, &bad).unwrap_err().to_string()
    }

    #[test]
    fn non_finite_and_negative_rates_are_refused_with_the_key() {
        for (set, key) in [
            ("rl.critic_lr=-inf", "rl.critic_lr"),
            ("rl.kl_coef=nan", "rl.kl_coef"),
            ("rl.kl_coef=-1", "rl.kl_coef"),
            ("rl.temperature=nan", "rl.temperature"),
            ("rl.entropy_coef=nan", "rl.entropy_coef"),
            ("sft.weight_decay=inf", "sft.weight_decay"),
        ] {
            let e = refused(&[set], None);
            assert!(e.contains(&format!("`{key}`")), "{set}: {e}");
        }
    }

    #[test]
    fn rewards_outside_the_f32_range_are_refused() {
        let e = refused(&["reward.correct=1e39"], None);
        assert!(e.contains("reward.correct") && e.contains("f32"), "{e}");
        let e = refused(&["reward.incorrect=-1e300"], None);
        assert!(e.contains("reward.incorrect"), "{e}");
    }

    #[test]
    fn absurd_sizes_are_refused_before_anything_is_allocated() {
        let e = refused(&["sft.batch_size=1000000000"], None);
        assert!(
            e.contains("sft.batch_size") && e.contains("1000000000"),
            "{e}"
        );
        let huge = format!("rl.prompts_per_step={}", u64::MAX / 2);
        let e = refused(&[&huge, "rl.samples_per_prompt=4"], None);
        assert!(
            e.contains("rl.prompts_per_step") && e.contains("× 4"),
            "{e}"
        );
        let e = refused(&["rl.max_new_tokens=100000000"], None);
        assert!(e.contains("rl.max_new_tokens"), "{e}");
    }

    #[test]
    fn a_kv_cache_larger_than_the_machine_is_refused_with_its_bytes() {
        let e = refused(&["engine.kv_memory_mb=1000000"], Some(16 << 30));
        assert!(
            e.contains("engine.kv_memory_mb") && e.contains("1048576000000 bytes"),
            "{e}"
        );
        let e = refused(
            &[
                "engine.kv_memory_mb=6000",
                "placement.policy=\"cpu:0,cpu:1,cpu:2\"",
            ],
            Some(16 << 30),
        );
        assert!(e.contains("3 replica(s)"), "{e}");
    }
}

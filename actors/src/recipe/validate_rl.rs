//! Checks of the `[rl]` options that only make sense together: combinations that would fail
//! at run time or silently do nothing are refused here, naming the keys; combinations that
//! run but are usually a mistake give a warning.

use super::{Algorithm, Recipe, RecipeError, Truncation};
use oxalign_models::engine::QuantMode;
use oxalign_rlhf::losses::{KlEstimator, KlMode, PolicyObjective, RolloutCorrectionKind};

/// The first inconsistent combination of `[rl]` options (and the critic's model folder).
pub(super) fn validate_rl(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    truncation_and_overlong(r, bad)?;
    cispo_has_no_dual_clip(r, bad)?;
    sampling(r, bad)?;
    distill(r, bad)?;
    dynamic_sampling(r, bad)?;
    trainer_precision(r, bad)?;
    rollout_correction(r, bad)?;
    kl_target(r, bad)?;
    critic_needs_ppo(r, bad)
}

/// Refuses `rl.truncated = "bootstrap"` without PPO's critic, an `rl.overlong_buffer`
/// outside `1..=max_new_tokens` or beside `"bootstrap"` (a cut-off response is then not
/// scored), and a negative or non-finite `rl.overlong_penalty`.
fn truncation_and_overlong(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let rl = &r.rl;
    if rl.truncated == Truncation::Bootstrap && rl.algorithm != Algorithm::Ppo {
        return Err(bad(
            "rl.truncated",
            format!(
                "\"bootstrap\" bootstraps from the critic's values, which only \"ppo\" has \
                 (rl.algorithm = {:?}); expected \"terminal\"",
                rl.algorithm
            ),
        ));
    }
    if let Some(buffer) = rl.overlong_buffer {
        if buffer == 0 || buffer > rl.max_new_tokens {
            return Err(bad(
                "rl.overlong_buffer",
                format!(
                    "{buffer}: expected 1..={} tokens (rl.max_new_tokens)",
                    rl.max_new_tokens
                ),
            ));
        }
        if rl.truncated == Truncation::Bootstrap {
            return Err(bad(
                "rl.overlong_buffer",
                "with rl.truncated = \"bootstrap\" a cut-off response is not scored, so the \
                 overlong penalty would never apply to it; use one or the other"
                    .into(),
            ));
        }
    }
    if !(rl.overlong_penalty.is_finite() && rl.overlong_penalty >= 0.0) {
        return Err(bad(
            "rl.overlong_penalty",
            format!("{}: expected a finite number >= 0", rl.overlong_penalty),
        ));
    }
    Ok(())
}

/// Refuses `rl.dual_clip` with `rl.policy_loss = "cispo"`, which never drops a gradient.
fn cispo_has_no_dual_clip(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if r.rl.policy_loss == PolicyObjective::Cispo && r.rl.dual_clip.is_some() {
        return Err(bad(
            "rl.dual_clip",
            "CISPO never drops a token's gradient (a clipped ratio only caps its weight), so a \
             dual clip has no meaning; remove rl.dual_clip or use rl.policy_loss = \"ppo\""
                .into(),
        ));
    }
    Ok(())
}

/// Refuses an `rl.kl_target` with `rl.kl_coef = 0` (the controller would never act) or
/// that is not a positive number of nats.
fn kl_target(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    let rl = &r.rl;
    if rl.kl_target.is_some() && rl.kl_coef == 0.0 {
        return Err(bad(
            "rl.kl_target",
            "the adaptive controller scales rl.kl_coef, which is 0, so it would never act; \
             set rl.kl_coef > 0 or remove rl.kl_target"
                .into(),
        ));
    }
    match rl.kl_target {
        Some(t) if !(t.is_finite() && t > 0.0) => Err(bad(
            "rl.kl_target",
            format!("{t}: expected nats per sequence > 0"),
        )),
        _ => Ok(()),
    }
}

/// Refuses a `model.critic_path` unless `rl.algorithm = "ppo"`, the only one with a critic.
fn critic_needs_ppo(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if r.model.critic_path.is_some() && r.rl.algorithm != Algorithm::Ppo {
        return Err(bad(
            "model.critic_path",
            format!(
                "only \"ppo\" has a critic (rl.algorithm = {:?}); the folder would be ignored",
                r.rl.algorithm
            ),
        ));
    }
    Ok(())
}

/// On-policy distillation needs a teacher, and takes its signal from the teacher's log-probs:
/// a KL penalty in the reward, or reward shaping with no reward weight, would be ignored.
fn distill(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    let rl = &r.rl;
    let distill = rl.algorithm == Algorithm::Distill;
    match (distill, &r.model.teacher_path) {
        (true, None) => {
            return Err(bad(
                "model.teacher_path",
                "rl.algorithm = \"distill\" needs the teacher's model folder".into(),
            ))
        }
        (false, Some(_)) => {
            return Err(bad(
                "model.teacher_path",
                format!(
                    "only rl.algorithm = \"distill\" uses a teacher (rl.algorithm = {:?}); \
                     the folder would be ignored",
                    rl.algorithm
                ),
            ))
        }
        _ => {}
    }
    if !rl.distill_reward_coef.is_finite() || (!distill && rl.distill_reward_coef != 0.0) {
        return Err(bad(
            "rl.distill_reward_coef",
            format!(
                "{}: expected a finite weight, and only with rl.algorithm = \"distill\"",
                rl.distill_reward_coef
            ),
        ));
    }
    if !distill {
        return Ok(());
    }
    if rl.kl_mode == KlMode::Reward && rl.kl_coef != 0.0 {
        return Err(bad(
            "rl.kl_coef",
            format!(
                "{}: with rl.algorithm = \"distill\" the reference is the teacher and each \
                 token's advantage already is −(log π − log π_teacher), so a KL penalty in the \
                 reward is not applied; set rl.kl_coef = 0 (or rl.kl_mode = \"loss\")",
                rl.kl_coef
            ),
        ));
    }
    if rl.overlong_buffer.is_some() && rl.distill_reward_coef == 0.0 {
        return Err(bad(
            "rl.overlong_buffer",
            "shapes the task reward, which rl.distill_reward_coef = 0 leaves out of the \
             distillation advantage; set rl.distill_reward_coef or remove rl.overlong_buffer"
                .into(),
        ));
    }
    Ok(())
}

/// `rl.trainer_precision = "fake_int8"` mirrors the CPU int8 engine's kernel: it needs
/// `engine.quant = "int8"` and a policy on CPU devices.
fn trainer_precision(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if r.rl.trainer_precision != oxalign_models::Precision::FakeInt8 {
        return Ok(());
    }
    let key = "rl.trainer_precision";
    if r.engine.quant != QuantMode::Int8 {
        return Err(bad(
            key,
            format!(
                "\"fake_int8\" computes in the int8 engine's numbers, so it needs engine.quant \
                 = \"int8\", not {:?}",
                r.engine.quant
            ),
        ));
    }
    if r.placement
        .policy
        .split(',')
        .any(|d| !d.trim().starts_with("cpu"))
    {
        return Err(bad(
            key,
            format!(
                "\"fake_int8\" mirrors the CPU int8 kernel, so it needs the policy on CPU \
                 devices, not {:?}",
                r.placement.policy
            ),
        ));
    }
    Ok(())
}

/// Dynamic sampling needs groups to compare, and a round cap that lets it draw.
fn dynamic_sampling(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let rl = &r.rl;
    let grouped = matches!(
        rl.algorithm,
        Algorithm::Grpo | Algorithm::DrGrpo | Algorithm::Rloo
    );
    if rl.dynamic_sampling && !grouped {
        return Err(bad(
            "rl.dynamic_sampling",
            format!(
                "drops groups of samples whose rewards are all equal, which only the group \
                 algorithms \"grpo\", \"dr_grpo\" and \"rloo\" have (rl.algorithm = {:?})",
                rl.algorithm
            ),
        ));
    }
    match rl.dynamic_sampling_max_rounds {
        Some(_) if !rl.dynamic_sampling => Err(bad(
            "rl.dynamic_sampling_max_rounds",
            "only applies with rl.dynamic_sampling = true; it would be ignored".into(),
        )),
        Some(0) => Err(bad(
            "rl.dynamic_sampling_max_rounds",
            "0: expected at least 1 generation round".into(),
        )),
        _ => Ok(()),
    }
}

/// Rollout-correction settings that would fail, be ignored, or correct nothing.
fn rollout_correction(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let mode = r.rl.rollout_correction();
    tis_cap_fits(&r.rl, mode, bad)?;
    mask_band_fits(&r.rl, mode, bad)?;
    stale_batches_weigh_tokens(&r.rl, mode, bad)?;
    something_to_correct(r, mode, bad)
}

/// Refuses `token_tis` without a cap in force or with one that is not above 0, and an
/// `rl.tis_cap` beside any other correction.
fn tis_cap_fits(
    rl: &super::RlSection,
    mode: RolloutCorrectionKind,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    match (mode, rl.tis_cap_in_force()) {
        (RolloutCorrectionKind::TokenTis, None) => Err(bad(
            "rl.tis_cap",
            "rl.rollout_correction = \"token_tis\" needs the cap C of min(w, C); \
             expected e.g. rl.tis_cap = 2.0"
                .into(),
        )),
        (RolloutCorrectionKind::TokenTis, Some(c)) if !(c.is_finite() && c > 0.0) => {
            Err(bad("rl.tis_cap", format!("{c}: expected a cap > 0")))
        }
        (RolloutCorrectionKind::TokenTis, _) | (_, None) => Ok(()),
        (m, Some(_)) => Err(bad(
            "rl.tis_cap",
            format!(
                "only rl.rollout_correction = \"token_tis\" uses it, not {m:?}; remove \
                 rl.tis_cap (seq_mask and icepop use rl.rollout_mask_low / _high)"
            ),
        )),
    }
}

/// Refuses `rl.rollout_mask_low` / `_high` beside a correction other than `seq_mask` and
/// `icepop`, and, with those, a band that is not `0 ≤ low ≤ 1 ≤ high`, `high > low`, finite.
fn mask_band_fits(
    rl: &super::RlSection,
    mode: RolloutCorrectionKind,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let masks = matches!(
        mode,
        RolloutCorrectionKind::SeqMask | RolloutCorrectionKind::Icepop
    );
    if !masks {
        if rl.rollout_mask_low.is_some() || rl.rollout_mask_high.is_some() {
            return Err(bad(
                "rl.rollout_mask_low",
                format!(
                    "rl.rollout_mask_low / _high bound the kept ratios of \"seq_mask\" and \
                     \"icepop\", not {mode:?} (rl.rollout_correction); they would be ignored"
                ),
            ));
        }
        return Ok(());
    }
    let (low, high) = rl.rollout_mask_band();
    if !(low.is_finite() && (0.0..=1.0).contains(&low)) {
        return Err(bad(
            "rl.rollout_mask_low",
            format!("{low}: expected a ratio in [0, 1]"),
        ));
    }
    if !(high.is_finite() && high >= 1.0 && high > low) {
        return Err(bad(
            "rl.rollout_mask_high",
            format!("{high}: expected a finite ratio >= 1 (and > rl.rollout_mask_low)"),
        ));
    }
    Ok(())
}

/// Refuses a correction where every weight would be 1: an f32 engine
/// (`engine.quant = "none"`) and on-policy batches (`rl.max_staleness = 0`).
fn something_to_correct(
    r: &Recipe,
    mode: RolloutCorrectionKind,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if mode != RolloutCorrectionKind::None
        && r.engine.quant == QuantMode::None
        && r.rl.max_staleness == 0
    {
        return Err(bad(
            "rl.rollout_correction",
            format!(
                "{mode:?} corrects the gap between the engine's and the trainer's log-probs, \
                 but with engine.quant = \"none\" and rl.max_staleness = 0 π_old is the \
                 engine's own log-prob, so every weight is 1 and nothing would be corrected; \
                 use a quantized engine (engine.quant = \"int8\" or \"q4\"), stale batches \
                 (rl.max_staleness >= 1) or remove the correction"
            ),
        ));
    }
    Ok(())
}

/// A stale batch (`rl.max_staleness ≥ 1`) needs a per-token π_old/π_behav weight: `none`
/// and `seq_mask` (which weighs kept rows 1) would train it as on-policy.
fn stale_batches_weigh_tokens(
    rl: &super::RlSection,
    mode: RolloutCorrectionKind,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if rl.max_staleness > 0
        && matches!(
            mode,
            RolloutCorrectionKind::None | RolloutCorrectionKind::SeqMask
        )
    {
        return Err(bad(
            "rl.rollout_correction",
            format!(
                "{mode:?} with rl.max_staleness = {}: a stale batch was sampled by an older \
                 policy, and without a per-token importance weight π_old/π_behav the clipped \
                 surrogate would treat it as on-policy (seq_mask weighs every kept sequence \
                 1); use \"token_tis\" (the default for stale batches) or \"icepop\", or \
                 set rl.max_staleness = 0",
                rl.max_staleness
            ),
        ));
    }
    Ok(())
}

/// Sampling settings that would silently do nothing or make every group's samples equal.
fn sampling(r: &Recipe, bad: &impl Fn(&str, String) -> RecipeError) -> Result<(), RecipeError> {
    let rl = &r.rl;
    if rl.temperature != 0.0 {
        return Ok(());
    }
    if rl.top_k > 0 || rl.top_p < 1.0 {
        return Err(bad(
            "rl.top_k",
            "rl.temperature = 0 decodes greedily, so rl.top_k / rl.top_p would be ignored".into(),
        ));
    }
    if matches!(
        rl.algorithm,
        Algorithm::Grpo | Algorithm::DrGrpo | Algorithm::Rloo
    ) {
        return Err(bad(
            "rl.temperature",
            format!(
                "0 (greedy) makes every sample of a prompt the same, so {:?}'s group \
                 advantages are all 0 and nothing is learned; expected a temperature > 0",
                rl.algorithm
            ),
        ));
    }
    Ok(())
}

/// Combinations that run but are usually a mistake, one sentence each.
pub fn warnings(r: &Recipe) -> Vec<String> {
    let rl = &r.rl;
    let mut out = Vec::new();
    if rl.kl_mode == KlMode::Loss && rl.kl_coef > 0.0 && rl.kl_estimator == KlEstimator::K1 {
        out.push(
            "rl.kl_mode = \"loss\" with rl.kl_estimator = \"k1\": the k1 estimate log π − log \
             π_ref has zero expected gradient under samples from π, so it barely regularises; \
             use \"k2\" (gradient of KL(π‖π_ref)) or \"k3\" (gradient of KL(π_ref‖π)), see \
             docs/RECIPES.md"
                .into(),
        );
    }
    out
}

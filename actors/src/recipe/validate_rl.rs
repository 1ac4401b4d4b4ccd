//! Checks of the `[rl]` options that only make sense together: combinations that would fail
//! at run time or silently do nothing are refused here, naming the keys; combinations that
//! run but are usually a mistake give a warning.

use super::{
    Algorithm, KlEstimatorName, KlModeName, PolicyLossName, Recipe, RecipeError, TruncatedName,
};

/// The first inconsistent combination of `[rl]` options (and the critic's model folder).
pub(super) fn validate_rl(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let rl = &r.rl;
    let ppo = rl.algorithm == Algorithm::Ppo;
    if rl.truncated == TruncatedName::Bootstrap && !ppo {
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
        if rl.truncated == TruncatedName::Bootstrap {
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
    if rl.policy_loss == PolicyLossName::Cispo && rl.dual_clip.is_some() {
        return Err(bad(
            "rl.dual_clip",
            "CISPO never drops a token's gradient (a clipped ratio only caps its weight), so a \
             dual clip has no meaning; remove rl.dual_clip or use rl.policy_loss = \"ppo\""
                .into(),
        ));
    }
    sampling(r, bad)?;
    if rl.kl_target.is_some() && rl.kl_coef == 0.0 {
        return Err(bad(
            "rl.kl_target",
            "the adaptive controller scales rl.kl_coef, which is 0, so it would never act; \
             set rl.kl_coef > 0 or remove rl.kl_target"
                .into(),
        ));
    }
    if let Some(t) = rl.kl_target {
        if !(t.is_finite() && t > 0.0) {
            return Err(bad(
                "rl.kl_target",
                format!("{t}: expected nats per sequence > 0"),
            ));
        }
    }
    if r.model.critic_path.is_some() && !ppo {
        return Err(bad(
            "model.critic_path",
            format!(
                "only \"ppo\" has a critic (rl.algorithm = {:?}); the folder would be ignored",
                rl.algorithm
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
    if rl.algorithm != Algorithm::Ppo && rl.algorithm != Algorithm::ReinforcePp {
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
    if rl.kl_mode == KlModeName::Loss && rl.kl_coef > 0.0 && rl.kl_estimator == KlEstimatorName::K1
    {
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

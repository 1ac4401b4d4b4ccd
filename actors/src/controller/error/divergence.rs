//! The error that stops a run whose training diverged: which role, in which phase of which
//! step, what diverged (a [`Divergence`] found by the role or by the controller's own checks
//! on the rollout) and which recipe key to lower. It does not detect anything itself.

use crate::recipe::RunKind;
use crate::roles::Divergence;

/// Training diverged; nothing of the failing step was applied or saved.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "training diverged: {role}, {phase} of {} step {step}: {cause}. No checkpoint was written for this step. Lower {lower}, or raise the matching [guard] limit if the value is expected",
    step_label(*.kind)
)]
pub struct DivergenceError {
    /// The role (`policy`, `critic`).
    pub role: &'static str,
    /// The phase (`sft`, `policy_train`, `critic_train`, `experience`).
    pub phase: &'static str,
    /// The kind of step: an SFT step (of an `sft` run or the warm-up of an `rl` run), an RM
    /// step, a DPO step or an RL step.
    pub kind: RunKind,
    /// 1-based step number within its phase.
    pub step: u64,
    /// What diverged.
    pub cause: Divergence,
    /// The recipe key(s) to lower.
    pub lower: &'static str,
}

/// How a step of `kind` is named in messages: `SFT`, `RM`, `DPO` or `RL`.
pub(crate) fn step_label(kind: RunKind) -> &'static str {
    match kind {
        RunKind::Sft => "SFT",
        RunKind::Rm => "RM",
        RunKind::Dpo => "DPO",
        RunKind::Rl => "RL",
    }
}

/// Fails on a rollout statistic that is not finite or above `limit` (before any update).
pub(crate) fn check_rollout(
    step: u64,
    what: &str,
    value: f64,
    limit: f64,
) -> Result<(), DivergenceError> {
    if value.is_finite() && value <= limit {
        return Ok(());
    }
    Err(DivergenceError {
        role: "policy",
        phase: "experience",
        kind: RunKind::Rl,
        step,
        cause: Divergence::Rollout {
            what: what.to_string(),
            value,
            limit,
        },
        lower: "rl.lr (or raise rl.kl_coef)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_role_phase_step_value_and_key() {
        let e = DivergenceError {
            role: "critic",
            phase: "critic_train",
            kind: RunKind::Rl,
            step: 3,
            cause: Divergence::Loss {
                what: "value loss".into(),
                value: f64::NAN,
                limit: 1e4,
                update: 2,
            },
            lower: "rl.critic_lr",
        };
        let msg = e.to_string();
        for want in ["critic", "critic_train", "RL step 3", "NaN", "rl.critic_lr"] {
            assert!(msg.contains(want), "{want:?} missing in {msg}");
        }
        assert!(check_rollout(1, "kl", 0.5, 10.0).is_ok());
        let err = check_rollout(4, "kl", 25.0, 10.0).unwrap_err().to_string();
        assert!(
            err.contains("kl is 2.5e1") && err.contains("RL step 4"),
            "{err}"
        );
    }

    #[test]
    fn rm_and_dpo_divergence_names_its_run_kind_not_rl() {
        for (kind, want) in [(RunKind::Rm, "RM step 7"), (RunKind::Dpo, "DPO step 7")] {
            let e = DivergenceError {
                role: "policy",
                phase: "dpo",
                kind,
                step: 7,
                cause: Divergence::Loss {
                    what: "loss".into(),
                    value: f64::NAN,
                    limit: 100.0,
                    update: 1,
                },
                lower: "dpo.lr",
            };
            let msg = e.to_string();
            assert!(msg.contains(want) && !msg.contains("RL step"), "{msg}");
        }
    }
}

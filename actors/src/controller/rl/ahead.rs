//! Pipelined, bounded off-policy rollouts (`rl.max_staleness = k ≥ 1`): step `s` takes the
//! batch generated for it during an earlier step (step 1, and a step with none waiting,
//! generates its own) and, once its update starts, the engine generates the batches of the
//! steps after those waiting, up to `s + k`, with the weights it holds (version `s − 1`). So
//! batch `j` always comes from policy version `max(0, j − 1 − k)`, a pure function of the step.
//! Nothing is generated ahead while the step scores, whose reference and trainer forwards it
//! would only slow down where they share cores.
//!
//! At most `k` batches wait at any time (the credits that bound the memory in flight). They are
//! plain data in `LoopState::ahead` and in each checkpoint's `rollouts_ahead.json` (under its
//! checksums), so a resume or a supervised replay trains on exactly the batches the
//! uninterrupted run would have. A policy spawned from a checkpoint refits its engine once as
//! the checkpoint's version (`run_loop.rs`), so batches carry their true version, and the
//! controller refuses to train on a batch more than `k` versions older than the policy
//! (`StalenessError`).
//!
//! A stale batch is rescored by the trainer (π_old, the proximal policy; `score.rs`), and the
//! engine's sampling log-probs are the behaviour policy's: the rollout correction (token TIS
//! with cap 2 unless the recipe chooses) weights each token by `min(π_old / π_behaviour, C)`. A
//! failure in the generation ahead after the step's update went through leaves the trainers
//! ahead of the newest checkpoint; the step then reports the policy version as moved
//! (`step.rs`), so the supervisor rewinds the policy and the critic before the replay.

use super::rollout::{rollout, Rollout};
use crate::controller::context::Ctx;
use crate::controller::error::{RunError, StalenessError};
use crate::controller::setup::Roles;
use oxalign_data::PromptSource;
use std::time::Instant;

/// The batch step `step` trains on: the one generated ahead for it, or (first step, `k = 0`,
/// or none waiting) one generated now. Returns it with the seconds spent generating now.
pub(super) async fn take_or_generate(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    ahead: &mut Vec<Rollout>,
    data_position: u64,
    step: u64,
) -> Result<(Rollout, f64), RunError> {
    match ahead.first() {
        Some(ro) if ro.step == step => Ok((ahead.remove(0), 0.0)),
        Some(ro) => Err(StalenessError::OutOfOrder {
            step,
            waiting: ro.step,
        }
        .into()),
        None => {
            let t = Instant::now();
            let ro = rollout(ctx, roles, data, data_position, step).await?;
            Ok((ro, t.elapsed().as_secs_f64()))
        }
    }
}

/// Refuses a batch from a policy more than `max_staleness` versions behind `policy_version`.
/// Returns the lag.
pub(super) fn check_staleness(
    ro: &Rollout,
    policy_version: u64,
    max_staleness: u64,
) -> Result<u64, StalenessError> {
    let lag = policy_version.saturating_sub(ro.batch.policy_version);
    if lag > max_staleness {
        return Err(StalenessError::TooStale {
            step: ro.step,
            batch_version: ro.batch.policy_version,
            policy_version,
            lag,
            max_staleness,
        });
    }
    Ok(lag)
}

/// The batches to generate while step `step` trains: the steps after those already waiting
/// (`waiting`), up to `step + max_staleness` and not past `last_step`, reading prompts from
/// stream position `data_position` on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct AheadPlan {
    pub first: u64,
    pub last: u64,
    pub data_position: u64,
}

impl AheadPlan {
    /// The plan of step `step`: `next_position` is the stream position after the batch it
    /// trains on and every batch waiting.
    pub(super) fn of(
        step: u64,
        waiting: &[Rollout],
        next_position: u64,
        max_staleness: u64,
        last_step: u64,
    ) -> Self {
        Self {
            first: waiting.last().map_or(step, |r| r.step) + 1,
            last: (step + max_staleness).min(last_step),
            data_position: next_position,
        }
    }

    /// Generates the planned batches one after another (one engine), each from where the
    /// previous one stopped reading the stream.
    pub(super) async fn generate(
        self,
        ctx: &Ctx<'_>,
        roles: &Roles,
        data: &dyn PromptSource,
    ) -> Result<Vec<Rollout>, RunError> {
        let mut out = Vec::new();
        let mut position = self.data_position;
        for step in self.first..=self.last {
            let ro = rollout(ctx, roles, data, position, step).await?;
            position += ro.prompts_drawn;
            out.push(ro);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::RolloutBatch;

    fn waiting(step: u64, version: u64) -> Rollout {
        Rollout {
            step,
            batch: RolloutBatch {
                policy_version: version,
                samples: Vec::new(),
            },
            texts: Vec::new(),
            rows: Default::default(),
            rewards: None,
            generated: 0,
            gen_tokens: 0,
            all_tokens: 0,
            correct: None,
            gen_secs: 0.0,
            prompts_drawn: 4,
            dynamic: None,
            episodes: None,
            episode_records: Vec::new(),
        }
    }

    /// With k = 1 each step generates the next one's batch; with k = 2 the first step fills
    /// both credits and later steps generate one each; nothing past the run's last step.
    #[test]
    fn plans_keep_k_batches_in_flight_and_stop_at_the_run_end() {
        assert_eq!(AheadPlan::of(1, &[], 4, 1, 10).first, 2);
        assert_eq!(AheadPlan::of(1, &[], 4, 1, 10).last, 2);
        let p = AheadPlan::of(1, &[], 4, 2, 10);
        assert_eq!((p.first, p.last), (2, 3));
        let p = AheadPlan::of(2, &[waiting(3, 0)], 12, 2, 10);
        assert_eq!((p.first, p.last, p.data_position), (4, 4, 12));
        let p = AheadPlan::of(10, &[], 40, 1, 10);
        assert!(p.first > p.last, "no batch after the last step");
        let p = AheadPlan::of(3, &[], 12, 0, 10);
        assert!(p.first > p.last, "k = 0 generates nothing ahead");
    }

    #[test]
    fn a_batch_older_than_the_staleness_bound_is_refused() {
        assert_eq!(check_staleness(&waiting(5, 3), 4, 1).unwrap(), 1);
        assert_eq!(check_staleness(&waiting(1, 0), 0, 0).unwrap(), 0);
        let e = check_staleness(&waiting(5, 2), 4, 1).unwrap_err();
        assert!(e.to_string().contains("rl.max_staleness = 1"), "{e}");
    }
}

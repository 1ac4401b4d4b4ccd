//! [`RewardShaping`]: how the rollout's length limit changes the scores advantages are
//! built from (DAPO's overlong punishment, bootstrapping truncated rows). The rollout stage
//! (dynamic sampling) and the experience stage read it.

use crate::batch::{Finish, Sample, ScoredBatch};
use crate::recipe::{RlSection, Truncation};
use oxalign_rlhf::reward::OverlongShaping;

/// How the rollout's length limit changes the scores the advantages are built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RewardShaping {
    /// DAPO's soft overlong punishment, when set.
    overlong: Option<OverlongShaping>,
    /// Rows cut off by the length limit bootstrap from the critic instead of ending.
    pub(crate) bootstrap_truncated: bool,
}

impl RewardShaping {
    pub(crate) fn of(rl: &RlSection) -> Self {
        Self {
            overlong: rl.overlong_buffer.map(|buffer| OverlongShaping {
                max_len: rl.max_new_tokens,
                buffer,
                penalty: rl.overlong_penalty,
            }),
            bootstrap_truncated: rl.truncated == Truncation::Bootstrap,
        }
    }

    /// The score of `sample` with reward `reward` after shaping, and whether it bootstraps
    /// (1; its score is then 0) or not (0).
    pub(crate) fn shaped(&self, reward: f32, sample: &Sample) -> (f32, f32) {
        let mut score = reward;
        if let Some(o) = &self.overlong {
            score += o.shaping(sample.response.len()) as f32;
        }
        if self.bootstrap_truncated && sample.finish == Finish::Length {
            return (0.0, 1.0);
        }
        (score, 0.0)
    }

    /// The scores after shaping, and per row whether it bootstraps (score then 0).
    pub(crate) fn apply(&self, scored: &ScoredBatch) -> (Vec<f32>, Vec<f32>) {
        scored
            .rewards
            .iter()
            .zip(&scored.rollout.samples)
            .map(|(&r, sample)| self.shaped(r, sample))
            .unzip()
    }
}

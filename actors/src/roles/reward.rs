//! The reward actor: scores responses with a rule-based verifier or an HF sequence
//! classifier. A scorer that fails is an error for the step, never a silent zero.

use super::{Busy, Sequences};
use crate::error::{Cause, RoleError};
use crate::monitor::MonitorHandle;
use crate::replicas::{shard_ranges, Replicas};
use oxalign_models::RewardModel;
use oxalign_rlhf::reward::ExactMatch;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::Instant;

/// How responses are scored.
pub enum Scorer {
    /// Exact match of the response text with the reference answer.
    ExactMatch(ExactMatch),
    /// A reward model's score at the last token of prompt + response.
    Model(Box<RewardModel>),
}

/// Messages the reward actor understands.
pub enum RewardMsg {
    /// One score per row.
    Score {
        /// Token ids (for a reward model).
        seqs: Sequences,
        /// Decoded response texts (for verifiers).
        texts: Vec<String>,
        /// Reference answers (for verifiers).
        answers: Vec<Option<String>>,
        /// Scores.
        reply: RpcReplyPort<Result<Vec<f32>, RoleError>>,
    },
}

/// The reward actor.
pub struct Reward;

/// Its replicas and monitor.
pub struct RewardState {
    replicas: Replicas<Scorer>,
    monitor: MonitorHandle,
}

impl RewardState {
    /// State over built replicas.
    pub fn new(replicas: Replicas<Scorer>, monitor: MonitorHandle) -> Self {
        Self { replicas, monitor }
    }
}

impl Actor for Reward {
    type Msg = RewardMsg;
    type State = RewardState;
    type Arguments = RewardState;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        a: RewardState,
    ) -> Result<RewardState, ActorProcessingErr> {
        Ok(a)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: RewardMsg,
        st: &mut RewardState,
    ) -> Result<(), ActorProcessingErr> {
        let RewardMsg::Score {
            seqs,
            texts,
            answers,
            reply,
        } = msg;
        let started = Instant::now();
        let busy = Busy::start(&st.monitor, "reward", "reward".into());
        let n = seqs.len();
        let (seqs, texts, answers) = (Arc::new(seqs), Arc::new(texts), Arc::new(answers));
        let r = st
            .replicas
            .each("reward", move |ctx, scorer| {
                let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                match scorer {
                    Scorer::ExactMatch(v) => Ok(range
                        .map(|i| v.score(&texts[i], answers[i].as_deref()) as f32)
                        .collect::<Vec<_>>()),
                    Scorer::Model(m) => {
                        if range.is_empty() {
                            return Ok(Vec::new());
                        }
                        let b = seqs.batch_rows(range, m.device())?;
                        let s = m.forward(&b.ids, Some(&b.attention_mask))?;
                        let s: Vec<f32> = s.to_dtype(candle_core::DType::F32)?.to_vec1()?;
                        match s.iter().position(|x| !x.is_finite()) {
                            Some(row) => Err(non_finite_score(row, s[row])),
                            None => Ok(s),
                        }
                    }
                }
            })
            .await
            .map(|parts| parts.into_iter().flatten().collect::<Vec<_>>());
        busy.done(&r, n, started.elapsed().as_secs_f64());
        let _ = reply.send(r);
        Ok(())
    }
}

/// A reward model's score that is NaN or infinite: the rollout diverged, nothing is applied.
fn non_finite_score(row: usize, value: f32) -> Cause {
    Cause::Diverged(super::Divergence::Rollout {
        what: format!("the reward model's score of row {row}"),
        value: value as f64,
        limit: f64::INFINITY,
    })
}

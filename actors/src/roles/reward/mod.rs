//! The reward actor: scores responses with the exact-match reward, a weighted sum of
//! rule-based verifiers (`oxalign_rlhf::reward`: exact match on an extracted answer, regex,
//! length penalty, JSON validity), an HF `*ForSequenceClassification` model, or an HTTP reward
//! service (`http/`: retries with backoff and jitter, a concurrency limit and a circuit
//! breaker). A scorer that fails is an error for the step (`Cause::RewardService` for the
//! service), never a silent zero. Accuracy is reported only when an exact-match check defines
//! it (docs/REWARDS.md).
//!
//! Verifiers and the model run on the role's executors (`Replicas::each`), like every
//! role's tensor work. The service's client is async and runs right here, on tokio: a
//! request waiting on the network holds no thread, so it neither blocks a tokio worker nor
//! occupies a device's executor thread, which on a GPU is shared with other roles. The actor
//! handles one message at a time, so one batch is in flight per reward role; inside it the
//! client's own concurrency limit applies.

pub mod http;
pub mod python;

use self::http::HttpReward;
use super::{Busy, Sequences};
use crate::error::{Cause, RoleError};
use crate::monitor::MonitorHandle;
use crate::replicas::{shard_ranges, Replicas};
use oxalign_models::RewardModel;
use oxalign_rlhf::reward::{ExactMatch, Sample, Verifiers};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::Instant;

/// How one replica scores responses.
pub enum Scorer {
    /// Exact match of the response's first line with the reference answer.
    ExactMatch(ExactMatch),
    /// A weighted sum of rule-based verifiers.
    Verifiers(Verifiers),
    /// A reward model's score at the last token of prompt + response.
    Model(Box<RewardModel>),
}

/// Where the reward role's scores come from.
pub enum Scoring {
    /// Scorers on the role's executors, one per device of its group.
    Local(Replicas<Scorer>),
    /// An HTTP reward service, awaited on tokio.
    Service(Arc<HttpReward>),
}

/// Messages the reward actor understands.
pub(crate) enum RewardMsg {
    /// One score per row.
    Score {
        /// Token ids (for a reward model; the response lengths for verifiers).
        seqs: Sequences,
        /// Prompt texts (for a reward service).
        prompts: Vec<String>,
        /// Decoded response texts (for verifiers and services).
        texts: Vec<String>,
        /// Reference answers (for verifiers and services).
        answers: Vec<Option<String>>,
        /// The rows' other columns, JSON object text (for services).
        columns: Vec<Option<String>>,
        /// Scores.
        reply: RpcReplyPort<Result<Vec<f32>, RoleError>>,
    },
}

// A local-only message (the cluster feature of ractor needs each message type to say so).
impl ractor::Message for RewardMsg {}

/// The reward actor.
pub(crate) struct Reward;

/// Its scorers and monitor.
pub(crate) struct RewardState {
    scoring: Scoring,
    monitor: MonitorHandle,
    /// The child process serving `reward.kind = "python"`; stopped with the actor.
    _server: Option<python::PythonServer>,
}

impl RewardState {
    /// State over any scoring.
    pub fn with(scoring: Scoring, monitor: MonitorHandle) -> Self {
        Self {
            scoring,
            monitor,
            _server: None,
        }
    }

    /// The same, owning the server process the scoring posts to.
    pub fn serving(mut self, server: Option<python::PythonServer>) -> Self {
        self._server = server;
        self
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
            prompts,
            texts,
            answers,
            columns,
            reply,
        } = msg;
        let started = Instant::now();
        let busy = Busy::start(&st.monitor, "reward", "reward".into());
        let n = seqs.len();
        let r = match &st.scoring {
            Scoring::Service(http) => http
                .score(&prompts, &texts, &answers, &columns)
                .await
                .map(|v| v.into_iter().map(|x| x as f32).collect())
                .map_err(|e| RoleError::new("reward", "reward", Cause::from(e))),
            Scoring::Local(replicas) => score_local(replicas, seqs, texts, answers).await,
        };
        busy.done(&r, n, started.elapsed().as_secs_f64());
        let _ = reply.send(r);
        Ok(())
    }
}

/// Scores on the replicas' executors, each replica its shard of the rows.
async fn score_local(
    replicas: &Replicas<Scorer>,
    seqs: Sequences,
    texts: Vec<String>,
    answers: Vec<Option<String>>,
) -> Result<Vec<f32>, RoleError> {
    let (seqs, texts, answers) = (Arc::new(seqs), Arc::new(texts), Arc::new(answers));
    replicas
        .each("reward", move |ctx, scorer| {
            let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
            match scorer {
                Scorer::ExactMatch(v) => Ok(range
                    .map(|i| v.score(&texts[i], answers[i].as_deref()) as f32)
                    .collect::<Vec<_>>()),
                Scorer::Verifiers(v) => Ok(range
                    .map(|i| {
                        v.score(&Sample {
                            response: &texts[i],
                            answer: answers[i].as_deref(),
                            response_tokens: seqs.pairs[i].1.len(),
                        }) as f32
                    })
                    .collect()),
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
        .map(|parts| parts.into_iter().flatten().collect())
}

/// A reward model's score that is NaN or infinite: the rollout diverged, nothing is applied.
fn non_finite_score(row: usize, value: f32) -> Cause {
    Cause::Diverged(super::Divergence::Rollout {
        what: format!("the reward model's score of row {row}"),
        value: value as f64,
        limit: f64::INFINITY,
    })
}

//! The reference actor: a frozen copy of the initial policy that reports log-probs for KL. Each
//! replica scores with its own f32 engine (batched prefill forwards, the exact f32 math of the
//! trainer), since the reference never trains. With `rl.algorithm = "distill"` it is loaded
//! from `model.teacher_path` instead (`controller::setup::reference_weights`, which first
//! checks the teacher's vocabulary and tokenizer against the policy's,
//! `recipe/teacher_check.rs`), and its log-probs give the distillation advantages. With
//! LoRA the reference is the policy's frozen base (`ReferenceModel::Base`): the same
//! weights the policy's adapters sit on, shared rather than copied, scored with the
//! trainer's forward (adapters off).

use super::rows::concat_rows;
use super::{Busy, Sequences};
use crate::batch::TokenArray;
use crate::error::Cause;
use crate::error::RoleError;
use crate::monitor::MonitorHandle;
use crate::replicas::{shard_ranges, Replicas};
use oxalign_models::engine::Engine;
use oxalign_models::{CausalLm, TokenDistribution};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::Instant;

/// Messages the reference understands.
pub enum ReferenceMsg {
    /// Next-token log-probs `[B, T-1]` of `seqs` under the frozen model and the rollouts'
    /// distribution, at the response positions (an engine replica leaves the prompt's at 0).
    Logprobs {
        /// The sequences.
        seqs: Sequences,
        /// The log-probs.
        reply: RpcReplyPort<Result<TokenArray, RoleError>>,
    },
}

// A local-only message (the cluster feature of ractor needs each message type to say so).
impl ractor::Message for ReferenceMsg {}

/// What one reference replica scores with.
pub enum ReferenceModel {
    /// Its own f32 scoring engine (a copy of the reference weights).
    Engine(Engine),
    /// A LoRA policy's frozen base, shared with the policy's replica on the same device.
    Base(CausalLm),
}

impl ReferenceModel {
    /// Next-token log-probs of rows `range` of `seqs` under `dist`, laid out like
    /// [`Sequences::engine_logprobs`].
    fn logprobs(
        &mut self,
        seqs: &Sequences,
        range: std::ops::Range<usize>,
        dist: TokenDistribution,
    ) -> Result<TokenArray, Cause> {
        match self {
            ReferenceModel::Engine(e) => seqs.engine_logprobs(e, range, dist),
            ReferenceModel::Base(m) => {
                let b = seqs.batch_rows(range, m.device())?;
                let out = m.next_token_outputs(&b.ids, Some(&b.attention_mask), dist)?;
                Ok(TokenArray::from_tensor(&out.logprobs)?)
            }
        }
    }
}

/// The reference actor.
pub struct Reference;

/// Its replicas and monitor.
pub struct ReferenceState {
    replicas: Replicas<ReferenceModel>,
    monitor: MonitorHandle,
    dist: TokenDistribution,
}

impl ReferenceState {
    /// State over built replicas, scoring under `dist` (the rollouts' distribution, so the
    /// KL compares like with like and is exactly 0 before the policy moves).
    pub fn new(
        replicas: Replicas<ReferenceModel>,
        monitor: MonitorHandle,
        dist: TokenDistribution,
    ) -> Self {
        Self {
            replicas,
            monitor,
            dist,
        }
    }
}

impl Actor for Reference {
    type Msg = ReferenceMsg;
    type State = ReferenceState;
    type Arguments = ReferenceState;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        a: ReferenceState,
    ) -> Result<ReferenceState, ActorProcessingErr> {
        Ok(a)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: ReferenceMsg,
        st: &mut ReferenceState,
    ) -> Result<(), ActorProcessingErr> {
        let ReferenceMsg::Logprobs { seqs, reply } = msg;
        let started = Instant::now();
        let busy = Busy::start(&st.monitor, "reference", "reference_logprobs".into());
        let n = seqs.len();
        let seqs = Arc::new(seqs);
        let dist = st.dist;
        let r = st
            .replicas
            .each("reference_logprobs", move |ctx, m| {
                let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                if range.is_empty() {
                    return Ok(None);
                }
                m.logprobs(&seqs, range, dist).map(Some)
            })
            .await
            .and_then(|parts| concat_rows("reference", "reference_logprobs", parts));
        busy.done(&r, n, started.elapsed().as_secs_f64());
        let _ = reply.send(r);
        Ok(())
    }
}

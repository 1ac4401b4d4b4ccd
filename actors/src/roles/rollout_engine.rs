//! The engine role (`placement.engine`): the policy's rollout engine as a role of its own, on
//! its own devices or node, as veRL, OpenRLHF and slime place rollout engines apart from
//! trainers. The policy then builds no engine; the stages, the evaluations and the generation
//! ahead ask `Roles::generator()` (`controller/generator.rs`), which is this role when there is
//! one.
//!
//! It generates rollouts and takes the trainer's weights at a refit as buckets
//! (`crate::batch::WeightBucket`, at most `cluster.refit_bucket_mb` each, whole tensors or
//! chunks of a bigger one, every piece with its checksum in the header metadata): every
//! bucket's pieces are checked against their checksums on arrival ([`EngineMsg::Bucket`]; a
//! mismatch is `Cause::Refit(BucketError::Checksum)`, naming the tensor and the bucket), and
//! the update is applied once all arrived ([`EngineMsg::Apply`]) with `Engine::refit`, verified
//! again by the engine's checksums of its own copy and by the trainer's log-prob probe, which
//! travels with it. A damaged or incomplete update is refused and the engine keeps its weights
//! and version. The supervisor rebuilds this role with the policy (an engine failure counts as
//! the policy's). What it does not support is refused by the recipe check
//! (`recipe/engine_placement_check.rs`). Not here: exporting the weights (`roles/policy/`) and
//! sending them (`controller/rl/refit.rs`).

use super::policy::generate;
use super::policy::EngineReplica;
use super::Busy;
use crate::batch::{Assembly, RolloutBatch, RolloutRequest, WeightBucket};
use crate::error::{Cause, RoleError};
use crate::monitor::MonitorHandle;
use crate::replicas::Replicas;
use oxalign_models::engine::{Probe, RefitReport};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::Instant;

/// The engine role's name in errors, the monitor and the supervisor.
pub(crate) const ENGINE_ROLE: &str = "engine";

/// Messages the engine role understands.
pub(crate) enum EngineMsg {
    /// Complete each sample of `request` (as the policy's own engine does).
    Generate {
        /// Prompt ids, sampling and limits of each sample.
        request: RolloutRequest,
        /// Label for the monitor.
        label: String,
        /// The samples and the weight version that generated them.
        reply: RpcReplyPort<Result<RolloutBatch, RoleError>>,
    },
    /// One bucket of update `version`, checked on arrival.
    Bucket {
        /// The update's version.
        version: u64,
        /// The bucket.
        bucket: WeightBucket,
        /// Accepted, or refused with the tensor and bucket named.
        reply: RpcReplyPort<Result<(), RoleError>>,
    },
    /// Applies the buckets of update `version` received so far, verified by `probe`.
    Apply {
        /// The update's version (must exceed the served version).
        version: u64,
        /// The trainer's log-probs of a fixed sequence.
        probe: Box<Probe>,
        /// Rank 0's report.
        reply: RpcReplyPort<Result<RefitReport, RoleError>>,
    },
}

// A local-only message (the cluster feature of ractor needs each message type to say so).
impl ractor::Message for EngineMsg {}

/// The engine role's actor.
pub(crate) struct RolloutEngine;

/// Its state: one engine replica per device and the update being received.
pub(crate) struct EngineState {
    engines: Replicas<EngineReplica>,
    monitor: MonitorHandle,
    pending: Option<Assembly>,
}

impl EngineState {
    /// State over already-built engines (one per device of `placement.engine`).
    pub fn new(engines: Replicas<EngineReplica>, monitor: MonitorHandle) -> Self {
        Self {
            engines,
            monitor,
            pending: None,
        }
    }

    /// Serves a generation off the mailbox (a refit's engine jobs queue behind it).
    fn spawn_generate(
        &self,
        request: RolloutRequest,
        label: String,
        reply: RpcReplyPort<Result<RolloutBatch, RoleError>>,
    ) {
        let (engines, monitor) = (self.engines.clone(), self.monitor.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let busy = Busy::start(&monitor, ENGINE_ROLE, label);
            let n = request.samples.len();
            let r = generate(&engines, request).await;
            busy.done(&r, n, started.elapsed().as_secs_f64());
            let _ = reply.send(r);
        });
    }

    /// Checks `bucket` into the update of `version` (a new version starts a new one). A
    /// refused bucket drops the whole update.
    async fn bucket(&mut self, version: u64, bucket: WeightBucket) -> Result<(), RoleError> {
        let mut asm = match self.pending.take() {
            Some(a) if a.version() == version => a,
            _ => Assembly::new(version),
        };
        let checked = tokio::task::spawn_blocking(move || asm.add(&bucket).map(|()| asm)).await;
        match checked {
            Ok(Ok(asm)) => {
                self.pending = Some(asm);
                Ok(())
            }
            Ok(Err(e)) => Err(refit_error(Cause::Refit(e))),
            Err(e) => Err(refit_error(Cause::Unreachable(e.to_string()))),
        }
    }

    /// Applies the update of `version` on every replica, verified.
    async fn apply(&mut self, version: u64, probe: Probe) -> Result<RefitReport, RoleError> {
        let asm = match self.pending.take() {
            Some(a) if a.version() == version => a,
            _ => Assembly::new(version),
        };
        let arrived = tokio::task::spawn_blocking(move || asm.finish())
            .await
            .map_err(|e| refit_error(Cause::Unreachable(e.to_string())))?
            .map_err(|e| refit_error(Cause::Refit(e)))?;
        let (arrived, probe) = (Arc::new(arrived), Arc::new(probe));
        let mut v = self
            .engines
            .each("refit", move |_, rep| {
                rep.refit_arrived(version, &arrived, &probe)
            })
            .await?;
        Ok(v.swap_remove(0))
    }
}

fn refit_error(cause: Cause) -> RoleError {
    RoleError::new(ENGINE_ROLE, "refit", cause)
}

impl Actor for RolloutEngine {
    type Msg = EngineMsg;
    type State = EngineState;
    type Arguments = EngineState;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        args: EngineState,
    ) -> Result<EngineState, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: EngineMsg,
        st: &mut EngineState,
    ) -> Result<(), ActorProcessingErr> {
        let started = Instant::now();
        match msg {
            EngineMsg::Generate {
                request,
                label,
                reply,
            } => st.spawn_generate(request, label, reply),
            EngineMsg::Bucket {
                version,
                bucket,
                reply,
            } => {
                let _ = reply.send(st.bucket(version, bucket).await);
            }
            EngineMsg::Apply {
                version,
                probe,
                reply,
            } => {
                let monitor = st.monitor.clone();
                let busy = Busy::start(&monitor, ENGINE_ROLE, format!("refit v{version}"));
                let r = st.apply(version, *probe).await;
                busy.done(&r, 1, started.elapsed().as_secs_f64());
                let _ = reply.send(r);
            }
        }
        Ok(())
    }
}

//! The worker's side of one connection: the role it hosts, built from a [`SpawnSpec`] by the
//! same setup code a single-process run uses (`controller::setup`), on an executor pool of
//! its own, and each [`Request`] answered by calling the role's trait. Each answer is polled
//! once as its request arrives, so the role's actor receives calls in their order on the
//! wire (the order the controller made them).

use super::spool;
use super::wire::{Request, Response, RoleKind, SpawnSpec};
use super::wire_error::WireError;
use crate::collective_groups::GroupSettings;
use crate::controller::setup::{self, RoleSources};
use crate::controller::RunError;
use crate::error::{Cause, Missing, RoleError, Unsupported};
use crate::executor::ExecutorPool;
use crate::monitor::MonitorHandle;
use crate::placement::DeviceGroup;
use crate::recipe::Recipe;
use crate::roles::{CriticRole, EngineRole, PolicyRole, ReferenceRole, RewardRole, ENGINE_LANE};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The largest refit bucket a worker reads from the spool, bytes: the upper bound of
/// `cluster.max_message_mb`, which every bucket must be below.
const MAX_BUCKET: u64 = 16384 << 20;

/// The role of one connection.
#[derive(Clone)]
pub(crate) enum Hosted {
    /// The policy.
    Policy(Arc<dyn PolicyRole>),
    /// The reference.
    Reference(Arc<dyn ReferenceRole>),
    /// The reward.
    Reward(Arc<dyn RewardRole>),
    /// The critic.
    Critic(Arc<dyn CriticRole>),
    /// The rollout engine role.
    Engine(Arc<dyn EngineRole>),
}

/// A hosted role with the executors it runs on.
pub(crate) struct HostedRole {
    /// The role.
    pub role: Hosted,
    /// Its name (`policy`, ...).
    pub name: &'static str,
    /// Its executors (this connection's own).
    pub pool: ExecutorPool,
    /// Its device group.
    pub group: DeviceGroup,
}

/// An answer being computed.
pub(crate) type Answering = Pin<Box<dyn Future<Output = Response> + Send>>;

impl HostedRole {
    /// Builds the role `spec` asks for, reporting to `monitor` (the connection's relay to
    /// the controller's monitor).
    pub async fn spawn(spec: SpawnSpec, monitor: MonitorHandle) -> Result<Self, WireError> {
        let recipe = Recipe::parse(&spec.recipe_toml, Path::new("<controller's recipe>"), &[])
            .map_err(|e| WireError::other(e.to_string(), true))?;
        let name = spec.kind.name();
        let placement: &str = match spec.kind {
            RoleKind::Policy => &recipe.placement.policy,
            RoleKind::Reference => &recipe.placement.reference,
            RoleKind::Reward => &recipe.placement.reward,
            RoleKind::Critic => &recipe.placement.critic,
            RoleKind::Engine => recipe.placement.engine.as_deref().unwrap_or_default(),
        };
        let group = DeviceGroup::parse(placement).map_err(|e| {
            WireError::other(format!("placement.{name} = {placement:?}: {e}"), true)
        })?;
        // The role's NCCL groups use the ids the controller made (`SpawnSpec::nccl_ids`).
        let groups = GroupSettings::handed(spec.nccl_ids.clone())
            .with_timeout(recipe.supervision.call_timeout());
        let pool = ExecutorPool::new().with_groups(groups);
        let role = build(&recipe, &spec, &monitor, &pool)
            .await
            .map_err(|e| match &e {
                RunError::Role { source, .. } => WireError::from(source),
                other => WireError::other(other.to_string(), other.is_bad_input()),
            })?;
        Ok(Self {
            role,
            name,
            pool,
            group,
        })
    }

    /// Stops the role (waiting at most `wait`) and retires its executors, so a job hung in
    /// one blocks nothing after it.
    pub async fn stop(&self, wait: Duration) {
        let r = match &self.role {
            Hosted::Policy(p) => p.stop(wait).await,
            Hosted::Reference(r) => r.stop(wait).await,
            Hosted::Reward(r) => r.stop(wait).await,
            Hosted::Critic(c) => c.stop(wait).await,
            Hosted::Engine(e) => e.stop(wait).await,
        };
        if let Err(e) = r {
            tracing::warn!("stopping the {}: {e}", self.name);
        }
        self.pool.faults().release_hangs();
        self.pool.retire(self.name, &self.group.specs);
        if matches!(self.name, "policy" | "engine") {
            self.pool.retire(ENGINE_LANE, &self.group.specs);
        }
    }

    /// The answer to `request`. The role's actor gets the request when the returned future
    /// is first polled, so polling each once in arrival order keeps the caller's order.
    pub fn answer(&self, request: Request) -> Answering {
        let role = self.role.clone();
        Box::pin(async move {
            match dispatch(&role, request).await {
                Ok(r) => r,
                Err(e) => Response::Failed(WireError::from(&e)),
            }
        })
    }
}

/// Builds the role through the single-process setup code.
async fn build(
    recipe: &Recipe,
    spec: &SpawnSpec,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Hosted, RunError> {
    let weights = || {
        spec.weights.clone().ok_or_else(|| {
            RunError::role(
                crate::controller::At::Setup,
                RoleError::new(
                    spec.kind.name(),
                    "setup",
                    Cause::Missing(Missing::SpawnWeights),
                ),
            )
        })
    };
    Ok(match spec.kind {
        RoleKind::Policy => {
            Hosted::Policy(setup::spawn_policy(recipe, &weights()?, monitor, pool).await?)
        }
        RoleKind::Reference => {
            Hosted::Reference(setup::spawn_reference(recipe, &weights()?, monitor, pool).await?)
        }
        RoleKind::Reward => Hosted::Reward(setup::spawn_reward(recipe, monitor, pool).await?),
        RoleKind::Critic => {
            let src = RoleSources {
                reference: weights()?,
                critic: spec.critic.clone(),
            };
            Hosted::Critic(setup::spawn_critic(recipe, &src, monitor, pool).await?)
        }
        RoleKind::Engine => {
            let engine = setup::spawn_engine(recipe, &weights()?, monitor, pool).await?;
            Hosted::Engine(engine.ok_or_else(|| {
                RunError::role(
                    crate::controller::At::Setup,
                    RoleError::new("engine", "setup", Cause::Missing(Missing::SpawnEngine)),
                )
            })?)
        }
    })
}

/// The phase names the controller uses, so a worker's errors keep them (else `remote`).
fn phase(name: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "reference_logprobs",
        "old_logprobs",
        "logprobs",
        "save",
        "save_reference",
        "save_final",
    ];
    KNOWN
        .iter()
        .find(|k| **k == name)
        .copied()
        .unwrap_or("remote")
}

fn wrong_role(role: &Hosted, request: &Request) -> RoleError {
    let name = match role {
        Hosted::Policy(_) => "policy",
        Hosted::Reference(_) => "reference",
        Hosted::Reward(_) => "reward",
        Hosted::Critic(_) => "critic",
        Hosted::Engine(_) => "engine",
    };
    let what = format!("{request:?}");
    let request: String = what.chars().take(40).collect();
    let cause = Unsupported::WrongRole {
        role: name,
        request,
    };
    RoleError::new(name, "remote", Cause::Unsupported(cause))
}

/// Calls the hosted role's trait for `request`.
async fn dispatch(role: &Hosted, request: Request) -> Result<Response, RoleError> {
    use Hosted as H;
    use Request as Q;
    Ok(match (role, request) {
        (H::Policy(p), Q::Generate { request, label }) => {
            Response::Batch(Box::new(p.generate(request, label).await?))
        }
        (H::Engine(e), Q::Generate { request, label }) => {
            Response::Batch(Box::new(e.generate(request, label).await?))
        }
        (H::Engine(e), Q::RefitBucket { version, spooled }) => {
            let bucket = tokio::task::spawn_blocking(move || spool::read(&spooled, MAX_BUCKET))
                .await
                .map_err(|e| RoleError::new("engine", "refit", Cause::Unreachable(e.to_string())))?
                .map_err(|e| RoleError::new("engine", "refit", Cause::Cluster(e.into())))?;
            e.take_bucket(version, bucket).await?;
            Response::Done
        }
        (H::Engine(e), Q::ApplyWeights { version, probe }) => {
            Response::Refit(e.apply_weights(version, *probe).await?)
        }
        (H::Policy(p), Q::Logprobs { phase: ph, seqs }) => {
            Response::Tokens(p.logprobs(phase(&ph), seqs).await?)
        }
        (H::Reference(r), Q::Logprobs { phase: ph, seqs }) => {
            Response::Tokens(r.logprobs(phase(&ph), seqs).await?)
        }
        (H::Policy(p), Q::TrainPolicy(w)) => Response::PolicyTrained(Box::new(p.train(*w).await?)),
        (
            H::Policy(p),
            Q::Sft {
                seqs,
                lr,
                max_grad_norm,
            },
        ) => Response::Sft(p.sft(seqs, lr, max_grad_norm).await?),
        (H::Policy(p), Q::Dpo(w)) => Response::Dpo(p.dpo(*w).await?),
        (H::Policy(p), Q::Refit(v)) => Response::Refit(p.refit(v).await?),
        (
            H::Policy(p),
            Q::Save {
                phase: ph,
                dir,
                optimizer,
            },
        ) => {
            p.save(phase(&ph), dir, optimizer).await?;
            Response::Done
        }
        (
            H::Critic(c),
            Q::Save {
                phase: ph,
                dir,
                optimizer,
            },
        ) => {
            c.save(phase(&ph), dir, optimizer).await?;
            Response::Done
        }
        (H::Policy(p), Q::LoadOptimizer(dir)) => load(p.load_optimizer(dir)).await?,
        (H::Critic(c), Q::LoadOptimizer(dir)) => load(c.load_optimizer(dir)).await?,
        (H::Reward(w), Q::Rewards(r)) => Response::Rewards(w.rewards(r).await?),
        (H::Critic(c), Q::Values(seqs)) => Response::Tokens(c.values(seqs).await?),
        (H::Critic(c), Q::TrainCritic(w)) => Response::CriticTrained(c.train(*w).await?),
        (role, request) => return Err(wrong_role(role, &request)),
    })
}

async fn load(f: impl Future<Output = Result<(), RoleError>>) -> Result<Response, RoleError> {
    f.await?;
    Ok(Response::Done)
}

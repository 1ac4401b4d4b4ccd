//! [`Remote`]: a role hosted by a worker on another node (or process), behind the same
//! traits as a local one (`roles/api.rs`), so the controller's loop does not change. Each
//! remote role has its own connection; each call is one request, bounded by the recipe's
//! `[supervision] call_timeout_s`, and a lost connection fails the call at once with
//! [`Cause::Cluster`]. The worker loads the weights itself from the paths the spawn request
//! names (a shared filesystem, as a cluster's run folder is), so no weights travel. What the
//! role reports to the worker's monitor (status, throughput, spans) reaches the controller's.
//! [`Remote::spawn`] sends the recipe (the role's placement reduced to the worker's devices,
//! no `[cluster]`, model paths made absolute) and the weights folders. A role whose placed
//! node accepts no connection moves to the first spare node that fits (`open_placed_or_spare`,
//! `spare_fit.rs`).

use super::connection::{Connection, Endpoint};
use super::error::ClusterError;
use super::error::{PassedOver, Unfit};
use super::spare_fit::fit;
use super::spool::{self, Spool};
use super::wire::{Request, Response, RoleKind, SpawnSpec};
use crate::batch::{
    RolloutBatch, RolloutRequest, Sequences, TokenArray, WeightBucket, WeightExport,
};
use crate::collective_groups;
use crate::error::{Cause, RoleError, LOAD_OPTIMIZER};
use crate::monitor::{ActorInfo, MonitorHandle};
use crate::placement::{DeviceGroup, RolePlacement};
use crate::recipe::{ClusterSection, PlacementSection, Recipe};
use crate::roles::{
    CriticTrainSummary, CriticWork, DpoSummary, DpoWork, ExportWeights, Generate, Logprobs,
    Persist, PolicyTrainSummary, PolicyWork, Refit, RewardRequest, Rewards, SftStepSummary, Stop,
    TakeWeights, TrainCritic, TrainPolicy, Values,
};
use async_trait::async_trait;
use oxalign_kernels::collective::NcclUniqueId;
use oxalign_kernels::device::DeviceSpec;
use oxalign_models::engine::{Probe, RefitReport};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A role served by a worker.
pub(crate) struct Remote {
    role: &'static str,
    conn: Connection,
    timeout: Duration,
    /// Where refit buckets for an engine role wait (the run folder's spool).
    spool: Spool,
}

/// Where a spawned role's weights come from.
#[derive(Debug, Clone, Default)]
pub(crate) struct RemoteSources<'a> {
    /// The policy's or reference's weights, or the critic's backbone.
    pub weights: Option<&'a Path>,
    /// The critic's own weights.
    pub critic: Option<&'a Path>,
}

impl Remote {
    /// Connects to `node` of the recipe's `[cluster]` (waiting up to
    /// `cluster.connect_timeout_s` for its worker), or to a spare that has the devices (see
    /// [`open_placed_or_spare`]), and has it build role `kind` on the devices its placement
    /// names there.
    pub async fn spawn(
        recipe: &Recipe,
        kind: RoleKind,
        node: &str,
        src: RemoteSources<'_>,
        monitor: &MonitorHandle,
    ) -> Result<Self, RoleError> {
        let role = kind.name();
        let fail = |cause: Cause| RoleError::new(role, "setup", cause);
        let on_worker = worker_recipe(recipe, kind);
        let devices = placement(&on_worker.placement, kind);
        let wanted = DeviceGroup::parse_unopened(devices).map_err(|source| {
            fail(Cause::Placement {
                role: Some(role),
                spec: Some(devices.to_string()),
                source,
            })
        })?;
        let timeout = recipe.supervision.call_timeout();
        let placed = Placed {
            node,
            role,
            wanted: &wanted.specs,
        };
        let (conn, node) = open_placed_or_spare(&recipe.cluster, placed, timeout, monitor)
            .await
            .map_err(&fail)?;
        let node = node.as_str();
        let spec = SpawnSpec {
            kind,
            nccl_ids: nccl_ids(&on_worker, kind).map_err(&fail)?,
            recipe_toml: on_worker.to_toml(),
            weights: src.weights.map(absolute),
            critic: src.critic.map(absolute),
            owner: conn.owner().to_string(),
            events: conn.events_group(),
        };
        let remote = Self {
            role,
            conn,
            timeout,
            spool: Spool::new(&recipe.run_dir()),
        };
        match remote.call("setup", Request::Spawn(Box::new(spec))).await? {
            Response::Spawned(devices) => {
                let names = devices.iter().map(|d| format!("{node}/{d}")).collect();
                monitor.report(ActorInfo::new(role, role, names));
                remote.conn.watch_as(role);
                Ok(remote)
            }
            other => Err(remote.unexpected("setup", &other)),
        }
    }

    async fn call(&self, phase: &'static str, request: Request) -> Result<Response, RoleError> {
        let node = self.conn.node();
        match self.conn.call(request, self.timeout).await {
            None => Err(RoleError::new(
                self.role,
                phase,
                Cause::Timeout {
                    seconds: Some(self.timeout.as_secs_f64()),
                },
            )),
            Some(Err(e)) => Err(RoleError::new(self.role, phase, Cause::Cluster(e))),
            Some(Ok(Response::Failed(e))) => Err(e.into_role_error(self.role, phase, node)),
            Some(Ok(r)) => Ok(r),
        }
    }

    fn unexpected(&self, phase: &'static str, r: &Response) -> RoleError {
        let what = format!("{r:?}");
        let what: String = what.chars().take(80).collect();
        RoleError::new(
            self.role,
            phase,
            Cause::Remote {
                node: self.conn.node().to_string(),
                message: format!("answered {what}… to a {phase} call"),
                bad_input: false,
            },
        )
    }
}

/// The NCCL ids the controller makes for role `kind` on the worker (see
/// `crate::collective_groups`): one per collective group the role builds there (the policy
/// two, for its trainers and its engines), none unless its devices are several GPUs.
fn nccl_ids(on_worker: &Recipe, kind: RoleKind) -> Result<Vec<NcclUniqueId>, Cause> {
    let groups = match kind {
        RoleKind::Policy => 2,
        _ => 1,
    };
    // Parsed, not opened: the GPUs are the worker's (a CPU-only controller build then
    // says it cannot make NCCL ids, rather than handing the worker none).
    match DeviceGroup::parse_unopened(placement(&on_worker.placement, kind)) {
        Ok(g) => collective_groups::ids_for(&g.specs, groups),
        // The worker reports a bad placement with its own message.
        Err(_) => Ok(Vec::new()),
    }
}

/// The placement string of role `kind` in `p` (the engine's falls back to the policy's).
fn placement(p: &PlacementSection, kind: RoleKind) -> &str {
    match kind {
        RoleKind::Policy => &p.policy,
        RoleKind::Reference => &p.reference,
        RoleKind::Reward => &p.reward,
        RoleKind::Critic => &p.critic,
        RoleKind::Engine => p.engine.as_ref().unwrap_or(&p.policy),
    }
}

/// A role to place: the node its placement names, its name, and its devices there.
#[derive(Clone, Copy)]
struct Placed<'a> {
    node: &'a str,
    role: &'a str,
    wanted: &'a [DeviceSpec],
}

/// A connection to the worker of `placed.node`, or, when none accepts there within the
/// connect timeout, to the first of `cluster.spare_nodes` that accepts and whose inventory
/// has the role's devices free (`spare_fit.rs`; asked within `timeout`); with the name of
/// the node that accepted. A spare passed over is named on stderr with why. Errors with the
/// placed node's failure when no spare is listed, else with [`ClusterError::NoSpare`].
async fn open_placed_or_spare(
    c: &ClusterSection,
    placed: Placed<'_>,
    timeout: Duration,
    monitor: &MonitorHandle,
) -> Result<(Connection, String), Cause> {
    let Placed { node, role, wanted } = placed;
    let failed = match Connection::open_reporting(&endpoint(c, node)?, monitor.clone()).await {
        Ok(conn) => return Ok((conn, node.to_string())),
        Err(e) => e,
    };
    let mut passed = Vec::new();
    for spare in c.spare_nodes.iter().filter(|s| *s != node) {
        let ep = endpoint(c, spare)?;
        match open_spare(&ep, wanted, timeout, monitor).await {
            Ok(conn) => {
                eprintln!("{role}: node {node} accepted no connection ({failed}); it runs on the spare {spare}");
                return Ok((conn, spare.clone()));
            }
            Err(why) => {
                let p = PassedOver {
                    spare: spare.clone(),
                    why,
                };
                eprintln!("{role}: node {node} accepted no connection; passed over {p}");
                passed.push(p);
            }
        }
    }
    if passed.is_empty() {
        return Err(Cause::Cluster(failed));
    }
    Err(Cause::Cluster(ClusterError::NoSpare {
        role: role.to_string(),
        placed: Box::new(failed),
        passed,
    }))
}

/// A connection to spare `ep` when its worker's inventory fits `wanted`; else why not.
/// A spare that does not fit is dropped before a spawn (its worker builds nothing).
async fn open_spare(
    ep: &Endpoint,
    wanted: &[DeviceSpec],
    timeout: Duration,
    monitor: &MonitorHandle,
) -> Result<Connection, Unfit> {
    let conn = Connection::open_reporting(ep, monitor.clone())
        .await
        .map_err(|e| Unfit::Unreachable(Box::new(e)))?;
    let inventory = match conn.call(Request::Inventory, timeout).await {
        Some(Ok(Response::Inventory(i))) => i,
        Some(Ok(other)) => {
            return Err(Unfit::Unreachable(Box::new(ClusterError::Protocol {
                node: ep.node.clone(),
                addr: ep.addr.clone(),
                message: format!("answered {} to an inventory request", other.kind()),
            })))
        }
        Some(Err(e)) => return Err(Unfit::Unreachable(Box::new(e))),
        None => {
            return Err(Unfit::Silent {
                seconds: timeout.as_secs_f64(),
            })
        }
    };
    fit(wanted, &inventory)?;
    Ok(conn)
}

/// The address, cookie and frame cap of `node`.
fn endpoint(c: &ClusterSection, node: &str) -> Result<Endpoint, Cause> {
    let nodes = c.resolved_nodes()?;
    let addr = nodes.get(node).ok_or_else(|| Cause::NoSuchNode {
        node: node.to_string(),
    })?;
    Ok(Endpoint {
        node: node.to_string(),
        addr: addr.clone(),
        cookie: c.cookie(),
        max_frame: c.max_message_bytes(),
        patience: c.connect_timeout(),
        tls: c.tls().map_err(|e| Cause::Cluster(e.into()))?,
    })
}

/// The recipe a worker builds role `kind` from: its placement reduced to the devices on the
/// node, no `[cluster]`, and the model folders absolute (the worker may run elsewhere).
fn worker_recipe(recipe: &Recipe, kind: RoleKind) -> Recipe {
    let mut r = recipe.clone();
    let p = &mut r.placement;
    let slot = match kind {
        RoleKind::Policy => Some(&mut p.policy),
        RoleKind::Reference => Some(&mut p.reference),
        RoleKind::Reward => Some(&mut p.reward),
        RoleKind::Critic => Some(&mut p.critic),
        RoleKind::Engine => p.engine.as_mut(),
    };
    if let Some(slot) = slot {
        *slot = RolePlacement::parse(slot).devices.to_string();
    }
    r.cluster = ClusterSection::default();
    let m = &mut r.model;
    for path in [
        &mut m.path,
        &mut m.reward_path,
        &mut m.critic_path,
        &mut m.teacher_path,
    ]
    .into_iter()
    .flatten()
    {
        *path = absolute(Path::new(path)).display().to_string();
    }
    r
}

/// `p` made absolute against this process's folder (unchanged when that fails).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[async_trait]
impl Stop for Remote {
    /// Stops the role on the worker; a worker already gone counts as stopped.
    async fn stop(&self, wait: Duration) -> Result<(), RoleError> {
        let ms = wait.as_millis() as u64;
        match self.conn.call(Request::Stop(ms), wait).await {
            Some(Ok(Response::Failed(e))) => {
                Err(e.into_role_error(self.role, "restart", self.conn.node()))
            }
            // Gone already, or not answering: dropping the connection makes the worker
            // stop the role as soon as it reads again.
            Some(Ok(_)) | Some(Err(_)) | None => Ok(()),
        }
    }

    fn shutdown(&self) {
        self.conn.notify(Request::Stop(0));
    }

    /// Waits (at most [`FINISH_WAIT`]) until the worker has stopped the role and relayed
    /// its last reports, which travel apart from the answers to its calls.
    async fn finish(&self) {
        let _ = self.stop(FINISH_WAIT).await;
    }
}

/// How long the end of a run waits for a remote role to stop and relay its last reports.
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// Unwraps the expected answer variant or names what came instead.
macro_rules! expect {
    ($self:ident, $phase:expr, $request:expr, $variant:ident($v:ident) => $out:expr) => {
        match $self.call($phase, $request).await? {
            Response::$variant($v) => Ok($out),
            other => Err($self.unexpected($phase, &other)),
        }
    };
}

#[async_trait]
impl Generate for Remote {
    async fn generate(
        &self,
        request: RolloutRequest,
        label: String,
    ) -> Result<RolloutBatch, RoleError> {
        let req = Request::Generate { request, label };
        expect!(self, "generate", req, Batch(b) => *b)
    }
}

#[async_trait]
impl Logprobs for Remote {
    async fn logprobs(
        &self,
        phase: &'static str,
        seqs: Sequences,
    ) -> Result<TokenArray, RoleError> {
        let req = Request::Logprobs {
            phase: phase.into(),
            seqs,
        };
        expect!(self, phase, req, Tokens(t) => t)
    }
}

#[async_trait]
impl Rewards for Remote {
    async fn rewards(&self, r: RewardRequest) -> Result<Vec<f32>, RoleError> {
        let req = Request::Rewards(r);
        expect!(self, "reward", req, Rewards(v) => v)
    }
}

#[async_trait]
impl Values for Remote {
    async fn values(&self, seqs: Sequences) -> Result<TokenArray, RoleError> {
        expect!(self, "values", Request::Values(seqs), Tokens(t) => t)
    }
}

#[async_trait]
impl TrainPolicy for Remote {
    async fn train(&self, work: PolicyWork) -> Result<PolicyTrainSummary, RoleError> {
        let req = Request::TrainPolicy(Box::new(work));
        expect!(self, "policy_train", req, PolicyTrained(s) => *s)
    }

    async fn sft(
        &self,
        seqs: Sequences,
        lr: f64,
        max_grad_norm: f64,
    ) -> Result<SftStepSummary, RoleError> {
        let req = Request::Sft {
            seqs,
            lr,
            max_grad_norm,
        };
        expect!(self, "sft", req, Sft(s) => s)
    }

    async fn dpo(&self, work: DpoWork) -> Result<DpoSummary, RoleError> {
        expect!(self, "dpo", Request::Dpo(Box::new(work)), Dpo(s) => s)
    }
}

#[async_trait]
impl TrainCritic for Remote {
    async fn train(&self, work: CriticWork) -> Result<CriticTrainSummary, RoleError> {
        let req = Request::TrainCritic(Box::new(work));
        expect!(self, "critic_train", req, CriticTrained(s) => s)
    }
}

#[async_trait]
impl Refit for Remote {
    async fn refit(&self, version: u64) -> Result<RefitReport, RoleError> {
        expect!(self, "refit", Request::Refit(version), Refit(r) => r)
    }
}

#[async_trait]
impl TakeWeights for Remote {
    async fn take_bucket(&self, version: u64, bucket: WeightBucket) -> Result<(), RoleError> {
        let (spool, slot) = (self.spool.clone(), self.conn.slot());
        let spooled = tokio::task::spawn_blocking(move || spool.write(slot, version, &bucket))
            .await
            .map_err(|e| RoleError::new(self.role, "refit", Cause::Unreachable(e.to_string())))?
            .map_err(|e| RoleError::new(self.role, "refit", Cause::Cluster(e.into())))?;
        let req = Request::RefitBucket {
            version,
            spooled: spooled.clone(),
        };
        let answer = self.call("refit", req).await;
        spool::remove(&spooled);
        match answer? {
            Response::Done => Ok(()),
            other => Err(self.unexpected("refit", &other)),
        }
    }

    async fn apply_weights(&self, version: u64, probe: Probe) -> Result<RefitReport, RoleError> {
        let req = Request::ApplyWeights {
            version,
            probe: Box::new(probe),
        };
        expect!(self, "refit", req, Refit(r) => r)
    }
}

/// A policy on a worker does not export its weights to an engine role (the recipe check
/// refuses `placement.engine` with a policy on a node).
#[async_trait]
impl ExportWeights for Remote {
    async fn export_weights(&self, _: u64, _: usize) -> Result<WeightExport, RoleError> {
        Err(RoleError::new(
            self.role,
            "refit",
            Cause::Unsupported(crate::error::Unsupported::ExportFromNode),
        ))
    }
}

#[async_trait]
impl Persist for Remote {
    async fn save(
        &self,
        phase: &'static str,
        dir: PathBuf,
        optimizer: bool,
    ) -> Result<(), RoleError> {
        let req = Request::Save {
            phase: phase.into(),
            dir: absolute(&dir),
            optimizer,
        };
        match self.call(phase, req).await? {
            Response::Done => Ok(()),
            other => Err(self.unexpected(phase, &other)),
        }
    }

    async fn load_optimizer(&self, dir: PathBuf) -> Result<(), RoleError> {
        let req = Request::LoadOptimizer(absolute(&dir));
        match self.call(LOAD_OPTIMIZER, req).await? {
            Response::Done => Ok(()),
            other => Err(self.unexpected(LOAD_OPTIMIZER, &other)),
        }
    }
}

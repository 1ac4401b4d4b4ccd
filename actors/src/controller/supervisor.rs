//! Supervision of the roles during RL steps: which failures are retried, the restart budget,
//! and rebuilding roles from the newest checkpoint. The loop that calls it is `rl/run_loop.rs`;
//! the failures that exercise it on purpose are `faults.rs`'s.
//!
//! A role's panic, error or timeout during an RL step is retried: the failed role is respawned
//! (never reused: its replicas may be poisoned, its executor hung), the policy and critic are
//! rewound to the newest checkpoint when they may have moved past it, the loop state is read
//! back from that checkpoint, and the steps since it are replayed with the same seeds (a pure
//! function of run seed, step and index), so no rollout is applied twice and none is lost.
//! Divergence, bad input and the controller's own failures are not retried.
//!
//! How a failure reaches it:
//! * Every role call (`roles::ask`) has a time limit, `[supervision] call_timeout_s`; a late
//!   answer is `Cause::Timeout`, and the controller adds the step.
//! * A panic in an executor job is caught by the executor. The replica's state behind its mutex
//!   is then poisoned, and `Replicas::each` refuses it (`Cause::Poisoned`) instead of reusing
//!   it. A replica whose job fails or panics aborts its collective, so data-parallel peers
//!   waiting for it are released at once.
//! * A role's collective group follows its devices (`collective_groups.rs`, via `Replicas::new`
//!   and `replicas::collective_group`): several CUDA devices get an NCCL group, anything else
//!   the thread group. Every collective call has a time limit (`GroupSettings`: the recipe's
//!   `supervision.call_timeout_s`, in the controller and on workers); a collective failure is
//!   `Cause::Collective` (in the trainers `RlhfError::Collective`), a failure retried here,
//!   never bad input. The NCCL id is the controller's: it makes one when the role is in its
//!   process, and for a role on a worker it puts one per group in the spawn request
//!   (`SpawnSpec::nccl_ids`), which the worker's pool hands to the groups it builds. All ranks
//!   of a group are in one process; communicator creation has no time limit of its own beyond
//!   the creating call's wait.
//! * A role on a worker node (`Remote`) fails at once when its connection breaks (the worker
//!   died: `ClusterError::Lost`), or at the call timeout when the worker stops answering.
//!
//! What the loop then does:
//! * it kills the failed role and retires its executors (detached, so a hung job blocks no
//!   one), and respawns it; a failure of the engine role (`placement.engine`) counts as the
//!   policy's, and the engine is rebuilt with it;
//! * it also rebuilds the roles placed on the same node ([`colocated`]), connecting to the
//!   node's address again and waiting up to `cluster.connect_timeout_s` for a worker to be
//!   there; if none comes and no spare node can take the role (`cluster/remote.rs`), the run
//!   fails with exit 1 and the `--resume` command;
//! * it does the same for the policy and the critic when they may hold updates the newest
//!   checkpoint does not (steps since it, or a failure in `policy_train`, `critic_train` or
//!   `refit`), restoring them from that checkpoint with their optimizer states, as `--resume`
//!   does; a rebuilt policy refits its engine as the checkpoint's version;
//! * it reads the loop state back from that checkpoint and replays the steps since it. Replayed
//!   steps are not reported again; the failed step's line carries `restarts`.
//!
//! A role failing while an RL checkpoint is written (its save) is handled the same way: the
//! roles are rebuilt from the previous checkpoint and the steps since it replayed; the restart
//! is counted on the next step's line. An I/O error sealing or publishing the checkpoint is not
//! replayed (the save retries it, `run/retry.rs`).
//!
//! The restart budget ([`Budget`]) allows `max_restarts` restarts within `restart_window`
//! steps. Past it the run fails with `RunError::RestartBudget` (exit 1, with the `--resume`
//! hint). The monitor counts each respawn of an actor (`ActorUpdate::restarting`; registering a
//! respawned actor again keeps its count).
//!
//! `[[faults]]` (`faults.rs`) is a plan shared through the `ExecutorPool`. The loop sets the
//! running step; rank 0's job checks the plan on its executor thread before its work and
//! panics, fails or hangs once. Outside RL steps it never fires, and only in the controller's
//! process (not on workers).

use crate::cluster::ClusterError;
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::run::checkpoint::{self, LoopState};
use crate::controller::run::saving::{load_critic_optimizer, load_policy_optimizer};
use crate::controller::setup::{self, RoleSources, Roles};
use crate::error::{Cause, RoleError};
use crate::executor::ExecutorPool;
use crate::monitor::ActorUpdate;
use crate::placement::{DeviceGroup, RolePlacement};
use crate::recipe::{role_placements, Recipe, SupervisionSection};
use crate::roles::{ENGINE_LANE, ENGINE_ROLE};
use std::path::Path;
use std::time::Duration;

/// How long a killed actor may take to stop.
const KILL_WAIT: Duration = Duration::from_secs(30);

/// A retried failure: the role and the phase that failed.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// `policy`, `reference`, `reward` or `critic`.
    pub role: String,
    /// The phase it failed in (`policy_train`, `reward`, ...).
    pub phase: &'static str,
}

/// The restart budget: at most `max_restarts` restarts within `restart_window` RL steps.
pub(crate) struct Budget {
    max: u32,
    window: u64,
    /// The RL step of each restart so far.
    restarts: Vec<u64>,
}

impl Budget {
    /// The budget of `[supervision]`.
    pub(crate) fn new(s: &SupervisionSection) -> Self {
        Self {
            max: s.max_restarts,
            window: s.restart_window,
            restarts: Vec::new(),
        }
    }

    /// Charges a restart for `e` at RL step `step`. Returns `e` itself when it is not
    /// retried, and [`RunError::RestartBudget`] when the budget is spent.
    pub(crate) fn charge(&mut self, step: u64, e: RunError) -> Result<Failure, RunError> {
        let Some(failure) = retried(&e) else {
            return Err(e);
        };
        let window = self.window;
        self.restarts.retain(|s| s + window > step);
        if self.restarts.len() >= self.max as usize {
            return Err(RunError::RestartBudget {
                max: self.max,
                window,
                source: Box::new(e),
            });
        }
        self.restarts.push(step);
        Ok(failure)
    }

    /// Restarts charged within the window ending at the last charged step.
    pub(crate) fn used(&self) -> usize {
        self.restarts.len()
    }

    /// The most restarts the window allows.
    pub(crate) fn max(&self) -> u32 {
        self.max
    }
}

/// The failed role when `e` is retried: a role's own failure that is neither bad input nor
/// a divergence.
fn retried(e: &RunError) -> Option<Failure> {
    let RunError::Role { source, .. } = e else {
        return None;
    };
    let role_known =
        ["policy", "reference", "reward", "critic", ENGINE_ROLE].contains(&source.role.as_str());
    let diverged = matches!(*source.cause, Cause::Diverged(_));
    // The engine role is rebuilt with the policy (its weights come from the policy's
    // checkpoint).
    let role = match source.role.as_str() {
        ENGINE_ROLE => "policy".to_string(),
        other => other.to_string(),
    };
    (role_known && !diverged && !source.is_bad_input()).then_some(Failure {
        role,
        phase: source.phase,
    })
}

/// The roles to respawn after `failure`: the failed one and those on its node (`colocated`,
/// see [`colocated`]: a lost worker took them all), and the policy and critic when they may
/// hold updates the checkpoint does not (`moved`: steps completed since it, or the failure
/// came in the update or refit, after one of them may have updated).
pub(crate) fn to_respawn(
    failure: &Failure,
    colocated: &[&str],
    moved: bool,
    ppo: bool,
) -> Vec<&'static str> {
    let updating = matches!(failure.phase, "policy_train" | "critic_train" | "refit");
    let rewind = moved || updating;
    ["policy", "reference", "reward", "critic"]
        .into_iter()
        .filter(|r| *r != "critic" || ppo)
        .filter(|r| {
            *r == failure.role
                || colocated.contains(r)
                || (rewind && matches!(*r, "policy" | "critic"))
        })
        .collect()
}

/// The roles placed on the same worker node as `role`; none when `role` is in this process.
pub(crate) fn colocated(recipe: &Recipe, role: &str) -> Vec<&'static str> {
    let placements = role_placements(recipe);
    let node_of = |name: &str| {
        placements
            .iter()
            .find(|(r, _)| *r == name)
            .and_then(|(_, p)| RolePlacement::parse(p).node)
    };
    // The engine role (rebuilt with the policy) may sit on a node of its own.
    let engine_node = recipe
        .placement
        .engine
        .as_deref()
        .and_then(|p| RolePlacement::parse(p).node);
    let mut nodes: Vec<&str> = node_of(role).into_iter().collect();
    if role == "policy" {
        nodes.extend(engine_node);
    }
    let mut out: Vec<&'static str> = placements
        .iter()
        .filter(|(r, p)| {
            *r != role
                && RolePlacement::parse(p)
                    .node
                    .is_some_and(|n| nodes.contains(&n))
        })
        .map(|(r, _)| *r)
        .collect();
    let engine_here = engine_node.is_some_and(|n| nodes.contains(&n));
    if role != "policy" && engine_here && !out.contains(&"policy") {
        out.push("policy");
    }
    out
}

/// Respawns `names` from the checkpoint `ckpt` (policy and critic with their optimizer
/// states; reference and reward from their sources), retiring their executors, and returns
/// the loop state of `ckpt` to replay from. Each respawn counts one restart in the monitor.
/// A failure to rebuild stops the run, named at RL step `step`.
pub(crate) async fn rebuild(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    roles: &mut Roles,
    names: &[&'static str],
    ckpt: &Path,
    step: u64,
) -> Result<LoopState, RunError> {
    // No retired thread stays blocked in an injected hang.
    pool.faults().release_hangs();
    for name in names {
        ctx.monitor.report(ActorUpdate::restarting(*name));
        rebuild_one(ctx, pool, roles, name, ckpt)
            .await
            .map_err(|e| match e {
                RunError::Role { source, .. } => {
                    RunError::role(At::Rl(step), no_worker_failed(source))
                }
                other => other,
            })?;
    }
    Ok(checkpoint::read_state(ckpt)?)
}

/// A node whose worker did not come back (and no spare that could take its roles) fails
/// the run (exit 1, with the `--resume` command), where at the start of a run it is the
/// user's setup (exit 2).
fn no_worker_failed(mut e: RoleError) -> RoleError {
    let no_worker = |c: &ClusterError| matches!(c, ClusterError::NoWorker { .. });
    let gone = match &*e.cause {
        Cause::Cluster(ClusterError::NoSpare { placed, .. }) => no_worker(placed),
        Cause::Cluster(c) => no_worker(c),
        _ => false,
    };
    if gone {
        e.cause = Box::new(Cause::Unreachable(e.cause.to_string()));
    }
    e
}

/// Stops role `name`, retires its executors and spawns it again.
async fn rebuild_one(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    roles: &mut Roles,
    name: &'static str,
    ckpt: &Path,
) -> Result<(), RunError> {
    stop(roles, name).await?;
    let placement = RolePlacement::parse(placement_of(ctx, name));
    let group = placement.device_group().map_err(|source| {
        let cause = Cause::Placement {
            role: None,
            spec: None,
            source,
        };
        RunError::role(At::Setup, RoleError::new(name, "restart", cause))
    })?;
    // A role on a node runs on that worker's executors, which its worker retires.
    if placement.node.is_none() {
        pool.retire(name, &group.specs);
        if name == "policy" {
            pool.retire(ENGINE_LANE, &group.specs);
        }
    }
    // The engine role goes down and comes back with the policy.
    if let (Some(spec), "policy") = (&ctx.recipe.placement.engine, name) {
        let placed = RolePlacement::parse(spec);
        if let (None, Ok(g)) = (placed.node, DeviceGroup::parse(placed.devices)) {
            pool.retire(ENGINE_LANE, &g.specs);
        }
    }
    respawn(ctx, pool, roles, name, ckpt).await
}

/// `placement.<name>` of the recipe.
fn placement_of<'a>(ctx: &Ctx<'a>, name: &str) -> &'a str {
    let p = &ctx.recipe.placement;
    match name {
        "policy" => &p.policy,
        "reference" => &p.reference,
        "reward" => &p.reward,
        _ => &p.critic,
    }
}

/// Kills role `name` (ending a hung call) and waits until it is gone.
async fn stop(roles: &Roles, name: &str) -> Result<(), RunError> {
    let r = match name {
        "policy" => match &roles.engine {
            Some(e) => match e.stop(KILL_WAIT).await {
                Ok(()) => roles.policy.stop(KILL_WAIT).await,
                Err(e) => Err(e),
            },
            None => roles.policy.stop(KILL_WAIT).await,
        },
        "reference" => roles.reference.stop(KILL_WAIT).await,
        "reward" => roles.reward.stop(KILL_WAIT).await,
        _ => match &roles.critic {
            Some(c) => c.stop(KILL_WAIT).await,
            None => Ok(()),
        },
    };
    r.map_err(|e| RunError::role(At::Setup, e))
}

/// Spawns role `name` again into `roles`, from `ckpt` for the policy and critic.
async fn respawn(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    roles: &mut Roles,
    name: &str,
    ckpt: &Path,
) -> Result<(), RunError> {
    let (r, m) = (ctx.recipe, ctx.monitor);
    match name {
        "policy" => {
            let dir = ckpt.join("policy");
            let p = setup::spawn_policy(r, &dir, m, pool).await?;
            load_policy_optimizer(&*p, dir.clone()).await?;
            roles.policy = p;
            roles.engine = setup::spawn_engine(r, &dir, m, pool).await?;
        }
        "reference" => {
            let dir = setup::reference_weights(ctx)?;
            roles.reference = setup::spawn_reference(r, &dir, m, pool).await?;
        }
        "reward" => roles.reward = setup::spawn_reward(r, m, pool).await?,
        _ => {
            let src = RoleSources {
                reference: ctx.run_dir.join("reference"),
                critic: Some(ckpt.join("critic")),
            };
            let c = setup::spawn_critic(r, &src, m, pool).await?;
            load_critic_optimizer(&*c, ckpt.join("critic")).await?;
            roles.critic = Some(c);
        }
    }
    Ok(())
}

/// The message shown when a step is replayed.
pub(crate) fn restart_note(
    step: u64,
    e: &str,
    names: &[&str],
    ckpt: &Path,
    budget: &Budget,
) -> String {
    format!(
        "warning: {e}\nrestarting {} from {} and replaying up to RL step {step} (restart {} of {} allowed in the window)",
        names.join(", "),
        ckpt.display(),
        budget.used(),
        budget.max()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(role: &str, phase: &'static str) -> Failure {
        Failure {
            role: role.into(),
            phase,
        }
    }

    #[test]
    fn only_the_failed_role_unless_the_policy_may_have_moved() {
        assert_eq!(
            to_respawn(&failure("reward", "reward"), &[], false, true),
            ["reward"]
        );
        assert_eq!(
            to_respawn(&failure("reward", "reward"), &[], true, true),
            ["policy", "reward", "critic"]
        );
        assert_eq!(
            to_respawn(&failure("critic", "critic_train"), &[], false, true),
            ["policy", "critic"]
        );
        assert_eq!(
            to_respawn(&failure("policy", "policy_train"), &[], false, false),
            ["policy"]
        );
        assert_eq!(
            to_respawn(
                &failure("reference", "reference_logprobs"),
                &["reward", "critic"],
                false,
                true
            ),
            ["reference", "reward", "critic"]
        );
    }

    #[test]
    fn a_node_gone_with_no_spare_to_stand_in_fails_the_run_not_the_setup() {
        use crate::cluster::{PassedOver, Unfit};
        use oxalign_kernels::device::DeviceSpec;
        let no_worker = |node: &str| ClusterError::NoWorker {
            node: node.into(),
            addr: "127.0.0.1:9".into(),
            waited_s: 1.0,
            last: "connection refused".into(),
        };
        let lacks = Unfit::Lacks {
            wanted: vec![DeviceSpec::cuda(0)],
            missing: vec![DeviceSpec::cuda(0)],
            has: vec![DeviceSpec::cpu(0)],
        };
        let no_spare = |placed| {
            Cause::Cluster(ClusterError::NoSpare {
                role: "reference".into(),
                placed: Box::new(placed),
                passed: vec![PassedOver {
                    spare: "node3".into(),
                    why: Unfit::Unreachable(Box::new(no_worker("node3"))),
                }],
            })
        };
        let cause = Cause::Cluster(ClusterError::NoSpare {
            role: "reference".into(),
            placed: Box::new(no_worker("node2")),
            passed: vec![PassedOver {
                spare: "node3".into(),
                why: lacks,
            }],
        });
        // At the start of a run: the user's setup (exit 2).
        assert!(cause.is_bad_input());
        // On a restart: a failure of the run (exit 1, with the `--resume` command), still
        // naming the spare and why it was passed over.
        let e = no_worker_failed(RoleError::new("reference", "restart", cause));
        assert!(matches!(*e.cause, Cause::Unreachable(_)), "{e}");
        assert!(!e.cause.is_bad_input());
        let msg = e.to_string();
        assert!(
            msg.contains("node node2 (127.0.0.1:9): no worker accepted"),
            "{msg}"
        );
        assert!(
            msg.contains(
                "no spare node can host the reference: spare node3: lacks cuda:0 (wants \
                 cuda:0; has cpu:0)"
            ),
            "{msg}"
        );
        let e = no_worker_failed(RoleError::new(
            "reference",
            "restart",
            no_spare(no_worker("node2")),
        ));
        assert!(matches!(*e.cause, Cause::Unreachable(_)), "{e}");
        // A refused cookie stays the user's to fix.
        let refused = ClusterError::Refused {
            node: "node2".into(),
            addr: "127.0.0.1:9".into(),
            reason: "wrong or missing cookie".into(),
        };
        let e = no_worker_failed(RoleError::new("reference", "restart", no_spare(refused)));
        assert!(e.cause.is_bad_input(), "{e}");
    }

    #[test]
    fn roles_on_one_node_go_down_together() {
        let mut r = Recipe::default();
        r.placement.policy = "node1:cpu".into();
        r.placement.reference = "node2:cpu".into();
        r.placement.reward = "node2:cpu".into();
        assert_eq!(colocated(&r, "reference"), ["reward"]);
        assert_eq!(colocated(&r, "policy"), Vec::<&str>::new());
        assert_eq!(
            colocated(&r, "critic"),
            Vec::<&str>::new(),
            "in this process"
        );
    }

    #[test]
    fn the_budget_counts_restarts_in_a_window_of_steps() {
        let s = SupervisionSection {
            call_timeout_s: 1.0,
            max_restarts: 2,
            restart_window: 3,
        };
        let mut b = Budget::new(&s);
        let fail = || {
            RunError::role(
                At::Rl(1),
                RoleError::new("reward", "reward", Cause::Injected("error".into())),
            )
        };
        assert!(b.charge(1, fail()).is_ok());
        assert!(b.charge(2, fail()).is_ok());
        let spent = b.charge(3, fail()).unwrap_err();
        assert!(matches!(spent, RunError::RestartBudget { .. }), "{spent}");
        assert!(b.charge(5, fail()).is_ok(), "steps 1 and 2 left the window");
        let bad = RunError::role(
            At::Rl(6),
            RoleError::new(
                "reward",
                "reward",
                Cause::Missing(crate::error::Missing::SftAnswers),
            ),
        );
        assert!(
            matches!(b.charge(6, bad), Err(RunError::Role { .. })),
            "not retried"
        );
    }
}

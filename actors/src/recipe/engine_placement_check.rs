//! The check of `placement.engine` (the rollout engine as a role of its own) and of
//! `cluster.refit_bucket_mb`: what an engine role supports today, with every other
//! combination refused by name. The role itself is `crate::roles::RolloutEngine`.

use super::{Recipe, RecipeError, RunKind};
use crate::placement::RolePlacement;

/// Refuses a bucket size of 0 or one a message cannot carry (`cluster.max_message_mb`), and with
/// `placement.engine`: bad devices, an unknown node, a run other than RL, a policy on a
/// worker node, expert parallelism, rollout routing replay, and faults injected into the
/// policy's generation (which the engine role does).
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let c = &r.cluster;
    let cap = c.max_message_mb;
    if c.refit_bucket_mb == 0 || c.refit_bucket_mb >= cap {
        return Err(bad(
            "cluster.refit_bucket_mb",
            format!(
                "{}: expected 1 MiB to below cluster.max_message_mb = {cap} MiB (the \
                 largest message)",
                c.refit_bucket_mb
            ),
        ));
    }
    let Some(spec) = &r.placement.engine else {
        return Ok(());
    };
    let key = "placement.engine";
    let placed = RolePlacement::parse(spec);
    placed
        .device_group()
        .map_err(|e| bad(key, format!("{spec:?}: {e}")))?;
    if let Some(node) = placed.node {
        let nodes = c
            .resolved_nodes()
            .map_err(|e| bad("cluster.slurm", e.to_string()))?;
        if !nodes.contains_key(node) {
            let known: Vec<&str> = nodes.keys().map(String::as_str).collect();
            let known = match known.is_empty() {
                true => "none".to_string(),
                false => known.join(", "),
            };
            return Err(bad(
                key,
                format!(
                    "{spec:?} names node {node:?}, which [cluster] nodes does not list (known: \
                     {known}); expected \"<node>:<devices>\" with a listed node, or devices only"
                ),
            ));
        }
    }
    let refuse = |what: &str| {
        bad(
            key,
            format!("{spec:?}: an engine role is not supported with {what}"),
        )
    };
    if r.run.kind != RunKind::Rl {
        return Err(refuse(
            "run.kind other than \"rl\" (sft, rm and dpo runs keep the policy's own engine)",
        ));
    }
    if let Some(node) = RolePlacement::parse(&r.placement.policy).node {
        return Err(refuse(&format!(
            "placement.policy on worker node {node:?} (the trainer's weights are exported \
             through the controller: place the policy in this process)"
        )));
    }
    if r.placement.expert_parallel > 1 {
        return Err(refuse(
            "placement.expert_parallel > 1 (expert-parallel engines dispatch tokens over the \
             policy's own device group)",
        ));
    }
    if r.rl.routing_replay {
        return Err(refuse("rl.routing_replay = true"));
    }
    if r.faults
        .iter()
        .any(|f| f.role == "policy" && f.phase == "generate")
    {
        return Err(refuse(
            "a [[faults]] entry in the policy's generate phase (the engine role generates)",
        ));
    }
    Ok(())
}

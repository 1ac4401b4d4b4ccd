//! Starting the reference actor over its replicas ([`start_reference`]), and the reference
//! of a LoRA run: the policy's frozen base, shared rather than loaded again, when that base
//! is the reference (the policy's adapters sit on the reference folder, as they do whenever
//! RL starts fresh adapters: `start.rs`). Otherwise, or for a teacher (`rl.algorithm =
//! "distill"`), the reference loads its own engines (`setup::spawn_reference`).

use crate::controller::error::{At, RunError};
use crate::error::{Cause, RoleError};
use crate::executor::ExecutorPool;
use crate::monitor::ActorInfo;
use crate::monitor::MonitorHandle;
use crate::placement::DeviceGroup;
use crate::recipe::{Algorithm, Recipe};
use crate::replicas::Replicas;
use crate::roles::{Local, PolicyRole, Reference, ReferenceModel, ReferenceRole, ReferenceState};
use ractor::Actor;
use std::path::Path;
use std::sync::Arc;

/// The reference served from `policy`'s frozen base when `[lora]` is on, the policy is in
/// this process, and its adapters' base is the folder `reference` (the same files); `None`
/// otherwise. The replicas run on the policy's devices.
pub(crate) async fn base_as_reference(
    recipe: &Recipe,
    policy: &dyn PolicyRole,
    reference: &Path,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Option<Arc<dyn ReferenceRole>>, RunError> {
    if recipe.lora.is_none() || recipe.rl.algorithm == Algorithm::Distill {
        return Ok(None);
    }
    let Some(base) = policy
        .frozen_base()
        .await
        .map_err(RunError::at(At::Setup))?
    else {
        return Ok(None);
    };
    let same = |p: &Path| std::fs::canonicalize(p).ok();
    if same(&base.folder).is_none() || same(&base.folder) != same(reference) {
        return Ok(None);
    }
    let group = DeviceGroup::parse(&recipe.placement.policy).map_err(|e| {
        RunError::role(
            At::Setup,
            RoleError::new("reference", "setup", Cause::placement("policy", e)),
        )
    })?;
    let refs = base.models.into_iter().map(ReferenceModel::Base).collect();
    start_reference(recipe, &group, refs, monitor, pool)
        .await
        .map(Some)
}

/// Starts the reference actor over `refs`, one replica per device of `group`.
pub(crate) async fn start_reference(
    recipe: &Recipe,
    group: &DeviceGroup,
    refs: Vec<ReferenceModel>,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Arc<dyn ReferenceRole>, RunError> {
    let fail =
        |cause: Cause| RunError::role(At::Setup, RoleError::new("reference", "setup", cause));
    monitor.report(ActorInfo::new("reference", "reference", group.names()));
    let (reference, _) = Actor::spawn(
        Some("reference".into()),
        Reference,
        ReferenceState::new(
            Replicas::new("reference", group.specs.clone(), refs, pool.clone()).map_err(&fail)?,
            monitor.clone(),
            recipe.scoring_distribution(),
        ),
    )
    .await
    .map_err(|e| fail(e.into()))?;
    let timeout = recipe.supervision.call_timeout();
    Ok(Arc::new(Local::new("reference", reference, timeout)))
}

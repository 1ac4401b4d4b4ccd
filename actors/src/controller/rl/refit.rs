//! The refit stage's transfer: the engine takes the trainer's weights as a new version. With
//! the engine inside the policy it is one call (`Refit::refit`, no weights leave the role).
//! With an engine role (`placement.engine`) the policy exports its weights as buckets
//! (`ExportWeights`), the controller sends them to the engine role one call each
//! (`TakeWeights::take_bucket`, checked on arrival) and has it apply them, verified by the
//! probe (`TakeWeights::apply_weights`); the bytes and seconds moved are measured here.

use crate::controller::setup::Roles;
use crate::error::RoleError;
use crate::recipe::Recipe;
use oxalign_models::engine::RefitReport;
use std::time::Instant;

/// What crossed to an engine role in one refit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Moved {
    /// Bucket bytes sent (safetensors buffers, headers included).
    pub bytes: u64,
    /// Buckets sent.
    pub buckets: usize,
    /// Wall time of export, transfer, apply and verification, seconds.
    pub seconds: f64,
}

/// The engine's report, and what moved when the engine is a role of its own.
pub(crate) struct RefitDone {
    /// The engine's report (rank 0).
    pub report: RefitReport,
    /// The transfer to an engine role; `None` with the policy's own engine.
    pub moved: Option<Moved>,
}

/// The engine takes the trainer's weights as `version`, verified.
pub(crate) async fn refit(
    recipe: &Recipe,
    roles: &Roles,
    version: u64,
) -> Result<RefitDone, RoleError> {
    let Some(engine) = &roles.engine else {
        let report = roles.policy.refit(version).await?;
        return Ok(RefitDone {
            report,
            moved: None,
        });
    };
    let t0 = Instant::now();
    let limit = recipe.cluster.refit_bucket_bytes();
    let export = roles.policy.export_weights(version, limit).await?;
    let (bytes, buckets) = (export.bytes(), export.buckets.len());
    for bucket in export.buckets {
        engine.take_bucket(version, bucket).await?;
    }
    let report = engine.apply_weights(version, export.probe).await?;
    crate::cluster::count_refit(bytes);
    Ok(RefitDone {
        report,
        moved: Some(Moved {
            bytes,
            buckets,
            seconds: t0.elapsed().as_secs_f64(),
        }),
    })
}

//! The jobs of a sharded (FSDP) training replica that need the whole model outside a
//! training step: a use between a gather and a release (refit, scoring), and saving (rank 0
//! writes the gathered HF weights; every rank writes its optimizer shard with its layout).
//! Replicated trainers pass straight through. Every rank of the group runs these jobs.

use super::policy::PolicyReplica;
use crate::error::Cause;
use crate::replicas::ReplicaCtx;
use oxalign_rlhf::trainer::Sharded;
use std::path::Path;

/// Runs `f` on `t` with the model's full weights present: gathered before and released
/// after when sharded (every rank must call it, even one with no rows to work on).
pub(crate) fn with_gathered<T: Sharded, R>(
    ctx: &ReplicaCtx<'_>,
    t: &mut T,
    f: impl FnOnce(&mut T) -> Result<R, Cause>,
) -> Result<R, Cause> {
    t.gather(ctx.collective)?;
    let out = f(t);
    let released = t.release();
    let out = out?;
    released?;
    Ok(out)
}

/// Saves a training replica into `dir`: rank 0 runs `write_model` (HF weights, gathered
/// first when sharded) and the optimizer goes to `dir/optimizer` (rank 0's whole state when
/// replicated; every rank's shard and layout when sharded). Expert-parallel: every rank runs
/// `write_model` (the model's save gathers the experts and rank 0 writes the whole model) and
/// writes its own optimizer state (`optimizer/expert_rank_<rank>/`).
pub(crate) fn save_replica<T: Sharded>(
    ctx: &ReplicaCtx<'_>,
    t: &mut T,
    dir: &Path,
    optimizer: bool,
    write_model: impl FnOnce(&T) -> Result<(), Cause>,
) -> Result<(), Cause> {
    let (sharded, spread) = (t.is_sharded(), t.is_expert_parallel());
    if !sharded && !spread && ctx.rank != 0 {
        return Ok(());
    }
    match spread {
        true => write_model(t)?,
        false => with_gathered(ctx, t, |t| match ctx.rank {
            0 => write_model(t),
            _ => Ok(()),
        })?,
    }
    if optimizer {
        t.save_optimizer(&dir.join("optimizer"))?;
    }
    Ok(())
}

/// Loads the optimizer state that [`save_replica`] wrote into `dir/optimizer`.
pub(crate) fn load_optimizer<T: Sharded>(t: &mut T, dir: &Path) -> Result<(), Cause> {
    Ok(t.load_optimizer(&dir.join("optimizer"))?)
}

/// [`with_gathered`] for a policy replica: its trainer's weights are present while `f`
/// uses the replica (to refit the engine from them or to score).
pub(crate) fn with_policy_gathered<R>(
    ctx: &ReplicaCtx<'_>,
    rep: &mut PolicyReplica,
    f: impl FnOnce(&mut PolicyReplica) -> Result<R, Cause>,
) -> Result<R, Cause> {
    rep.trainer.gather(ctx.collective)?;
    let out = f(rep);
    let released = rep.trainer.release();
    let out = out?;
    released?;
    Ok(out)
}

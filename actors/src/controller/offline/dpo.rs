//! `run.kind = "dpo"`: direct preference optimisation of the policy on the preference rows
//! of `data.path`, `[dpo]` settings (DPO, cDPO with `label_smoothing`, or IPO). The frozen
//! reference is the initial policy; the reference role scores every training and held-out
//! pair once, before the first step, and the summed log-probs are reused by every epoch.
//! Held-out preference accuracy and implicit-reward margin are measured at the start, every
//! `dpo.eval_every` steps and the end. The policy is saved as `<run>/final/`.

use super::driver::{drive, Steps};
use super::eval::{pairwise, response_logprobs, Scorer};
use super::pairs::{encode_prefs, load_prefs, sequences, EncodedPairs};
use super::report::OfflineSummary;
use super::task::{HeldOut, OfflineTask};
use crate::controller::context::Ctx;
use crate::controller::error::DivergenceError;
use crate::controller::error::{At, RunError};
use crate::controller::run::saving::save_final_policy;
use crate::controller::setup;
use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::monitor::StepMetrics;
use crate::roles::{DpoWork, PolicyRole, ReferenceRole};
use async_trait::async_trait;
use oxalign_data::{Dataset, PreferencePair};
use oxalign_rlhf::losses::DpoLoss;
use oxalign_rlhf::trainer::DpoConfig;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

const KIND: &str = "DPO";

/// Summed response log-probs of each pair's chosen and rejected side.
type PairSums = (Vec<f64>, Vec<f64>);

async fn sums(
    ctx: &Ctx<'_>,
    scorer: &Scorer<'_>,
    at: At,
    pairs: &EncodedPairs,
) -> Result<PairSums, RunError> {
    let c = response_logprobs(ctx, scorer, at, &pairs.0).await?;
    let r = response_logprobs(ctx, scorer, at, &pairs.1).await?;
    Ok((
        c.iter().map(|x| x.0).collect(),
        r.iter().map(|x| x.0).collect(),
    ))
}

/// Held-out preference accuracy and margin of the implicit rewards `β (log π − log π_ref)`.
async fn evaluate(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
    eval: &EncodedPairs,
    reference: &PairSums,
) -> Result<(f64, f64), RunError> {
    let beta = ctx.recipe.dpo.beta;
    let (c, r) = sums(ctx, &Scorer::Policy(policy), At::Eval("eval"), eval).await?;
    let reward = |p: &[f64], q: &[f64]| -> Vec<f64> {
        p.iter().zip(q).map(|(a, b)| beta * (a - b)).collect()
    };
    Ok(pairwise(
        &reward(&c, &reference.0),
        &reward(&r, &reference.1),
    ))
}

fn loss(ctx: &Ctx<'_>) -> DpoLoss {
    let dpo = &ctx.recipe.dpo;
    dpo.loss.with_label_smoothing(dpo.label_smoothing)
}

/// The reference's summed log-probs of every training pair, in training-row order of epoch
/// 0 (the position `i` of epoch `e` is row `order_e[i]`, so they are keyed by position).
async fn reference_of_training_rows(
    ctx: &Ctx<'_>,
    reference: &dyn ReferenceRole,
    data: &Dataset<PreferencePair>,
) -> Result<HashMap<u64, (f64, f64)>, RunError> {
    let mut out = HashMap::new();
    let n = data.train_len() as u64;
    let at = At::Setup;
    for start in (0..n).step_by(64) {
        let rows = (start..(start + 64).min(n))
            .map(|i| data.train_item(i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RunError::controller(at, "data", Cause::from(e)))?;
        let enc = encode_prefs(ctx, at, &rows)?;
        let (c, r) = sums(ctx, &Scorer::Reference(reference), at, &enc).await?;
        for (k, row) in rows.iter().enumerate() {
            out.insert(pair_key(row), (c[k], r[k]));
        }
    }
    Ok(out)
}

/// A key of a pair's text (the same pair in another epoch finds its reference log-probs).
fn pair_key(p: &PreferencePair) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&p.prompt, &p.chosen, &p.rejected).hash(&mut h);
    h.finish()
}

/// The update of step `step` on `rows`, with their reference log-probs from `ref_train`.
fn work(
    ctx: &Ctx<'_>,
    rows: &[PreferencePair],
    ref_train: &HashMap<u64, (f64, f64)>,
    at: At,
    lr: f64,
) -> Result<Box<DpoWork>, RunError> {
    let (c, rj) = encode_prefs(ctx, at, rows)?;
    let refs = rows
        .iter()
        .map(|p| ref_train.get(&pair_key(p)).copied())
        .collect::<Option<Vec<(f64, f64)>>>()
        .ok_or_else(|| {
            let e = Cause::Missing(crate::error::Missing::ReferenceLogprobs);
            RunError::controller(at, "reference_logprobs", e)
        })?;
    Ok(Box::new(DpoWork {
        chosen: sequences(ctx, c),
        rejected: sequences(ctx, rj),
        ref_chosen: refs.iter().map(|x| x.0 as f32).collect(),
        ref_rejected: refs.iter().map(|x| x.1 as f32).collect(),
        cfg: DpoConfig {
            beta: ctx.recipe.dpo.beta,
            loss: loss(ctx),
            lr,
            max_grad_norm: ctx.recipe.rl.max_grad_norm,
        },
    }))
}

/// Direct preference optimisation of the policy against the frozen reference's log-probs
/// (computed once, before the first step); held out: implicit-reward accuracy and margin.
struct Dpo {
    policy: Arc<dyn PolicyRole>,
    eval: EncodedPairs,
    ref_eval: PairSums,
    ref_train: HashMap<u64, (f64, f64)>,
}

#[async_trait]
impl OfflineTask for Dpo {
    type Row = PreferencePair;

    fn name(&self) -> &'static str {
        "dpo"
    }

    async fn train(
        &self,
        ctx: &Ctx<'_>,
        rows: &[PreferencePair],
        step: u64,
        lr: f64,
    ) -> Result<StepMetrics, RunError> {
        let at = At::Train { kind: KIND, step };
        let w = work(ctx, rows, &self.ref_train, at, lr)?;
        let done = self.policy.dpo(*w).await.map_err(RunError::at(at))?;
        if let Some(cause) = done.diverged {
            let e = DivergenceError {
                role: "policy",
                phase: "dpo",
                kind: crate::recipe::RunKind::Dpo,
                step,
                cause,
                lower: "dpo.lr",
            };
            return Err(e.into());
        }
        let st = &done.stats;
        Ok(StepMetrics::new(step)
            .with("loss", st.loss)
            .with("accuracy", st.reward_accuracy)
            .with("margin", st.reward_margin)
            .with("chosen_reward", st.chosen_reward)
            .with("rejected_reward", st.rejected_reward)
            .with("grad_norm", done.grad_norm)
            .with("lr", lr))
    }

    async fn evaluate(&self, ctx: &Ctx<'_>) -> Result<Option<HeldOut>, RunError> {
        if self.eval.0.is_empty() {
            return Ok(None);
        }
        let (acc, margin) = evaluate(ctx, &*self.policy, &self.eval, &self.ref_eval).await?;
        Ok(Some((
            vec![("eval_accuracy", acc), ("eval_margin", margin)],
            format!("held-out accuracy {acc:.3}  margin {margin:.4}"),
        )))
    }

    async fn save(&self, ctx: &Ctx<'_>) -> Result<PathBuf, RunError> {
        save_final_policy(ctx, &*self.policy).await
    }

    fn shutdown(&self) {
        self.policy.shutdown();
    }
}

/// Runs the DPO steps and saves the policy.
pub(crate) async fn run(ctx: &Ctx<'_>, pool: &ExecutorPool) -> Result<OfflineSummary, RunError> {
    let r = ctx.recipe;
    let data = load_prefs(ctx)?;
    let eval = encode_prefs(ctx, At::Eval("eval"), data.eval_items())?;
    let policy = setup::spawn_policy(r, ctx.policy_dir, ctx.monitor, pool).await?;
    let reference = setup::spawn_reference(r, ctx.policy_dir, ctx.monitor, pool).await?;
    let ref_train = reference_of_training_rows(ctx, &*reference, &data).await?;
    let ref_eval = sums(ctx, &Scorer::Reference(&*reference), At::Setup, &eval).await?;
    reference.shutdown();
    let s = &r.dpo;
    let steps = Steps {
        steps: s.steps,
        batch_size: s.batch_size,
        lr: s.lr,
        warmup_steps: s.warmup_steps,
        eval_every: s.eval_every,
    };
    let task = Dpo {
        policy,
        eval,
        ref_eval,
        ref_train,
    };
    drive(ctx, &task, &data, KIND, steps).await
}

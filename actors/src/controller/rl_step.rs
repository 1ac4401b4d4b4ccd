//! One RL step: generate, then reference log-probs, rewards, values and the trainer's own
//! log-probs concurrently; experience; policy and critic updates concurrently; KL control;
//! metrics to the monitor and a row of the live table.

use super::divergence::{check_rollout, DivergenceError};
use super::lengths::encode_rollout_prompt;
use super::run_error::{At, RunError};
use super::setup::Roles;
use super::{Ctx, LoopState};
use crate::error::Cause;
use crate::executor::ExecutorError;
use crate::monitor::{metric, StepMetrics};
use crate::recipe::{Algorithm, KlEstimatorName, KlModeName, LossAggName};
use crate::roles::{
    ask, CriticMsg, CriticWork, PolicyMsg, PolicyWork, ReferenceMsg, RewardMsg, Sequences,
};
use candle_core::{Device, Tensor};
use oxalign_models::{GenerationRequest, SamplingParams};
use oxalign_rlhf::advantages::GaeConfig;
use oxalign_rlhf::data::PromptSource;
use oxalign_rlhf::losses::{KlEstimator, LossAgg, PpoConfig};
use oxalign_rlhf::trainer::{build_experience, AdvantageKind, ExperienceConfig, PolicyLossConfig};
use std::sync::Arc;
use std::time::Instant;

/// The numbers of one step shown in the table.
pub(crate) struct StepRow {
    pub reward_mean: f64,
    /// The step's line of the live table.
    pub line: String,
    /// Key metrics for the progress bar.
    pub brief: String,
}

/// Per-sample sampling seed: a pure function of run seed, step and sample index, so a
/// resumed run samples exactly what the uninterrupted run would have.
fn sample_seed(seed: u64, step: u64, index: usize) -> u64 {
    let mut x = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (index as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x.wrapping_mul(0x94D0_49BB_1331_11EB)
}

fn estimator(e: KlEstimatorName) -> KlEstimator {
    match e {
        KlEstimatorName::K1 => KlEstimator::K1,
        KlEstimatorName::K2 => KlEstimator::K2,
        KlEstimatorName::K3 => KlEstimator::K3,
    }
}

fn agg(a: LossAggName) -> LossAgg {
    match a {
        LossAggName::TokenMean => LossAgg::TokenMean,
        LossAggName::SeqMeanTokenSum => LossAgg::SeqMeanTokenSum,
        LossAggName::SeqMeanTokenMean => LossAgg::SeqMeanTokenMean,
    }
}

/// The header of the live table.
pub(crate) fn header() -> String {
    format!(
        "{:>5} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7}",
        "step", "reward", "acc", "kl", "pg_loss", "v_loss", "tok/s", "sec"
    )
}

/// `[B, T-1]` tensor holding each row's response values at its response positions.
fn place_response_values(
    seqs: &Sequences,
    values: &[Vec<f32>],
    device: &Device,
) -> candle_core::Result<Tensor> {
    let t = seqs.padded_len();
    let mut out = vec![0f32; seqs.len() * (t - 1)];
    for (row, ((p, _), v)) in seqs.pairs.iter().zip(values).enumerate() {
        for (j, x) in v.iter().enumerate() {
            out[row * (t - 1) + p.len() - 1 + j] = *x;
        }
    }
    Tensor::from_vec(out, (seqs.len(), t - 1), device)
}

/// Mean and max over the response tokens of `|old - rollout|` (both `[B, T-1]`).
fn logprob_mismatch(
    old_lp: &Tensor,
    rollout_lp: &Tensor,
    mask: &Tensor,
) -> candle_core::Result<(f64, f64)> {
    let d = ((old_lp - rollout_lp)?.abs()? * mask)?;
    let total = mask.sum_all()?.to_scalar::<f32>()?.max(1.0);
    let mean = d.sum_all()?.to_scalar::<f32>()? / total;
    let max = d.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    Ok((mean as f64, max as f64))
}

/// A panic of a blocking task (the experience computation) as a typed cause.
fn blocking_panic(e: tokio::task::JoinError) -> Cause {
    Cause::Executor(ExecutorError::Panicked {
        device: "the blocking pool".into(),
        message: e.to_string(),
    })
}

pub(crate) async fn run_step(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    state: &mut LoopState,
    step: u64,
) -> Result<StepRow, RunError> {
    let at = At::Rl(step);
    let controller = |phase, cause: Cause| RunError::controller(at, phase, cause);
    let r = ctx.recipe;
    let rl = &r.rl;
    let t0 = Instant::now();
    let mut m = StepMetrics::new(step);

    // 1. Prompts and generation.
    let items: Vec<_> = (0..rl.prompts_per_step as u64)
        .map(|i| data.train_item(state.data_position + i))
        .collect();
    let mut requests = Vec::new();
    let mut answers = Vec::new();
    for it in &items {
        let prompt = encode_rollout_prompt(ctx, at, &it.prompt, || {
            format!("RL step {step}, prompt {:?}", it.prompt)
        })?;
        for _ in 0..rl.samples_per_prompt {
            let mut q = GenerationRequest::new(prompt.clone(), rl.max_new_tokens);
            q.sampling = SamplingParams {
                temperature: rl.temperature as f32,
                top_k: rl.top_k,
                top_p: rl.top_p as f32,
                seed: sample_seed(r.run.seed, step, requests.len()),
            };
            requests.push(q);
            answers.push(it.answer.clone());
        }
    }
    let n = requests.len();
    let requests = Arc::new(requests);
    let timer = ctx.monitor.time("policy", "generate", step);
    let completions = ask("policy", "generate", &roles.policy, |reply| {
        PolicyMsg::Generate {
            requests: requests.clone(),
            label: format!("generate step {step}"),
            reply,
        }
    })
    .await
    .map_err(RunError::at(at))?;
    let gen_secs = timer.finish();
    let seqs = Arc::new(Sequences {
        pairs: requests
            .iter()
            .zip(&completions)
            .map(|(q, c)| (q.prompt.clone(), c.tokens.clone()))
            .collect(),
        pad_id: ctx.pad_id,
    });
    let texts: Vec<String> = completions
        .iter()
        .map(|c| ctx.tok.decode_generated(&c.tokens, true))
        .collect::<Result<_, _>>()
        .map_err(|e| controller("decode", e.into()))?;
    let gen_tokens: usize = completions.iter().map(|c| c.tokens.len()).sum();

    // 2. Reference log-probs, rewards, values and trainer log-probs, concurrently.
    let t_score = Instant::now();
    let answers = Arc::new(answers);
    let texts = Arc::new(texts);
    let timed = |actor: &'static str, phase: &'static str| ctx.monitor.time(actor, phase, step);
    let ref_fut = async {
        let _t = timed("reference", "reference_logprobs");
        ask(
            "reference",
            "reference_logprobs",
            &roles.reference,
            |reply| ReferenceMsg::Logprobs {
                seqs: seqs.clone(),
                reply,
            },
        )
        .await
    };
    let reward_fut = async {
        let _t = timed("reward", "reward");
        ask("reward", "reward", &roles.reward, |reply| {
            RewardMsg::Score {
                seqs: seqs.clone(),
                texts: texts.clone(),
                answers: answers.clone(),
                reply,
            }
        })
        .await
    };
    let values_fut = async {
        match &roles.critic {
            Some(c) => {
                let _t = timed("critic", "values");
                ask("critic", "values", c, |reply| CriticMsg::Values {
                    seqs: seqs.clone(),
                    reply,
                })
                .await
                .map(Some)
            }
            None => Ok(None),
        }
    };
    let old_fut = async {
        let _t = timed("policy", "old_logprobs");
        ask("policy", "old_logprobs", &roles.policy, |reply| {
            PolicyMsg::Logprobs {
                seqs: seqs.clone(),
                reply,
            }
        })
        .await
    };
    let (ref_lp, scores, values, old_lp) = tokio::join!(ref_fut, reward_fut, values_fut, old_fut);
    let failed = RunError::at(at);
    let (ref_lp, scores, values, old_lp) = (
        ref_lp.map_err(&failed)?,
        scores.map_err(&failed)?,
        values.map_err(&failed)?,
        old_lp.map_err(&failed)?,
    );
    let score_secs = t_score.elapsed().as_secs_f64();
    let device = old_lp.device().clone();
    let rollout_lp = place_response_values(
        &seqs,
        &completions
            .iter()
            .map(|c| c.logprobs.clone())
            .collect::<Vec<_>>(),
        &device,
    )
    .map_err(|e| controller("experience", e.into()))?;

    // 3. Experience (a little tensor math, off the async runtime).
    let kind = match rl.algorithm {
        Algorithm::Ppo => AdvantageKind::Gae(GaeConfig {
            gamma: rl.gamma,
            lambda: rl.lam,
        }),
        Algorithm::Grpo => AdvantageKind::Grpo,
        Algorithm::DrGrpo => AdvantageKind::DrGrpo,
        Algorithm::Rloo => AdvantageKind::Rloo,
        Algorithm::ReinforcePp => AdvantageKind::ReinforcePp { gamma: rl.gamma },
    };
    let beta = state.kl.beta();
    let exp_cfg = ExperienceConfig {
        kind,
        group_size: rl.samples_per_prompt,
        kl_coef: if rl.kl_mode == KlModeName::Reward {
            beta
        } else {
            0.0
        },
        kl_estimator: estimator(rl.kl_estimator),
        whiten: rl.whiten_advantages,
    };
    let exp = {
        let (scores, old_lp, ref_lp, values, seqs) = (
            scores.clone(),
            old_lp.clone(),
            ref_lp.clone(),
            values.clone(),
            seqs.clone(),
        );
        tokio::task::spawn_blocking(move || -> Result<_, Cause> {
            let mask = seqs.batch(&Device::Cpu)?.response_mask;
            let mask = mask.to_device(old_lp.device())?;
            let exp =
                build_experience(&scores, &old_lp, &ref_lp, values.as_ref(), &mask, &exp_cfg)?;
            Ok(exp)
        })
        .await
        .map_err(blocking_panic)
        .and_then(|r| r)
        .map_err(|e| controller("experience", e))?
    };
    let mismatch = seqs
        .batch(&device)
        .map_err(Cause::from)
        .and_then(|b| Ok(logprob_mismatch(&old_lp, &rollout_lp, &b.response_mask)?))
        .map_err(|e| controller("experience", e))?;

    // Divergence of the rollout itself stops the step before any update.
    let guard = &r.guard;
    check_rollout(step, "kl", exp.stats.kl, guard.max_kl)?;
    check_rollout(step, "reward_mean", exp.stats.score_mean, f64::INFINITY)?;
    check_rollout(step, "adv_std", exp.stats.adv_std, f64::INFINITY)?;

    // 4. Policy and critic updates, concurrently.
    let t_train = Instant::now();
    let shuffle_seed = sample_seed(r.run.seed ^ 0x5EED, step, 0);
    let policy_work = Arc::new(PolicyWork {
        seqs: seqs.clone(),
        old_logprobs: old_lp.clone(),
        advantages: exp.advantages.clone(),
        ref_logprobs: ref_lp.clone(),
        rollout_logprobs: rollout_lp,
        cfg: PolicyLossConfig {
            ppo: PpoConfig {
                clip_low: rl.clip_eps,
                clip_high: rl.clip_eps,
                dual_clip: rl.dual_clip,
                agg: agg(rl.loss_agg),
            },
            kl_loss_coef: if rl.kl_mode == KlModeName::Loss {
                beta
            } else {
                0.0
            },
            kl_estimator: estimator(rl.kl_estimator),
            entropy_coef: rl.entropy_coef,
            tis_cap: rl.tis_cap,
            max_grad_norm: rl.max_grad_norm,
        },
        lr: rl.lr,
        epochs: rl.ppo_epochs,
        minibatch_size: rl.minibatch_size,
        shuffle_seed,
    });
    let policy_fut = async {
        let _t = timed("policy", "policy_train");
        ask("policy", "policy_train", &roles.policy, |reply| {
            PolicyMsg::Train {
                work: policy_work,
                reply,
            }
        })
        .await
    };
    let critic_fut = async {
        match (&roles.critic, &values, &exp.returns) {
            (Some(c), Some(v), Some(ret)) => {
                let _t = timed("critic", "critic_train");
                let work = Arc::new(CriticWork {
                    seqs: seqs.clone(),
                    old_values: v.clone(),
                    returns: ret.clone(),
                    clip: Some(rl.value_clip),
                    lr: rl.critic_lr,
                    max_grad_norm: rl.max_grad_norm,
                    epochs: rl.ppo_epochs,
                    minibatch_size: rl.minibatch_size,
                    shuffle_seed,
                });
                ask("critic", "critic_train", c, |reply| CriticMsg::Train {
                    work,
                    reply,
                })
                .await
                .map(Some)
            }
            _ => Ok(None),
        }
    };
    let (ps, vl) = tokio::join!(policy_fut, critic_fut);
    let (ps, vl) = (ps.map_err(&failed)?, vl.map_err(&failed)?);
    let train_secs = t_train.elapsed().as_secs_f64();
    let diverged = |role, phase, cause, lower| DivergenceError {
        role,
        phase,
        sft: false,
        step,
        cause,
        lower,
    };
    if let Some(cause) = ps.diverged.clone() {
        return Err(diverged("policy", "policy_train", cause, "rl.lr").into());
    }
    let vl = match vl {
        Some(c) => match c.diverged {
            Some(cause) => {
                let e = diverged("critic", "critic_train", cause, "rl.critic_lr");
                return Err(e.into());
            }
            None => Some(c.value_loss),
        },
        None => None,
    };
    state.policy_version += 1;
    // The engine takes the new weights in memory, verified before the next rollout.
    let timer = ctx.monitor.time("policy", "refit", step);
    let version = state.policy_version;
    let refit = ask("policy", "refit", &roles.policy, |reply| PolicyMsg::Refit {
        version,
        reply,
    })
    .await
    .map_err(&failed)?;
    timer.finish();
    state.data_position += rl.prompts_per_step as u64;
    state
        .kl
        .update(exp.stats.kl, n as u64)
        .map_err(|e| controller("kl_controller", e.into()))?;

    // 5. Metrics.
    let correct = texts
        .iter()
        .zip(answers.iter())
        .filter(|(t, a)| {
            a.as_deref()
                .is_some_and(|a| oxalign_rlhf::reward::ExactMatch::is_correct(t, a))
        })
        .count();
    let step_secs = t0.elapsed().as_secs_f64();
    let all_tokens: usize = seqs.pairs.iter().map(|(p, r)| p.len() + r.len()).sum();
    let s = &exp.stats;
    for (k, v) in [
        (metric::REWARD_MEAN, s.score_mean),
        (metric::REWARD_STD, s.score_std),
        ("accuracy", correct as f64 / n as f64),
        (metric::KL, s.kl),
        ("kl_coef", beta),
        (metric::POLICY_LOSS, ps.stats.policy_loss),
        (metric::ENTROPY, ps.stats.entropy),
        (metric::CLIP_FRAC, ps.stats.clip_frac),
        ("approx_kl", ps.stats.approx_kl),
        ("grad_norm", ps.stats.step.grad_norm),
        (metric::ADV_MEAN, s.adv_mean),
        (metric::ADV_STD, s.adv_std),
        (metric::RESPONSE_LEN, gen_tokens as f64 / n as f64),
        ("logprob_mismatch_mean", mismatch.0),
        ("logprob_mismatch_max", mismatch.1),
        ("policy_version", state.policy_version as f64),
        ("data_position", state.data_position as f64),
        (metric::TOKENS_PER_SEC, all_tokens as f64 / step_secs),
        ("gen_tokens_per_sec", gen_tokens as f64 / gen_secs.max(1e-9)),
        (metric::STEP_SECONDS, step_secs),
        ("time_generate", gen_secs),
        ("time_score", score_secs),
        ("time_train", train_secs),
        ("refit_seconds", refit.seconds),
        ("refit_verify_seconds", refit.verify_seconds),
        ("refit_tensors_verified", refit.checksums_ok as f64),
        (
            "refit_probe_max_abs_diff",
            refit.probe_max_abs_diff.unwrap_or(f32::NAN) as f64,
        ),
    ] {
        m.values.insert(k.to_string(), v);
    }
    if let Some(v) = vl {
        m.values.insert(metric::VALUE_LOSS.to_string(), v);
    }
    ctx.monitor.report(m);
    let line = format!(
        "{:>5} {:>8.3} {:>7.1}% {:>8.4} {:>9.4} {:>9} {:>8.0} {:>7.2}",
        step,
        s.score_mean,
        100.0 * correct as f64 / n as f64,
        s.kl,
        ps.stats.policy_loss,
        vl.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into()),
        all_tokens as f64 / step_secs,
        step_secs
    );
    let brief = format!(
        "reward {:.3}  kl {:.3}  {:.0} tok/s",
        s.score_mean,
        s.kl,
        all_tokens as f64 / step_secs
    );
    Ok(StepRow {
        reward_mean: s.score_mean,
        line,
        brief,
    })
}

//! The rollout stage of an RL step: the step's prompts are drawn from the data stream, the
//! policy generates their samples, and the samples are decoded. With DAPO's dynamic sampling
//! (`rl.dynamic_sampling`) the stage also scores each round's rewards, drops the groups whose
//! rewards are all equal, and draws further rounds of prompts until the batch holds
//! `rl.prompts_per_step` informative groups or `rl.dynamic_sampling_max_rounds` rounds ran.
//!
//! Round `r` reads prompts `data_position + r·prompts_per_step ..` and seeds its samples with
//! indices `r·batch + i`: pure functions of (run seed, step, index), so a resumed or replayed
//! step draws exactly the same samples.

use super::episodes::{self, episode_scores, surviving_groups, EpisodeStats, RunEnv};
use super::seeds::sample_seed;
use super::shaping::RewardShaping;
use crate::batch::{RolloutBatch, RolloutRequest, SampleRequest, Sampling};
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::lengths::{encode_rollout_prompt, quoted};
use crate::controller::setup::Roles;
use crate::environment::EpisodeRecord;
use crate::error::Cause;
use crate::recipe::OnEpisodeFailure;
use crate::roles::{Generate, RewardRequest};
use oxalign_data::PromptSource;
use oxalign_rlhf::advantages::{informative_count, informative_groups, select_groups};
use serde::{Deserialize, Serialize};

/// Each sample's prompt text, reference answer and other dataset columns (JSON object
/// text; empty in a batch saved before columns were kept), in sample order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RowTexts {
    pub prompts: Vec<String>,
    pub answers: Vec<Option<String>>,
    #[serde(default)]
    pub columns: Vec<Option<String>>,
}

/// The rollout stage's output: the samples the step trains on, and what generating cost.
/// Plain data: a batch generated ahead (`rl.max_staleness`) waits in the loop state and in
/// its checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Rollout {
    /// The RL step that trains on it.
    pub step: u64,
    /// The samples trained on.
    pub batch: RolloutBatch,
    /// Their decoded responses.
    pub texts: Vec<String>,
    /// Their prompt texts and reference answers.
    pub rows: RowTexts,
    /// Their rewards, when dynamic sampling already scored them.
    pub rewards: Option<Vec<f32>>,
    /// Every generated sample, dropped groups included: count, response tokens, prompt
    /// plus response tokens, and the ones matching their answer (when the reward defines
    /// accuracy).
    pub generated: usize,
    pub gen_tokens: usize,
    pub all_tokens: usize,
    pub correct: Option<usize>,
    /// Seconds of generation (all rounds).
    pub gen_secs: f64,
    /// Prompts read from the data stream (all rounds).
    pub prompts_drawn: u64,
    /// Dynamic sampling's rounds and group counts, when it is on.
    pub dynamic: Option<DynamicReport>,
    /// What the episodes did (`[env]`); None for single turns.
    #[serde(default)]
    pub episodes: Option<EpisodeStats>,
    /// Each sample's episode, in sample order (`[env]`); empty for single turns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub episode_records: Vec<EpisodeRecord>,
}

/// What dynamic sampling did in one step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct DynamicReport {
    /// Generation rounds run.
    pub rounds: usize,
    /// Groups with all-equal rewards that were not trained on.
    pub dropped: usize,
    /// Groups with all-equal rewards trained on because the round cap was hit.
    pub filled: usize,
}

/// One round's prompts × samples as a rollout request, with each sample's prompt text and
/// reference answer: prompts from stream position `first`, sample seeds from `seed_base`.
fn rollout_request(
    ctx: &Ctx<'_>,
    data: &dyn PromptSource,
    first: u64,
    seed_base: usize,
    step: u64,
) -> Result<(RolloutRequest, RowTexts), RunError> {
    let (r, rl) = (ctx.recipe, &ctx.recipe.rl);
    let mut request = RolloutRequest::default();
    let mut rows = RowTexts::default();
    for group in 0..rl.prompts_per_step as u64 {
        let it = data
            .train_item(first + group)
            .map_err(|e| RunError::controller(At::Rl(step), "data", e))?;
        let prompt = encode_rollout_prompt(ctx, At::Rl(step), &it.prompt, || {
            format!("RL step {step}, prompt {}", quoted(&it.prompt))
        })?;
        for _ in 0..rl.samples_per_prompt {
            let sample_id = request.samples.len();
            request.samples.push(SampleRequest {
                sample_id: sample_id as u64,
                group_id: group,
                prompt: prompt.clone(),
                max_new_tokens: rl.max_new_tokens,
                sampling: Sampling {
                    temperature: rl.temperature as f32,
                    top_k: rl.top_k,
                    top_p: rl.top_p as f32,
                    seed: sample_seed(r.run.seed, step, seed_base + sample_id),
                },
                // An episode's turn ends where the chat template ends a turn.
                stop_token_ids: match ctx.env {
                    Some(env) => env.stop_ids.clone(),
                    None => Vec::new(),
                },
            });
            rows.prompts.push(it.prompt.clone());
            rows.answers.push(it.answer.clone());
            rows.columns.push(it.columns.clone());
        }
    }
    Ok((request, rows))
}

/// One round: the policy generates the samples of `prompts_per_step` prompts from stream
/// position `first`, which are decoded.
async fn generate(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    first: u64,
    round: usize,
    step: u64,
) -> Result<Rollout, RunError> {
    let at = At::Rl(step);
    let rl = &ctx.recipe.rl;
    let seed_base = round * rl.prompts_per_step * rl.samples_per_prompt;
    let (request, rows) = rollout_request(ctx, data, first, seed_base, step)?;
    let generator = roles.generator();
    let timer = ctx.monitor.time(generator.actor(), "generate", step);
    let label = format!("generate step {step}");
    let (batch, records) = match ctx.env {
        Some(env) => {
            let texts = (&rows.prompts[..], &rows.answers[..], &rows.columns[..]);
            let (b, r) = episodes::generate(&generator, env, ctx.tok, &request, texts, &label)
                .await
                .map_err(RunError::at(at))?;
            (b, Some(r))
        }
        None => (
            generator
                .generate(request, label)
                .await
                .map_err(RunError::at(at))?,
            None,
        ),
    };
    let gen_secs = timer.finish();
    // An episode's reward reads its last turn, the answer.
    let texts: Vec<String> = batch
        .samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let answer = records
                .as_ref()
                .map_or(0..s.response.len(), |r| r[i].last_turn.clone());
            ctx.tok.decode_generated(&s.response[answer], true)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| RunError::controller(at, "decode", e))?;
    let correct = ctx.answer_check.as_ref().map(|check| {
        texts
            .iter()
            .zip(&rows.answers)
            .filter(|(t, a)| check.is_correct(t, a.as_deref()))
            .count()
    });
    let ro = Rollout {
        step,
        generated: batch.len(),
        gen_tokens: batch.generated_tokens(),
        all_tokens: batch
            .samples
            .iter()
            .map(|s| s.prompt.len() + s.response.len())
            .sum(),
        batch,
        texts,
        rows,
        rewards: None,
        correct,
        gen_secs,
        prompts_drawn: rl.prompts_per_step as u64,
        dynamic: None,
        episodes: records.as_ref().map(|r| EpisodeStats::of(r)),
        episode_records: records.unwrap_or_default(),
    };
    match ctx.env {
        Some(env) => score_episodes(ctx, roles, env, ro).await,
        None => Ok(ro),
    }
}

/// Scores a round of episodes now (`episodes::episode_scores`) and, with
/// `env.on_failure = "drop"`, keeps only the groups without a failed episode.
async fn score_episodes(
    ctx: &Ctx<'_>,
    roles: &Roles,
    env: &RunEnv,
    mut ro: Rollout,
) -> Result<Rollout, RunError> {
    let step = ro.step;
    let scores = rewards(ctx, roles, &ro, step).await?;
    ro.rewards = Some(episode_scores(env, &scores, &ro.episode_records));
    let g = ctx.recipe.rl.samples_per_prompt;
    let kept = surviving_groups(&ro.episode_records, g);
    if env.on_failure == OnEpisodeFailure::Score || kept.len() * g == ro.batch.len() {
        return Ok(ro);
    }
    if kept.is_empty() {
        let first = ro.episode_records.iter().find(|r| r.end.failed());
        let first = first.map_or_else(String::new, |r| {
            format!("{} (turn {})", r.end, r.end_turn + 1)
        });
        return Err(RunError::controller(
            At::Rl(step),
            "episodes",
            Cause::EpisodesFailed { first },
        ));
    }
    let dropped = ro.batch.len() - kept.len() * g;
    let report = DynamicReport {
        rounds: 1,
        dropped: 0,
        filled: 0,
    };
    let pairs: Vec<(usize, usize)> = kept.into_iter().map(|k| (0, k)).collect();
    let mut out = merge(vec![ro], &pairs, g, report);
    out.dynamic = None;
    if let Some(e) = out.episodes.as_mut() {
        e.dropped = dropped;
    }
    Ok(out)
}

/// The reward of each sample of `ro`.
async fn rewards(
    ctx: &Ctx<'_>,
    roles: &Roles,
    ro: &Rollout,
    step: u64,
) -> Result<Vec<f32>, RunError> {
    let _t = ctx.monitor.time("reward", "reward", step);
    let request = RewardRequest {
        seqs: ro.batch.sequences(ctx.pad_id),
        prompts: ro.rows.prompts.clone(),
        texts: ro.texts.clone(),
        answers: ro.rows.answers.clone(),
        columns: ro.rows.columns.clone(),
    };
    roles
        .reward
        .rewards(request)
        .await
        .map_err(RunError::at(At::Rl(step)))
}

/// The rollout stage of step `step`, from stream position `data_position`.
pub(super) async fn rollout(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    data_position: u64,
    step: u64,
) -> Result<Rollout, RunError> {
    let rl = &ctx.recipe.rl;
    if !rl.dynamic_sampling {
        return generate(ctx, roles, data, data_position, 0, step).await;
    }
    let (target, g) = (rl.prompts_per_step, rl.samples_per_prompt);
    let shaping = RewardShaping::of(rl);
    let (mut rounds, mut flags) = (Vec::new(), Vec::new());
    while rounds.len() < rl.dynamic_sampling_max_rounds() && informative_count(&flags) < target {
        let r = rounds.len();
        let first = data_position + (r * target) as u64;
        let mut ro = generate(ctx, roles, data, first, r, step).await?;
        let scores = match ro.rewards.take() {
            Some(episode_scores) => episode_scores,
            None => rewards(ctx, roles, &ro, step).await?,
        };
        let shaped: Vec<f32> = scores
            .iter()
            .zip(&ro.batch.samples)
            .map(|(&s, sample)| shaping.shaped(s, sample).0)
            .collect();
        flags.push(
            informative_groups(&shaped, g)
                .map_err(|e| RunError::controller(At::Rl(step), "dynamic_sampling", e))?,
        );
        ro.rewards = Some(scores);
        rounds.push(ro);
    }
    let selection = select_groups(&flags, target);
    let report = DynamicReport {
        rounds: rounds.len(),
        dropped: selection.dropped,
        filled: selection.filled,
    };
    Ok(merge(rounds, &selection.kept, g, report))
}

/// The kept groups `(round, group)` of `rounds`, renumbered in order, with every round's
/// generation totals.
fn merge(
    mut rounds: Vec<Rollout>,
    kept: &[(usize, usize)],
    group_size: usize,
    report: DynamicReport,
) -> Rollout {
    let mut out = Rollout {
        step: rounds[0].step,
        batch: RolloutBatch {
            policy_version: rounds[0].batch.policy_version,
            samples: Vec::new(),
        },
        texts: Vec::new(),
        rows: RowTexts::default(),
        rewards: None,
        generated: rounds.iter().map(|r| r.generated).sum(),
        gen_tokens: rounds.iter().map(|r| r.gen_tokens).sum(),
        all_tokens: rounds.iter().map(|r| r.all_tokens).sum(),
        correct: rounds.iter().map(|r| r.correct).sum(),
        gen_secs: rounds.iter().map(|r| r.gen_secs).sum(),
        prompts_drawn: rounds.iter().map(|r| r.prompts_drawn).sum(),
        dynamic: Some(report),
        episodes: EpisodeStats::sum(rounds.iter().map(|r| r.episodes)),
        episode_records: Vec::new(),
    };
    let mut rewards = Vec::with_capacity(kept.len() * group_size);
    for (new_group, &(r, group)) in kept.iter().enumerate() {
        let ro = &mut rounds[r];
        for i in group * group_size..(group + 1) * group_size {
            let mut s = ro.batch.samples[i].clone();
            s.sample_id = out.batch.samples.len() as u64;
            s.group_id = new_group as u64;
            out.batch.samples.push(s);
            out.texts.push(std::mem::take(&mut ro.texts[i]));
            out.rows
                .prompts
                .push(std::mem::take(&mut ro.rows.prompts[i]));
            out.rows.answers.push(ro.rows.answers[i].take());
            if let Some(c) = ro.rows.columns.get_mut(i) {
                out.rows.columns.push(c.take());
            }
            rewards.push(ro.rewards.as_ref().map_or(0.0, |v| v[i]));
            if let Some(r) = ro.episode_records.get(i) {
                out.episode_records.push(r.clone());
            }
        }
    }
    out.rewards = Some(rewards);
    out
}

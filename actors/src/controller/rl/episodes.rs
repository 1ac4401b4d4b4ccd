//! Multi-turn episodes in the rollout stage (`[env]`): the run's environment and limits
//! ([`RunEnv`]), one round's episodes through `crate::environment::run_episodes`, their
//! scores (the reward role's score of the last turn plus the environment's rewards; a failed
//! episode's group dropped, or scored `env.failure_reward`), and the counts the step reports.

use crate::batch::{RolloutBatch, RolloutRequest};
use crate::environment::{
    built_in_tool, run_episodes, Environment, EpisodeLimits, EpisodeRecord, EpisodeRow,
    HttpEnvironment, HttpTool, Tool, ToolRunner,
};
use crate::recipe::{EnvKind, EnvSection, OnEpisodeFailure};
use crate::roles::Generate;
use crate::service::SetupError;
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_models::text::turn_wrapper::turn_end_token;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The run's environment (`[env]`: the tool runner or an environment server), the tools
/// the chat template declares, and the episodes' limits.
pub(crate) struct RunEnv {
    pub env: Box<dyn Environment>,
    /// The tools' JSON schemas for the chat template's `tools=` (the tool runner's).
    pub tools: Option<serde_json::Value>,
    pub limits: EpisodeLimits,
    pub on_failure: OnEpisodeFailure,
    pub failure_reward: f32,
    /// Ids that end a model turn: the tokenizer's stop ids and the token with which the
    /// chat template ends an assistant turn.
    pub stop_ids: Vec<u32>,
}

impl RunEnv {
    /// The environment of `env` (checked by the recipe's validation), for the policy's
    /// tokenizer. `Err` when a server's client cannot be set up.
    pub fn new(env: &EnvSection, tok: &Tokenizer) -> Result<Self, SetupError> {
        let chat = tok.chat_template().is_some();
        let mut stop_ids = tok.stop_token_ids().to_vec();
        stop_ids.extend(turn_end_token(tok).filter(|id| !stop_ids.contains(id)));
        let (environment, tools): (Box<dyn Environment>, _) = match env.kind {
            EnvKind::Tools => {
                let mut tools: Vec<Box<dyn Tool>> = env
                    .tools
                    .iter()
                    .filter_map(|name| built_in_tool(name))
                    .collect();
                let persistence = env.http.persistence();
                for t in &env.http_tools {
                    let p = t.parameters.clone();
                    let tool = HttpTool::new(&t.name, &t.description, p, &t.url, &persistence)?;
                    tools.push(Box::new(tool));
                }
                let timeout = Duration::from_secs_f64(env.tool_timeout_s);
                let runner = ToolRunner::new(tools, env.tool_format, timeout);
                let schemas = runner.schemas();
                (Box::new(runner), Some(schemas))
            }
            EnvKind::Http => {
                let server = HttpEnvironment::new(&env.http.url, &env.http.persistence())?;
                (Box::new(server), None)
            }
        };
        Ok(Self {
            env: environment,
            tools,
            limits: EpisodeLimits {
                max_turns: env.max_turns,
                max_tokens: env.max_tokens,
                deadline: Duration::from_secs_f64(env.timeout_s),
                chat,
            },
            on_failure: env.on_failure,
            failure_reward: env.failure_reward as f32,
            stop_ids,
        })
    }
}

/// What the episodes of one batch did, for the step's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct EpisodeStats {
    pub episodes: usize,
    pub turns: usize,
    pub tool_calls: usize,
    pub tool_errors: usize,
    /// Seconds the environment took, summed over episodes.
    pub env_secs: f64,
    /// Episodes that timed out, and that failed otherwise.
    pub timed_out: usize,
    pub env_failed: usize,
    /// Episodes that ended by a rule rather than their environment: the turn limit, the
    /// token budget, a cut turn, a stop token the chat template cannot continue after.
    pub cut: usize,
    /// Samples dropped with their group because an episode of it failed.
    pub dropped: usize,
}

impl EpisodeStats {
    pub fn of(records: &[EpisodeRecord]) -> Self {
        use crate::environment::EpisodeEnd as E;
        let mut s = EpisodeStats {
            episodes: records.len(),
            ..Self::default()
        };
        for r in records {
            s.turns += r.turns;
            s.tool_calls += r.tool_calls;
            s.tool_errors += r.tool_errors;
            s.env_secs += r.env_secs;
            match r.end {
                E::TimedOut(_) => s.timed_out += 1,
                E::EnvFailed(_) => s.env_failed += 1,
                E::TurnLimit | E::TokenBudget | E::TurnLength | E::EndOfText => s.cut += 1,
                E::Done => {}
            }
        }
        s
    }

    /// The totals of several rounds' stats; None when no round ran episodes.
    pub fn sum(rounds: impl Iterator<Item = Option<EpisodeStats>>) -> Option<EpisodeStats> {
        rounds.flatten().reduce(|a, b| EpisodeStats {
            episodes: a.episodes + b.episodes,
            turns: a.turns + b.turns,
            tool_calls: a.tool_calls + b.tool_calls,
            tool_errors: a.tool_errors + b.tool_errors,
            env_secs: a.env_secs + b.env_secs,
            timed_out: a.timed_out + b.timed_out,
            env_failed: a.env_failed + b.env_failed,
            cut: a.cut + b.cut,
            dropped: a.dropped + b.dropped,
        })
    }

    /// The step's `episode_*` metrics.
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let n = self.episodes.max(1) as f64;
        vec![
            ("episode_turns_mean", self.turns as f64 / n),
            ("episode_tool_calls_mean", self.tool_calls as f64 / n),
            ("episode_tool_errors", self.tool_errors as f64),
            ("episode_env_seconds_mean", self.env_secs / n),
            ("episode_timed_out", self.timed_out as f64),
            ("episode_env_failed", self.env_failed as f64),
            ("episode_cut", self.cut as f64),
            ("episode_samples_dropped", self.dropped as f64),
        ]
    }
}

/// One round's episodes: the batch (one sample per request), each episode's record.
/// `prompts`, `answers` and `columns` are the requests' dataset rows (`columns` may be empty).
pub(crate) async fn generate<G: Generate + ?Sized>(
    gen: &G,
    env: &RunEnv,
    tok: &Tokenizer,
    request: &RolloutRequest,
    (prompts, answers, columns): (&[String], &[Option<String>], &[Option<String>]),
    label: &str,
) -> Result<(RolloutBatch, Vec<EpisodeRecord>), crate::error::RoleError> {
    let rows: Vec<EpisodeRow<'_>> = (0..request.samples.len())
        .map(|i| EpisodeRow {
            prompt: &prompts[i],
            answer: answers[i].as_deref(),
            columns: columns.get(i).and_then(|c| c.as_deref()),
        })
        .collect();
    let out = run_episodes(
        gen,
        env.env.as_ref(),
        tok,
        request,
        &rows,
        env.limits,
        label,
    )
    .await?;
    Ok((out.batch, out.records))
}

/// Each episode's score: the reward role's score of its last turn plus its environment's
/// rewards; a failed episode scores `env.failure_reward` (`on_failure = "score"`).
pub(crate) fn episode_scores(env: &RunEnv, scores: &[f32], records: &[EpisodeRecord]) -> Vec<f32> {
    scores
        .iter()
        .zip(records)
        .map(|(&s, r)| {
            if r.end.failed() {
                env.failure_reward
            } else {
                s + r.env_reward
            }
        })
        .collect()
}

/// The groups (of `group_size` samples) without a failed episode, in order.
pub(crate) fn surviving_groups(records: &[EpisodeRecord], group_size: usize) -> Vec<usize> {
    records
        .chunks(group_size)
        .enumerate()
        .filter(|(_, g)| !g.iter().any(|r| r.end.failed()))
        .map(|(i, _)| i)
        .collect()
}

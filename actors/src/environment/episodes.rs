//! The turn loop of a batch of multi-turn episodes, token in and token out.
//!
//! Turn `k` of every live episode is generated in one request to the policy (continuous
//! batching across episodes): its prompt is the episode's ids so far, the dataset prompt
//! followed by every sampled turn and every reply, exactly as they were appended. Each
//! finished turn goes to its environment (concurrently over episodes); the reply is
//! rendered once, by the model's own chat template after the stop token the model produced
//! (`oxalign_models::text::turn_wrapper`), tokenized once and appended. The conversation is
//! never rendered again, so the ids trained on are the ids sampled and appended.
//!
//! An episode ends when its environment says so, at the turn limit, when its tokens reach
//! the budget, when a turn is cut at the per-turn limit, at the batch's deadline, or when
//! its environment fails or does not answer in time; the [`EpisodeRecord`] says which, at
//! which turn. Nothing is waited on past the deadline.

use super::{EnvError, Environment, Episode, EpisodeRow};
use crate::batch::{Finish, RolloutBatch, RolloutRequest, Sample, SampleRequest};
use crate::error::RoleError;
use crate::roles::Generate;
use oxalign_models::text::chat_template::ChatMessage;
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_models::text::turn_wrapper::{observation_text, raw_observation, TurnWrapError};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::time::{Duration, Instant};

/// The limits of every episode of a batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpisodeLimits {
    /// Most model turns.
    pub max_turns: usize,
    /// Most response tokens (model and environment) after the prompt.
    pub max_tokens: usize,
    /// Wall-clock limit of the whole batch, from its first turn.
    pub deadline: Duration,
    /// Replies rendered by the tokenizer's chat template (else raw `<tool_response>` lines).
    pub chat: bool,
}

/// Why an episode ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "reason", content = "detail")]
pub enum EpisodeEnd {
    /// The environment ended it (e.g. a final answer without a tool call).
    Done,
    /// It used every turn.
    TurnLimit,
    /// Its tokens reached `max_tokens`.
    TokenBudget,
    /// A turn reached the per-turn token limit without a stop token.
    TurnLength,
    /// The model ended its turn with a stop token after which the chat template cannot
    /// continue (e.g. the end of text instead of the end of a chat turn): the episode is over.
    EndOfText,
    /// The batch's deadline passed, or the environment did not answer in time.
    TimedOut(String),
    /// The environment failed.
    EnvFailed(String),
}

impl std::fmt::Display for EpisodeEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EpisodeEnd::Done => f.write_str("done"),
            EpisodeEnd::TurnLimit => f.write_str("turn limit"),
            EpisodeEnd::TokenBudget => f.write_str("token budget"),
            EpisodeEnd::TurnLength => f.write_str("turn cut at rl.max_new_tokens"),
            EpisodeEnd::EndOfText => {
                f.write_str("ended by a stop token the chat template cannot continue after")
            }
            EpisodeEnd::TimedOut(m) => write!(f, "timed out: {m}"),
            EpisodeEnd::EnvFailed(m) => write!(f, "environment failed: {m}"),
        }
    }
}

impl EpisodeEnd {
    /// Whether the episode failed (timed out or its environment failed), rather than ending
    /// by a rule.
    pub fn failed(&self) -> bool {
        matches!(self, EpisodeEnd::TimedOut(_) | EpisodeEnd::EnvFailed(_))
    }
}

/// What one episode did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// Model turns generated.
    pub turns: usize,
    /// Tool calls made, and how many failed.
    pub tool_calls: usize,
    pub tool_errors: usize,
    /// Sum of the environment's rewards.
    pub env_reward: f32,
    /// Why it ended, and in which turn (from 0).
    pub end: EpisodeEnd,
    pub end_turn: usize,
    /// Seconds its environment took to answer (all turns).
    pub env_secs: f64,
    /// Response positions of its last model turn (what a reward reads as the answer).
    pub last_turn: Range<usize>,
}

/// A batch of episodes: one sample per episode, in request order, and their records.
#[derive(Debug, Clone)]
pub struct EpisodeOutcome {
    /// Each sample's response holds every turn and reply after the prompt; the replies are
    /// its `observations`.
    pub batch: RolloutBatch,
    pub records: Vec<EpisodeRecord>,
}

/// One episode while it runs.
struct Live {
    episode: Option<Box<dyn Episode>>,
    response: Vec<u32>,
    logprobs: Vec<f32>,
    observations: Vec<Range<usize>>,
    record: EpisodeRecord,
    ended: bool,
}

impl Live {
    fn end(&mut self, end: EpisodeEnd, turn: usize) {
        self.record.end = end;
        self.record.end_turn = turn;
        self.ended = true;
    }
}

/// Runs one episode per sample of `request` (its `max_new_tokens` is each turn's limit)
/// in `env`, starting from `rows`; `label` names the generation calls.
pub async fn run_episodes<G: Generate + ?Sized>(
    gen: &G,
    env: &dyn Environment,
    tok: &Tokenizer,
    request: &RolloutRequest,
    rows: &[EpisodeRow<'_>],
    limits: EpisodeLimits,
    label: &str,
) -> Result<EpisodeOutcome, RoleError> {
    let deadline = tokio::time::Instant::now() + limits.deadline;
    let mut live = start(env, rows, deadline).await;
    let mut version = u64::MAX;
    for turn in 0..limits.max_turns {
        let active: Vec<usize> = (0..live.len()).filter(|&i| !live[i].ended).collect();
        if active.is_empty() {
            break;
        }
        let turn_request = next_turn(request, &live, &active, turn, limits.max_tokens);
        let batch = gen
            .generate(turn_request, format!("{label}, turn {}", turn + 1))
            .await?;
        version = version.min(batch.policy_version);
        let mut stepping = Vec::new();
        for (&i, s) in active.iter().zip(batch.samples) {
            let ep = &mut live[i];
            let start = ep.response.len();
            ep.response.extend_from_slice(&s.response);
            ep.logprobs.extend_from_slice(&s.logprobs);
            ep.record.turns += 1;
            ep.record.last_turn = start..ep.response.len();
            match s.finish {
                Finish::Length if ep.response.len() >= limits.max_tokens => {
                    ep.end(EpisodeEnd::TokenBudget, turn)
                }
                Finish::Length => ep.end(EpisodeEnd::TurnLength, turn),
                Finish::Stop => stepping.push(i),
            }
        }
        step_all(&mut live, &stepping, turn, tok, limits, deadline).await;
    }
    for (i, ep) in live.iter_mut().enumerate() {
        if !ep.ended {
            let turn = ep.record.turns.saturating_sub(1);
            ep.end(EpisodeEnd::TurnLimit, turn);
        }
        debug_assert_eq!(ep.response.len(), ep.logprobs.len(), "episode {i}");
    }
    let closing = live
        .iter_mut()
        .filter_map(|ep| ep.episode.as_mut())
        .map(|e| e.close());
    futures::future::join_all(closing).await;
    if version == u64::MAX {
        // Every episode failed before its first turn: the batch still belongs to the
        // policy's current version (an empty request generates nothing and says which).
        let empty = gen
            .generate(RolloutRequest::default(), label.to_string())
            .await?;
        version = empty.policy_version;
    }
    Ok(assemble(request, live, version))
}

/// Starts every episode (concurrently); one whose reset fails or times out is ended at once.
async fn start(
    env: &dyn Environment,
    rows: &[EpisodeRow<'_>],
    deadline: tokio::time::Instant,
) -> Vec<Live> {
    let resets = rows
        .iter()
        .map(|&row| tokio::time::timeout_at(deadline, env.reset(row)));
    let started = futures::future::join_all(resets).await;
    started
        .into_iter()
        .map(|r| {
            let mut ep = Live {
                episode: None,
                response: Vec::new(),
                logprobs: Vec::new(),
                observations: Vec::new(),
                record: EpisodeRecord {
                    turns: 0,
                    tool_calls: 0,
                    tool_errors: 0,
                    env_reward: 0.0,
                    end: EpisodeEnd::Done,
                    end_turn: 0,
                    env_secs: 0.0,
                    last_turn: 0..0,
                },
                ended: false,
            };
            match r {
                Ok(Ok(e)) => ep.episode = Some(e),
                Ok(Err(e)) => ep.end(failure(e), 0),
                Err(_) => ep.end(deadline_passed(), 0),
            }
            ep
        })
        .collect()
}

/// Turn `turn`'s request: each active episode's ids so far as its prompt, its per-turn limit
/// cut to what is left of the budget, and a seed of its own for the turn.
fn next_turn(
    request: &RolloutRequest,
    live: &[Live],
    active: &[usize],
    turn: usize,
    max_tokens: usize,
) -> RolloutRequest {
    let samples = active
        .iter()
        .map(|&i| {
            let first = &request.samples[i];
            let ep = &live[i];
            let mut prompt = first.prompt.clone();
            prompt.extend_from_slice(&ep.response);
            let left = max_tokens.saturating_sub(ep.response.len()).max(1);
            let mut sampling = first.sampling;
            sampling.seed = turn_seed(sampling.seed, turn);
            SampleRequest {
                prompt,
                max_new_tokens: first.max_new_tokens.min(left),
                sampling,
                ..first.clone()
            }
        })
        .collect();
    RolloutRequest { samples }
}

/// The seed of turn `turn` of a sample seeded `seed` (turn 0 keeps it).
fn turn_seed(seed: u64, turn: usize) -> u64 {
    if turn == 0 {
        return seed;
    }
    let x = seed ^ (turn as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (x ^ (x >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Sends turn `turn` of the episodes `which` to their environments (concurrently, each
/// bounded by the deadline) and appends the replies of those that go on.
async fn step_all(
    live: &mut [Live],
    which: &[usize],
    turn: usize,
    tok: &Tokenizer,
    limits: EpisodeLimits,
    deadline: tokio::time::Instant,
) {
    let calls = live
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| which.contains(i))
        .map(|(_, ep)| async move {
            let text = tok
                .decode(&ep.response[ep.record.last_turn.clone()], false)
                .unwrap_or_default();
            let episode = ep
                .episode
                .as_mut()
                .expect("a live episode has its environment");
            let began = Instant::now();
            let answer = tokio::time::timeout_at(deadline, episode.step(turn, &text)).await;
            ep.record.env_secs += began.elapsed().as_secs_f64();
            (ep, answer)
        });
    for (ep, answer) in futures::future::join_all(calls).await {
        let t = match answer {
            Err(_) => return_end(ep, deadline_passed(), turn),
            Ok(Err(e)) => return_end(ep, failure(e), turn),
            Ok(Ok(t)) => Some(t),
        };
        let Some(t) = t else { continue };
        ep.record.env_reward += t.reward;
        ep.record.tool_calls += t.tool_calls;
        ep.record.tool_errors += t.tool_errors;
        if t.done {
            ep.end(EpisodeEnd::Done, turn);
        } else if turn + 1 == limits.max_turns {
            ep.end(EpisodeEnd::TurnLimit, turn);
        } else {
            append_reply(ep, &t.reply, turn, tok, limits);
        }
    }
}

fn return_end<T>(ep: &mut Live, end: EpisodeEnd, turn: usize) -> Option<T> {
    ep.end(end, turn);
    None
}

/// Appends the environment's `reply` to the episode as tokens (ending it when they do not
/// fit the budget or cannot be rendered).
fn append_reply(
    ep: &mut Live,
    reply: &[ChatMessage],
    turn: usize,
    tok: &Tokenizer,
    limits: EpisodeLimits,
) {
    let ids = match reply_ids(ep, reply, tok, limits.chat) {
        Ok(ids) => ids,
        Err(ReplyError::AfterEndOfText) => return ep.end(EpisodeEnd::EndOfText, turn),
        Err(ReplyError::Failed(message)) => return ep.end(EpisodeEnd::EnvFailed(message), turn),
    };
    if ep.response.len() + ids.len() >= limits.max_tokens {
        return ep.end(EpisodeEnd::TokenBudget, turn);
    }
    let start = ep.response.len();
    ep.response.extend_from_slice(&ids);
    ep.logprobs.resize(ep.response.len(), 0.0);
    ep.observations.push(start..ep.response.len());
}

/// Why a reply cannot follow a turn.
enum ReplyError {
    /// The turn ended with a stop token the chat template does not continue after.
    AfterEndOfText,
    /// The reply could not be rendered or tokenized.
    Failed(String),
}

/// The ids of `reply` after the episode's last turn.
fn reply_ids(
    ep: &Live,
    reply: &[ChatMessage],
    tok: &Tokenizer,
    chat: bool,
) -> Result<Vec<u32>, ReplyError> {
    let failed = |e: &dyn std::fmt::Display| ReplyError::Failed(e.to_string());
    let text = if chat {
        let stop = ep.response.last().copied().into_iter().collect::<Vec<_>>();
        let stop = tok.decode(&stop, false).map_err(|e| failed(&e))?;
        match observation_text(tok, reply, &stop) {
            Ok(text) => text,
            Err(TurnWrapError::StopMismatch { .. }) => return Err(ReplyError::AfterEndOfText),
            Err(e) => return Err(failed(&e)),
        }
    } else {
        raw_observation(reply)
    };
    tok.encode(&text, false).map_err(|e| failed(&e))
}

fn failure(e: EnvError) -> EpisodeEnd {
    match e {
        EnvError::TimedOut { .. } => EpisodeEnd::TimedOut(e.to_string()),
        EnvError::Failed { .. } => EpisodeEnd::EnvFailed(e.to_string()),
    }
}

fn deadline_passed() -> EpisodeEnd {
    EpisodeEnd::TimedOut("the episodes' deadline passed".into())
}

/// One sample per episode, in request order.
fn assemble(request: &RolloutRequest, live: Vec<Live>, version: u64) -> EpisodeOutcome {
    let mut samples = Vec::with_capacity(live.len());
    let mut records = Vec::with_capacity(live.len());
    for (first, ep) in request.samples.iter().zip(live) {
        samples.push(Sample {
            sample_id: first.sample_id,
            group_id: first.group_id,
            prompt: first.prompt.clone(),
            response: ep.response,
            logprobs: ep.logprobs,
            finish: match ep.record.end {
                EpisodeEnd::Done | EpisodeEnd::EndOfText => Finish::Stop,
                _ => Finish::Length,
            },
            routing: None,
            observations: ep.observations,
        });
        records.push(ep.record);
    }
    EpisodeOutcome {
        batch: RolloutBatch {
            policy_version: version,
            samples,
        },
        records,
    }
}

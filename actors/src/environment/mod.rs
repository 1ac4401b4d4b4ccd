//! Environments of multi-turn episodes. An [`Environment`] starts an [`Episode`] from a
//! dataset row; each of the model's turns goes to [`Episode::step`], which answers with a
//! [`Transition`]: the reply the model sees next (tool results, the next user turn), a reward
//! and whether the episode is over.
//!
//! * `tools.rs`: the built-in tool runner: it parses the turn's tool calls
//!   (`oxalign_models::text::tool_call`), runs each declared [`Tool`] and answers with their
//!   results; a turn without a call ends the episode (it is the final answer).
//! * `calculator.rs`: the built-in calculator tool.
//! * `http.rs`: an environment server in any language, over HTTP/JSON.
//! * `http_tool.rs`: a tool served over HTTP.
//! * `episodes.rs`: the turn loop over a batch of episodes: generation through the policy,
//!   the environments' replies appended as tokens (never a re-rendered conversation), and
//!   the limits that end an episode (turns, tokens, deadline, a failing environment).

mod calculator;
mod episodes;
mod http;
mod http_tool;
mod tools;

#[cfg(test)]
mod episodes_tests;

pub use calculator::Calculator;
pub use episodes::{run_episodes, EpisodeEnd, EpisodeLimits, EpisodeOutcome, EpisodeRecord};
pub use http::HttpEnvironment;
pub use http_tool::HttpTool;
pub use tools::{Tool, ToolError, ToolRunner};

use async_trait::async_trait;
use oxalign_models::text::chat_template::ChatMessage;

/// The built-in tool called `name`, if there is one.
pub fn built_in_tool(name: &str) -> Option<Box<dyn Tool>> {
    match name {
        "calculator" => Some(Box::new(Calculator)),
        _ => None,
    }
}

/// The dataset row an episode starts from.
#[derive(Debug, Clone, Copy)]
pub struct EpisodeRow<'a> {
    /// The prompt's text.
    pub prompt: &'a str,
    /// The reference answer, when the dataset has one.
    pub answer: Option<&'a str>,
    /// The row's other columns, as JSON object text.
    pub columns: Option<&'a str>,
}

/// What the environment answers to one model turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transition {
    /// Messages the model sees before its next turn (role `tool` for tool results).
    pub reply: Vec<ChatMessage>,
    /// Reward of this turn (summed over the episode).
    pub reward: f32,
    /// The episode is over (the reply, if any, is not shown).
    pub done: bool,
    /// Tool calls the turn made, and how many of them failed (bad call, unknown tool, tool
    /// error): counted in the step's metrics.
    pub tool_calls: usize,
    pub tool_errors: usize,
}

/// Why an environment could not answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EnvError {
    /// It did not answer within its time limit.
    #[error("{what} did not answer within {secs} s")]
    TimedOut {
        /// The call (e.g. `tool "search"`, `environment http://…/step`).
        what: String,
        /// The limit.
        secs: f64,
    },
    /// It failed (unreachable, an error status, a malformed answer).
    #[error("{what} failed: {message}")]
    Failed {
        /// The call.
        what: String,
        /// What went wrong.
        message: String,
    },
}

/// Starts episodes.
#[async_trait]
pub trait Environment: Send + Sync {
    /// A new episode for `row`.
    async fn reset(&self, row: EpisodeRow<'_>) -> Result<Box<dyn Episode>, EnvError>;
}

/// One running episode.
#[async_trait]
pub trait Episode: Send {
    /// The environment's answer to the model's turn `turn` (decoded with its special
    /// tokens, so tool-call markers survive); `index` counts the episode's turns from 0.
    async fn step(&mut self, index: usize, turn: &str) -> Result<Transition, EnvError>;

    /// The episode is over (ended by any rule, or failed): release what it holds. Best
    /// effort and short; the default does nothing.
    async fn close(&mut self) {}
}

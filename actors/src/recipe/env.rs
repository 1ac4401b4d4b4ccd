//! `[env]`: multi-turn episodes. With the section, every RL sample is an episode: the
//! policy's turns alternate with an environment's replies (tool results) until the episode
//! ends, and the trainer learns from the model's tokens only. Without it, a sample is one
//! completion.

use super::{Recipe, RecipeError, RunKind};
use oxalign_models::text::tool_call::ToolCallFormat;
use serde::{Deserialize, Serialize};

/// The built-in tools `env.tools` may name (`crate::environment::built_in_tool`).
pub const BUILT_IN_TOOLS: &[&str] = &["calculator"];

/// What happens to an episode that times out or whose environment fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnEpisodeFailure {
    /// Its whole group (the samples of its prompt) leaves the batch.
    #[default]
    Drop,
    /// It is trained on with the reward `env.failure_reward`.
    Score,
}

/// Which environment answers the model's turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EnvKind {
    /// The built-in tool runner: `env.tools`, called in `env.tool_format`.
    #[default]
    Tools,
    /// An environment server (`[env.http]`), in any language; docs/ENVIRONMENTS.md.
    Http,
}

/// `[env.http]`: where the environment server is and how hard to try.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvHttpSection {
    /// The server's base URL (`http://` or `https://`); its endpoints are `/reset`, `/step`
    /// and `/close` under it. Required with `env.kind = "http"`.
    pub url: String,
    /// Seconds one attempt may take. Default 30.
    pub timeout_s: f64,
    /// Retries of a failed call (a retried step carries the same `turn_index`). Default 2.
    pub max_retries: u32,
    /// Backoff before the first retry, seconds; doubled up to `backoff_max_s`. Default 0.2.
    pub backoff_min_s: f64,
    /// Longest backoff, seconds. Default 2.
    pub backoff_max_s: f64,
    /// No retry starts later than this after a call's first attempt, seconds. Default 30.
    pub retry_budget_s: f64,
    /// Consecutive failed attempts that open the circuit breaker (refused connections,
    /// error statuses; a call that times out ends its own episode and does not count).
    /// Default 5.
    pub breaker_failures: u32,
    /// Seconds the open breaker fails calls without sending them. Default 10.
    pub breaker_cooldown_s: f64,
}

impl Default for EnvHttpSection {
    fn default() -> Self {
        Self {
            url: String::new(),
            timeout_s: 30.0,
            max_retries: 2,
            backoff_min_s: 0.2,
            backoff_max_s: 2.0,
            retry_budget_s: 30.0,
            breaker_failures: 5,
            breaker_cooldown_s: 10.0,
        }
    }
}

/// `[[env.http_tools]]`: a tool served over HTTP (`POST url` with `{"name", "arguments"}`,
/// answered `{"result"}` or `{"error"}`), called through `[env.http]`'s retry settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpToolSection {
    /// The name the model calls it by.
    pub name: String,
    /// The `http://` or `https://` URL its calls are posted to.
    pub url: String,
    /// What it does, for the model (the chat template's `tools=`). Default empty.
    #[serde(default)]
    pub description: String,
    /// Its arguments as a JSON schema (a TOML table). Default: an object without properties.
    #[serde(default = "no_parameters")]
    pub parameters: serde_json::Value,
}

fn no_parameters() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// `[env]`: the environment of multi-turn episodes and their limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvSection {
    /// `"tools"` (the built-in tool runner) or `"http"` (an environment server,
    /// `[env.http]`). Default `"tools"`.
    pub kind: EnvKind,
    /// Built-in tools the model may call, declared to it through the chat template's
    /// `tools=` (`"calculator"`). Default `["calculator"]`.
    pub tools: Vec<String>,
    /// How the model writes tool calls: `"hermes"` (`<tool_call>{json}</tool_call>`, Qwen2.5,
    /// Qwen3) or `"llama3"` (a JSON `{"name", "parameters"}` turn). Default `"hermes"`.
    pub tool_format: ToolCallFormat,
    /// Most model turns per episode. Default 4.
    pub max_turns: usize,
    /// Most response tokens per episode, model and environment together
    /// (`rl.max_new_tokens` limits each turn). Default 256.
    pub max_tokens: usize,
    /// Seconds the episodes of one batch may take, from their first turn; an episode still
    /// waiting on its environment then ends as timed out. Default 300.
    pub timeout_s: f64,
    /// Seconds one tool call may take before its episode ends as timed out. Default 10.
    pub tool_timeout_s: f64,
    /// `"drop"` (a failed episode's group leaves the batch) or `"score"` (it is trained on
    /// with `failure_reward`). Default `"drop"`.
    pub on_failure: OnEpisodeFailure,
    /// The reward of a failed episode with `on_failure = "score"`. Default 0.
    pub failure_reward: f64,
    /// `[env.http]`: the environment server of `kind = "http"`, and the retry settings of
    /// every HTTP tool.
    pub http: EnvHttpSection,
    /// `[[env.http_tools]]`: tools served over HTTP, beside the built-in `env.tools`
    /// (`kind = "tools"`). Default none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub http_tools: Vec<HttpToolSection>,
}

impl Default for EnvSection {
    fn default() -> Self {
        Self {
            kind: EnvKind::Tools,
            http: EnvHttpSection::default(),
            http_tools: Vec::new(),
            tools: vec!["calculator".into()],
            tool_format: ToolCallFormat::Hermes,
            max_turns: 4,
            max_tokens: 256,
            timeout_s: 300.0,
            tool_timeout_s: 10.0,
            on_failure: OnEpisodeFailure::Drop,
            failure_reward: 0.0,
        }
    }
}

/// Refuses an `[env]` that cannot run: outside RL, limits that are not positive, unknown
/// tools, or an RL setting episodes do not support.
pub(super) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let Some(env) = &r.env else { return Ok(()) };
    if r.run.kind != RunKind::Rl {
        return Err(bad(
            "env",
            "RL runs only: episodes are generated by RL steps".into(),
        ));
    }
    if env.max_turns == 0 {
        return Err(bad("env.max_turns", "expected 1 or more".into()));
    }
    if env.max_tokens < r.rl.max_new_tokens {
        return Err(bad(
            "env.max_tokens",
            format!(
                "{} is below rl.max_new_tokens = {} (one turn's limit); expected at least that",
                env.max_tokens, r.rl.max_new_tokens
            ),
        ));
    }
    for (key, v) in [
        ("env.timeout_s", env.timeout_s),
        ("env.tool_timeout_s", env.tool_timeout_s),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(bad(key, format!("{v} is not a positive number of seconds")));
        }
    }
    if !env.failure_reward.is_finite() {
        return Err(bad("env.failure_reward", "expected a finite number".into()));
    }
    if env.kind == EnvKind::Http {
        return validate_http(&env.http, bad);
    }
    validate_tools(env, bad)?;
    if r.rl.routing_replay {
        return Err(bad(
            "rl.routing_replay",
            "is not supported with [env] episodes yet (each turn is routed apart)".into(),
        ));
    }
    Ok(())
}

/// Refuses an `[env.http]` without a usable URL or with limits that are not positive.
fn validate_http(
    http: &EnvHttpSection,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if let Err(e) = crate::service::check_url(&http.url) {
        return Err(bad("env.http.url", format!("{:?}: {e}", http.url)));
    }
    for (key, v) in [
        ("env.http.timeout_s", http.timeout_s),
        ("env.http.backoff_min_s", http.backoff_min_s),
        ("env.http.backoff_max_s", http.backoff_max_s),
        ("env.http.retry_budget_s", http.retry_budget_s),
        ("env.http.breaker_cooldown_s", http.breaker_cooldown_s),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(bad(key, format!("{v} is not a positive number of seconds")));
        }
    }
    Ok(())
}

impl EnvHttpSection {
    /// The transport's retry and breaker settings.
    pub(crate) fn persistence(&self) -> crate::service::Persistence {
        let secs = std::time::Duration::from_secs_f64;
        crate::service::Persistence {
            timeout: secs(self.timeout_s),
            max_retries: self.max_retries,
            min_backoff: secs(self.backoff_min_s),
            max_backoff: secs(self.backoff_max_s),
            retry_budget: secs(self.retry_budget_s),
            breaker_failures: self.breaker_failures,
            breaker_cooldown: secs(self.breaker_cooldown_s),
            timeouts_trip_breaker: false,
        }
    }
}

/// Refuses a tool runner without tools, an unknown built-in, a name used twice, or an HTTP
/// tool without a usable URL.
fn validate_tools(
    env: &EnvSection,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if env.tools.is_empty() && env.http_tools.is_empty() {
        return Err(bad(
            "env.tools",
            "expected at least one tool (built in: calculator; or [[env.http_tools]])".into(),
        ));
    }
    if let Some(t) = env
        .tools
        .iter()
        .find(|t| !BUILT_IN_TOOLS.contains(&t.as_str()))
    {
        return Err(bad(
            "env.tools",
            format!(
                "unknown tool {t:?}; built in: {}",
                BUILT_IN_TOOLS.join(", ")
            ),
        ));
    }
    let mut names: Vec<&str> = env.tools.iter().map(String::as_str).collect();
    for (i, t) in env.http_tools.iter().enumerate() {
        let key = format!("env.http_tools[{i}]");
        if t.name.trim().is_empty() || names.contains(&t.name.as_str()) {
            return Err(bad(
                &format!("{key}.name"),
                format!("{:?}: expected a non-empty name no other tool has", t.name),
            ));
        }
        names.push(&t.name);
        if let Err(e) = crate::service::check_url(&t.url) {
            return Err(bad(&format!("{key}.url"), format!("{:?}: {e}", t.url)));
        }
        if !t.parameters.is_object() {
            return Err(bad(
                &format!("{key}.parameters"),
                "expected a table (the arguments' JSON schema)".into(),
            ));
        }
    }
    Ok(())
}

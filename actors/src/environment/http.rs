//! An environment served over HTTP, in any language (`tools/env_server.py` serves Python
//! ones). The protocol (docs/ENVIRONMENTS.md), JSON both ways:
//! * `POST <url>/reset` `{"prompt", "answer", "columns"}` → `{"episode_id"}`;
//! * `POST <url>/step` `{"episode_id", "turn_index", "turn"}` → `{"reply": [{"role",
//!   "content"}], "reward", "done"}`; a step sent again with the same `turn_index` (a retry)
//!   must get the same answer;
//! * `POST <url>/close` `{"episode_id"}` → anything: the episode is over (sent once, not
//!   retried, not waited on for long).
//!
//! Every call goes through the shared transport (`crate::service`): a timeout per attempt,
//! retries with backoff, a circuit breaker, redirects refused, answers read up to a limit.
//! A call that still fails ends the episode as failed (or timed out), naming the URL and the
//! last failure; its answer is checked before anything in it is used.

use super::{EnvError, Environment, Episode, EpisodeRow, Transition};
use crate::service::{self, error_chain, read_limited, snippet, AttemptLog, Attempts};
use crate::service::{Persistence, SetupError};
use async_trait::async_trait;
use oxalign_models::text::chat_template::ChatMessage;
use reqwest_middleware::ClientWithMiddleware;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The largest answer read from an environment server, bytes.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// How long a `close` may take before it is left behind.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A client of an environment server.
#[derive(Clone)]
pub struct HttpEnvironment {
    base: Arc<str>,
    client: ClientWithMiddleware,
    timeout: Duration,
}

impl HttpEnvironment {
    /// A client of the server at `url` (its endpoints are `url/reset`, `url/step`,
    /// `url/close`); refuses a URL that is not `http(s)://host…`.
    pub(crate) fn new(url: &str, persistence: &Persistence) -> Result<Self, SetupError> {
        let url = service::checked_url(url)?;
        Ok(Self {
            base: Arc::from(url.trim_end_matches('/')),
            client: service::client(persistence)?,
            timeout: persistence.timeout,
        })
    }

    /// Posts `body` to `<url>/<path>` and reads the JSON answer.
    async fn post(&self, path: &str, body: &Value) -> Result<Value, EnvError> {
        let url = format!("{}/{path}", self.base);
        post_json(&self.client, &url, body, self.timeout, "environment").await
    }
}

/// Posts `body` to `url` through `client` (attempts limited to `timeout`) and reads the
/// JSON answer; `who` names the service in errors (`environment`, `tool "search"`).
pub(super) async fn post_json(
    client: &ClientWithMiddleware,
    url: &str,
    body: &Value,
    timeout: Duration,
    who: &str,
) -> Result<Value, EnvError> {
    let what = format!("{who} {url}");
    let failed = |message: String| EnvError::Failed {
        what: what.clone(),
        message,
    };
    let log = Arc::new(AttemptLog::default());
    let sent = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .with_extension(Attempts(log.clone()))
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(_) if log.last_timed_out() => {
            return Err(EnvError::TimedOut {
                what: format!("{what} (each of {} attempt(s))", log.attempts().max(1)),
                secs: timeout.as_secs_f64(),
            })
        }
        Err(e) => {
            let last = log.last_failure().unwrap_or_else(|| error_chain(&e));
            return Err(failed(format!(
                "{} attempt(s); last failure: {last}",
                log.attempts().max(1)
            )));
        }
    };
    let status = response.status();
    if status.is_redirection() {
        return Err(failed(format!(
            "answered HTTP {status}; redirects are not followed"
        )));
    }
    let bytes = read_limited(response, MAX_ANSWER_BYTES)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !status.is_success() {
        return Err(failed(format!("HTTP {status}{}", snippet(&bytes))));
    }
    serde_json::from_slice(&bytes).map_err(|e| failed(format!("the answer is not JSON: {e}")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetAnswer {
    episode_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepAnswer {
    #[serde(default)]
    reply: Vec<ChatMessage>,
    reward: f32,
    done: bool,
}

#[async_trait]
impl Environment for HttpEnvironment {
    async fn reset(&self, row: EpisodeRow<'_>) -> Result<Box<dyn Episode>, EnvError> {
        let columns: Value = row
            .columns
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or(Value::Null);
        let body = json!({"prompt": row.prompt, "answer": row.answer, "columns": columns});
        let answer = self.post("reset", &body).await?;
        let ResetAnswer { episode_id } =
            serde_json::from_value(answer).map_err(|e| EnvError::Failed {
                what: format!("environment {}/reset", self.base),
                message: format!("expected {{\"episode_id\": \"...\"}}: {e}"),
            })?;
        Ok(Box::new(HttpEpisode {
            env: self.clone(),
            id: episode_id,
        }))
    }
}

struct HttpEpisode {
    env: HttpEnvironment,
    id: String,
}

#[async_trait]
impl Episode for HttpEpisode {
    async fn step(&mut self, index: usize, turn: &str) -> Result<Transition, EnvError> {
        let body = json!({"episode_id": self.id, "turn_index": index, "turn": turn});
        let answer = self.env.post("step", &body).await?;
        let bad = |message: String| EnvError::Failed {
            what: format!("environment {}/step", self.env.base),
            message,
        };
        let a: StepAnswer = serde_json::from_value(answer).map_err(|e| {
            bad(format!(
                "expected {{\"reply\": [{{\"role\", \"content\"}}], \"reward\", \"done\"}}: {e}"
            ))
        })?;
        if !a.reward.is_finite() {
            return Err(bad(format!("reward {} is not finite", a.reward)));
        }
        Ok(Transition {
            reply: a.reply,
            reward: a.reward,
            done: a.done,
            ..Transition::default()
        })
    }

    async fn close(&mut self) {
        let body = json!({"episode_id": self.id});
        let url = format!("{}/close", self.env.base);
        // One attempt, not waited on for long: the server also forgets idle episodes.
        let request = self
            .env
            .client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        let _ = tokio::time::timeout(CLOSE_WAIT, request.send()).await;
    }
}

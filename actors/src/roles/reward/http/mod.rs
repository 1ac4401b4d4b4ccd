//! The client of an HTTP reward service: the batch is split into chunks of
//! `rows_per_request` rows, posted as JSON ([`schema`]) up to `concurrency` at a time, each
//! attempt with a timeout, retried with exponential backoff and jitter within a retry
//! budget (reqwest-retry), behind a circuit breaker (the shared transport, `crate::service`).
//!
//! It is async and runs on the caller's tokio runtime: waiting for the service blocks no
//! thread. A chunk that fails after its retries fails the whole batch with an
//! [`HttpRewardError`] naming the URL, the attempts and the last failure; the other chunks
//! are cancelled and no reward of the batch is returned, so nothing is half applied.
//! Proxies from the environment are not used; TLS is rustls with the ring provider.
//!
//! Redirects are not followed: the rows go to the configured URL only, and a 3xx answer is
//! an [`HttpRewardError::Redirected`] naming the URL and the `Location`. An answer longer
//! than [`MAX_RESPONSE_BYTES`] is refused unread.

mod error;
pub mod schema;

pub(crate) use crate::service::check_url;
pub(crate) use crate::service::MAX_RESPONSE_BYTES;
pub use error::HttpRewardError;

use crate::service::{client, Persistence};
use crate::service::{error_chain, read_limited, snippet, AttemptLog, Attempts, BodyError};
use futures::{StreamExt, TryStreamExt};
use reqwest_middleware::ClientWithMiddleware;
use schema::{column_objects, parse_rewards, RewardRequest};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// How to reach the service and how hard to try.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpRewardConfig {
    /// `http://` or `https://` endpoint that takes the POST.
    pub url: String,
    /// Limit of one attempt, connect to last byte.
    pub timeout: Duration,
    /// Retries after the first attempt of a request.
    pub max_retries: u32,
    /// Backoff before the first retry; doubled each retry (capped at `max_backoff`), then
    /// jittered uniformly down to half of `min_backoff`.
    pub min_backoff: Duration,
    /// Longest backoff between two attempts.
    pub max_backoff: Duration,
    /// No retry starts later than this after a request's first attempt.
    pub retry_budget: Duration,
    /// Rows per request.
    pub rows_per_request: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Consecutive failed attempts that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long the open breaker fails attempts without sending them.
    pub breaker_cooldown: Duration,
}

impl HttpRewardConfig {
    /// The transport's retry and breaker settings.
    fn persistence(&self) -> Persistence {
        Persistence {
            timeout: self.timeout,
            max_retries: self.max_retries,
            min_backoff: self.min_backoff,
            max_backoff: self.max_backoff,
            retry_budget: self.retry_budget,
            breaker_failures: self.breaker_failures,
            breaker_cooldown: self.breaker_cooldown,
            timeouts_trip_breaker: true,
        }
    }
}

/// A reward service client. Cheap to share; its breaker is shared by every request it sends.
pub struct HttpReward {
    cfg: HttpRewardConfig,
    client: ClientWithMiddleware,
}

impl HttpReward {
    /// A client for `cfg`; refuses a URL that is not `http(s)://host...`.
    pub fn new(cfg: HttpRewardConfig) -> Result<Self, HttpRewardError> {
        let bad = |message: String| HttpRewardError::Config {
            url: cfg.url.clone(),
            message,
        };
        check_url(&cfg.url).map_err(|e| bad(e.to_string()))?;
        if cfg.timeout.is_zero() || cfg.rows_per_request == 0 || cfg.concurrency == 0 {
            return Err(bad(
                "timeout, rows per request and concurrency must be positive".into(),
            ));
        }
        let client = client(&cfg.persistence()).map_err(|e| bad(e.to_string()))?;
        Ok(Self { cfg, client })
    }

    /// The configured URL.
    pub fn url(&self) -> &str {
        &self.cfg.url
    }

    /// One reward per row of `responses` (with the same rows of `prompts`, `answers` and
    /// `columns`, the rows' other columns as JSON object text; `columns` may be empty), or
    /// the first chunk's failure. Nothing is returned unless every row was scored.
    pub async fn score(
        &self,
        prompts: &[String],
        responses: &[String],
        answers: &[Option<String>],
        columns: &[Option<String>],
    ) -> Result<Vec<f64>, HttpRewardError> {
        let n = responses.len();
        assert!(
            prompts.len() == n && answers.len() == n && (columns.is_empty() || columns.len() == n),
            "one prompt and one answer per response"
        );
        let step = self.cfg.rows_per_request;
        let chunks: Vec<Range<usize>> =
            (0..n).step_by(step).map(|s| s..(s + step).min(n)).collect();
        let parts: Vec<Vec<f64>> = futures::stream::iter(chunks)
            .map(|r| {
                let cols = columns.get(r.clone()).unwrap_or_default();
                self.post(
                    &prompts[r.clone()],
                    &responses[r.clone()],
                    &answers[r],
                    cols,
                )
            })
            .buffered(self.cfg.concurrency)
            .try_collect()
            .await?;
        Ok(parts.concat())
    }

    /// Posts one chunk, retried by the middleware, and reads its rewards.
    async fn post(
        &self,
        prompts: &[String],
        responses: &[String],
        answers: &[Option<String>],
        columns: &[Option<String>],
    ) -> Result<Vec<f64>, HttpRewardError> {
        let rows = responses.len();
        let body = serde_json::to_vec(&RewardRequest {
            prompts,
            responses,
            answers,
            columns: column_objects(columns),
        })
        .expect("strings serialize");
        let log = Arc::new(AttemptLog::default());
        let sent = self
            .client
            .post(&self.cfg.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .with_extension(Attempts(log.clone()))
            .send()
            .await;
        let failed = |last: String| HttpRewardError::Failed {
            url: self.cfg.url.clone(),
            rows,
            attempts: log.attempts().max(1),
            last,
        };
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                return Err(failed(
                    log.last_failure().unwrap_or_else(|| error_chain(&e)),
                ))
            }
        };
        let status = response.status();
        if status.is_redirection() {
            return Err(self.redirected(&response, rows));
        }
        let bytes = match read_limited(response, MAX_RESPONSE_BYTES).await {
            Ok(b) => b,
            Err(BodyError::TooLarge { limit }) => {
                return Err(HttpRewardError::TooLarge {
                    url: self.cfg.url.clone(),
                    rows,
                    status: status.as_u16(),
                    limit,
                })
            }
            Err(e) if status.is_success() => return Err(failed(e.to_string())),
            Err(_) => Vec::new(),
        };
        if !status.is_success() {
            return Err(failed(format!("HTTP {status}{}", snippet(&bytes))));
        }
        parse_rewards(&bytes, rows).map_err(|message| HttpRewardError::BadResponse {
            url: self.cfg.url.clone(),
            rows,
            attempts: log.attempts().max(1),
            message,
        })
    }

    /// The error for a 3xx answer: redirects are never followed.
    fn redirected(&self, response: &reqwest::Response, rows: usize) -> HttpRewardError {
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
        HttpRewardError::Redirected {
            url: self.cfg.url.clone(),
            rows,
            status: response.status().as_u16(),
            location: location.unwrap_or_else(|| "(none)".into()),
        }
    }
}

//! The client of an HTTP reward service: the batch is split into chunks of
//! `rows_per_request` rows, posted as JSON ([`schema`]) up to `concurrency` at a time, each
//! attempt with a timeout, retried with exponential backoff and jitter within a retry
//! budget (reqwest-retry), behind a circuit breaker (`breaker.rs`).
//!
//! It is async and runs on the caller's tokio runtime: waiting for the service blocks no
//! thread. A chunk that fails after its retries fails the whole batch with an
//! [`HttpRewardError`] naming the URL, the attempts and the last failure; the other chunks
//! are cancelled and no reward of the batch is returned, so nothing is half applied.
//! Proxies from the environment are not used; TLS is rustls with the ring provider.
//!
//! Redirects are not followed: the rows go to the configured URL only, and a 3xx answer is
//! an [`HttpRewardError::Redirected`] naming the URL and the `Location`. An answer longer
//! than [`MAX_RESPONSE_BYTES`] is refused unread (`body.rs`).

mod body;
mod breaker;
mod error;
pub mod schema;

pub(crate) use body::MAX_RESPONSE_BYTES;
pub use error::HttpRewardError;

use body::{read_limited, snippet, BodyError};
use breaker::{AttemptLog, Attempts, Breaker, Guard};
use error::error_chain;
use futures::{StreamExt, TryStreamExt};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::{Jitter, RetryTransientMiddleware};
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

/// Why a reward-service URL is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UrlError {
    /// It does not parse as a URL.
    #[error("not a URL: {0}")]
    NotUrl(#[from] url::ParseError),
    /// Another scheme, or no host.
    #[error("expected an http:// or https:// URL with a host")]
    NotHttp,
}

/// `Ok` when `url` is an `http://` or `https://` URL with a host, else what is wrong.
pub(crate) fn check_url(url: &str) -> Result<(), UrlError> {
    let parsed = reqwest::Url::parse(url)?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(UrlError::NotHttp);
    }
    Ok(())
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
        // Another part of the process may have installed a provider first; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let inner = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| bad(format!("cannot build the HTTP client: {}", error_chain(&e))))?;
        let policy = ExponentialBackoff::builder()
            .retry_bounds(cfg.min_backoff, cfg.max_backoff.max(cfg.min_backoff))
            .jitter(Jitter::Bounded)
            .base(2)
            .build_with_total_retry_duration_and_max_retries(cfg.retry_budget, cfg.max_retries);
        let breaker = Arc::new(Breaker::new(cfg.breaker_failures, cfg.breaker_cooldown));
        let client = ClientBuilder::new(inner)
            .with(RetryTransientMiddleware::new_with_policy(policy))
            .with(Guard(breaker))
            .build();
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

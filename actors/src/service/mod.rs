//! The transport of oxalign's clients of HTTP services (the reward service, environment
//! servers): JSON posted with a timeout per attempt, retried with exponential backoff and
//! jitter within a retry budget (reqwest-retry), behind a circuit breaker (`breaker.rs`),
//! redirects never followed, answers read up to a size limit (`body.rs`). Proxies from the
//! environment are not used; TLS is rustls with the ring provider.

mod body;
mod breaker;

pub(crate) use body::{read_limited, snippet, BodyError, MAX_RESPONSE_BYTES};
pub(crate) use breaker::{AttemptLog, Attempts, Breaker, Guard};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::{Jitter, RetryTransientMiddleware};
use std::sync::Arc;
use std::time::Duration;

/// How hard a client tries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Persistence {
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
    /// Consecutive failed attempts that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long the open breaker fails attempts without sending them.
    pub breaker_cooldown: Duration,
    /// Whether attempts that time out count towards the breaker (a reward service that
    /// stalls is down; an environment whose one episode hangs is not).
    pub timeouts_trip_breaker: bool,
}

/// Why a service client cannot be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    /// The service's URL is refused.
    #[error("{url:?}: {source}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        #[source]
        source: UrlError,
    },
    /// reqwest cannot build the client.
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
}

/// `url` checked as a service URL ([`check_url`]).
pub(crate) fn checked_url(url: &str) -> Result<&str, SetupError> {
    check_url(url).map_err(|source| SetupError::Url {
        url: url.into(),
        source,
    })?;
    Ok(url)
}

/// A client with the retry and breaker middleware of `p`; its breaker is shared by every
/// request it sends.
pub(crate) fn client(p: &Persistence) -> Result<ClientWithMiddleware, SetupError> {
    // Another part of the process may have installed a provider first; either is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let inner = reqwest::Client::builder()
        .timeout(p.timeout)
        .connect_timeout(p.timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| SetupError::Build(error_chain(&e)))?;
    let policy = ExponentialBackoff::builder()
        .retry_bounds(p.min_backoff, p.max_backoff.max(p.min_backoff))
        .jitter(Jitter::Bounded)
        .base(2)
        .build_with_total_retry_duration_and_max_retries(p.retry_budget, p.max_retries);
    let breaker = Arc::new(Breaker::new(p.breaker_failures, p.breaker_cooldown));
    Ok(ClientBuilder::new(inner)
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .with(Guard {
            breaker,
            count_timeouts: p.timeouts_trip_breaker,
        })
        .build())
}

/// Why a service URL is refused.
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

/// `e` and its sources, joined by ": ", without reqwest's repeated "for url (...)".
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = s.source();
    }
    let joined = parts.join(": ");
    match (joined.find(" for url ("), joined.find("): ")) {
        (Some(a), Some(b)) if b > a => format!("{}{}", &joined[..a], &joined[b + 1..]),
        _ => joined,
    }
}

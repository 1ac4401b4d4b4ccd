//! The circuit breaker and the per-attempt bookkeeping of a service client, as one
//! reqwest middleware that runs inside the retry middleware, once per attempt.
//!
//! A failed attempt is a transport error (refused, reset, timed out) or a retryable status
//! (5xx, 408, 429). After `threshold` consecutive failed attempts the breaker opens: for
//! `cooldown`, every attempt fails at once without touching the network, and the retry
//! middleware treats that as final. After the cool-down the next attempt goes through (half
//! open): a success closes the breaker, a failure opens it again for another cool-down.
//! Attempts that succeed reset the count. It does not decide retries (reqwest-retry does).

use super::body::{read_limited, snippet};
use super::error_chain;
use async_trait::async_trait;
use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use reqwest_retry::{default_on_request_failure, default_on_request_success, Retryable};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Consecutive failures and the open window.
#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    consecutive: u32,
    open_until: Option<Instant>,
    last: Option<String>,
}

impl Breaker {
    /// Opens after `threshold` (≥ 1) consecutive failed attempts, for `cooldown`.
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a counter and two options; a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Err(why)` while the breaker is open at `now`.
    pub(crate) fn check(&self, now: Instant) -> Result<(), BreakerOpen> {
        let s = self.lock();
        match s.open_until {
            Some(until) if now < until => Err(BreakerOpen {
                consecutive: s.consecutive,
                seconds_left: (until - now).as_secs_f64(),
                last: s.last.clone().unwrap_or_else(|| "unknown".into()),
            }),
            _ => Ok(()),
        }
    }

    /// Counts a failed attempt at `now`; opens the breaker at the threshold.
    pub(crate) fn failure(&self, now: Instant, what: String) {
        let mut s = self.lock();
        s.consecutive = s.consecutive.saturating_add(1);
        s.last = Some(what);
        if s.consecutive >= self.threshold {
            s.open_until = Some(now + self.cooldown);
        }
    }

    /// A successful attempt closes the breaker.
    pub(crate) fn success(&self) {
        let mut s = self.lock();
        s.consecutive = 0;
        s.open_until = None;
    }
}

/// What the attempts of one request did, shared with the caller through the request's
/// extensions.
#[derive(Debug, Default)]
pub(crate) struct AttemptLog {
    count: AtomicU32,
    last_failure: Mutex<Option<String>>,
    last_timed_out: AtomicBool,
}

impl AttemptLog {
    /// Attempts made so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }

    /// The last attempt's failure, if it failed.
    pub(crate) fn last_failure(&self) -> Option<String> {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the last attempt timed out.
    pub(crate) fn last_timed_out(&self) -> bool {
        self.last_timed_out.load(Ordering::SeqCst)
    }

    fn note(&self, what: Option<String>) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = what;
    }
}

/// The extension that carries a request's [`AttemptLog`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Attempts(pub(crate) Arc<AttemptLog>);

/// The breaker is open: it fails the attempt without sending it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("circuit breaker open after {consecutive} consecutive failed attempts (failing fast for {seconds_left:.1} s more); the last: {last}")]
pub(crate) struct BreakerOpen {
    /// Consecutive failed attempts that opened it.
    consecutive: u32,
    /// Seconds until it lets an attempt through again.
    seconds_left: f64,
    /// The last failure before it opened.
    last: String,
}

/// The middleware: counts attempts, records failures, and trips the breaker. With
/// `count_timeouts` false, an attempt that timed out is recorded but does not count towards
/// the breaker (an environment whose one episode hangs is not down).
pub(crate) struct Guard {
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) count_timeouts: bool,
}

#[async_trait]
impl Middleware for Guard {
    async fn handle(
        &self,
        req: Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let log = ext.get::<Attempts>().cloned().unwrap_or_default().0;
        log.count.fetch_add(1, Ordering::SeqCst);
        if let Err(why) = self.breaker.check(Instant::now()) {
            log.note(Some(why.to_string()));
            return Err(reqwest_middleware::Error::middleware(why));
        }
        let result = next.run(req, ext).await;
        let timed_out =
            matches!(&result, Err(reqwest_middleware::Error::Reqwest(e)) if e.is_timeout());
        log.last_timed_out.store(timed_out, Ordering::SeqCst);
        let verdict = match &result {
            Ok(r) => default_on_request_success(r),
            Err(e) => default_on_request_failure(e),
        };
        let (result, what) = match result {
            Ok(r) if !r.status().is_success() && !r.status().is_redirection() => {
                let (r, what) = with_read_body(r).await;
                (Ok(r), Some(what))
            }
            Ok(r) => (Ok(r), None),
            Err(e) => {
                let what = error_chain(&e);
                (Err(e), Some(what))
            }
        };
        match verdict {
            Some(Retryable::Transient) if timed_out && !self.count_timeouts => {}
            Some(Retryable::Transient) => self
                .breaker
                .failure(Instant::now(), what.clone().unwrap_or_default()),
            None => self.breaker.success(),
            Some(Retryable::Fatal) => {}
        }
        log.note(what);
        result
    }
}

/// The most of a failed answer's body kept for the failure message (a service's own error
/// text, such as a reward function's exception).
const FAILURE_BODY_BYTES: usize = 4 << 10;

/// A failed (non-2xx) answer rebuilt with its body read, and `"HTTP <status>: <start of the
/// body>"` for the failure message, so the breaker's and the last attempt's reports carry
/// the service's own words. A body over [`FAILURE_BODY_BYTES`] or unreadable is dropped.
async fn with_read_body(r: Response) -> (Response, String) {
    let status = r.status();
    let mut rebuilt = http::Response::builder()
        .status(status)
        .version(r.version());
    if let Some(headers) = rebuilt.headers_mut() {
        headers.extend(r.headers().iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let (body, what) = match read_limited(r, FAILURE_BODY_BYTES).await {
        Ok(body) => {
            let what = format!("HTTP {status}{}", snippet(&body));
            (body, what)
        }
        Err(e) => (Vec::new(), format!("HTTP {status} ({e})")),
    };
    let rebuilt = rebuilt
        .body(body)
        .expect("status, version and headers come from a valid response");
    (Response::from(rebuilt), what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_at_the_threshold_and_half_opens_after_the_cooldown() {
        let b = Breaker::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        b.failure(t0, "HTTP 500".into());
        b.failure(t0, "HTTP 500".into());
        assert!(b.check(t0).is_ok(), "two failures are under the threshold");
        b.failure(t0, "HTTP 503".into());
        let why = b
            .check(t0 + Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("3 consecutive") && why.contains("HTTP 503"),
            "{why}"
        );
        // Half open after the cool-down: one more failure opens it again at once.
        let later = t0 + Duration::from_secs(11);
        assert!(b.check(later).is_ok());
        b.failure(later, "refused".into());
        assert!(b.check(later).is_err());
        // A success closes it and resets the count.
        b.success();
        assert!(b.check(later).is_ok());
        b.failure(later, "HTTP 500".into());
        assert!(b.check(later).is_ok());
    }

    #[test]
    fn a_success_in_between_resets_the_count() {
        let b = Breaker::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        b.failure(t0, "x".into());
        b.success();
        b.failure(t0, "x".into());
        assert!(b.check(t0).is_ok());
    }
}

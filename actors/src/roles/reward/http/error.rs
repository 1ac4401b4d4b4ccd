//! [`HttpRewardError`]: why a reward service gave no rewards. Every variant names the URL;
//! a failed request never becomes a reward.

/// A reward service failed to score a batch.
#[derive(Debug, thiserror::Error)]
pub enum HttpRewardError {
    /// The client cannot be built from its settings (the user's configuration).
    #[error("reward service {url:?}: {message}")]
    Config {
        /// The configured URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// No usable answer within the retry budget: the service is down, slow, failing, or the
    /// circuit breaker is open.
    #[error("reward service {url}: a request of {rows} rows failed after {attempts} attempt(s); last failure: {last}")]
    Failed {
        /// The URL posted to.
        url: String,
        /// Rows in the request.
        rows: usize,
        /// Attempts made (1 + retries).
        attempts: u32,
        /// The last attempt's failure: the transport error, the HTTP status and body, or the
        /// open breaker.
        last: String,
    },
    /// The service answered 2xx with a body that breaks the schema (not JSON, wrong number
    /// of rewards, a non-finite reward).
    #[error("reward service {url}: bad response to a request of {rows} rows (attempt {attempts}): {message}")]
    BadResponse {
        /// The URL posted to.
        url: String,
        /// Rows in the request.
        rows: usize,
        /// Attempts made.
        attempts: u32,
        /// What is wrong with the body.
        message: super::schema::ResponseError,
    },
    /// The service answered with a redirect, which is never followed: the rows go to the
    /// configured URL only.
    #[error(
        "reward service {url}: a request of {rows} rows was answered with HTTP {status}, a \
         redirect to {location}; redirects are not followed: set reward.http.url to the \
         service's own URL"
    )]
    Redirected {
        /// The URL posted to.
        url: String,
        /// Rows in the request.
        rows: usize,
        /// The 3xx status.
        status: u16,
        /// The `Location` header, or `(none)`.
        location: String,
    },
    /// The answer is longer than the limit; it was not read.
    #[error(
        "reward service {url}: the answer (HTTP {status}) to a request of {rows} rows is over \
         the limit of {limit} bytes"
    )]
    TooLarge {
        /// The URL posted to.
        url: String,
        /// Rows in the request.
        rows: usize,
        /// Its status.
        status: u16,
        /// The limit, bytes.
        limit: usize,
    },
}

impl HttpRewardError {
    /// True for a configuration error (the user's input: a bad setting, or a URL that
    /// redirects), false for a failure of the run.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            HttpRewardError::Config { .. } | HttpRewardError::Redirected { .. }
        )
    }
}

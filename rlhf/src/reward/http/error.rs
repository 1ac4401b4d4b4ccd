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
}

impl HttpRewardError {
    /// True for a configuration error (the user's input), false for a failure of the run.
    pub fn is_config(&self) -> bool {
        matches!(self, HttpRewardError::Config { .. })
    }
}

//! The error of a reward setting that cannot be used, naming its key (`[reward]`,
//! `[[reward.verifiers]]`, `[reward.http]`, `[reward.python]`).

/// A reward setting that cannot be used, naming its key.
#[derive(Debug, thiserror::Error)]
#[error("key `{key}`: {message}")]
pub struct RewardKeyError {
    /// Dotted key, e.g. `reward.verifiers[1].pattern`.
    pub key: String,
    /// What is wrong and what was expected.
    pub message: String,
}

/// A [`RewardKeyError`] for `key`.
pub(crate) fn key_error(key: impl Into<String>, message: impl Into<String>) -> RewardKeyError {
    RewardKeyError {
        key: key.into(),
        message: message.into(),
    }
}

//! `UserError`: a mistake of the person running `oxalign` (bad path, malformed input, a
//! checkpoint that does not fit its config). `main` maps it to exit code 2; every other error
//! is a bug or an environment failure and exits with 1. It does not format messages itself.

use std::fmt::Display;

/// Exit code for a user's mistake (same as clap's usage errors).
pub const USER_ERROR_EXIT: i32 = 2;
/// Exit code for anything else that failed.
pub const INTERNAL_ERROR_EXIT: i32 = 1;

/// An error caused by the user's input; its message says what was wrong and what was expected.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UserError(pub String);

impl UserError {
    /// A user error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        UserError(message.into())
    }
}

/// Shorthand: `Err(UserError)` as an `anyhow::Error`.
pub fn user_error<T>(message: impl Into<String>) -> anyhow::Result<T> {
    Err(UserError::new(message).into())
}

/// Turns a library error into a [`UserError`] (its full message kept), for errors that are
/// the user's doing whatever their kind (e.g. every tokenizer-loading error).
pub trait IntoUserError<T> {
    /// Marks the error as the user's, prefixed with `context` when it is not empty.
    fn user_err(self, context: impl Display) -> anyhow::Result<T>;
}

impl<T, E: std::error::Error> IntoUserError<T> for Result<T, E> {
    fn user_err(self, context: impl Display) -> anyhow::Result<T> {
        self.map_err(|e| {
            let context = context.to_string();
            let message = if context.is_empty() {
                error_chain(&e)
            } else {
                format!("{context}: {}", error_chain(&e))
            };
            UserError::new(message).into()
        })
    }
}

/// `e` and its sources joined with `: ` (skipping a source already spelled out by its parent).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Exit code for an error reaching `main`: 2 when a [`UserError`] is anywhere in its chain.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err.chain().any(|e| e.is::<UserError>()) {
        USER_ERROR_EXIT
    } else {
        INTERNAL_ERROR_EXIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_errors_exit_2_even_under_context() {
        use anyhow::Context;
        let err = user_error::<()>("bad line")
            .context("reading x.jsonl")
            .unwrap_err();
        assert_eq!(exit_code(&err), USER_ERROR_EXIT);
        let err = anyhow::anyhow!("matmul failed");
        assert_eq!(exit_code(&err), INTERNAL_ERROR_EXIT);
    }

    #[test]
    fn user_err_keeps_source_chain() {
        let io: Result<(), std::io::Error> =
            Err(std::io::Error::new(std::io::ErrorKind::NotFound, "gone"));
        let err = io.user_err("cannot open f.txt").unwrap_err();
        assert_eq!(err.to_string(), "cannot open f.txt: gone");
        assert_eq!(exit_code(&err), USER_ERROR_EXIT);
    }
}

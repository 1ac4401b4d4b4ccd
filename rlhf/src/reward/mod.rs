//! Rewards that need no model of ours: rule-based verifiers and their weighted sums, pure
//! functions of the text.
//!
//! Model-based rewards (HF sequence classifiers) and the client of an HTTP reward service
//! live with the reward actor (`oxalign_actors::roles::reward`). Verifiers judge text against
//! reference answers: exact match on an extracted answer (`answer_match.rs`, `extract.rs`;
//! `exact_match.rs` is the first-line form of the `exact_match` reward), a regex, a length
//! penalty, JSON validity, summed with weights (`verifiers.rs`); DAPO's soft overlong
//! punishment (`overlong.rs`).

mod answer_match;
mod exact_match;
mod extract;
mod json_valid;
mod length_penalty;
mod overlong;
mod regex_match;
mod verifiers;

pub use answer_match::AnswerMatch;
pub use exact_match::ExactMatch;
pub use extract::{Extract, ExtractKind};
pub use json_valid::JsonValid;
pub use length_penalty::LengthPenalty;
pub use overlong::OverlongShaping;
pub use regex_match::RegexMatch;
pub use verifiers::{Sample, Verifier, VerifierKind, Verifiers};

/// A verifier that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    /// A regex does not compile or lacks the capture group it needs.
    #[error("regex {pattern:?} {message}")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        message: String,
    },
    /// A weight is unusable.
    #[error("verifier {index}: weight {message}")]
    Weight {
        /// The verifier's position in the sum.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// No verifier has a non-zero weight.
    #[error("no verifier has a non-zero weight: the reward would always be 0")]
    Empty,
}

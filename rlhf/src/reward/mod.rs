//! Reward functions that need no model: rule-based verifiers.
//!
//! Model-based rewards (HF sequence classifiers) live with the reward actor; this module
//! only judges text against reference answers.

mod exact_match;
mod overlong;

pub use exact_match::ExactMatch;
pub use overlong::OverlongShaping;

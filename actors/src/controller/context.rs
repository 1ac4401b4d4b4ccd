//! [`Ctx`]: the pieces every phase of a run needs (recipe, run folder, tokenizer, monitor,
//! time limit, accuracy check), borrowed for the run's length.

use super::rl::episodes::RunEnv;
use crate::monitor::MonitorHandle;
use crate::recipe::Recipe;
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_rlhf::reward::AnswerMatch;
use std::path::Path;

/// The pieces every phase needs.
pub(crate) struct Ctx<'a> {
    pub recipe: &'a Recipe,
    /// The run folder.
    pub run_dir: &'a Path,
    /// The policy's initial model folder (its tokenizer files go into every checkpoint).
    pub policy_dir: &'a Path,
    /// The policy's context in tokens (`max_position_embeddings`).
    pub context: usize,
    pub tok: &'a Tokenizer,
    pub monitor: &'a MonitorHandle,
    pub pad_id: u32,
    pub quiet: bool,
    /// How long one role call may take (`supervision.call_timeout_s`).
    pub timeout: std::time::Duration,
    /// The exact-match check that defines accuracy, when the reward has one (per-step
    /// `accuracy` and the held-out evaluations are reported only then).
    pub answer_check: Option<AnswerMatch>,
    /// The environment of multi-turn episodes (`[env]`); None: one completion per sample.
    pub env: Option<&'a RunEnv>,
}

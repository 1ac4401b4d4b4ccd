//! oxalign-data: the datasets of oxalign — a generated arithmetic task, and JSONL or Parquet
//! files (or a folder of Parquet shards) of prompts, SFT rows or preference pairs (schemas in `schema.rs` and
//! `sft_schema.rs`), streamed from disk. Errors are [`DataError`]s naming the file and row.
//!
//! A dataset is addressed by position: item `i` of the training stream is a pure function
//! of the seed and `i`, so the data position saved in a checkpoint is one integer and a
//! resumed run neither replays nor skips data. Tokenization happens elsewhere.

mod answer_coverage;
mod arithmetic;
mod arithmetic_export;
mod dataset;
mod error;
mod jsonl_rows;
mod parquet_rows;
mod parquet_shards;
mod prompt_file;
mod row_check;
mod row_error;
mod row_file;
mod row_scan;
mod schema;
mod sft_schema;
mod tool_task;

pub use answer_coverage::AnswerCoverage;
pub use arithmetic::ArithmeticTask;
pub use arithmetic_export::{distinct_train_items, near_misses, write_arithmetic_files};
pub use dataset::{DataSpec, Dataset};
pub use error::{DataError, NoAnswer, RowAt};
pub use prompt_file::PromptFile;
pub use row_check::{check_first_rows, RowCheck, CHECK_ROWS};
pub use row_error::RowError;
pub use row_scan::{DataReport, OnBadRow, PROBE_ROWS};
pub use schema::{PreferencePair, RowContext, RowSchema, DEFAULT_ANSWER_FIELD};
pub use sft_schema::{SftPair, SftRow};
pub use tool_task::{tool_problems, write_tool_files, ToolProblem};

/// One prompt and, where the task has one, its reference answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PromptItem {
    /// The text the policy continues.
    pub prompt: String,
    /// The reference answer (for rule-based rewards, SFT targets and accuracy).
    #[serde(default)]
    pub answer: Option<String>,
    /// The row's other columns (all but `prompt`/`messages`, the answer column included)
    /// as the text of one JSON object, for rewards that read them (a Python reward
    /// function's keyword arguments, as TRL passes dataset columns); `None` when the row has
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<String>,
}

/// A source of prompts addressed by position.
pub trait PromptSource: Send + Sync {
    /// Training item number `index` (any `u64`; sources cycle through epochs).
    fn train_item(&self, index: u64) -> Result<PromptItem, DataError>;
    /// The held-out evaluation set, fixed for the run.
    fn eval_items(&self) -> &[PromptItem];
}

/// SplitMix64: a tiny, well-mixed hash used to derive per-position randomness from a seed.
pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

//! [`DataError`]: why a dataset file could not be used. Every variant names the file and,
//! for a bad row, where it is (line, or row group and row) and what was expected.

use std::fmt;
use std::path::PathBuf;

/// Where a row lives in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowAt {
    /// A JSONL line (1-based).
    Line(u64),
    /// A Parquet row: row group and row within it (both 0-based).
    Row {
        /// Row group.
        group: usize,
        /// Row within the group.
        row: u64,
    },
}

impl fmt::Display for RowAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowAt::Line(n) => write!(f, "line {n}"),
            RowAt::Row { group, row } => write!(f, "row group {group}, row {row}"),
        }
    }
}

/// A prompts file without the reference answers the recipe needs ([`DataError::NoAnswer`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: {rows} `{field}` (the first row has {columns}); {needed_by} needs the reference \
     answer: {hint}",
    path.display()
)]
pub struct NoAnswer {
    /// The file.
    pub path: PathBuf,
    /// "no row has" or "none of the first N rows has".
    pub rows: String,
    /// The answer column looked for (`data.answer_field`).
    pub field: String,
    /// What needs the answer.
    pub needed_by: String,
    /// The first row's columns, quoted.
    pub columns: String,
    /// How to fix it.
    pub hint: String,
}

/// "none of the first N rows matches," (or the only row's wording).
fn checked_rows(n: usize) -> String {
    match n {
        1 => "it is the file's only row,".into(),
        n => format!("none of the first {n} rows matches,"),
    }
}

/// A dataset file that cannot be read, or a row that does not match its schema.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read dataset {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a readable Parquet file.
    #[error("{}: not a readable Parquet file: {message}", path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The reader's message.
        message: String,
    },
    /// One row is malformed (`data.on_bad_row = "fail"`, the default).
    #[error("{}: {at}: {message} (expected {expected}; set data.on_bad_row = \"skip\" to skip and count such rows)", path.display())]
    Row {
        /// The file.
        path: PathBuf,
        /// Where the row is.
        at: RowAt,
        /// What is wrong with it.
        message: Box<crate::RowError>,
        /// The schema the row should follow.
        expected: &'static str,
    },
    /// The first rows all fail: the file is in another schema (skipping would skip it all).
    #[error(
        "{}: {at}: {message}; {} so the file's schema does not match (data.on_bad_row = \
         \"skip\" would skip every row); accepted schemas: {expected}",
        path.display(),
        checked_rows(*checked)
    )]
    Schema {
        /// The file.
        path: PathBuf,
        /// Where the first row is.
        at: RowAt,
        /// What is wrong with it.
        message: Box<crate::RowError>,
        /// Rows checked, none good.
        checked: usize,
        /// The accepted schemas.
        expected: &'static str,
    },
    /// No row looked at has the reference answer the reward needs.
    #[error("{0}")]
    NoAnswer(Box<NoAnswer>),
    /// The file has no usable rows.
    #[error("{}: no usable rows ({skipped} skipped; expected {expected})", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
        /// Rows skipped as malformed.
        skipped: u64,
        /// The schema.
        expected: &'static str,
    },
    /// A folder given as a dataset holds no Parquet shards.
    #[error(
        "{}: a folder with no .parquet files; expected a JSONL or Parquet file, or a folder \
         of Parquet shards (the Hugging Face datasets layout, read in name order)",
        path.display()
    )]
    NoShards {
        /// The folder.
        path: PathBuf,
    },
    /// A split leaves nothing to train on or to evaluate.
    #[error("{}: {message}", path.display())]
    Split {
        /// The file.
        path: PathBuf,
        /// What is wrong with the split.
        message: String,
    },
}

//! [`RowFile`]: a JSONL or Parquet file (chosen by the `.parquet` extension) addressed by
//! row number, read on demand.

use crate::error::{DataError, RowAt};
use crate::jsonl_rows::JsonlRows;
use crate::parquet_rows::ParquetRows;
use crate::RowError;
use std::path::Path;

/// An indexed dataset file.
pub(crate) enum RowFile {
    /// One JSON object per line.
    Jsonl(JsonlRows),
    /// A Parquet file.
    Parquet(ParquetRows),
}

impl RowFile {
    /// Opens `path`: Parquet when its extension is `parquet`, JSONL otherwise.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        if is_parquet(path) {
            Ok(RowFile::Parquet(ParquetRows::open(path)?))
        } else {
            Ok(RowFile::Jsonl(JsonlRows::open(path)?))
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        match self {
            RowFile::Jsonl(f) => f.len(),
            RowFile::Parquet(f) => f.len(),
        }
    }

    /// True with no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where row `i` is.
    pub fn at(&self, i: usize) -> RowAt {
        match self {
            RowFile::Jsonl(f) => f.at(i),
            RowFile::Parquet(f) => f.at(i),
        }
    }

    /// Row `i` as JSON (`Ok(Err(message))` for a row that is not readable as JSON).
    pub fn read(&mut self, i: usize) -> Result<Result<serde_json::Value, RowError>, DataError> {
        match self {
            RowFile::Jsonl(f) => f.read(i),
            RowFile::Parquet(f) => f.read(i),
        }
    }
}

/// True for a `.parquet` path.
pub(crate) fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

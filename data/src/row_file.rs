//! [`RowFile`]: a JSONL or Parquet file (chosen by the `.parquet` extension), or a folder of
//! Parquet shards, addressed by row number, read on demand.

use crate::error::{DataError, RowAt};
use crate::jsonl_rows::JsonlRows;
use crate::parquet_rows::{is_parquet, ParquetRows};
use crate::parquet_shards::ParquetShards;
use crate::RowError;
use std::path::Path;

/// An indexed dataset file.
pub(crate) enum RowFile {
    /// One JSON object per line.
    Jsonl(JsonlRows),
    /// A Parquet file.
    Parquet(ParquetRows),
    /// A folder's Parquet shards, in name order.
    Shards(ParquetShards),
}

impl RowFile {
    /// Opens `path`: a folder's Parquet shards when it is a folder, Parquet when its
    /// extension is `parquet`, JSONL otherwise.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        if path.is_dir() {
            Ok(RowFile::Shards(ParquetShards::open(path)?))
        } else if is_parquet(path) {
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
            RowFile::Shards(f) => f.len(),
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
            RowFile::Shards(f) => f.at(i),
        }
    }

    /// The file holding row `i` when `path` is a folder of shards (its row errors name the
    /// shard); `None` for a single file.
    pub fn shard_of(&self, i: usize) -> Option<&Path> {
        match self {
            RowFile::Shards(f) => Some(f.file_of(i)),
            _ => None,
        }
    }

    /// Row `i` as JSON (`Ok(Err(message))` for a row that is not readable as JSON).
    pub fn read(&mut self, i: usize) -> Result<Result<serde_json::Value, RowError>, DataError> {
        match self {
            RowFile::Jsonl(f) => f.read(i),
            RowFile::Parquet(f) => f.read(i),
            RowFile::Shards(f) => f.read(i),
        }
    }
}

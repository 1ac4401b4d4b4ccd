//! Random access to the rows of a Parquet file (arrow-rs' `parquet` crate, record API): the
//! footer gives each row group's row count, and a row is read by decoding its row group,
//! which is kept until a row of another group is asked for. Memory holds one row group.
//! Columns become JSON values (strings, numbers, lists of structs for chat messages).

use super::error::{DataError, RowAt};
use parquet::file::reader::{FileReader, SerializedFileReader};
use std::fs::File;
use std::path::{Path, PathBuf};

/// An opened Parquet file.
pub struct ParquetRows {
    path: PathBuf,
    reader: SerializedFileReader<File>,
    /// First row of each group, plus the total at the end.
    starts: Vec<u64>,
    cached: Option<(usize, Vec<serde_json::Value>)>,
}

impl ParquetRows {
    /// Opens `path` and reads its footer.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let file = File::open(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let reader = SerializedFileReader::new(file).map_err(|e| DataError::Parquet {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut starts = vec![0u64];
        for g in reader.metadata().row_groups() {
            let last = *starts.last().unwrap_or(&0);
            starts.push(last + g.num_rows().max(0) as u64);
        }
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            starts,
            cached: None,
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        *self.starts.last().unwrap_or(&0) as usize
    }

    /// True with no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where row `i` is.
    pub fn at(&self, i: usize) -> RowAt {
        let (group, row) = self.locate(i);
        RowAt::Row { group, row }
    }

    /// Row group and row within it of row `i`.
    fn locate(&self, i: usize) -> (usize, u64) {
        let i = i as u64;
        let group = self.starts.partition_point(|&s| s <= i).saturating_sub(1);
        (group, i - self.starts[group])
    }

    /// Row `i` as a JSON object of its columns.
    pub fn read(&mut self, i: usize) -> Result<Result<serde_json::Value, String>, DataError> {
        let (group, row) = self.locate(i);
        if self.cached.as_ref().map(|c| c.0) != Some(group) {
            let rows = self.decode(group)?;
            self.cached = Some((group, rows));
        }
        let rows = &self.cached.as_ref().map(|c| &c.1);
        Ok(rows
            .and_then(|r| r.get(row as usize))
            .cloned()
            .ok_or_else(|| format!("row group {group} has no row {row}")))
    }

    fn decode(&self, group: usize) -> Result<Vec<serde_json::Value>, DataError> {
        let bad = |e: parquet::errors::ParquetError| DataError::Parquet {
            path: self.path.clone(),
            message: format!("row group {group}: {e}"),
        };
        let g = self.reader.get_row_group(group).map_err(bad)?;
        let mut out = Vec::new();
        for row in g.get_row_iter(None).map_err(bad)? {
            out.push(row.map_err(bad)?.to_json_value());
        }
        Ok(out)
    }
}

//! A folder of Parquet shards as one dataset: the Hugging Face `datasets` layout
//! (`train-00000-of-00002.parquet`, `train-00001-of-00002.parquet`, ...). Its `*.parquet`
//! files, in name order, are read back to back; row `i` of the dataset is a row of one
//! shard. Each shard keeps only its footer open, and only the shard read last keeps a
//! decoded row group, so memory holds one row group whatever the number of shards.

use crate::error::{DataError, RowAt};
use crate::parquet_rows::{is_parquet, ParquetRows};
use crate::RowError;
use std::path::{Path, PathBuf};

/// The Parquet shards of a folder, opened.
pub(crate) struct ParquetShards {
    shards: Vec<ParquetRows>,
    /// The shards' files, in the order of `shards`.
    paths: Vec<PathBuf>,
    /// First dataset row of each shard, plus the total at the end.
    starts: Vec<usize>,
    /// The shard whose row group is decoded.
    current: Option<usize>,
}

/// The `*.parquet` files of `dir` (not its subfolders), in name order.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let io = |source| DataError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_file() && is_parquet(&path) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

impl ParquetShards {
    /// Opens every shard of `dir` (their footers only); a folder without `*.parquet` files
    /// is an error.
    pub fn open(dir: &Path) -> Result<Self, DataError> {
        let paths = shard_files(dir)?;
        if paths.is_empty() {
            return Err(DataError::NoShards {
                path: dir.to_path_buf(),
            });
        }
        let mut shards = Vec::with_capacity(paths.len());
        let mut starts = vec![0];
        for p in &paths {
            let shard = ParquetRows::open(p)?;
            starts.push(starts.last().copied().unwrap_or(0) + shard.len());
            shards.push(shard);
        }
        Ok(Self {
            shards,
            paths,
            starts,
            current: None,
        })
    }

    /// Number of rows, all shards together.
    pub fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The shard holding row `i` (of the dataset), and the row's index in it.
    fn locate(&self, i: usize) -> (usize, usize) {
        let shard = self.starts.partition_point(|&s| s <= i).saturating_sub(1);
        let shard = shard.min(self.shards.len().saturating_sub(1));
        (shard, i - self.starts[shard].min(i))
    }

    /// Where row `i` is in its shard ([`Self::file_of`] names the shard).
    pub fn at(&self, i: usize) -> RowAt {
        let (shard, row) = self.locate(i);
        self.shards[shard].at(row)
    }

    /// The shard file holding row `i`.
    pub fn file_of(&self, i: usize) -> &Path {
        &self.paths[self.locate(i).0]
    }

    /// Row `i` as a JSON object of its columns.
    pub fn read(&mut self, i: usize) -> Result<Result<serde_json::Value, RowError>, DataError> {
        let (shard, row) = self.locate(i);
        if let Some(last) = self.current.filter(|&c| c != shard) {
            self.shards[last].forget_group();
        }
        self.current = Some(shard);
        self.shards[shard].read(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parquet_rows::tests::{spec, write};
    use crate::{Dataset, OnBadRow, SftRow};

    #[test]
    fn a_folder_of_shards_reads_as_one_dataset_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            &d.join("train-00001-of-00002.parquet"),
            &[&[("c", Some("3"))]],
        );
        write(
            &d.join("train-00000-of-00002.parquet"),
            &[&[("a", Some("1"))], &[("b", Some("2"))]],
        );
        std::fs::write(d.join("README.md"), "not a shard").unwrap();
        let mut s = ParquetShards::open(d).unwrap();
        assert_eq!(s.len(), 3);
        let prompts: Vec<String> = (0..3)
            .map(|i| s.read(i).unwrap().unwrap()["prompt"].to_string())
            .collect();
        assert_eq!(prompts, ["\"a\"", "\"b\"", "\"c\""]);
        assert_eq!(s.at(1), RowAt::Row { group: 1, row: 0 });
        assert!(s.file_of(2).ends_with("train-00001-of-00002.parquet"));
        // Back to the first shard after the second: still read right.
        assert_eq!(s.read(0).unwrap().unwrap()["prompt"], "a");
    }

    /// A dataset on a folder trains on every shard's rows; a bad row is named by its shard.
    #[test]
    fn a_dataset_reads_a_folder_and_names_a_bad_rows_shard() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            &d.join("train-00000-of-00002.parquet"),
            &[&[("1+1=", Some("2"))]],
        );
        write(
            &d.join("train-00001-of-00002.parquet"),
            &[&[("2+2=", Some("4")), ("3+3=", Some("6"))]],
        );
        let data = Dataset::<SftRow>::load(&spec(d, OnBadRow::Fail), None).unwrap();
        assert_eq!(data.train_len(), 3);
        write(
            &d.join("train-00001-of-00002.parquet"),
            &[&[("2+2=", None)]],
        );
        let e = Dataset::<SftRow>::load(&spec(d, OnBadRow::Fail), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("train-00001-of-00002.parquet: row group 0, row 0"),
            "{e}"
        );
    }

    #[test]
    fn a_folder_without_shards_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rows.jsonl"), "{}\n").unwrap();
        let e = ParquetShards::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("no .parquet files"), "{e}");
    }
}

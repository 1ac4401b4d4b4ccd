//! Random access to the rows of a Parquet file (arrow-rs' `parquet` crate, record API): the
//! footer gives each row group's row count, and a row is read by decoding its row group,
//! which is kept until a row of another group is asked for. Memory holds one row group.
//! Columns become JSON values (strings, numbers, lists of structs for chat messages).

use crate::error::{DataError, RowAt};
use crate::RowError;
use parquet::file::reader::{FileReader, SerializedFileReader};
use std::fs::File;
use std::path::{Path, PathBuf};

/// An opened Parquet file.
pub(crate) struct ParquetRows {
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
        let reader = unpanicked(path, "footer", || {
            SerializedFileReader::new(file).map_err(|e| DataError::Parquet {
                path: path.to_path_buf(),
                message: e.to_string(),
            })
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
    pub fn read(&mut self, i: usize) -> Result<Result<serde_json::Value, RowError>, DataError> {
        let (group, row) = self.locate(i);
        if self.cached.as_ref().map(|c| c.0) != Some(group) {
            let rows = self.decode(group)?;
            self.cached = Some((group, rows));
        }
        let rows = &self.cached.as_ref().map(|c| &c.1);
        Ok(rows
            .and_then(|r| r.get(row as usize))
            .cloned()
            .ok_or(RowError::NoSuchRow { group, row }))
    }

    /// Drops the decoded row group (a folder of shards keeps one decoded, in one shard).
    pub fn forget_group(&mut self) {
        self.cached = None;
    }

    /// Decodes row group `group`. The parquet crate can panic on a damaged page (a flipped
    /// byte in its data), so the decoder runs under `catch_unwind` and a panic becomes a
    /// [`DataError::Parquet`] naming the file and the row group, like any decoding error.
    fn decode(&self, group: usize) -> Result<Vec<serde_json::Value>, DataError> {
        let at = format!("row group {group}");
        unpanicked(&self.path, &at, || self.decode_unguarded(group))
    }

    fn decode_unguarded(&self, group: usize) -> Result<Vec<serde_json::Value>, DataError> {
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

/// True for a `.parquet` path.
pub(crate) fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Runs `f`, a call into the parquet crate, turning a panic (the crate can panic on damaged
/// bytes) into a [`DataError::Parquet`] naming `path` and `at` (the footer or a row group).
fn unpanicked<T>(
    path: &Path,
    at: &str,
    f: impl FnOnce() -> Result<T, DataError>,
) -> Result<T, DataError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the decoder failed");
        Err(DataError::Parquet {
            path: path.to_path_buf(),
            message: format!("{at}: damaged data: {what}"),
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::{DataSpec, Dataset, OnBadRow, SftRow};
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::path::Path;
    use std::sync::Arc;

    /// Writes `groups` of `(prompt, response?)` rows, one row group each, snappy-compressed.
    pub(crate) fn write(path: &Path, groups: &[&[(&str, Option<&str>)]]) {
        let schema = parse_message_type(
            "message rows { REQUIRED BYTE_ARRAY prompt (UTF8); OPTIONAL BYTE_ARRAY response (UTF8); }",
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut w = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
        for rows in groups {
            let mut rg = w.next_row_group().unwrap();
            let prompts: Vec<ByteArray> = rows.iter().map(|r| r.0.into()).collect();
            let mut col = rg.next_column().unwrap().unwrap();
            col.typed::<ByteArrayType>()
                .write_batch(&prompts, None, None)
                .unwrap();
            col.close().unwrap();
            let present: Vec<ByteArray> = rows.iter().filter_map(|r| r.1).map(Into::into).collect();
            let defs: Vec<i16> = rows.iter().map(|r| i16::from(r.1.is_some())).collect();
            let mut col = rg.next_column().unwrap().unwrap();
            col.typed::<ByteArrayType>()
                .write_batch(&present, Some(&defs), None)
                .unwrap();
            col.close().unwrap();
            rg.close().unwrap();
        }
        w.close().unwrap();
    }

    pub(crate) fn spec(path: &Path, on_bad_row: OnBadRow) -> DataSpec {
        DataSpec {
            path: path.to_path_buf(),
            eval_path: None,
            eval_fraction: 0.0,
            seed: 1,
            on_bad_row,
            answer_field: "answer".into(),
        }
    }

    #[test]
    fn integer_columns_are_not_text() {
        use parquet::data_type::Int64Type;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ints.parquet");
        let schema = parse_message_type(
            "message rows { REQUIRED BYTE_ARRAY prompt (UTF8); REQUIRED INT64 response; }",
        )
        .unwrap();
        let file = std::fs::File::create(&p).unwrap();
        let props = Arc::new(WriterProperties::builder().build());
        let mut w = SerializedFileWriter::new(file, Arc::new(schema), props).unwrap();
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<ByteArrayType>()
            .write_batch(&["1+1=".into()], None, None)
            .unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<Int64Type>()
            .write_batch(&[2], None, None)
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
        w.close().unwrap();
        let e = Dataset::<SftRow>::load(&spec(&p, OnBadRow::Fail), None)
            .err()
            .expect("an integer response is refused")
            .to_string();
        assert!(
            e.contains("row group 0, row 0") && e.contains("`response` is a number"),
            "{e}"
        );
    }

    /// Every single-byte flip in the data pages of a Parquet file is refused with an error
    /// naming the file (or read, when the flip lands in a value's text), never a panic.
    #[test]
    fn a_flipped_byte_in_a_data_page_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sft.parquet");
        let rows: Vec<(String, Option<String>)> = (0..200)
            .map(|i| (format!("{i}+{i}="), Some((2 * i).to_string())))
            .collect();
        let rows: Vec<(&str, Option<&str>)> = rows
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_deref()))
            .collect();
        write(&p, &[&rows]);
        let good = std::fs::read(&p).unwrap();
        let damaged = dir.path().join("damaged.parquet");
        // The data pages sit after the 4-byte magic and before the footer.
        let (mut refused, mut panicked) = (0, Vec::new());
        for at in 4..good.len().min(1200) {
            let mut bytes = good.clone();
            bytes[at] ^= 0xFF;
            std::fs::write(&damaged, &bytes).unwrap();
            let load = std::panic::catch_unwind(|| {
                Dataset::<SftRow>::load(&spec(&damaged, OnBadRow::Fail), None).map(|_| ())
            });
            match load {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    assert!(e.to_string().contains("damaged.parquet"), "{e}");
                    refused += 1;
                }
                Err(_) => panicked.push(at),
            }
        }
        assert!(panicked.is_empty(), "flips at {panicked:?} panicked");
        assert!(refused > 0, "no flip was refused");
    }

    #[test]
    fn reads_rows_across_row_groups_and_names_a_bad_one_by_group_and_row() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sft.parquet");
        write(
            &p,
            &[
                &[("1+1=", Some("2")), ("2+2=", Some("4"))],
                &[("3+3=", None), ("4+4=", Some("8"))],
            ],
        );
        let e = Dataset::<SftRow>::load(&spec(&p, OnBadRow::Fail), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("sft.parquet: row group 1, row 0") && e.contains("response"),
            "{e}"
        );
        let d = Dataset::<SftRow>::load(&spec(&p, OnBadRow::Skip), None).unwrap();
        assert_eq!(
            (d.train_len(), d.report().skipped, d.report().rows),
            (3, 1, 4)
        );
        let mut seen: Vec<String> = (0..3)
            .map(|i| d.train_item(i).unwrap().examples[0].prompt.clone())
            .collect();
        seen.sort();
        assert_eq!(seen, ["1+1=", "2+2=", "4+4="]);
    }
}

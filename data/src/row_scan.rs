//! Checking the rows of a file against a schema: [`scan`] parses rows in order, keeps the
//! numbers of the good ones and counts those without a reference answer; a bad row fails
//! the scan or, with [`OnBadRow::Skip`] (the `data.on_bad_row` policy, defined here), is
//! counted in the [`DataReport`].
//!
//! A file whose first rows all fail is not "a file with a bad row" but a file in another
//! schema: skipping would skip all of it, so the error says the schema does not match and
//! lists the accepted ones instead of suggesting `data.on_bad_row = "skip"`.

use crate::error::DataError;
use crate::row_file::RowFile;
use crate::schema::{RowContext, RowSchema};
use std::path::Path;

/// What to do with a malformed row (`data.on_bad_row`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadRow {
    /// Stop with an error naming the file, the row and what was expected (the default).
    #[default]
    Fail,
    /// Skip the row, count it and report it.
    Skip,
}

/// Rows seen and skipped while loading (training and held-out files together).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DataReport {
    /// Rows read.
    pub rows: u64,
    /// Rows skipped as malformed.
    pub skipped: u64,
    /// The first few skipped rows, `file: where: what`.
    pub first_skipped: Vec<String>,
}

/// How many skipped rows the report spells out.
const REPORTED_SKIPS: usize = 5;

/// How many leading rows are looked at before a failing first row is called a schema
/// mismatch.
pub const PROBE_ROWS: usize = 16;

/// What a scan found.
pub(super) struct Scanned {
    /// The good rows' numbers.
    pub good: Vec<u32>,
    /// Good rows without a reference answer.
    pub lacking_answer: u64,
}

/// Checks rows `0..limit` of `file` (all of them with `usize::MAX`).
pub(super) fn scan<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    cx: &RowContext<'_>,
    policy: OnBadRow,
    limit: usize,
    report: &mut DataReport,
) -> Result<Scanned, DataError> {
    let n = file.len().min(limit);
    let mut out = Scanned {
        good: Vec::with_capacity(n),
        lacking_answer: 0,
    };
    for i in 0..n {
        report.rows += 1;
        match parse::<T>(file, path, cx, i)? {
            Ok(row) => {
                out.lacking_answer += u64::from(row.lacks_answer());
                out.good.push(i as u32);
            }
            Err(e) if policy == OnBadRow::Skip => {
                report.skipped += 1;
                if report.first_skipped.len() < REPORTED_SKIPS {
                    report.first_skipped.push(short(&e));
                }
            }
            Err(e) if out.good.is_empty() => return Err(mismatch::<T>(file, path, cx, e)?),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The error for a failing first row `first`: a schema mismatch when none of the first
/// [`PROBE_ROWS`] rows parses, else `first` itself (some rows are good: skipping may help).
fn mismatch<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    cx: &RowContext<'_>,
    first: DataError,
) -> Result<DataError, DataError> {
    let checked = file.len().min(PROBE_ROWS);
    for i in 1..checked {
        if parse::<T>(file, path, cx, i)?.is_ok() {
            return Ok(first);
        }
    }
    Ok(match first {
        DataError::Row {
            path, at, message, ..
        } => DataError::Schema {
            path,
            at,
            message,
            checked,
            expected: T::EXPECTED,
        },
        other => other,
    })
}

/// `file: where: what` of a row error, without the hint about skipping.
fn short(e: &DataError) -> String {
    match e {
        DataError::Row {
            path, at, message, ..
        } => format!("{}: {at}: {message}", path.display()),
        other => other.to_string(),
    }
}

/// Row `i`, parsed: the outer error is I/O, the inner one a malformed row.
pub(super) fn parse<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    cx: &RowContext<'_>,
    i: usize,
) -> Result<Result<T, DataError>, DataError> {
    let parsed = file.read(i)?.and_then(|v| T::from_row(&v, cx));
    Ok(parsed.map_err(|message| DataError::Row {
        path: file.shard_of(i).unwrap_or(path).to_path_buf(),
        at: file.at(i),
        message: Box::new(message),
        expected: T::EXPECTED,
    }))
}

/// Row `i`, parsed; a malformed row is an error.
pub(super) fn read_one<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    cx: &RowContext<'_>,
    i: usize,
) -> Result<T, DataError> {
    parse::<T>(file, path, cx, i)?
}

/// Rows `rows`, parsed.
pub(super) fn read_all<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    cx: &RowContext<'_>,
    rows: &[u32],
) -> Result<Vec<T>, DataError> {
    rows.iter()
        .map(|&i| read_one::<T>(file, path, cx, i as usize))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataSpec, Dataset, PromptItem, SftRow};

    fn file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("data.jsonl");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn a_file_whose_first_rows_all_fail_is_a_schema_mismatch_without_the_skip_hint() {
        let rows: String = (0..20)
            .map(|i| format!("{{\"question\": \"{i}\"}}\n"))
            .collect();
        let (_d, p) = file(&rows);
        let e = Dataset::<SftRow>::load(&DataSpec::new(&p), None)
            .err()
            .unwrap();
        assert!(matches!(e, DataError::Schema { checked: 16, .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("data.jsonl: line 1"), "{e}");
        assert!(e.contains("none of the first 16 rows matches"), "{e}");
        assert!(
            e.contains("schema does not match") && e.contains("\"completion\""),
            "{e}"
        );
        assert!(!e.contains("to skip and count"), "{e}");
    }

    #[test]
    fn a_bad_first_row_among_good_ones_keeps_the_skip_hint() {
        let (_d, p) = file("{\"prompt\": 1}\n{\"prompt\": \"a\"}\n");
        let e = Dataset::<PromptItem>::load(&DataSpec::new(&p), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("line 1") && e.contains("on_bad_row = \"skip\" to skip"),
            "{e}"
        );
        let (_d, p) = file("{\"prompt\": \"a\"}\n{\"prompt\": 1}\n");
        let e = Dataset::<PromptItem>::load(&DataSpec::new(&p), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("on_bad_row = \"skip\" to skip"),
            "{e}"
        );
    }

    #[test]
    fn the_only_row_failing_is_a_schema_mismatch() {
        let (_d, p) = file("{\"question\": \"a\"}\n");
        let e = Dataset::<SftRow>::load(&DataSpec::new(&p), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("the file's only row") && e.contains("accepted schemas"),
            "{e}"
        );
    }

    #[test]
    fn a_loaded_prompt_file_counts_the_rows_without_an_answer() {
        let (_d, p) = file("{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"b\"}\n");
        let d = Dataset::<PromptItem>::load(&DataSpec::new(&p), None).unwrap();
        let a = d.answers();
        assert_eq!((a.rows, a.lacking, a.whole_file), (2, 1, true));
    }
}

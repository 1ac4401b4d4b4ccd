//! What `oxalign train --check` reads of a data file: the first [`CHECK_ROWS`] rows, parsed
//! in the run's schema by the run's own row parser (`row_scan.rs`), so a file a run would
//! refuse is refused by `--check` with the same message (file, row, expected fields); and
//! the file's row count, so the summary says how much of it was read.

use crate::answer_coverage::{first_columns, AnswerCoverage};
use crate::error::DataError;
use crate::row_file::RowFile;
use crate::row_scan::{scan, DataReport, OnBadRow};
use crate::schema::{RowContext, RowSchema};
use std::path::Path;

/// How many leading rows of each data file `--check` parses.
pub const CHECK_ROWS: usize = 1000;

/// What checking the first rows of one file found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowCheck {
    /// Rows in the file.
    pub file_rows: u64,
    /// Rows parsed: the first `min(file_rows, CHECK_ROWS)`.
    pub checked: u64,
    /// Of those, malformed rows a run would skip (`data.on_bad_row = "skip"`).
    pub skipped: u64,
    /// The reference answers in the good rows parsed.
    pub answers: AnswerCoverage,
}

/// Checks the first [`CHECK_ROWS`] rows of `path` as a run would (`oxalign train --check`):
/// the same errors for a malformed row or a file in another schema, the rows skipped under
/// `policy`, and the answer coverage of the rows read.
pub fn check_first_rows<T: RowSchema>(
    path: &Path,
    cx: &RowContext<'_>,
    policy: OnBadRow,
) -> Result<RowCheck, DataError> {
    let mut file = RowFile::open(path)?;
    let mut report = DataReport::default();
    let scanned = scan::<T>(&mut file, path, cx, policy, CHECK_ROWS, &mut report)?;
    if scanned.good.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            skipped: report.skipped,
            expected: T::EXPECTED,
        });
    }
    Ok(RowCheck {
        file_rows: file.len() as u64,
        checked: report.rows,
        skipped: report.skipped,
        answers: AnswerCoverage {
            rows: scanned.good.len() as u64,
            lacking: scanned.lacking_answer,
            whole_file: file.len() <= CHECK_ROWS,
            first_columns: first_columns(&mut file)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PromptItem, SftRow};

    fn file(rows: impl Iterator<Item = String>) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("data.jsonl");
        std::fs::write(&p, rows.map(|r| r + "\n").collect::<String>()).unwrap();
        (dir, p)
    }

    fn pair(i: usize) -> String {
        format!("{{\"prompt\": \"{i}\", \"completion\": \"{i}\"}}")
    }

    #[test]
    fn a_bad_row_far_into_the_file_is_found_and_named() {
        let bad = (1..=700).map(|i| match i {
            700 => "{\"prompt\": \"a\"}".to_string(),
            i => pair(i),
        });
        let (_d, p) = file(bad);
        let cx = RowContext::new(None);
        let e = check_first_rows::<SftRow>(&p, &cx, OnBadRow::Fail).unwrap_err();
        assert!(matches!(e, DataError::Row { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("data.jsonl: line 700"), "{e}");
        assert!(
            e.contains("no `completion`") && e.contains("expected {"),
            "{e}"
        );
        assert!(e.contains("data.on_bad_row = \"skip\""), "{e}");
        let c = check_first_rows::<SftRow>(&p, &cx, OnBadRow::Skip).unwrap();
        assert_eq!((c.file_rows, c.checked, c.skipped), (700, 700, 1));
    }

    #[test]
    fn checking_reads_the_first_rows_only_and_counts_the_file() {
        let rows = (0..=CHECK_ROWS).map(|i| match i {
            i if i == CHECK_ROWS => "not json".to_string(),
            i => format!("{{\"prompt\": \"{i}\", \"solution\": \"{i}\"}}"),
        });
        let (_d, p) = file(rows);
        let cx = RowContext::new(None);
        let c = check_first_rows::<PromptItem>(&p, &cx, OnBadRow::Fail).unwrap();
        assert_eq!((c.file_rows, c.checked, c.skipped), (1001, 1000, 0));
        let a = &c.answers;
        assert_eq!((a.rows, a.lacking, a.whole_file), (1000, 1000, false));
        assert_eq!(a.first_columns, ["prompt", "solution"]);
        let cx = RowContext {
            tok: None,
            answer_field: "solution",
        };
        let c = check_first_rows::<PromptItem>(&p, &cx, OnBadRow::Fail).unwrap();
        assert_eq!(c.answers.lacking, 0);
    }

    #[test]
    fn a_file_in_another_schema_is_a_mismatch_or_with_skip_empty() {
        let (_d, p) = file((0..20).map(|i| format!("{{\"question\": \"{i}\"}}")));
        let cx = RowContext::new(None);
        let e = check_first_rows::<SftRow>(&p, &cx, OnBadRow::Fail).unwrap_err();
        assert!(matches!(e, DataError::Schema { .. }), "{e}");
        assert!(!e.to_string().contains("to skip and count"), "{e}");
        let e = check_first_rows::<SftRow>(&p, &cx, OnBadRow::Skip).unwrap_err();
        assert!(matches!(e, DataError::Empty { skipped: 20, .. }), "{e}");
    }
}

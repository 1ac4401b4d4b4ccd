//! [`AnswerCoverage`]: how many prompt rows carry the reference answer a rule-based reward
//! needs. A file where no row has it would train at reward 0 without a word (a TRL dataset
//! keeps its answers in `solution` or `ground_truth`), so that is an error naming the
//! column looked for and the columns the file has; a file where only some rows lack it
//! gets a warning with the count.

use crate::error::{DataError, NoAnswer};
use crate::row_file::RowFile;
use std::path::Path;

/// Columns that often hold a reference answer, suggested in that order.
const ANSWER_LIKE: [&str; 7] = [
    "solution",
    "ground_truth",
    "answer",
    "final_answer",
    "reference",
    "target",
    "label",
];

/// Reference answers in the rows of a prompt file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnswerCoverage {
    /// Good rows looked at.
    pub rows: u64,
    /// Of those, rows without the answer column.
    pub lacking: u64,
    /// True when every row of the file was looked at (else only the first ones were).
    pub whole_file: bool,
    /// The columns of the file's first row.
    pub first_columns: Vec<String>,
}

impl AnswerCoverage {
    /// `Err` when no row looked at has `field` (the reference answer, which `needed_by`
    /// needs); a warning when only some lack it; `None` when all have it.
    pub fn require(
        &self,
        path: &Path,
        field: &str,
        needed_by: &str,
    ) -> Result<Option<String>, DataError> {
        if self.lacking == 0 {
            return Ok(None);
        }
        if self.lacking < self.rows {
            return Ok(Some(format!(
                "{}: {} of {} rows have no `{field}` ({needed_by} needs the reference \
                 answer): their responses are scored as wrong",
                path.display(),
                self.lacking,
                self.rows
            )));
        }
        let rows = match self.whole_file {
            true => "no row has".to_string(),
            false => format!("none of the first {} rows has", self.rows),
        };
        Err(DataError::NoAnswer(Box::new(NoAnswer {
            path: path.to_path_buf(),
            rows,
            field: field.to_string(),
            needed_by: needed_by.to_string(),
            columns: self.columns(),
            hint: self.hint(field),
        })))
    }

    fn columns(&self) -> String {
        let names: Vec<String> = self
            .first_columns
            .iter()
            .map(|c| format!("`{c}`"))
            .collect();
        match names.is_empty() {
            true => "no columns".into(),
            false => names.join(", "),
        }
    }

    /// How to fix it: name the likeliest answer column, or add one.
    fn hint(&self, field: &str) -> String {
        let has = |c: &str| self.first_columns.iter().any(|f| f == c);
        let guess = ANSWER_LIKE
            .into_iter()
            .find(|&c| c != field && !["prompt", "messages"].contains(&c) && has(c));
        match guess {
            Some(c) => format!("name the answer column with data.answer_field = \"{c}\""),
            None => format!(
                "add a `{field}` column, or name the column that holds the reference answer \
                 with data.answer_field"
            ),
        }
    }
}

/// The column names of the first row of `file` (none for an empty file or a row that is
/// not an object).
pub(super) fn first_columns(file: &mut RowFile) -> Result<Vec<String>, DataError> {
    if file.is_empty() {
        return Ok(Vec::new());
    }
    Ok(match file.read(0)? {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coverage(rows: u64, lacking: u64, columns: &[&str]) -> AnswerCoverage {
        AnswerCoverage {
            rows,
            lacking,
            whole_file: true,
            first_columns: columns.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn no_row_with_the_answer_is_an_error_naming_the_columns_and_the_fix() {
        let c = coverage(3, 3, &["prompt", "solution"]);
        let e = c
            .require(Path::new("prompts.jsonl"), "answer", "the reward")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("prompts.jsonl: no row has `answer`"), "{e}");
        assert!(e.contains("the first row has `prompt`, `solution`"), "{e}");
        assert!(e.contains("data.answer_field = \"solution\""), "{e}");
    }

    #[test]
    fn without_an_answer_like_column_the_hint_says_to_add_or_name_one() {
        let mut c = coverage(2, 2, &["prompt", "id"]);
        c.whole_file = false;
        let e = c
            .require(Path::new("p.jsonl"), "answer", "the reward")
            .unwrap_err()
            .to_string();
        assert!(e.contains("none of the first 2 rows has `answer`"), "{e}");
        assert!(e.contains("add a `answer` column"), "{e}");
    }

    #[test]
    fn some_rows_without_the_answer_give_a_warning_with_the_count() {
        let w = coverage(10, 3, &["prompt", "answer"])
            .require(Path::new("p.jsonl"), "answer", "the reward")
            .unwrap()
            .unwrap();
        assert!(w.contains("3 of 10 rows have no `answer`"), "{w}");
        let all = coverage(10, 0, &["prompt", "answer"]);
        assert_eq!(
            all.require(Path::new("p.jsonl"), "answer", "x").unwrap(),
            None
        );
    }
}

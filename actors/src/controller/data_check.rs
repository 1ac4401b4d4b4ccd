//! The data checks a run and `oxalign train --check` share: every data file the recipe names
//! is read in the schema of its run kind, and a prompts file must carry the reference
//! answer when something in the recipe compares with it (an exact-match reward or
//! verifier, or the SFT warm-up that trains on it). A run checks every row; `--check`
//! checks the first [`oxalign_data::CHECK_ROWS`] of each file with the run's row parser and
//! counts the rest, so a malformed row or a file in another schema exits 2 before a model
//! is loaded.

use crate::controller::error::{At, RunError};
use crate::error::Cause;
use crate::recipe::{Recipe, RewardKind, RunKind, TaskKind};
use oxalign_data::{
    check_first_rows, AnswerCoverage, DataError, PreferencePair, PromptItem, RowCheck, RowContext,
    RowSchema, SftRow,
};
use oxalign_models::text::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

/// What compares responses with (or trains on) the prompts' reference answers; `None` when
/// nothing in the recipe needs them.
pub fn answers_needed_by(recipe: &Recipe) -> Option<&'static str> {
    if recipe.run.kind != RunKind::Rl || recipe.data.task == TaskKind::Arithmetic {
        return None;
    }
    match (recipe.reward.answer_check(), recipe.reward.kind) {
        (Ok(Some(_)), RewardKind::ExactMatch) => Some("reward.kind = \"exact_match\""),
        (Ok(Some(_)), _) => Some("the exact_match verifier in reward.verifiers"),
        _ if recipe.sft.steps > 0 => Some("the SFT warm-up (sft.steps > 0)"),
        _ => None,
    }
}

/// A bad-input error of the `data` setup phase.
fn data_error(e: DataError) -> RunError {
    RunError::controller(At::Setup, "data", Cause::from(e))
}

/// Refuses a prompts file where no row has the reference answer the recipe needs; warns
/// once on stderr when only some rows lack it.
pub(crate) fn require_answers(
    recipe: &Recipe,
    path: &Path,
    answers: &AnswerCoverage,
) -> Result<(), RunError> {
    let Some(needed_by) = answers_needed_by(recipe) else {
        return Ok(());
    };
    let field = &recipe.data.answer_field;
    if let Some(w) = answers
        .require(path, field, needed_by)
        .map_err(data_error)?
    {
        eprintln!("warning: {w}");
    }
    Ok(())
}

/// The tokenizer a run would render chat messages with, without writing anything: the
/// model folder's, the run's existing `init/` folder's, or the byte tokenizer that
/// `policy_dir` writes into a fresh run's `init/`.
fn check_tokenizer(recipe: &Recipe) -> Result<Tokenizer, RunError> {
    let init = recipe.run_dir().join("init");
    let dir = match &recipe.model.path {
        Some(p) => PathBuf::from(p),
        None if init.join("tokenizer.json").is_file() => init,
        None => return Ok(oxalign_models::text::byte_tokenizer::build_plain_text()),
    };
    Tokenizer::from_dir(&dir)
        .map_err(|e| RunError::controller(At::Setup, "tokenizer", Cause::from(e)))
}

/// The data files the recipe reads: `data.path` and `data.eval_path` (none for the
/// arithmetic task of an RL run).
fn data_files(recipe: &Recipe) -> Vec<PathBuf> {
    if recipe.run.kind == RunKind::Rl && recipe.data.task == TaskKind::Arithmetic {
        return Vec::new();
    }
    let d = &recipe.data;
    d.path
        .iter()
        .chain(&d.eval_path)
        .map(PathBuf::from)
        .collect()
}

/// What `--check` read of the recipe's data files, all files together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataChecked {
    /// Rows parsed (the first [`oxalign_data::CHECK_ROWS`] of each file).
    pub checked: u64,
    /// Rows in the files.
    pub rows: u64,
    /// Of the rows parsed, malformed ones the run would skip (`data.on_bad_row = "skip"`).
    pub skipped: u64,
}

impl DataChecked {
    fn add(&mut self, c: &RowCheck) {
        self.checked += c.checked;
        self.rows += c.file_rows;
        self.skipped += c.skipped;
    }

    /// "4 rows checked", "1000 of 5000 rows checked", with ", 2 would be skipped" when
    /// some would; `noun` names the rows ("rows", "data rows").
    pub fn describe(&self, noun: &str) -> String {
        let mut s = match self.checked == self.rows {
            true => format!("{} {noun} checked", self.checked),
            false => format!("{} of {} {noun} checked", self.checked, self.rows),
        };
        if self.skipped > 0 {
            s += &format!(", {} would be skipped", self.skipped);
        }
        s
    }
}

/// Checks the first `CHECK_ROWS` (1000) rows of each data file as the run would, with the
/// run's row parser (`oxalign train --check`), and counts their rows. Only `data.path` must
/// carry answers.
pub fn check_data(recipe: &Recipe) -> Result<DataChecked, RunError> {
    let files = data_files(recipe);
    let mut out = DataChecked::default();
    if files.is_empty() {
        return Ok(out);
    }
    let tok = check_tokenizer(recipe)?;
    let cx = RowContext {
        tok: Some(&tok),
        answer_field: &recipe.data.answer_field,
    };
    for (i, path) in files.iter().enumerate() {
        let checked = match recipe.run.kind {
            RunKind::Rl => first_rows::<PromptItem>(recipe, path, &cx)?,
            RunKind::Sft => first_rows::<SftRow>(recipe, path, &cx)?,
            RunKind::Rm | RunKind::Dpo => first_rows::<PreferencePair>(recipe, path, &cx)?,
        };
        if i == 0 {
            require_answers(recipe, path, &checked.answers)?;
        }
        out.add(&checked);
    }
    Ok(out)
}

fn first_rows<T: RowSchema>(
    recipe: &Recipe,
    path: &Path,
    cx: &RowContext<'_>,
) -> Result<RowCheck, RunError> {
    check_first_rows::<T>(path, cx, recipe.data.on_bad_row).map_err(data_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::RewardSection;

    fn prompts_recipe(reward: RewardKind, sft_steps: u64) -> Recipe {
        let mut r = Recipe::default();
        r.data.task = TaskKind::File;
        r.data.path = Some("p.jsonl".into());
        r.reward = RewardSection {
            kind: reward,
            ..RewardSection::default()
        };
        r.sft.steps = sft_steps;
        r
    }

    #[test]
    fn answers_are_needed_by_an_exact_match_reward_or_an_sft_warm_up_only() {
        let needed = |k, s| answers_needed_by(&prompts_recipe(k, s));
        assert!(needed(RewardKind::ExactMatch, 0)
            .unwrap()
            .contains("exact_match"));
        assert_eq!(needed(RewardKind::Http, 0), None);
        assert!(needed(RewardKind::Http, 5).unwrap().contains("SFT warm-up"));
        let mut arithmetic = prompts_recipe(RewardKind::ExactMatch, 0);
        arithmetic.data.task = TaskKind::Arithmetic;
        assert_eq!(
            answers_needed_by(&arithmetic),
            None,
            "the task has its answers"
        );
    }

    #[test]
    fn a_file_without_answers_is_bad_input_and_a_partial_one_is_not() {
        let r = prompts_recipe(RewardKind::ExactMatch, 0);
        let mut cov = AnswerCoverage {
            rows: 4,
            lacking: 4,
            whole_file: true,
            first_columns: vec!["prompt".into(), "solution".into()],
        };
        let e = require_answers(&r, Path::new("p.jsonl"), &cov).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
        assert!(
            e.to_string().contains("data.answer_field = \"solution\""),
            "{e}"
        );
        cov.lacking = 1;
        require_answers(&r, Path::new("p.jsonl"), &cov).unwrap();
    }

    #[test]
    fn the_check_summary_says_how_much_was_read_and_what_would_be_skipped() {
        let all = DataChecked {
            checked: 4,
            rows: 4,
            skipped: 0,
        };
        assert_eq!(all.describe("rows"), "4 rows checked");
        let part = DataChecked {
            checked: 1000,
            rows: 5000,
            skipped: 2,
        };
        assert_eq!(
            part.describe("data rows"),
            "1000 of 5000 data rows checked, 2 would be skipped"
        );
    }
}

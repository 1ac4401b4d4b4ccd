//! Prompts from a JSONL or Parquet file ([`PromptFile`], the prompts schema of `schema.rs`)
//! as a [`PromptSource`] for RL and evaluation.

use crate::dataset::Dataset;
use crate::{DataError, PromptItem, PromptSource};

/// A streamed prompt file.
pub type PromptFile = Dataset<PromptItem>;

impl PromptSource for Dataset<PromptItem> {
    fn train_item(&self, index: u64) -> Result<PromptItem, DataError> {
        Dataset::train_item(self, index)
    }

    fn eval_items(&self) -> &[PromptItem] {
        Dataset::eval_items(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataSpec, OnBadRow};
    use std::path::Path;

    fn spec(p: &Path, on_bad_row: OnBadRow) -> DataSpec {
        DataSpec {
            path: p.to_path_buf(),
            eval_path: None,
            eval_fraction: 0.0,
            seed: 3,
            on_bad_row,
            answer_field: "answer".into(),
        }
    }

    #[test]
    fn visits_each_line_once_per_epoch_and_names_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        std::fs::write(
            &p,
            "{\"prompt\": \"a\", \"answer\": \"1\"}\n\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\"}\n",
        )
        .unwrap();
        let f = PromptFile::load(&spec(&p, OnBadRow::Fail), None).unwrap();
        assert_eq!(f.train_len(), 3);
        for epoch in 0..2 {
            let mut seen: Vec<String> = (0..3)
                .map(|i| PromptSource::train_item(&f, epoch * 3 + i).unwrap().prompt)
                .collect();
            seen.sort();
            assert_eq!(seen, ["a", "b", "c"]);
        }
        std::fs::write(&p, "{\"prompt\": \"a\"}\n{\"prompt\": 5}\n").unwrap();
        let e = PromptFile::load(&spec(&p, OnBadRow::Fail), None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("p.jsonl: line 2"), "{e}");
        let f = PromptFile::load(&spec(&p, OnBadRow::Skip), None).unwrap();
        assert_eq!((f.train_len(), f.report().skipped), (1, 1));
        assert!(f.report().first_skipped[0].contains("line 2"));
    }

    #[test]
    fn the_split_is_seeded_and_disjoint() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        let text: String = (0..100)
            .map(|i| format!("{{\"prompt\": \"{i}\"}}\n"))
            .collect();
        std::fs::write(&p, text).unwrap();
        let mut s = spec(&p, OnBadRow::Fail);
        s.eval_fraction = 0.2;
        let a = PromptFile::load(&s, None).unwrap();
        let b = PromptFile::load(&s, None).unwrap();
        assert_eq!(a.eval_items(), b.eval_items());
        assert_eq!((a.train_len(), a.eval_items().len()), (80, 20));
        for i in 0..80 {
            let it = PromptSource::train_item(&a, i).unwrap();
            assert_eq!(it, PromptSource::train_item(&b, i).unwrap());
            assert!(!a.eval_items().contains(&it));
        }
        s.seed = 4;
        let c = PromptFile::load(&s, None).unwrap();
        assert_ne!(a.eval_items(), c.eval_items());
    }
}

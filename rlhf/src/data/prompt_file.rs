//! Prompts from a JSONL file: one `{"prompt": ..., "answer": ...}` object per line.
//!
//! The training stream visits every line once per epoch in a seeded order. A malformed line
//! is an error naming the file and the line number; nothing is skipped silently.

use super::{splitmix64, PromptItem, PromptSource};
use crate::RlhfError;
use std::path::Path;

/// A prompt file, loaded whole.
pub struct PromptFile {
    seed: u64,
    items: Vec<PromptItem>,
    eval: Vec<PromptItem>,
}

impl PromptFile {
    /// Loads `path` (training prompts) and optionally `eval_path` (held-out prompts).
    pub fn load(path: &Path, eval_path: Option<&Path>, seed: u64) -> Result<Self, RlhfError> {
        let items = read_items(path)?;
        if items.is_empty() {
            return Err(RlhfError::Data(format!("{}: no prompts (expected JSONL lines like {{\"prompt\": \"...\", \"answer\": \"...\"}})", path.display())));
        }
        let eval = match eval_path {
            Some(p) => read_items(p)?,
            None => Vec::new(),
        };
        Ok(Self { seed, items, eval })
    }

    /// Number of training prompts.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True if there are no training prompts (never, after `load`).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

fn read_items(path: &Path) -> Result<Vec<PromptItem>, RlhfError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| RlhfError::Data(format!("cannot read prompts {}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let item: PromptItem = serde_json::from_str(line).map_err(|e| {
            RlhfError::Data(format!(
                "{}:{}: {e} (expected {{\"prompt\": string, \"answer\": string?}})",
                path.display(),
                i + 1
            ))
        })?;
        out.push(item);
    }
    Ok(out)
}

impl PromptSource for PromptFile {
    fn train_item(&self, index: u64) -> PromptItem {
        let n = self.items.len() as u64;
        let (epoch, pos) = (index / n, index % n);
        // A seeded permutation per epoch: sort positions by a per-epoch hash (cached would be
        // faster, but files here are small and this keeps the source stateless).
        let key =
            |j: u64| splitmix64(self.seed ^ splitmix64(epoch) ^ splitmix64(j.wrapping_add(0x51)));
        let mut order: Vec<u64> = (0..n).collect();
        order.sort_by_key(|&j| key(j));
        self.items[order[pos as usize] as usize].clone()
    }

    fn eval_items(&self) -> &[PromptItem] {
        &self.eval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visits_each_line_once_per_epoch_and_names_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        std::fs::write(
            &p,
            "{\"prompt\": \"a\", \"answer\": \"1\"}\n\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\"}\n",
        )
        .unwrap();
        let f = PromptFile::load(&p, None, 3).unwrap();
        assert_eq!(f.len(), 3);
        for epoch in 0..2 {
            let mut seen: Vec<String> =
                (0..3).map(|i| f.train_item(epoch * 3 + i).prompt).collect();
            seen.sort();
            assert_eq!(seen, ["a", "b", "c"]);
        }
        std::fs::write(&p, "{\"prompt\": \"a\"}\n{\"prompt\": 5}\n").unwrap();
        let e = PromptFile::load(&p, None, 3).err().unwrap().to_string();
        assert!(e.contains("p.jsonl:2"), "{e}");
    }
}

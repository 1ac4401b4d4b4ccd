//! The arithmetic task as data files, in the three schemas: prompts (`{"prompt", "answer"}`),
//! SFT (`{"prompt", "response"}`) and preferences (`{"prompt", "chosen", "rejected"}` with
//! near-miss rejected answers: off by one, or the digits swapped), each as a training and a
//! held-out file. The split is the task's own (held-out sums never appear in training).

use crate::arithmetic::ArithmeticTask;
use crate::{splitmix64, PromptItem, PromptSource};
use serde_json::json;
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Wrong answers close to `answer`: `answer ± 1` and its digits reversed (when different).
pub fn near_misses(answer: u64) -> Vec<String> {
    let mut out = vec![(answer + 1).to_string()];
    if answer > 0 {
        out.push((answer - 1).to_string());
    }
    let swapped: String = answer.to_string().chars().rev().collect();
    if swapped != answer.to_string() {
        out.push(swapped.trim_start_matches('0').to_string());
    }
    out.retain(|s| !s.is_empty() && *s != answer.to_string());
    out
}

/// The distinct training items of `task`, in stream order (at most `limit`).
pub fn distinct_train_items(task: &ArithmeticTask, limit: usize) -> Vec<PromptItem> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut misses = 0;
    for i in 0.. {
        if out.len() >= limit || misses > 10_000 {
            break;
        }
        let it = task.train_pair(i);
        if seen.insert(it.prompt.clone()) {
            out.push(it);
            misses = 0;
        } else {
            misses += 1;
        }
    }
    out
}

/// Writes `rows` to `path`, one JSON value per line.
pub(crate) fn write_lines(path: &Path, rows: &[serde_json::Value]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in rows {
        writeln!(f, "{r}")?;
    }
    f.flush()
}

/// One preference row per near miss of each item (all of them, in a seeded order).
fn preference_rows(items: &[PromptItem], seed: u64) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let Some(answer) = it.answer.as_deref() else {
            continue;
        };
        let Ok(n) = answer.parse::<u64>() else {
            continue;
        };
        let mut misses = near_misses(n);
        misses.sort_by_key(|m| {
            splitmix64(seed ^ splitmix64(i as u64) ^ m.len() as u64 ^ m.as_bytes()[0] as u64)
        });
        for m in misses {
            rows.push(json!({"prompt": it.prompt, "chosen": answer, "rejected": m}));
        }
    }
    rows
}

/// Writes `{prompts,sft,preferences}.{train,eval}.jsonl` into `dir`; returns the paths.
pub fn write_arithmetic_files(
    dir: &Path,
    seed: u64,
    max_operand: u32,
    eval_size: usize,
    train_size: usize,
) -> std::io::Result<Vec<(PathBuf, usize)>> {
    std::fs::create_dir_all(dir)?;
    let task = ArithmeticTask::new(seed, max_operand, eval_size);
    let train = distinct_train_items(&task, train_size);
    let eval = task.eval_items().to_vec();
    let mut written = Vec::new();
    for (split, items) in [("train", &train), ("eval", &eval)] {
        let prompts: Vec<_> = items
            .iter()
            .map(|it| json!({"prompt": it.prompt, "answer": it.answer}))
            .collect();
        let sft: Vec<_> = items
            .iter()
            .map(|it| json!({"prompt": it.prompt, "response": it.answer}))
            .collect();
        let prefs = preference_rows(items, seed);
        for (name, rows) in [("prompts", prompts), ("sft", sft), ("preferences", prefs)] {
            let path = dir.join(format!("{name}.{split}.jsonl"));
            write_lines(&path, &rows)?;
            written.push((path, rows.len()));
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_are_wrong_and_close() {
        assert_eq!(near_misses(15), ["16", "14", "51"]);
        assert_eq!(near_misses(0), ["1"]);
        assert_eq!(near_misses(11), ["12", "10"]);
        assert_eq!(near_misses(10), ["11", "9", "1"]);
        assert_eq!(near_misses(6_000_000_000)[0], "6000000001");
    }

    #[test]
    fn files_are_seeded_and_held_out_sums_stay_out_of_training() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_arithmetic_files(a.path(), 1, 9, 40, 1000).unwrap();
        write_arithmetic_files(b.path(), 1, 9, 40, 1000).unwrap();
        let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap();
        for f in ["sft.train.jsonl", "preferences.eval.jsonl"] {
            assert_eq!(read(a.path(), f), read(b.path(), f));
        }
        let train = read(a.path(), "prompts.train.jsonl");
        assert_eq!(train.lines().count(), 60);
        for line in read(a.path(), "prompts.eval.jsonl").lines() {
            assert!(!train.contains(line), "{line} is in both splits");
        }
    }
}

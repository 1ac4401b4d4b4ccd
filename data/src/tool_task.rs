//! The calculator task of multi-turn episodes: three-operand expressions `a*b+c` (`a`, `c` in
//! 10..=99, `b` in 2..=9) that a tiny model gets wrong in its head but right by calling the
//! calculator and copying its result. Written as chat data files:
//! * `prompts.{train,eval}.jsonl`: `{"messages": [user], "answer"}` for GRPO with `[env]`;
//! * `sft.{train,eval}.jsonl`: tool-use demonstrations, each as two conversational rows (the
//!   call turn `[user, assistant]`, and the answer turn `[user, assistant, tool, assistant]`),
//!   since a row trains its last assistant turn.
//!
//! The call is Hermes/Qwen style, `<tool_call>{json}</tool_call>`. Held-out expressions never
//! appear in the training files; the same seed gives the same files.

use crate::arithmetic_export::write_lines;
use crate::splitmix64;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// One expression and its value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolProblem {
    /// `a*b+c`.
    pub expression: String,
    /// Its value.
    pub answer: u64,
}

impl ToolProblem {
    /// The problem drawn by `x` (a hash).
    fn draw(x: u64) -> Self {
        let a = 10 + x % 90;
        let b = 2 + (x / 90) % 8;
        let c = 10 + (x / 720) % 90;
        Self {
            expression: format!("{a}*{b}+{c}"),
            answer: a * b + c,
        }
    }

    /// The assistant's tool call for this problem.
    pub fn call(&self) -> String {
        let expr = Value::String(self.expression.clone());
        format!("<tool_call>{{\"name\":\"calculator\",\"arguments\":{{\"expression\":{expr}}}}}</tool_call>")
    }
}

/// `eval_size` held-out problems and up to `train_size` training ones, disjoint, seeded.
pub fn tool_problems(
    seed: u64,
    eval_size: usize,
    train_size: usize,
) -> (Vec<ToolProblem>, Vec<ToolProblem>) {
    let mut seen = HashSet::new();
    let mut drawn = Vec::new();
    let total = eval_size + train_size;
    // 90 * 8 * 90 = 64800 distinct problems.
    for i in 0..total as u64 * 4 + 1000 {
        if drawn.len() == total.min(64_800) {
            break;
        }
        let p = ToolProblem::draw(splitmix64(seed ^ splitmix64(i)));
        if seen.insert(p.expression.clone()) {
            drawn.push(p);
        }
    }
    let train = drawn.split_off(eval_size.min(drawn.len()));
    (drawn, train)
}

fn prompt_row(p: &ToolProblem) -> Value {
    json!({
        "messages": [{"role": "user", "content": p.expression}],
        "answer": p.answer.to_string(),
    })
}

fn demo_rows(p: &ToolProblem) -> [Value; 2] {
    let user = json!({"role": "user", "content": p.expression});
    let call = json!({"role": "assistant", "content": p.call()});
    let result = json!({"role": "tool", "content": p.answer.to_string()});
    let answer = json!({"role": "assistant", "content": p.answer.to_string()});
    [
        json!({"messages": [user, call]}),
        json!({"messages": [user, call, result, answer]}),
    ]
}

/// Writes `{prompts,sft}.{train,eval}.jsonl` into `dir`; returns the paths and row counts.
pub fn write_tool_files(
    dir: &Path,
    seed: u64,
    eval_size: usize,
    train_size: usize,
) -> std::io::Result<Vec<(PathBuf, usize)>> {
    std::fs::create_dir_all(dir)?;
    let (eval, train) = tool_problems(seed, eval_size, train_size);
    let mut written = Vec::new();
    for (split, problems) in [("train", &train), ("eval", &eval)] {
        let prompts: Vec<Value> = problems.iter().map(prompt_row).collect();
        let sft: Vec<Value> = problems.iter().flat_map(demo_rows).collect();
        for (name, rows) in [("prompts", prompts), ("sft", sft)] {
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
    fn problems_are_seeded_disjoint_and_correct() {
        let (eval, train) = tool_problems(3, 50, 500);
        assert_eq!((eval.len(), train.len()), (50, 500));
        assert_eq!(tool_problems(3, 50, 500).0, eval);
        let held: HashSet<_> = eval.iter().map(|p| &p.expression).collect();
        assert!(train.iter().all(|p| !held.contains(&p.expression)));
        for p in eval.iter().chain(&train) {
            let (ab, c) = p.expression.split_once('+').unwrap();
            let (a, b) = ab.split_once('*').unwrap();
            let v = |s: &str| s.parse::<u64>().unwrap();
            assert_eq!(v(a) * v(b) + v(c), p.answer);
            assert!((10..=99).contains(&v(a)) && (2..=9).contains(&v(b)));
        }
        assert_eq!(
            ToolProblem::draw(0).call(),
            "<tool_call>{\"name\":\"calculator\",\"arguments\":{\"expression\":\"10*2+10\"}}</tool_call>"
        );
    }

    #[test]
    fn files_hold_prompts_and_two_demonstration_rows_per_problem() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_tool_files(dir.path(), 1, 10, 40).unwrap();
        let rows: Vec<usize> = written.iter().map(|(_, n)| *n).collect();
        assert_eq!(rows, vec![40, 80, 10, 20]);
        let sft = std::fs::read_to_string(dir.path().join("sft.train.jsonl")).unwrap();
        let second: Value = serde_json::from_str(sft.lines().nth(1).unwrap()).unwrap();
        let roles: Vec<&str> = second["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    }
}

//! The generated arithmetic task: prompts `a+b=` with the exact sum as the answer.
//!
//! Operands are drawn from `0..=max_operand`. The held-out pairs are drawn first from their
//! own stream and never appear in training. It does not tokenize or score.

use crate::{splitmix64, DataError, PromptItem, PromptSource};
use std::collections::HashSet;

/// `a+b=` → `a+b`, with a held-out set disjoint from the training stream.
pub struct ArithmeticTask {
    seed: u64,
    max_operand: u32,
    eval: Vec<PromptItem>,
    held_out: HashSet<(u32, u32)>,
}

impl ArithmeticTask {
    /// A task over operands `0..=max_operand` with `eval_size` held-out prompts.
    ///
    /// `eval_size` is capped at half of all pairs so training keeps most of them.
    pub fn new(seed: u64, max_operand: u32, eval_size: usize) -> Self {
        let n = max_operand as u64 + 1;
        // In u128: with max_operand = u32::MAX, n² is 2^64.
        let pairs = (n as u128) * (n as u128) / 2;
        let eval_size = eval_size.min(pairs.min(usize::MAX as u128) as usize);
        let mut held_out = HashSet::new();
        let mut eval = Vec::with_capacity(eval_size);
        let mut i = 0u64;
        while eval.len() < eval_size {
            let pair = pair_at(seed ^ 0xE7A1, i, n);
            i += 1;
            if held_out.insert(pair) {
                eval.push(item(pair));
            }
        }
        Self {
            seed,
            max_operand,
            eval,
            held_out,
        }
    }

    /// Largest operand.
    pub fn max_operand(&self) -> u32 {
        self.max_operand
    }
}

fn pair_at(seed: u64, index: u64, n: u64) -> (u32, u32) {
    let h = splitmix64(seed.wrapping_mul(0x1000_0000_01B3) ^ splitmix64(index));
    ((h % n) as u32, ((h >> 32) % n) as u32)
}

/// The prompt `a+b=` and its exact sum (in u64: two u32 operands can pass `u32::MAX`).
fn item((a, b): (u32, u32)) -> PromptItem {
    PromptItem {
        prompt: format!("{a}+{b}="),
        answer: Some((a as u64 + b as u64).to_string()),
        columns: None,
    }
}

impl PromptSource for ArithmeticTask {
    fn train_item(&self, index: u64) -> Result<PromptItem, DataError> {
        Ok(self.train_pair(index))
    }

    fn eval_items(&self) -> &[PromptItem] {
        &self.eval
    }
}

impl ArithmeticTask {
    /// Training item `index` (never a held-out pair).
    pub fn train_pair(&self, index: u64) -> PromptItem {
        let n = self.max_operand as u64 + 1;
        // Rejection-sample past held-out pairs; `attempt` keeps it a pure function of index.
        let mut attempt = 0u64;
        loop {
            let pair = pair_at(self.seed, index.wrapping_mul(64).wrapping_add(attempt), n);
            if !self.held_out.contains(&pair) {
                return item(pair);
            }
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_correct_deterministic_and_disjoint_from_eval() {
        let t = ArithmeticTask::new(7, 99, 200);
        assert_eq!(t.eval_items().len(), 200);
        let again = ArithmeticTask::new(7, 99, 200);
        for i in 0..2000 {
            let it = t.train_pair(i);
            assert_eq!(it, again.train_pair(i));
            let (a, b) = it.prompt.trim_end_matches('=').split_once('+').unwrap();
            let (a, b): (u32, u32) = (a.parse().unwrap(), b.parse().unwrap());
            assert!(a <= 99 && b <= 99);
            assert_eq!(it.answer.as_deref(), Some((a + b).to_string().as_str()));
            assert!(
                !t.eval_items().contains(&it),
                "training item {i} is held out"
            );
        }
        assert_ne!(
            ArithmeticTask::new(8, 99, 200).train_pair(0),
            t.train_pair(0)
        );
    }

    #[test]
    fn sums_past_u32_are_exact() {
        assert_eq!(
            item((3_000_000_000, 3_000_000_000)).answer.as_deref(),
            Some("6000000000")
        );
        let t = ArithmeticTask::new(1, u32::MAX, 10);
        assert_eq!(t.eval_items().len(), 10);
        for i in 0..200 {
            let it = t.train_pair(i);
            let (a, b) = it.prompt.trim_end_matches('=').split_once('+').unwrap();
            let sum = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
            assert_eq!(it.answer, Some(sum.to_string()), "{}", it.prompt);
        }
    }

    #[test]
    fn eval_is_capped_for_small_operand_ranges() {
        let t = ArithmeticTask::new(1, 3, 1000);
        assert_eq!(t.eval_items().len(), 8);
        for i in 0..100 {
            assert!(!t.eval_items().contains(&t.train_pair(i)));
        }
    }
}

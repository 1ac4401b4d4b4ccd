//! `oxalign data arithmetic --out DIR`: writes the quickstart's addition task as data files in
//! the three schemas the recipes read (prompts, SFT, preferences with near-miss rejected
//! answers), each with a training and a held-out split. Seeded; it trains nothing.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use oxalign_data::{write_arithmetic_files, write_tool_files};

use crate::user_error::{user_error, IntoUserError};

/// Arguments of `oxalign data`.
#[derive(Debug, Parser)]
#[command(about = "Write a task's data files (prompts, SFT pairs, preference pairs)")]
pub struct Args {
    /// The task.
    #[command(subcommand)]
    pub task: Task,
}

/// The tasks `oxalign data` can write.
#[derive(Debug, Subcommand)]
pub enum Task {
    /// The addition task of the quickstart ("7+8=" -> "15").
    #[command(
        long_about = "Write the addition task of the quickstart as JSONL files in DIR: \
prompts.{train,eval}.jsonl ({\"prompt\", \"answer\"}), sft.{train,eval}.jsonl ({\"prompt\", \
\"response\"}) and preferences.{train,eval}.jsonl ({\"prompt\", \"chosen\", \"rejected\"}, the \
rejected answer off by one or with its digits swapped). Held-out sums never appear in the \
training files. The same --seed gives the same files."
    )]
    Arithmetic(ArithmeticArgs),
    /// The calculator task of multi-turn episodes ("37*6+58" -> a calculator call -> "280").
    #[command(
        long_about = "Write the calculator task of multi-turn episodes as chat JSONL files in \
DIR: prompts.{train,eval}.jsonl ({\"messages\": [user], \"answer\"}, for GRPO with [env]) and \
sft.{train,eval}.jsonl (tool-use demonstrations: the call turn and the answer turn as two \
conversational rows). Expressions are a*b+c (a, c in 10..=99, b in 2..=9); held-out ones never \
appear in the training files. The same --seed gives the same files."
    )]
    Tools(ToolsArgs),
}

/// Arguments of `oxalign data tools`.
#[derive(Debug, Parser)]
pub struct ToolsArgs {
    /// Output folder (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the problems and the split.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Held-out problems.
    #[arg(long, default_value_t = 200)]
    pub eval_size: usize,
    /// Training problems.
    #[arg(long, default_value_t = 5_000)]
    pub train_size: usize,
    /// Write into --out even when it already holds files (they are overwritten).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `oxalign data arithmetic`.
#[derive(Debug, Parser)]
pub struct ArithmeticArgs {
    /// Output folder (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the split and the order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Largest operand (operands are 0..=N).
    #[arg(long, default_value_t = 9)]
    pub max_operand: u32,
    /// Held-out sums (at most half of all pairs).
    #[arg(long, default_value_t = 40)]
    pub eval_size: usize,
    /// Most training sums (distinct; fewer when the operand range has fewer).
    #[arg(long, default_value_t = 10_000)]
    pub train_size: usize,
    /// Write into --out even when it already holds files (they are overwritten).
    #[arg(long)]
    pub force: bool,
}

/// Refuses an `out` folder that already holds something, unless `force`.
fn check_out(out: &Path, force: bool) -> anyhow::Result<()> {
    if force || !out.exists() {
        return Ok(());
    }
    let empty = std::fs::read_dir(out)
        .map(|mut entries| entries.next().is_none())
        .unwrap_or(false);
    if empty {
        return Ok(());
    }
    user_error(format!(
        "--out {}: already exists and is not an empty folder; choose another folder, or pass \
         --force to overwrite its files",
        out.display()
    ))
}

/// Runs `oxalign data`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let a = match args.task {
        Task::Arithmetic(a) => a,
        Task::Tools(t) => return write_tools(t),
    };
    if a.max_operand == 0 {
        return user_error("--max-operand must be at least 1");
    }
    check_out(&a.out, a.force)?;
    let written = write_arithmetic_files(&a.out, a.seed, a.max_operand, a.eval_size, a.train_size)
        .user_err(format!("writing into {}", a.out.display()))?;
    for (path, rows) in written {
        println!("{} ({rows} rows)", path.display());
    }
    Ok(())
}

/// `oxalign data tools`.
fn write_tools(t: ToolsArgs) -> anyhow::Result<()> {
    if t.eval_size == 0 || t.train_size == 0 {
        return user_error("--eval-size and --train-size must be at least 1");
    }
    check_out(&t.out, t.force)?;
    let written = write_tool_files(&t.out, t.seed, t.eval_size, t.train_size)
        .user_err(format!("writing into {}", t.out.display()))?;
    for (path, rows) in written {
        println!("{} ({rows} rows)", path.display());
    }
    Ok(())
}

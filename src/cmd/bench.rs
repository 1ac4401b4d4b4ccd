//! `oxalign bench ...`: the benchmark subcommands, one file each (`bench_train.rs`,
//! `bench_matmul.rs`, ...). This file only routes; it measures nothing itself.

use clap::{Parser, Subcommand};

/// Arguments of `oxalign bench`.
#[derive(Debug, Parser)]
#[command(
    about = "Benchmarks (training throughput, matmul peak, generation, RL steps); each prints one JSON line",
    long_about = "Benchmarks. Each subcommand prints one JSON line with its measurements."
)]
pub struct Args {
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// One variant per benchmark; each holds that benchmark's `Args` (whose `#[command(about)]`
/// is the help text, so variants carry no doc comments).
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    Train(super::bench_train::Args),
    Matmul(super::bench_matmul::Args),
    Generate(super::bench_generate::Args),
    RlStep(super::bench_rl_step::Args),
    Turns(super::bench_turns::Args),
}

/// Runs `oxalign bench <benchmark>`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Train(a) => super::bench_train::run(a),
        BenchCommand::Matmul(a) => super::bench_matmul::run(a),
        BenchCommand::Generate(a) => super::bench_generate::run(a),
        BenchCommand::RlStep(a) => super::bench_rl_step::run(a),
        BenchCommand::Turns(a) => super::bench_turns::run(a),
    }
}

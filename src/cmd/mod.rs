//! One module per `oxalign` subcommand, each with an `Args` (clap) and a `run(Args)`.
//! Shared plumbing (JSONL, model folders, input records) lives outside `cmd/`.

pub mod bench;
pub mod bench_generate;
pub mod bench_matmul;
pub mod bench_rl_step;
pub mod bench_train;
pub mod bench_train_batch;
pub mod bench_turns;
pub mod cluster;
pub(crate) mod curves;
pub mod dashboard;
pub mod data;
pub mod generate;
pub mod init_model;
pub mod launch;
pub mod logprobs;
pub mod merge_lora;
pub mod proc_stats;
pub mod score;
pub mod spread;
pub mod tokenize;
pub mod train;
pub mod train_resume;
pub mod worker;

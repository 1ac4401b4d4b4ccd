//! The `oxalign` command-line launcher: parses arguments, runs one subcommand from `cmd/`, and
//! turns errors into exit codes (2 for the user's mistakes, 1 for anything else). It holds no
//! model or training logic; each subcommand is a thin layer over the library crates.

mod cmd;
mod context_len;
mod jsonl;
mod model_dir;
mod prompt_input;
mod user_error;

use clap::{Parser, Subcommand};

/// RLHF training system: SFT, reward-model, DPO and RL runs (run.kind); RL with PPO, GRPO, Dr. GRPO,
/// RLOO, REINFORCE++ (DAPO, GSPO and CISPO options) or on-policy distillation, with an inference engine in the loop.
#[derive(Debug, Parser)]
#[command(name = "oxalign", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// One variant per subcommand; each holds that subcommand's `Args` from `cmd/<name>.rs`, whose
/// `#[command(about, long_about)]` is the help text (so variants carry no doc comments, which
/// would override it). To add a subcommand: a file in `cmd/`, a variant here, an arm in `run`.
#[derive(Debug, Subcommand)]
enum Command {
    Bench(cmd::bench::Args),
    InitModel(cmd::init_model::Args),
    Logprobs(cmd::logprobs::Args),
    MergeLora(cmd::merge_lora::Args),
    Generate(cmd::generate::Args),
    Score(cmd::score::Args),
    Tokenize(cmd::tokenize::Args),
    Train(cmd::train::Args),
    Dashboard(cmd::dashboard::Args),
    Data(cmd::data::Args),
    Worker(cmd::worker::Args),
    Launch(cmd::launch::Args),
    Cluster(cmd::cluster::Args),
}

impl Command {
    fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Bench(args) => cmd::bench::run(args),
            Command::InitModel(args) => cmd::init_model::run(args),
            Command::Logprobs(args) => cmd::logprobs::run(args),
            Command::MergeLora(args) => cmd::merge_lora::run(args),
            Command::Generate(args) => cmd::generate::run(args),
            Command::Score(args) => cmd::score::run(args),
            Command::Tokenize(args) => cmd::tokenize::run(args),
            Command::Train(args) => cmd::train::run(args),
            Command::Dashboard(args) => cmd::dashboard::run(args),
            Command::Data(args) => cmd::data::run(args),
            Command::Worker(args) => cmd::worker::run(args),
            Command::Launch(args) => cmd::launch::run(args),
            Command::Cluster(args) => cmd::cluster::run(args),
        }
    }
}

fn main() {
    // Before any thread exists: candle's element-wise ops run inline (no spinning pool).
    oxalign_kernels::cpu_threads::configure_cpu_threads();
    // Freed tensor buffers stay mapped for the next step (no page faults, no re-zeroing).
    oxalign_kernels::host_memory::configure_host_allocator();
    // Logs go to stderr, filtered by RUST_LOG (default: warnings only; ractor_cluster's
    // session ends are routine for a worker, which logs what matters in its own words).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,ractor_cluster=error")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(err) = cli.command.run() {
        eprintln!("error: {err:#}");
        std::process::exit(user_error::exit_code(&err));
    }
}

//! `oxalign train RECIPE`: validates a recipe, then runs it (an `sft`, `rm`, `dpo` or `rl` run),
//! optionally with the live dashboard. `--check` stops after validation and reading the first
//! 1000 rows of each data file; `--resume RUN_DIR`
//! continues from the run's newest valid checkpoint (see `train_resume.rs` for the checks).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use oxalign_actors::controller::{self, latest_checkpoint, RunError, TrainOptions};
use oxalign_actors::monitor::{Monitor, MonitorConfig};
use oxalign_actors::recipe::{validate, warnings, Recipe};

use super::train_resume::{self, claim_fresh, claim_resume};
use crate::user_error::{IntoUserError, UserError};

/// Arguments of `oxalign train`.
#[derive(Debug, Parser)]
#[command(
    about = "Run a training recipe: SFT, reward model, DPO or RL (run.kind)",
    long_about = "Run a training recipe (a TOML file, see configs/ and docs/RECIPES.md). run.kind \
picks what it trains: \"sft\" (supervised fine-tuning), \"rm\" (a Bradley-Terry reward model), \
\"dpo\" (DPO, cDPO or IPO against the frozen initial policy) or \"rl\" (the default: an optional \
SFT warm-up, then RL with rl.algorithm = ppo, grpo, dr_grpo, rloo, reinforce_pp or distill \
(on-policy distillation from model.teacher_path), with DAPO's options (clip-higher, dynamic \
sampling, overlong shaping) and the GSPO or CISPO objective (rl.policy_loss)).\n\n\
Outputs go to \
<run.out_dir>/<run.name>/: the resolved recipe.toml, metrics.jsonl (one line per step), \
timeline.jsonl, checkpoints/sft_N/ and step_N/ (policy and critic in HF layout with optimizer \
states, and a SHA-256 of every file; RL runs) or final/ (sft, rm and dpo runs), and \
summary.json at the end.\n\n\
--resume continues from the newest checkpoint that verifies (a damaged newer one is set aside \
with a warning), cuts metrics.jsonl back to that step, and refuses a recipe that changed \
except for the keys named with --allow-change. A step whose loss, gradient or weights diverge \
(see the recipe's [guard] section) stops the run before anything of it is saved (exit code 1). \
A role that panics, fails or passes [supervision] call_timeout_s during an RL step is rebuilt \
from the newest checkpoint and the steps since it are replayed, at most max_restarts times \
within restart_window steps; past that the run stops (exit code 1) with the --resume command."
)]
pub struct Args {
    /// The recipe file.
    pub recipe: PathBuf,
    /// Override a recipe key, e.g. `--set rl.lr=1e-5` (repeatable; value in TOML syntax).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Validate the recipe (keys, types, paths, devices) and the first 1000 rows of each data
    /// file (schema, reference answers) with the run's row parser, then exit.
    #[arg(long)]
    pub check: bool,
    /// Continue the run in this folder from its newest valid checkpoint. The recipe must be
    /// the one the run started with, except for keys named with --allow-change.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,
    /// With --resume: let this key differ from the run's recipe.toml (repeatable). Only
    /// run.steps, run.checkpoint_every, run.keep_checkpoints, sft.checkpoint_every, the
    /// supervision.* keys, faults, log.tensorboard, a node's address (cluster.nodes.NODE) and
    /// cluster.connect_timeout_s, cluster.max_message_mb and cluster.cookie_env may.
    #[arg(long = "allow-change", value_name = "KEY", requires = "resume")]
    pub allow_change: Vec<String>,
    /// Start over in a run folder that holds a finished run or checkpoints, replacing its
    /// outputs (final/, summary.json, logs, checkpoints). Without it such a folder is refused.
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,
    /// Serve the live dashboard on this address, e.g. 127.0.0.1:8265.
    #[arg(long, value_name = "ADDR")]
    pub dashboard: Option<SocketAddr>,
    /// Keep serving the dashboard after the run ends (its final state, charts and
    /// timeline) until Ctrl-C.
    #[arg(long = "dashboard-keep", requires = "dashboard")]
    pub dashboard_keep: bool,
    /// Bearer token required by the dashboard (mandatory for non-loopback addresses).
    #[arg(long)]
    pub token: Option<String>,
    /// No per-step table.
    #[arg(long)]
    pub quiet: bool,
}

/// Refuses a recipe whose `rl.max_new_tokens` leaves no room for a prompt in the policy's
/// context (`max_position_embeddings`). Longer prompts are refused by the run itself.
fn check_generation_fits(recipe: &Recipe, run_dir: &std::path::Path) -> anyhow::Result<()> {
    let pdir = controller::policy_dir(recipe, run_dir).map_err(classify)?;
    let config = pdir.join("config.json");
    let context = oxalign_models::ModelConfig::from_file(&config)
        .user_err(config.display())?
        .max_position_embeddings;
    if recipe.rl.max_new_tokens < context {
        return Ok(());
    }
    Err(UserError::new(format!(
        "rl.max_new_tokens = {} leaves no room for a prompt in the policy's context of {context} tokens (max_position_embeddings in {}); lower rl.max_new_tokens",
        recipe.rl.max_new_tokens,
        config.display()
    ))
    .into())
}

/// A run error as the CLI reports it: a [`UserError`] (exit code 2) when the user's input is
/// at fault, any other error (exit code 1) when the run failed.
fn classify(e: RunError) -> anyhow::Error {
    let message = e.to_string();
    classify_message(&e, message)
}

/// `message` about `e`, marked as the user's mistake when `e` is bad input.
fn classify_message(e: &RunError, message: String) -> anyhow::Error {
    if e.is_bad_input() {
        UserError::new(message).into()
    } else {
        anyhow::anyhow!(message)
    }
}

/// Prints the end of an `sft`, `rm` or `dpo` run: held-out numbers first → last, skipped rows,
/// and where the model is.
fn print_offline(summary: &controller::RunSummary) {
    let Some(o) = &summary.offline else { return };
    println!(
        "\nrun {} ({}) finished: {} steps in {:.1}s",
        summary.name, o.kind, o.steps, summary.wall_seconds
    );
    for (k, last) in &o.eval_last {
        let first = o
            .eval_first
            .get(k)
            .map_or("-".into(), |v| format!("{v:.4}"));
        println!("  held-out {k}: {first} -> {last:.4}");
    }
    println!(
        "  data: {} rows read, {} skipped",
        o.data.rows, o.data.skipped
    );
    println!(
        "  model: {}/ (HF folder with checksums.json)",
        o.model_dir.display()
    );
}

/// `--check` after the recipe passed: reads the first 1000 rows of each data file (schema
/// and reference answers, as the run would) and counts the rest, then says what the run
/// would do.
fn check_only(args: &Args, recipe: &Recipe) -> anyhow::Result<()> {
    // The first rows of every data file, in the run's schema, with its answer checks.
    let data = controller::check_data(recipe).map_err(classify)?;
    let checked = match data.rows {
        0 => String::new(),
        _ => format!(", {}", data.describe("data rows")),
    };
    if recipe.run.kind != oxalign_actors::recipe::RunKind::Rl {
        println!(
            "{}: ok ({:?} run on {} ({}), outputs in {})",
            args.recipe.display(),
            recipe.run.kind,
            recipe.data.path.as_deref().unwrap_or("-"),
            data.describe("rows"),
            recipe.run_dir().display()
        );
        return Ok(());
    }
    println!(
        "{}: ok ({:?}, {} RL steps of {} prompts × {} samples{checked}, policy on {}, outputs in {})",
        args.recipe.display(),
        recipe.rl.algorithm,
        recipe.run.steps,
        recipe.rl.prompts_per_step,
        recipe.rl.samples_per_prompt,
        recipe.placement.policy,
        recipe.run_dir().display()
    );
    Ok(())
}

/// Runs `oxalign train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut recipe = Recipe::load(&args.recipe, &args.overrides).user_err("")?;
    if let Some(dir) = &args.resume {
        // The run continues where it is, whatever out_dir/name the recipe says.
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        recipe.run.name = name;
        recipe.run.out_dir = dir
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| ".".into());
    }
    validate(&recipe, &args.recipe).user_err("")?;
    for w in warnings(&recipe) {
        eprintln!("warning: {}: {w}", args.recipe.display());
    }
    // A model folder's context is known now: refuse before --check returns and before the
    // run folder exists. A fresh model's config is written into the run folder, checked below.
    if recipe.model.path.is_some() {
        check_generation_fits(&recipe, &recipe.run_dir())?;
    }
    if let Some(addr) = args.dashboard {
        // Before the run folder exists: a refused dashboard leaves nothing behind.
        oxalign::dashboard::check_access(addr, args.token.as_deref()).user_err("--dashboard")?;
    }
    if args.check {
        return check_only(&args, &recipe);
    }
    let run_dir = recipe.run_dir();
    // Held until the run ends: a second `train` of this folder is refused, never mixed in.
    let _lock = train_resume::lock(&run_dir)?;
    let resume_from = match &args.resume {
        Some(dir) => Some(claim_resume(dir, &recipe, &args.allow_change, args.quiet)?),
        None => {
            claim_fresh(&run_dir, args.overwrite)?;
            None
        }
    };
    if recipe.model.path.is_none() {
        check_generation_fits(&recipe, &run_dir)?;
    }
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(train_live(&args, &recipe, &run_dir, resume_from))
}

/// Trains with the monitor (and the dashboard, when asked) running, then reports.
async fn train_live(
    args: &Args,
    recipe: &Recipe,
    run_dir: &Path,
    resume_from: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut cfg = MonitorConfig::with_run_dir(run_dir);
    cfg.resume = args.resume.is_some();
    cfg.tensorboard = recipe.log.tensorboard;
    let (monitor, _join) = Monitor::spawn(cfg).await.context("starting the monitor")?;
    let server = match args.dashboard {
        Some(addr) => {
            let s = oxalign::dashboard::serve_live(addr, args.token.clone(), monitor.clone())
                .await
                .user_err("--dashboard")?;
            eprintln!("dashboard: {}", s.url());
            Some(s)
        }
        None => None,
    };
    let opts = TrainOptions {
        resume_from,
        quiet: args.quiet,
    };
    let result = controller::train(recipe, &monitor, &opts).await;
    let _ = monitor.shutdown().await;
    let outcome = report(result, args, run_dir);
    if let Some(s) = server {
        if args.dashboard_keep {
            let ended = if outcome.is_ok() {
                "ended"
            } else {
                "failed (the error follows when the dashboard stops)"
            };
            eprintln!(
                "the run {ended}; the dashboard stays up at {} until Ctrl-C",
                s.url()
            );
            s.run_until_ctrl_c().await.context("the dashboard")?;
        } else {
            let _ = s.shutdown().await;
        }
    }
    outcome
}

/// Prints what a finished run reports (an RL run's picture and summary, an offline run's
/// lines), or turns its failure into the error `oxalign train` exits with.
fn report(
    result: Result<controller::RunSummary, RunError>,
    args: &Args,
    run_dir: &Path,
) -> anyhow::Result<()> {
    match result {
        Ok(summary) if summary.offline.is_some() => {
            print_offline(&summary);
            Ok(())
        }
        Ok(summary) => {
            if !args.quiet {
                if let Some(picture) = super::curves::picture(&summary) {
                    println!("\n{picture}");
                }
            }
            print_rl_summary(&summary);
            print_traffic();
            Ok(())
        }
        Err(e) => Err(failure(&e, &args.recipe, run_dir)),
    }
}

/// The end-of-run lines of an RL run: steps, wall time, held-out accuracy, outputs.
fn print_rl_summary(summary: &controller::RunSummary) {
    let pct = |x: Option<f64>| {
        x.map(|a| format!("{:.1}%", 100.0 * a))
            .unwrap_or_else(|| "-".into())
    };
    let measured = [
        summary.accuracy_init,
        summary.accuracy_sft,
        summary.accuracy_final,
    ]
    .iter()
    .any(Option::is_some);
    let accuracy = if measured {
        format!(
            "  held-out accuracy (greedy): init {}, after SFT {}, after RL {}\n  held-out accuracy (8 samples per prompt): after SFT {}, after RL {}",
            pct(summary.accuracy_init),
            pct(summary.accuracy_sft),
            pct(summary.accuracy_final),
            pct(summary.sampled_accuracy_sft),
            pct(summary.sampled_accuracy_final),
        )
    } else {
        "  held-out accuracy: not measured (no held-out prompts, or the reward has no exact-match check)"
            .to_string()
    };
    println!(
        "\nrun {} finished: {} RL steps in {:.1}s\n{accuracy}\n  outputs: {}/ (final/: the trained policy as an HF folder; metrics.jsonl, summary.json, checkpoints/)",
        summary.name,
        summary.steps,
        summary.wall_seconds,
        summary.run_dir.display()
    );
}

/// The cluster's traffic of this run, when roles ran on other processes.
fn print_traffic() {
    let t = oxalign_actors::cluster::traffic();
    if t.sent + t.received + t.refit_bytes == 0 {
        return;
    }
    let refit = match t.refits {
        0 => String::new(),
        n => format!(
            "; refit to the engine role: {} bytes in {n} refits ({} bytes each)",
            t.refit_bytes,
            t.refit_bytes / n
        ),
    };
    println!(
        "  cluster traffic: {} bytes sent, {} bytes received{refit}",
        t.sent, t.received
    );
}

/// The error a failed run exits with: what failed, where the logs are, and how to resume
/// from the newest checkpoint when resuming can help.
fn failure(e: &RunError, recipe_path: &Path, run_dir: &Path) -> anyhow::Error {
    let hint = match latest_checkpoint(run_dir) {
        Some(c) if !e.is_divergence() && !e.is_bad_input() => format!(
            "\nthe newest checkpoint is {}; continue with: oxalign train {} --resume {}",
            c.display(),
            recipe_path.display(),
            run_dir.display()
        ),
        _ => String::new(),
    };
    let message = format!(
        "training failed: {e}\nlogs: {}/metrics.jsonl{hint}",
        run_dir.display()
    );
    classify_message(e, message)
}

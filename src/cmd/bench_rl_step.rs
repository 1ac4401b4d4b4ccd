//! `oxalign bench rl-step`: wall time of full RL steps (GRPO by default) on a given model
//! folder and prompt file, through the real controller and actors — generation on the
//! engine, scoring (reference and trainer log-probs, rewards), experience, the policy
//! update and the verified refit — with the time of each phase and the completion tokens,
//! as one JSON line. It writes its run folder under the system temp dir and removes it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use oxalign_actors::controller::{self, TrainOptions};
use oxalign_actors::monitor::{Monitor, MonitorConfig};
use oxalign_actors::recipe::{validate, Recipe};
use serde::Serialize;

use super::spread::Spread;
use crate::user_error::{user_error, IntoUserError};

/// Arguments of `oxalign bench rl-step`.
#[derive(Debug, Parser)]
#[command(
    about = "Measure full RL steps (generate, score, experience, update, refit) on a model and prompts",
    long_about = "Measure full RL steps through the real controller: --warmup untimed steps, then \
--steps timed ones, each of --prompts-per-step prompts from --prompts (JSONL {\"prompt\", \
\"answer\"}) × --samples completions of up to --max-new-tokens tokens, an exact-match reward, \
a frozen reference and one policy update per step (GRPO by default, KL as a k3 loss term with \
coefficient --beta, as TRL's GRPOTrainer does). No SFT, no critic. Prints one JSON line: \
step_seconds and each phase (generate, score, experience, train, refit; median/min/max over \
the timed steps), completion tokens per step and generation tokens/s. \
tools/bench_trl_grpo.py runs the same step in TRL for comparison."
)]
pub struct Args {
    /// Policy model folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt file: JSONL lines `{"prompt": "...", "answer": "..."}`.
    #[arg(long)]
    pub prompts: PathBuf,
    /// Prompts per step.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub prompts_per_step: u64,
    /// Completions per prompt (the GRPO group).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(2..))]
    pub samples: u64,
    /// Completion length limit.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_new_tokens: u64,
    /// Algorithm: grpo, dr_grpo, rloo, reinforce_pp.
    #[arg(long, default_value = "grpo")]
    pub algorithm: String,
    /// KL coefficient (k3 estimator, loss term).
    #[arg(long, default_value_t = 0.04)]
    pub beta: f64,
    /// Rollout weight precision: none, bf16, int8, q4.
    #[arg(long, default_value = "none")]
    pub quant: String,
    /// The trainers' precision (`model.precision`): f32 or bf16-mixed (bf16 matmuls over f32
    /// master weights and f32 AdamW moments).
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// Timed steps.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// Untimed steps before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// Run seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// `rl.max_staleness`: with k ≥ 1 the engine generates the next step's batch while this
    /// one trains (the first step still generates its own; keep --warmup ≥ 1).
    #[arg(long, default_value_t = 0)]
    pub max_staleness: u64,
}

/// The JSON line.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    algorithm: String,
    quant: String,
    precision: String,
    prompts_per_step: u64,
    samples: u64,
    max_new_tokens: u64,
    max_staleness: u64,
    steps: usize,
    threads: usize,
    step_seconds: Spread,
    /// Generating the step's batch (during the previous step when it was generated ahead).
    generate_seconds: Spread,
    /// The part of generation the step waited for.
    generate_exposed_seconds: Spread,
    score_seconds: Spread,
    experience_seconds: Spread,
    train_seconds: Spread,
    refit_seconds: Spread,
    completion_tokens: Spread,
    gen_tokens_per_sec: Spread,
}

/// The recipe of the benchmark run.
fn recipe_text(a: &Args, out_dir: &Path) -> String {
    let steps = a.warmup + a.steps;
    format!(
        r#"[run]
name = "bench-rl-step"
out_dir = {out:?}
seed = {seed}
steps = {steps}
checkpoint_every = 0

[model]
path = {model:?}
precision = {precision:?}

[data]
task = "jsonl"
path = {prompts:?}
eval_size = 0

[sft]
steps = 0

[rl]
algorithm = {alg:?}
prompts_per_step = {pps}
samples_per_prompt = {samples}
ppo_epochs = 1
minibatch_size = {batch}
kl_coef = {beta}
kl_mode = "loss"
kl_estimator = "k3"
max_new_tokens = {mnt}
temperature = 1.0
max_staleness = {stale}

[reward]
kind = "exact_match"

[engine]
quant = {quant:?}
refit_tolerance = {tol}
"#,
        out = out_dir.display().to_string(),
        seed = a.seed,
        model = a.model.display().to_string(),
        prompts = a.prompts.display().to_string(),
        alg = a.algorithm,
        pps = a.prompts_per_step,
        samples = a.samples,
        batch = a.prompts_per_step * a.samples,
        beta = a.beta,
        mnt = a.max_new_tokens,
        stale = a.max_staleness,
        quant = a.quant,
        precision = a.precision,
        tol = refit_tolerance(&a.quant),
    )
}

/// The refit probe's tolerance for an engine of weight precision `quant`: the f32 default, or
/// one a rounded engine's log-probs meet (a quantized engine serves weights a little off the
/// trainer's, so the strict f32 check would reject every refit).
fn refit_tolerance(quant: &str) -> f64 {
    match quant {
        "none" => 1e-4,
        "bf16" => 0.05,
        _ => 1.0,
    }
}

/// Runs `oxalign bench rl-step`.
pub fn run(a: Args) -> anyhow::Result<()> {
    for (what, p) in [("--model", &a.model), ("--prompts", &a.prompts)] {
        if !p.exists() {
            return user_error(format!("{what} {}: no such file or folder", p.display()));
        }
    }
    let out_dir = std::env::temp_dir().join(format!("oxalign-bench-rl-{}", std::process::id()));
    let text = recipe_text(&a, &out_dir);
    let label = Path::new("<bench rl-step recipe>");
    let recipe = Recipe::parse(&text, label, &[]).user_err("")?;
    validate(&recipe, label).user_err("")?;
    let run_dir = recipe.run_dir();
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let result = rt.block_on(async {
        let (monitor, _join) = Monitor::spawn(MonitorConfig::with_run_dir(&run_dir))
            .await
            .context("starting the monitor")?;
        let opts = TrainOptions {
            quiet: true,
            ..TrainOptions::default()
        };
        let r = controller::train(&recipe, &monitor, &opts).await;
        let _ = monitor.shutdown().await;
        r.map_err(|e| anyhow::anyhow!("benchmark run failed: {e}"))
    });
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl"));
    let _ = std::fs::remove_dir_all(&out_dir);
    result?;
    let metrics = metrics.context("reading the benchmark run's metrics.jsonl")?;
    let report = report(&a, &metrics)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Phase spreads over the timed steps of `metrics` (one JSON object per line).
fn report(a: &Args, metrics: &str) -> anyhow::Result<Report> {
    let rows: Vec<serde_json::Value> = metrics
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("parsing metrics.jsonl")?;
    let timed: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| {
            r.get("step")
                .and_then(|s| s.as_u64())
                .is_some_and(|s| s > a.warmup)
        })
        .filter(|r| r.get("time_generate").is_some())
        .collect();
    if timed.is_empty() {
        anyhow::bail!("the benchmark run recorded no timed RL step");
    }
    let col = |k: &str| -> Vec<f64> {
        timed
            .iter()
            .map(|r| r.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN))
            .collect()
    };
    let (step, gen, exposed, score, train, refit) = (
        col("step_seconds"),
        col("time_generate"),
        col("time_generate_exposed"),
        col("time_score"),
        col("time_train"),
        col("refit_seconds"),
    );
    let experience: Vec<f64> = (0..step.len())
        .map(|i| (step[i] - exposed[i] - score[i] - train[i] - refit[i]).max(0.0))
        .collect();
    let n = (a.prompts_per_step * a.samples) as f64;
    let tokens: Vec<f64> = col("response_len").iter().map(|l| l * n).collect();
    let tps: Vec<f64> = col("gen_tokens_per_sec");
    Ok(Report {
        bench: "rl-step",
        algorithm: a.algorithm.clone(),
        quant: a.quant.clone(),
        precision: a.precision.clone(),
        prompts_per_step: a.prompts_per_step,
        samples: a.samples,
        max_new_tokens: a.max_new_tokens,
        max_staleness: a.max_staleness,
        steps: timed.len(),
        threads: rayon_threads(),
        step_seconds: Spread::of(&step),
        generate_seconds: Spread::of(&gen),
        generate_exposed_seconds: Spread::of(&exposed),
        score_seconds: Spread::of(&score),
        experience_seconds: Spread::of(&experience),
        train_seconds: Spread::of(&train),
        refit_seconds: Spread::of(&refit),
        completion_tokens: Spread::of(&tokens),
        gen_tokens_per_sec: Spread::of(&tps),
    })
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

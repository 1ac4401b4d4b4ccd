//! The report stage of an RL step: its metrics to the monitor (and so to `metrics.jsonl`,
//! the dashboard and Prometheus) and its row of the live table. It computes nothing that
//! feeds back into training.

use super::episodes::EpisodeStats;
use super::experience::Experience;
use super::refit::Moved;
use super::rollout::DynamicReport;
use super::zero_variance::GroupSpread;
use crate::monitor::{metric, StepMetrics, StepSamples};
use crate::roles::PolicyTrainSummary;
use oxalign_models::engine::RefitReport;

/// What one step reports: its metrics and the numbers shown in the table.
pub(crate) struct StepRow {
    /// Every key of the step's `metrics.jsonl` line (the loop adds `restarts`).
    pub metrics: StepMetrics,
    pub reward_mean: f64,
    /// The groups whose rewards were all equal (group-relative advantages only).
    pub spread: Option<GroupSpread>,
    /// The step's line of the live table.
    pub line: String,
    /// Key metrics for the progress bar.
    pub brief: String,
    /// The samples the step logs (`rl.log_samples`); set by the step, not by [`row`].
    pub samples: Option<StepSamples>,
}

impl StepRow {
    /// The row with the samples the step logs.
    pub(crate) fn with_samples(self, samples: Option<StepSamples>) -> Self {
        StepRow { samples, ..self }
    }
}

/// The header of the live table.
pub(crate) fn header() -> String {
    format!(
        "{:>5} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7}",
        "step", "reward", "acc", "kl", "pg_loss", "v_loss", "tok/s", "sec"
    )
}

/// What one step measured, gathered for the report.
pub(crate) struct StepOutcome<'a> {
    pub step: u64,
    /// Samples trained on.
    pub samples: usize,
    /// Samples generated (more than `samples` when dynamic sampling dropped groups).
    pub generated: usize,
    /// Dynamic sampling's rounds and group counts, when it is on.
    pub dynamic: Option<DynamicReport>,
    /// What the multi-turn episodes did (`[env]`).
    pub episodes: Option<EpisodeStats>,
    /// Generated completions that match their reference answer, when the reward defines
    /// accuracy.
    pub correct: Option<usize>,
    /// Generated tokens, and prompt plus generated tokens (all samples generated).
    pub gen_tokens: usize,
    pub all_tokens: usize,
    pub beta: f64,
    /// The policy's learning rate this step (`rl.lr_schedule`).
    pub lr: f64,
    pub exp: &'a Experience,
    pub policy: &'a PolicyTrainSummary,
    pub value_loss: Option<f64>,
    pub refit: &'a RefitReport,
    /// What a refit sent to an engine role (`placement.engine`); `None` otherwise.
    pub refit_moved: Option<Moved>,
    pub policy_version: u64,
    pub data_position: u64,
    /// Versions the batch lagged the trainer (0 on-policy; ≤ `rl.max_staleness`).
    pub staleness: u64,
    /// Seconds: the whole step, the batch's generation (during an earlier step when it was
    /// generated ahead), the part of generation the step waited for (not hidden behind its
    /// scoring and training), scoring, training.
    pub step_secs: f64,
    pub gen_secs: f64,
    pub gen_wait_secs: f64,
    pub score_secs: f64,
    pub train_secs: f64,
}

/// The step's metrics (every key of `metrics.jsonl` but `restarts`).
fn metrics(o: &StepOutcome<'_>) -> StepMetrics {
    let mut m = StepMetrics::new(o.step);
    let always = [learning(o), timing(o)].concat();
    let episodes = o.episodes.map(|e| e.metrics()).unwrap_or_default();
    let optional = [
        refit_transfer(o),
        dynamic_sampling(o),
        correction(o),
        episodes,
    ]
    .concat();
    for (k, v) in always.into_iter().chain(optional) {
        m.values.insert(k.to_string(), v);
    }
    let extra = [
        ("routing_overridden", o.policy.routing_overridden),
        ("router_aux_loss", o.policy.stats.router_aux_loss),
        (metric::VALUE_LOSS, o.value_loss),
        // Group-relative advantages only: the groups that taught nothing.
        (
            "zero_variance_groups",
            o.exp.spread.map(|s| s.zero_variance),
        ),
        // Only a reward with an exact-match check defines accuracy; otherwise there is
        // none (not a 0).
        (
            metric::ACCURACY,
            o.correct.map(|c| c as f64 / o.generated as f64),
        ),
    ];
    for (k, v) in extra {
        if let Some(v) = v {
            m.values.insert(k.to_string(), v);
        }
    }
    m
}

/// Rewards, KL, the policy update's statistics and the rollout's shape.
fn learning(o: &StepOutcome<'_>) -> Vec<(&'static str, f64)> {
    let (s, ps, n) = (&o.exp.stats, &o.policy.stats, o.generated as f64);
    // The whole batch when the trainer scored it, else the update's first minibatch.
    let mismatch = o.exp.mismatch.unwrap_or(o.policy.rollout_mismatch);
    vec![
        (metric::REWARD_MEAN, s.score_mean),
        (metric::REWARD_STD, s.score_std),
        (metric::KL, s.kl),
        ("kl_seq", s.kl_seq),
        ("kl_coef", o.beta),
        ("lr", o.lr),
        (metric::POLICY_LOSS, ps.policy_loss),
        (metric::ENTROPY, ps.entropy),
        (metric::CLIP_FRAC, ps.clip_frac),
        ("approx_kl", ps.approx_kl),
        ("grad_norm", ps.step.grad_norm),
        (metric::ADV_MEAN, s.adv_mean),
        (metric::ADV_STD, s.adv_std),
        (metric::RESPONSE_LEN, o.gen_tokens as f64 / n),
        ("logprob_mismatch_mean", mismatch.0),
        ("logprob_mismatch_max", mismatch.1),
        ("policy_version", o.policy_version as f64),
        ("data_position", o.data_position as f64),
        ("staleness", o.staleness as f64),
    ]
}

/// Throughput, the stages' seconds and the refit's verification.
fn timing(o: &StepOutcome<'_>) -> Vec<(&'static str, f64)> {
    vec![
        (metric::TOKENS_PER_SEC, o.all_tokens as f64 / o.step_secs),
        (
            "gen_tokens_per_sec",
            o.gen_tokens as f64 / o.gen_secs.max(1e-9),
        ),
        (metric::STEP_SECONDS, o.step_secs),
        ("time_generate", o.gen_secs),
        ("time_generate_exposed", o.gen_wait_secs),
        ("time_score", o.score_secs),
        ("time_train", o.train_secs),
        ("refit_seconds", o.refit.seconds),
        ("refit_verify_seconds", o.refit.verify_seconds),
        ("refit_tensors_verified", o.refit.checksums_ok as f64),
        (
            "refit_probe_max_abs_diff",
            o.refit.probe_max_abs_diff.unwrap_or(f32::NAN) as f64,
        ),
    ]
}

/// What the refit moved to an engine role (none when the engine is inside the policy).
fn refit_transfer(o: &StepOutcome<'_>) -> Vec<(&'static str, f64)> {
    o.refit_moved.as_ref().map_or_else(Vec::new, |moved| {
        vec![
            ("refit_bytes", moved.bytes as f64),
            ("refit_buckets", moved.buckets as f64),
            ("refit_transfer_seconds", moved.seconds),
        ]
    })
}

/// DAPO's dynamic sampling rounds, when on.
fn dynamic_sampling(o: &StepOutcome<'_>) -> Vec<(&'static str, f64)> {
    o.dynamic.as_ref().map_or_else(Vec::new, |d| {
        vec![
            ("dynamic_rounds", d.rounds as f64),
            ("dynamic_groups_dropped", d.dropped as f64),
            ("dynamic_groups_filled", d.filled as f64),
            ("samples_trained", o.samples as f64),
        ]
    })
}

/// What the rollout correction did, when one is on.
fn correction(o: &StepOutcome<'_>) -> Vec<(&'static str, f64)> {
    o.exp.correction.as_ref().map_or_else(Vec::new, |c| {
        vec![
            ("rollout_is_weight_mean", c.weight_mean),
            ("rollout_masked_frac", c.masked_frac),
            ("rollout_masked_seq_frac", c.masked_seq_frac),
            ("rollout_truncated_frac", c.truncated_frac),
        ]
    })
}

/// The step's metrics, table row and progress-bar text.
pub(crate) fn row(o: &StepOutcome<'_>) -> StepRow {
    let s = &o.exp.stats;
    let tok_s = o.all_tokens as f64 / o.step_secs;
    let acc = o.correct.map_or_else(
        || "-".to_string(),
        |c| format!("{:.1}%", 100.0 * c as f64 / o.generated as f64),
    );
    let line = format!(
        "{:>5} {:>8.3} {:>8} {:>8.4} {:>9.4} {:>9} {:>8.0} {:>7.2}",
        o.step,
        s.score_mean,
        acc,
        s.kl,
        o.policy.stats.policy_loss,
        o.value_loss
            .map(|v| format!("{v:.4}"))
            .unwrap_or_else(|| "-".into()),
        tok_s,
        o.step_secs
    );
    let brief = format!(
        "reward {:.3}  kl {:.3}  {:.0} tok/s",
        s.score_mean, s.kl, tok_s
    );
    StepRow {
        metrics: metrics(o),
        reward_mean: s.score_mean,
        spread: o.exp.spread,
        line,
        brief,
        samples: None,
    }
}

//! Scalar metrics of one training step, as an open name -> value map so a new metric needs
//! no schema change. It computes nothing: the controller and trainers fill it in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Standard metric names. Any other name is allowed; these are the ones the dashboard
/// charts and `/metrics` exports by name.
pub mod metric {
    /// Mean sequence reward of the step's rollouts (after any reward shaping the recipe
    /// reports; units of the reward model).
    pub const REWARD_MEAN: &str = "reward_mean";
    /// Standard deviation of the sequence rewards.
    pub const REWARD_STD: &str = "reward_std";
    /// Fraction of the step's responses the reward's exact-match check judges correct;
    /// absent when the reward has no such check (a model, a service, verifiers without
    /// `exact_match`).
    pub const ACCURACY: &str = "accuracy";
    /// Mean per-token KL(policy || reference) over response tokens, in nats (the recipe's estimator).
    pub const KL: &str = "kl";
    /// Policy (actor) loss.
    pub const POLICY_LOSS: &str = "policy_loss";
    /// Critic value loss.
    pub const VALUE_LOSS: &str = "value_loss";
    /// Mean per-token entropy of the policy, in nats.
    pub const ENTROPY: &str = "entropy";
    /// Fraction of tokens whose ratio was clipped.
    pub const CLIP_FRAC: &str = "clip_frac";
    /// Mean advantage.
    pub const ADV_MEAN: &str = "adv_mean";
    /// Standard deviation of the advantages.
    pub const ADV_STD: &str = "adv_std";
    /// Mean response length, in tokens.
    pub const RESPONSE_LEN: &str = "response_len";
    /// Generated tokens per second during the step.
    pub const TOKENS_PER_SEC: &str = "tokens_per_sec";
    /// Wall-clock duration of the whole step, in seconds.
    pub const STEP_SECONDS: &str = "step_seconds";
    /// Prefix of per-phase durations in seconds: `time_generate`, `time_policy_train`, ...
    pub const TIME_PREFIX: &str = "time_";
}

/// The metrics of one step. Serialised flat, one JSON object per step:
/// `{"step":3,"unix_ms":1700000000000,"kl":0.01,"reward_mean":0.5}`.
/// Non-finite values (NaN, ±inf) are written as `null` and read back as NaN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "RawStepMetrics", into = "RawStepMetrics")]
pub struct StepMetrics {
    /// Training step.
    pub step: u64,
    /// When the step's metrics were reported, ms since the Unix epoch (0 if unknown).
    pub unix_ms: u64,
    /// Metric name -> value, ordered by name. Names must not be `step` or `unix_ms`.
    pub values: BTreeMap<String, f64>,
}

impl StepMetrics {
    /// Empty metrics for `step`, stamped now.
    pub fn new(step: u64) -> Self {
        StepMetrics {
            step,
            unix_ms: super::clock::unix_ms_now(),
            values: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) one metric; builder style.
    pub fn with(mut self, name: impl Into<String>, value: f64) -> Self {
        self.insert(name, value);
        self
    }

    /// Adds (or replaces) one metric. The reserved names `step` and `unix_ms` are stored
    /// as `metric_step` / `metric_unix_ms` so they cannot clash with the step fields.
    pub fn insert(&mut self, name: impl Into<String>, value: f64) {
        let name = name.into();
        let name = match name.as_str() {
            "step" | "unix_ms" => format!("metric_{name}"),
            _ => name,
        };
        self.values.insert(name, value);
    }

    /// The value of `name`, if reported.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }

    /// Merges a later report for the same step: its values win, the newer stamp is kept.
    pub fn merge(&mut self, other: &StepMetrics) {
        self.unix_ms = self.unix_ms.max(other.unix_ms);
        for (k, v) in &other.values {
            self.values.insert(k.clone(), *v);
        }
    }
}

/// Wire form of [`StepMetrics`]: the step fields plus the flattened map, with `null`
/// standing for non-finite values (JSON has no NaN).
#[derive(Serialize, Deserialize)]
struct RawStepMetrics {
    step: u64,
    #[serde(default)]
    unix_ms: u64,
    #[serde(flatten)]
    values: BTreeMap<String, Option<f64>>,
}

impl From<RawStepMetrics> for StepMetrics {
    fn from(raw: RawStepMetrics) -> Self {
        StepMetrics {
            step: raw.step,
            unix_ms: raw.unix_ms,
            values: raw
                .values
                .into_iter()
                .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
                .collect(),
        }
    }
}

impl From<StepMetrics> for RawStepMetrics {
    fn from(m: StepMetrics) -> Self {
        RawStepMetrics {
            step: m.step,
            unix_ms: m.unix_ms,
            values: m
                .values
                .into_iter()
                .map(|(k, v)| (k, v.is_finite().then_some(v)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_flat_and_round_trips_non_finite_values() {
        let m = StepMetrics {
            step: 7,
            unix_ms: 42,
            values: BTreeMap::new(),
        }
        .with(metric::REWARD_MEAN, 0.25)
        .with(metric::KL, f64::NAN);
        let line = serde_json::to_string(&m).unwrap();
        assert_eq!(
            line,
            r#"{"step":7,"unix_ms":42,"kl":null,"reward_mean":0.25}"#
        );
        let back: StepMetrics = serde_json::from_str(&line).unwrap();
        assert_eq!(back.step, 7);
        assert_eq!(back.get(metric::REWARD_MEAN), Some(0.25));
        assert!(back.get(metric::KL).unwrap().is_nan());
    }

    #[test]
    fn reserved_names_do_not_clash_with_step_fields() {
        let m = StepMetrics::new(1).with("step", 5.0);
        assert_eq!(m.get("metric_step"), Some(5.0));
        let back: StepMetrics = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back.step, 1);
        assert_eq!(back.get("metric_step"), Some(5.0));
    }

    #[test]
    fn merge_keeps_both_reports() {
        let mut a = StepMetrics::new(3).with(metric::KL, 0.1);
        let b = StepMetrics::new(3)
            .with(metric::POLICY_LOSS, -0.2)
            .with(metric::KL, 0.2);
        a.merge(&b);
        assert_eq!(a.get(metric::KL), Some(0.2));
        assert_eq!(a.get(metric::POLICY_LOSS), Some(-0.2));
    }
}

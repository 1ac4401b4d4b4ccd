//! [`StepSamples`]: a few of one RL step's rollout samples as text (prompt, completion,
//! reward, reference answer, why generation ended), for `samples.jsonl` and the dashboard's
//! "Samples" table. Plain serde data; which samples are chosen is the controller's business.

use serde::{Deserialize, Serialize};

/// One rollout sample as text: one line of `samples.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// The RL step (1-based) whose batch held the sample.
    pub step: u64,
    /// The prompt as the data file gave it.
    pub prompt: String,
    /// The decoded completion (special tokens skipped).
    pub completion: String,
    /// The reward the reward role gave it (before any shaping).
    pub reward: f64,
    /// The reference answer, when the data row has one.
    pub answer: Option<String>,
    /// Why generation ended: `stop` (a stop token) or `length` (`max_new_tokens`).
    pub finish_reason: String,
    /// A multi-turn episode (`[env]`): its turns, tool calls, end and whole transcript;
    /// `completion` is then its last turn (what the reward read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode: Option<EpisodeLog>,
}

/// What a logged multi-turn episode did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeLog {
    /// Model turns.
    pub turns: usize,
    /// Tool calls, and how many of them failed.
    pub tool_calls: usize,
    pub tool_errors: usize,
    /// Why it ended (`done`, `turn limit`, `timed out: …`, …).
    pub end: String,
    /// Every turn and reply after the prompt, special tokens kept.
    pub transcript: String,
}

/// The samples one RL step logged, in batch order.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StepSamples {
    /// The RL step.
    pub step: u64,
    /// Its first `rl.log_samples` samples.
    pub samples: Vec<SampleRecord>,
}

impl StepSamples {
    /// Groups `records` (as read back from `samples.jsonl`) into the last step's samples;
    /// `None` without records.
    pub fn latest_of(records: Vec<SampleRecord>) -> Option<StepSamples> {
        let step = records.iter().map(|r| r.step).max()?;
        let samples = records.into_iter().filter(|r| r.step == step).collect();
        Some(StepSamples { step, samples })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(step: u64, completion: &str) -> SampleRecord {
        SampleRecord {
            step,
            prompt: "1+1=".into(),
            completion: completion.into(),
            reward: 1.0,
            answer: None,
            finish_reason: "stop".into(),
            episode: None,
        }
    }

    #[test]
    fn latest_keeps_only_the_highest_step() {
        let got = StepSamples::latest_of(vec![rec(1, "a"), rec(2, "b"), rec(2, "c")]).unwrap();
        assert_eq!(got.step, 2);
        assert_eq!(got.samples.len(), 2);
        assert!(StepSamples::latest_of(Vec::new()).is_none());
    }

    #[test]
    fn record_has_the_documented_keys() {
        let v = serde_json::to_value(rec(3, "2")).unwrap();
        for key in [
            "step",
            "prompt",
            "completion",
            "reward",
            "answer",
            "finish_reason",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert!(v["answer"].is_null());
    }
}

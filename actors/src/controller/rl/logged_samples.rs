//! The samples an RL step logs (`rl.log_samples`): the first `k` of its batch as text —
//! prompt, decoded completion, reference answer, finish reason — picked from the rollout
//! before scoring consumes it, then given their rewards once scored. The monitor writes them
//! to `samples.jsonl` and shows them on the dashboard. Nothing here feeds back into training.

use super::rollout::Rollout;
use crate::batch::Finish;
use crate::monitor::{EpisodeLog, SampleRecord, StepSamples};
use oxalign_models::text::tokenizer::Tokenizer;

/// The first `k` samples of `ro` as records still without their reward (an episode's
/// transcript decoded by `tok`); `None` when `k` is 0 (logging off).
pub(crate) fn pick(ro: &Rollout, k: usize, tok: &Tokenizer) -> Option<Vec<SampleRecord>> {
    if k == 0 {
        return None;
    }
    let records = ro
        .batch
        .samples
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, s)| SampleRecord {
            step: ro.step,
            prompt: ro.rows.prompts.get(i).cloned().unwrap_or_default(),
            completion: ro.texts.get(i).cloned().unwrap_or_default(),
            reward: 0.0,
            answer: ro.rows.answers.get(i).cloned().flatten(),
            finish_reason: finish_reason(s.finish).to_string(),
            episode: ro.episode_records.get(i).map(|r| EpisodeLog {
                turns: r.turns,
                tool_calls: r.tool_calls,
                tool_errors: r.tool_errors,
                end: r.end.to_string(),
                transcript: tok.decode(&s.response, false).unwrap_or_default(),
            }),
        })
        .collect();
    Some(records)
}

/// `samples` with their rewards (`rewards` in batch order, as scored) as the step's log.
pub(crate) fn with_rewards(
    step: u64,
    samples: Option<Vec<SampleRecord>>,
    rewards: &[f32],
) -> Option<StepSamples> {
    let mut samples = samples?;
    for (record, r) in samples.iter_mut().zip(rewards) {
        record.reward = f64::from(*r);
    }
    Some(StepSamples { step, samples })
}

/// The terminal lines of a step's logged samples: prompt, completion (newlines shown as
/// `\n`, each cut to 60 characters), reward, answer and finish.
pub(crate) fn terminal_lines(s: &StepSamples) -> Vec<String> {
    fn cut(text: &str) -> String {
        let flat = text.replace('\n', "\\n");
        match flat.char_indices().nth(60) {
            Some((i, _)) => format!("{}…", &flat[..i]),
            None => flat,
        }
    }
    s.samples
        .iter()
        .map(|r| {
            let answer = r
                .answer
                .as_deref()
                .map(|a| format!(", answer {:?}", cut(a)));
            format!(
                "    sample: {:?} → {:?}  reward {:.3}{} ({})",
                cut(&r.prompt),
                cut(&r.completion),
                r.reward,
                answer.unwrap_or_default(),
                r.finish_reason
            )
        })
        .collect()
}

/// The name `samples.jsonl` gives a finish: `stop` or `length` (as OpenAI and TRL do).
fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewards_are_matched_in_batch_order() {
        let rec = |c: &str| SampleRecord {
            step: 2,
            prompt: "p".into(),
            completion: c.into(),
            reward: 0.0,
            answer: Some("4".into()),
            finish_reason: "stop".into(),
            episode: None,
        };
        let got = with_rewards(2, Some(vec![rec("4"), rec("5")]), &[1.0, 0.0, 1.0]).unwrap();
        assert_eq!(got.step, 2);
        let rewards: Vec<f64> = got.samples.iter().map(|s| s.reward).collect();
        assert_eq!(rewards, vec![1.0, 0.0]);
        assert!(with_rewards(2, None, &[1.0]).is_none());
    }

    #[test]
    fn finish_reasons_use_the_usual_names() {
        assert_eq!(finish_reason(Finish::Stop), "stop");
        assert_eq!(finish_reason(Finish::Length), "length");
    }
}

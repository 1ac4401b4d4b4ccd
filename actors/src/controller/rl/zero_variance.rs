//! Steps that learn nothing. GRPO, Dr. GRPO, RLOO (and DAPO, GRPO with options) compare
//! each sample's score with the other samples of its prompt: a group whose scores are all
//! equal has advantage 0 for every token, and a step where every group is like that moves
//! the policy by nothing but the KL term. A reward that cannot tell the samples apart (no
//! reference answer read, a verifier that never matches) does this at every step, with a
//! reward column of 0.000 that looks like a slow start.
//!
//! [`GroupSpread`] measures it per step (`zero_variance_groups` in `metrics.jsonl`);
//! [`ZeroVarianceWatch`] turns [`STREAK`] such steps in a row into one warning line.

/// Steps in a row with every group at zero variance before the warning.
pub(crate) const STREAK: u32 = 5;

/// Scores closer than this count as equal (GRPO's own ε in its std normalisation).
const EQUAL: f32 = 1e-6;

/// The groups of one step whose scores are all equal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GroupSpread {
    /// Fraction of the step's groups whose scores are all equal (0 to 1).
    pub zero_variance: f64,
    /// The score every sample of the step had, when they all had the same one.
    pub all_equal: Option<f64>,
}

/// The spread of `scores` (the shaped scores advantages are built from, the `group_size`
/// samples of a prompt side by side); `None` without groups (`group_size` < 2 or no score).
pub(crate) fn group_spread(scores: &[f32], group_size: usize) -> Option<GroupSpread> {
    if group_size < 2 || scores.is_empty() {
        return None;
    }
    let flat = |s: &[f32]| {
        let (lo, hi) = s
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        hi - lo <= EQUAL
    };
    let groups = scores.chunks(group_size);
    let n = groups.len();
    let zero = groups.filter(|g| flat(g)).count();
    Some(GroupSpread {
        zero_variance: zero as f64 / n as f64,
        all_equal: flat(scores).then(|| f64::from(scores[0])),
    })
}

/// Counts the steps in a row whose groups all had zero variance.
#[derive(Debug, Default)]
pub(crate) struct ZeroVarianceWatch {
    /// Steps in the current run of such steps.
    streak: u32,
    /// Its first step.
    first: u64,
    /// The one score of all its steps' samples, while they all had the same.
    value: Option<f64>,
}

impl ZeroVarianceWatch {
    /// Takes step `step`'s spread; returns the warning when the step makes [`STREAK`] in a
    /// row (once per run of such steps).
    pub(crate) fn observe(
        &mut self,
        step: u64,
        spread: Option<GroupSpread>,
        group_size: usize,
    ) -> Option<String> {
        let Some(s) = spread.filter(|s| s.zero_variance >= 1.0) else {
            self.streak = 0;
            return None;
        };
        if self.streak == 0 {
            (self.first, self.value) = (step, s.all_equal);
        } else if self.value != s.all_equal {
            self.value = None;
        }
        self.streak += 1;
        (self.streak == STREAK).then(|| self.message(step, group_size))
    }

    fn message(&self, step: u64, group_size: usize) -> String {
        let why = match self.value {
            Some(v) => format!("all rewards equal to {v}"),
            None => "each group's rewards equal among themselves".to_string(),
        };
        format!(
            "steps {}-{step}: nothing is being learned: every group of rl.samples_per_prompt = \
             {group_size} samples had the same reward ({why}), so every group-relative advantage \
             is 0; check that the reward can tell the samples apart (the reference answer \
             column, data.answer_field; reward.kind; rl.max_new_tokens long enough for an \
             answer) or sample more diversely (rl.temperature)",
            self.first
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fraction_of_groups_with_equal_scores() {
        let s = group_spread(&[0.0, 0.0, 1.0, 0.0, 2.0, 2.0], 2).unwrap();
        assert!((s.zero_variance - 2.0 / 3.0).abs() < 1e-12, "{s:?}");
        assert_eq!(s.all_equal, None);
        let s = group_spread(&[0.0; 4], 2).unwrap();
        assert_eq!((s.zero_variance, s.all_equal), (1.0, Some(0.0)));
        assert_eq!(group_spread(&[1.0, 0.0], 1), None);
    }

    #[test]
    fn five_steps_in_a_row_at_zero_variance_warn_once() {
        let zero = group_spread(&[0.0; 4], 2);
        let mixed = group_spread(&[0.0, 1.0, 0.0, 0.0], 2);
        let mut w = ZeroVarianceWatch::default();
        // Four, then a step with signal: the count starts over.
        for step in 1..=4 {
            assert_eq!(w.observe(step, zero, 2), None);
        }
        assert_eq!(w.observe(5, mixed, 2), None);
        let warned: Vec<(u64, String)> = (6..=20)
            .filter_map(|step| w.observe(step, zero, 2).map(|m| (step, m)))
            .collect();
        assert_eq!(warned.len(), 1, "{warned:?}");
        let (step, m) = &warned[0];
        assert_eq!(*step, 10);
        assert!(m.starts_with("steps 6-10: nothing is being learned"), "{m}");
        assert!(m.contains("all rewards equal to 0"), "{m}");
        assert!(m.contains("rl.samples_per_prompt = 2"), "{m}");
        // Groups flat at different values: said so, without one value.
        let mut w = ZeroVarianceWatch::default();
        let flat_apart = group_spread(&[0.0, 0.0, 1.0, 1.0], 2);
        let m = (1..=5).filter_map(|s| w.observe(s, flat_apart, 2)).last();
        assert!(m.unwrap().contains("each group's rewards equal"));
    }
}

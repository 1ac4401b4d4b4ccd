//! Rule-based rewards composed as a weighted sum: `reward = Σ_i w_i · s_i(response)`, where
//! each verifier's score `s_i` is 0 or 1 (exact match, regex, JSON validity) or a
//! non-positive token count (length penalty). The first exact-match term also defines the
//! step's accuracy; a sum without one has no accuracy.

use super::{AnswerMatch, JsonValid, LengthPenalty, RegexMatch, VerifierError};

/// One scored row: the decoded response, its reference answer, its length.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    /// The decoded response text.
    pub response: &'a str,
    /// The reference answer, when the data has one.
    pub answer: Option<&'a str>,
    /// Response tokens (generated ids, EOS included).
    pub response_tokens: usize,
}

/// A verifier's kind, as a recipe names it (`[[reward.verifiers]] kind`); the
/// [`Verifier`] is built from it and the entry's other keys.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VerifierKind {
    /// 1 when the extracted answer equals the reference answer, else 0. The first one in
    /// the sum defines the step's accuracy.
    ExactMatch,
    /// 1 when `pattern` matches anywhere in the response, else 0.
    Regex,
    /// `-max(0, response tokens - target_tokens)`: the weight is the reward per token over.
    LengthPenalty,
    /// 1 when the whole response, trimmed, is valid JSON, else 0.
    JsonValid,
}

/// One rule-based verifier.
#[derive(Debug, Clone)]
pub enum Verifier {
    /// Exact match on an extracted answer (0 or 1).
    ExactMatch(AnswerMatch),
    /// A regex match (0 or 1).
    Regex(RegexMatch),
    /// Tokens over a target length, negated (≤ 0).
    LengthPenalty(LengthPenalty),
    /// JSON validity (0 or 1).
    JsonValid(JsonValid),
}

impl Verifier {
    /// The verifier's unweighted score of `s`.
    pub fn score(&self, s: &Sample<'_>) -> f64 {
        match self {
            Verifier::ExactMatch(v) => v.score(s.response, s.answer),
            Verifier::Regex(v) => v.score(s.response),
            Verifier::LengthPenalty(v) => v.score(s.response_tokens),
            Verifier::JsonValid(v) => v.score(s.response),
        }
    }
}

/// A weighted sum of verifiers.
#[derive(Debug, Clone)]
pub struct Verifiers {
    terms: Vec<(f64, Verifier)>,
}

impl Verifiers {
    /// The sum `Σ weight · verifier`. Needs at least one term, finite weights, and one weight
    /// that is not zero.
    pub fn new(terms: Vec<(f64, Verifier)>) -> Result<Self, VerifierError> {
        if let Some(i) = terms.iter().position(|(w, _)| !w.is_finite()) {
            return Err(VerifierError::Weight {
                index: i,
                message: format!("{}: expected a finite number", terms[i].0),
            });
        }
        if terms.iter().all(|(w, _)| *w == 0.0) {
            return Err(VerifierError::Empty);
        }
        Ok(Self { terms })
    }

    /// The reward of `s`.
    pub fn score(&self, s: &Sample<'_>) -> f64 {
        self.terms.iter().map(|(w, v)| w * v.score(s)).sum()
    }

    /// The exact-match verifier that defines accuracy: the first one in the sum.
    pub fn answer_check(&self) -> Option<&AnswerMatch> {
        self.terms.iter().find_map(|(_, v)| match v {
            Verifier::ExactMatch(m) => Some(m),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::Extract;

    fn sample<'a>(response: &'a str, answer: Option<&'a str>, tokens: usize) -> Sample<'a> {
        Sample {
            response,
            answer,
            response_tokens: tokens,
        }
    }

    #[test]
    fn weighted_sum_of_every_kind() {
        let v = Verifiers::new(vec![
            (
                1.0,
                Verifier::ExactMatch(AnswerMatch {
                    extract: Extract::Boxed,
                }),
            ),
            (0.5, Verifier::Regex(RegexMatch::new(r"\\boxed").unwrap())),
            (
                0.1,
                Verifier::LengthPenalty(LengthPenalty { target_tokens: 8 }),
            ),
            (0.25, Verifier::JsonValid(JsonValid)),
        ])
        .unwrap();
        // Correct, boxed, 3 tokens over, not JSON: 1 + 0.5 - 0.3.
        let s = sample(r"so \boxed{7}", Some("7"), 11);
        assert!((v.score(&s) - 1.2).abs() < 1e-12, "{}", v.score(&s));
        // Wrong answer, boxed, short.
        assert_eq!(v.score(&sample(r"\boxed{6}", Some("7"), 4)), 0.5);
        // JSON only.
        assert_eq!(v.score(&sample("[1]", Some("7"), 2)), 0.25);
        let check = v.answer_check().expect("an exact-match term");
        assert!(check.is_correct(r"\boxed{7}", Some("7")));
    }

    #[test]
    fn no_exact_match_no_accuracy_and_bad_weights_refused() {
        let v = Verifiers::new(vec![(1.0, Verifier::JsonValid(JsonValid))]).unwrap();
        assert!(v.answer_check().is_none());
        let zero = Verifiers::new(vec![(0.0, Verifier::JsonValid(JsonValid))]);
        assert!(matches!(zero, Err(VerifierError::Empty)));
        assert!(matches!(Verifiers::new(vec![]), Err(VerifierError::Empty)));
        let nan = Verifiers::new(vec![(f64::NAN, Verifier::JsonValid(JsonValid))]);
        assert!(matches!(nan, Err(VerifierError::Weight { index: 0, .. })));
    }
}

//! Exact-match verifier: a response is correct when its text, trimmed, equals the answer.
//!
//! The response is cut at the first newline (the task's answer is one line). It does not
//! normalise numbers or parse expressions.

/// Scores responses by exact match with a reference answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExactMatch {
    /// Reward for a correct response.
    pub correct: f64,
    /// Reward for an incorrect response, or one without a reference.
    pub incorrect: f64,
}

impl ExactMatch {
    /// True when `response` (up to its first newline, trimmed) equals `answer` (trimmed).
    pub fn is_correct(response: &str, answer: &str) -> bool {
        let line = response.split('\n').next().unwrap_or("");
        line.trim() == answer.trim()
    }

    /// The reward for `response` against `answer`.
    pub fn score(&self, response: &str, answer: Option<&str>) -> f64 {
        match answer {
            Some(a) if Self::is_correct(response, a) => self.correct,
            _ => self.incorrect,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_trimmed_first_line_only() {
        let r = ExactMatch {
            correct: 1.0,
            incorrect: -0.5,
        };
        assert_eq!(r.score("81", Some("81")), 1.0);
        assert_eq!(r.score(" 81 \nextra", Some("81")), 1.0);
        assert_eq!(r.score("810", Some("81")), -0.5);
        assert_eq!(r.score("", Some("81")), -0.5);
        assert_eq!(r.score("81", None), -0.5);
    }
}

//! Regex verifier: 1 when a pattern matches anywhere in the response, else 0 (anchor it with
//! `^...$` to match the whole response). It needs no reference answer.

use super::extract::compile;
use super::VerifierError;
use regex::Regex;

/// Scores whether the response matches a pattern.
#[derive(Debug, Clone)]
pub struct RegexMatch {
    regex: Regex,
}

impl RegexMatch {
    /// A verifier for `pattern` (Rust `regex` syntax).
    pub fn new(pattern: &str) -> Result<Self, VerifierError> {
        Ok(Self {
            regex: compile(pattern)?,
        })
    }

    /// 1 when the pattern matches `response`, else 0.
    pub fn score(&self, response: &str) -> f64 {
        f64::from(u8::from(self.regex.is_match(response)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_anywhere_unless_anchored() {
        let r = RegexMatch::new(r"<answer>\d+</answer>").unwrap();
        assert_eq!(r.score("think... <answer>12</answer>"), 1.0);
        assert_eq!(r.score("<answer>x</answer>"), 0.0);
        let whole = RegexMatch::new(r"^\d+$").unwrap();
        assert_eq!(whole.score("12"), 1.0);
        assert_eq!(whole.score("12 apples"), 0.0);
        assert!(RegexMatch::new("[").is_err());
    }
}

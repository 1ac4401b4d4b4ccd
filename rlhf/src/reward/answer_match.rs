//! Exact match on an extracted answer: 1 when the answer found in a response (see
//! [`Extract`]) equals the reference answer, else 0. With [`Extract::LastNumber`] two
//! numbers are equal when their values are (`2.50` = `2.5`); otherwise the trimmed texts
//! must be equal. It does not parse expressions.

use super::Extract;

/// The exact-match verifier of a weighted sum; it also defines a step's accuracy.
#[derive(Debug, Clone)]
pub struct AnswerMatch {
    /// Where the answer is in a response.
    pub extract: Extract,
}

impl AnswerMatch {
    /// The verifier of today's `exact_match` reward: the response's first line.
    pub fn first_line() -> Self {
        Self {
            extract: Extract::FirstLine,
        }
    }

    /// True when `response`'s extracted answer equals `answer`; false without a reference
    /// or without an answer to extract.
    pub fn is_correct(&self, response: &str, answer: Option<&str>) -> bool {
        let (Some(answer), Some(found)) = (answer, self.extract.apply(response)) else {
            return false;
        };
        let answer = answer.trim();
        if found == answer {
            return true;
        }
        matches!(self.extract, Extract::LastNumber) && same_number(&found, answer)
    }

    /// 1 when correct, else 0.
    pub fn score(&self, response: &str, answer: Option<&str>) -> f64 {
        f64::from(u8::from(self.is_correct(response, answer)))
    }
}

fn same_number(a: &str, b: &str) -> bool {
    let parse = |s: &str| s.replace(',', "").parse::<f64>().ok();
    matches!((parse(a), parse(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::ExactMatch;

    #[test]
    fn first_line_agrees_with_the_exact_match_reward() {
        let m = AnswerMatch::first_line();
        for (resp, ans) in [("81", "81"), (" 81 \nx", "81"), ("810", "81"), ("", "81")] {
            assert_eq!(
                m.is_correct(resp, Some(ans)),
                ExactMatch::is_correct(resp, ans),
                "{resp:?} vs {ans:?}"
            );
        }
        assert!(!m.is_correct("81", None), "no reference, not correct");
    }

    #[test]
    fn numbers_compare_by_value_only_for_last_number() {
        let m = AnswerMatch {
            extract: Extract::LastNumber,
        };
        assert_eq!(m.score("so it is 2.50", Some("2.5")), 1.0);
        assert_eq!(m.score("1,000 total", Some("1000")), 1.0);
        assert_eq!(m.score("so it is 3", Some("2.5")), 0.0);
        assert_eq!(m.score("no number", Some("2")), 0.0);
        let boxed = AnswerMatch {
            extract: Extract::Boxed,
        };
        assert_eq!(boxed.score(r"\boxed{2.50}", Some("2.5")), 0.0);
        assert_eq!(boxed.score(r"\boxed{ 2.5 }", Some("2.5")), 1.0);
    }
}

//! Length penalty: minus the number of response tokens past a target length,
//! `-max(0, tokens - target_tokens)`. Weighted by `w`, each token over the target costs `w`
//! reward; a response at or under the target costs nothing. The EOS token counts as a token.

/// Penalises responses longer than a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthPenalty {
    /// Response tokens allowed before the penalty starts.
    pub target_tokens: usize,
}

impl LengthPenalty {
    /// `-max(0, response_tokens - target_tokens)`: zero or negative.
    pub fn score(&self, response_tokens: usize) -> f64 {
        -(response_tokens.saturating_sub(self.target_tokens) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_unit_per_token_over_the_target() {
        let p = LengthPenalty { target_tokens: 4 };
        assert_eq!(p.score(0), 0.0);
        assert_eq!(p.score(4), 0.0);
        assert_eq!(p.score(5), -1.0);
        assert_eq!(p.score(10), -6.0);
    }
}

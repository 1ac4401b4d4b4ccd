//! DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): a length-aware penalty added to
//! the reward of responses that run into the generation budget, so the policy learns to
//! finish before the cut instead of being rewarded or punished for text it never completed.

/// The soft overlong penalty settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlongShaping {
    /// The generation budget `L_max`, in tokens.
    pub max_len: usize,
    /// The buffer `L_cache` before `L_max` over which the penalty ramps up (tokens, ≥ 1).
    pub buffer: usize,
    /// The penalty at `L_max` (reward units, ≥ 0); DAPO uses 1.
    pub penalty: f64,
}

impl OverlongShaping {
    /// The reward to add to a response of `len` tokens:
    /// `0` for `len ≤ L_max − L_cache`, `−penalty · (len − (L_max − L_cache)) / L_cache` up to
    /// `L_max`, `−penalty` beyond.
    pub fn shaping(&self, len: usize) -> f64 {
        let start = self.max_len.saturating_sub(self.buffer);
        if len <= start {
            0.0
        } else if len <= self.max_len {
            -self.penalty * (len - start) as f64 / self.buffer.max(1) as f64
        } else {
            -self.penalty
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramps_linearly_over_the_buffer() {
        let s = OverlongShaping {
            max_len: 20,
            buffer: 4,
            penalty: 1.0,
        };
        assert_eq!(s.shaping(0), 0.0);
        assert_eq!(s.shaping(16), 0.0);
        assert_eq!(s.shaping(17), -0.25);
        assert_eq!(s.shaping(19), -0.75);
        assert_eq!(s.shaping(20), -1.0);
        assert_eq!(s.shaping(25), -1.0);
        let half = OverlongShaping { penalty: 0.5, ..s };
        assert_eq!(half.shaping(18), -0.25);
    }
}

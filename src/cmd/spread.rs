//! [`Spread`]: the median and spread of a benchmark's repeated measurements.

use serde::Serialize;

/// Median, min and max of a set of measurements (same unit as the inputs).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; all zero when `values` is empty.
    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

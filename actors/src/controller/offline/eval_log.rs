//! [`EvalLog`]: the held-out metrics of a data-file run, at the start and the latest
//! evaluation.

use crate::monitor::StepMetrics;
use std::collections::BTreeMap;

/// Held-out metrics: the first evaluation's and the latest one's.
#[derive(Default)]
pub(crate) struct EvalLog {
    /// Before the first step.
    pub first: BTreeMap<String, f64>,
    /// After the latest evaluated step.
    pub last: BTreeMap<String, f64>,
}

impl EvalLog {
    /// Records `values` (step 0 is the first evaluation) and adds them to `metrics`.
    pub(crate) fn record(
        &mut self,
        step: u64,
        values: &[(&str, f64)],
        mut metrics: StepMetrics,
    ) -> StepMetrics {
        let into = if step == 0 {
            &mut self.first
        } else {
            &mut self.last
        };
        for (k, v) in values {
            into.insert(k.to_string(), *v);
            metrics = metrics.with(*k, *v);
        }
        metrics
    }
}

//! `[supervision]` (call timeouts and the restart budget) and `[[faults]]` (injected
//! failures, for tests and drills), with their checks. The supervisor itself lives in
//! `controller/supervisor.rs`; the injection point in `faults.rs`.

use super::{Algorithm, Recipe, RecipeError};
use oxalign_models::engine::QuantMode;
use serde::{Deserialize, Serialize};

/// `[supervision]`: how long a role call may take and how often a failed step is replayed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisionSection {
    /// Seconds one role call (a generation, a scoring pass, an update, a save) may take
    /// before it counts as failed with a timeout. Default `600`.
    pub call_timeout_s: f64,
    /// Restarts allowed within `restart_window` RL steps; one more fails the run. `0` fails
    /// on the first role failure. Default `3`.
    pub max_restarts: u32,
    /// The window of the restart budget, in RL steps. Default `10`.
    pub restart_window: u64,
}

impl Default for SupervisionSection {
    fn default() -> Self {
        Self {
            call_timeout_s: 600.0,
            max_restarts: 3,
            restart_window: 10,
        }
    }
}

/// Largest `supervision.call_timeout_s`: about 31.7 years, far above any real call and far
/// below what a `Duration` or a timer deadline can hold.
pub const MAX_CALL_TIMEOUT_S: f64 = 1e9;

impl SupervisionSection {
    /// The call timeout as a duration (a value past [`MAX_CALL_TIMEOUT_S`], or not a positive
    /// number, which `validate` refuses, saturates instead of panicking).
    pub fn call_timeout(&self) -> std::time::Duration {
        let s = self.call_timeout_s;
        let s = if s.is_nan() { MAX_CALL_TIMEOUT_S } else { s };
        std::time::Duration::from_secs_f64(s.clamp(0.0, MAX_CALL_TIMEOUT_S))
    }
}

/// What an injected fault does to the job it hits.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The job panics on its executor thread (the replica's state is poisoned).
    Panic,
    /// The job returns an error.
    Error,
    /// The job blocks its executor thread until the call times out.
    Hang,
}

/// One `[[faults]]` entry: a failure injected once into `role`'s job of `phase` at RL step
/// `step` (the first attempt of that step; a replay runs clean).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// `policy`, `reference`, `reward` or `critic`.
    pub role: String,
    /// A phase of that role in an RL step (see [`FAULT_PHASES`]).
    pub phase: String,
    /// The RL step (1-based).
    pub step: u64,
    /// `panic`, `error` or `hang`.
    pub kind: FaultKind,
}

/// The phases of each role's work in an RL step, where a fault can be injected.
pub(crate) const FAULT_PHASES: &[(&str, &[&str])] = &[
    (
        "policy",
        &["generate", "old_logprobs", "policy_train", "refit"],
    ),
    ("reference", &["reference_logprobs"]),
    ("reward", &["reward"]),
    ("critic", &["values", "critic_train"]),
];

/// Checks `[supervision]` and every `[[faults]]` entry; errors name the key.
pub(super) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let s = &r.supervision;
    if !(s.call_timeout_s > 0.0 && s.call_timeout_s <= MAX_CALL_TIMEOUT_S) {
        return Err(bad(
            "supervision.call_timeout_s",
            format!(
                "{}: expected a positive number of seconds, at most {MAX_CALL_TIMEOUT_S:e}",
                s.call_timeout_s
            ),
        ));
    }
    if s.restart_window == 0 {
        return Err(bad(
            "supervision.restart_window",
            "0: expected at least 1 step".into(),
        ));
    }
    for (i, f) in r.faults.iter().enumerate() {
        let key = |k: &str| format!("faults[{i}].{k}");
        let Some((_, phases)) = FAULT_PHASES.iter().find(|(role, _)| *role == f.role) else {
            let roles: Vec<&str> = FAULT_PHASES.iter().map(|(r, _)| *r).collect();
            return Err(bad(
                &key("role"),
                format!("{:?}: expected one of {}", f.role, roles.join(", ")),
            ));
        };
        if f.role == "critic" && r.rl.algorithm != Algorithm::Ppo {
            return Err(bad(
                &key("role"),
                format!("\"critic\": {:?} has no critic", r.rl.algorithm),
            ));
        }
        if !phases.contains(&f.phase.as_str()) {
            return Err(bad(
                &key("phase"),
                format!(
                    "{:?}: the {} works in {}",
                    f.phase,
                    f.role,
                    phases.join(", ")
                ),
            ));
        }
        if f.phase == "old_logprobs" && r.engine.quant == QuantMode::None {
            return Err(bad(
                &key("phase"),
                "\"old_logprobs\": the trainer scores old log-probs only for a quantized engine (engine.quant)".into(),
            ));
        }
        if f.step == 0 || f.step > r.run.steps {
            return Err(bad(
                &key("step"),
                format!("{}: expected an RL step in 1..={}", f.step, r.run.steps),
            ));
        }
    }
    Ok(())
}

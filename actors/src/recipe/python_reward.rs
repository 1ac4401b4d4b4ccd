//! `[reward.python]`: TRL-style Python reward functions that `reward.kind = "python"`
//! serves from a child process (`roles/reward/python.rs`), and their door checks.

use super::reward_key::{key_error, RewardKeyError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// `[reward.python]`: the file and functions of `reward.kind = "python"`. Each function
/// takes TRL's `reward_funcs` arguments (`prompts`, `completions`, `answer` and the
/// dataset's other columns as keyword arguments) and returns one number per row; the
/// reward is their weighted sum.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PythonRewardSection {
    /// The Python file defining the functions. Required.
    pub file: String,
    /// The functions' names. Required (at least one).
    pub functions: Vec<String>,
    /// One weight per function, in the same order; empty: all 1. Default empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<f64>,
    /// The interpreter (a name on the PATH or a path). Default `"python3"`.
    pub python: String,
    /// Seconds the server may take to import the file and start listening. Default `120`.
    pub startup_timeout_s: f64,
}

impl Default for PythonRewardSection {
    fn default() -> Self {
        Self {
            file: String::new(),
            functions: Vec::new(),
            weights: Vec::new(),
            python: "python3".into(),
            startup_timeout_s: 120.0,
        }
    }
}

/// Whether `name` can be a Python function's name.
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

impl PythonRewardSection {
    /// Checks the keys; errors name them.
    pub fn check(&self) -> Result<(), RewardKeyError> {
        let key = |k: &str| format!("reward.python.{k}");
        if self.file.is_empty() {
            return Err(key_error(
                key("file"),
                "missing: expected the Python file defining the reward functions",
            ));
        }
        if !Path::new(&self.file).is_file() {
            return Err(key_error(
                key("file"),
                format!("{:?} is not a file", self.file),
            ));
        }
        if self.functions.is_empty() {
            return Err(key_error(
                key("functions"),
                "empty: expected the names of one or more functions of the file",
            ));
        }
        if let Some(bad) = self.functions.iter().find(|f| !is_identifier(f)) {
            return Err(key_error(
                key("functions"),
                format!("{bad:?} is not a Python function name"),
            ));
        }
        if !self.weights.is_empty() && self.weights.len() != self.functions.len() {
            return Err(key_error(
                key("weights"),
                format!("{} weights for {} functions: give none (all 1) or one per function, in the same order", self.weights.len(), self.functions.len()),
            ));
        }
        if let Some(w) = self.weights.iter().find(|w| !w.is_finite()) {
            return Err(key_error(
                key("weights"),
                format!("{w}: expected finite numbers"),
            ));
        }
        if self.python.is_empty() {
            return Err(key_error(
                key("python"),
                "empty: expected an interpreter, e.g. \"python3\"",
            ));
        }
        if !(self.startup_timeout_s.is_finite() && self.startup_timeout_s > 0.0) {
            return Err(key_error(
                key("startup_timeout_s"),
                format!("{}: expected more than 0 seconds", self.startup_timeout_s),
            ));
        }
        Ok(())
    }
}

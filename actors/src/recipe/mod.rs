//! Training recipes: one TOML file describes a whole run.
//!
//! Parsing is strict (`deny_unknown_fields`) and every error names the file, the key path
//! and what was expected. `--set key.path=value` overrides are applied to the TOML tree
//! before it is typed, so they get the same checks. Filesystem and device checks live in
//! `validate.rs`.

mod cluster;
mod engine_placement_check;
mod env;
mod expert_parallel_check;
mod head_check;
mod host_name;
pub(crate) use host_name::valid_host;
mod kind_sections;
mod log;
mod lora;
mod moe_switches;
mod numbers;
mod offline;
mod overrides;
mod precision;
mod python_reward;
mod resume_check;
mod reward;
mod reward_key;
mod sections;
mod sharding_check;
mod slurm;
mod supervision;
mod teacher_check;
mod validate;
mod validate_rl;

pub use cluster::{
    is_loopback, is_loopback_host, role_placements, split_addr, AddressError, ClusterSection,
    DEFAULT_COOKIE_ENV,
};
pub use env::{
    EnvHttpSection, EnvKind, EnvSection, HttpToolSection, OnEpisodeFailure, BUILT_IN_TOOLS,
};
pub use log::LogSection;
pub use lora::{BaseDtype, LoraSection};
pub use offline::{DpoSection, RmSection, RunKind};
pub(crate) use overrides::apply_override;
pub use python_reward::PythonRewardSection;
pub use resume_check::{changed_keys, check_resume, RESUMABLE_KEYS};
pub use reward::{RewardKind, RewardSection};
pub(crate) use reward_key::key_error;
pub use reward_key::RewardKeyError;
pub use sections::*;
pub use slurm::SlurmError;
pub use supervision::{FaultKind, FaultSpec, SupervisionSection, MAX_CALL_TIMEOUT_S};
pub(crate) use teacher_check::same_vocabulary;
pub use teacher_check::TeacherError;
pub use validate::validate;
pub use validate_rl::warnings;

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A whole training recipe. Every section (and every field) has a documented default, so
/// an empty file is a valid recipe.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Recipe {
    /// `[run]`: name, seed, length, checkpoints.
    pub run: RunSection,
    /// `[model]`: policy / reward / critic sources.
    pub model: ModelSection,
    /// `[data]`: prompts.
    pub data: DataSection,
    /// `[sft]`: supervised warm-up.
    pub sft: SftSection,
    /// `[rl]`: the RL algorithm.
    pub rl: RlSection,
    /// `[rm]`: reward-model training (`run.kind = "rm"`).
    pub rm: RmSection,
    /// `[dpo]`: preference optimisation (`run.kind = "dpo"`).
    pub dpo: DpoSection,
    /// `[reward]`: scoring.
    pub reward: RewardSection,
    /// `[engine]`: the policy's generation engine.
    pub engine: EngineSection,
    /// `[placement]`: device groups per role.
    pub placement: PlacementSection,
    /// `[guard]`: divergence limits.
    pub guard: GuardSection,
    /// `[supervision]`: call timeouts and the restart budget.
    pub supervision: SupervisionSection,
    /// `[cluster]`: worker nodes that `[placement]` may name (none by default).
    #[serde(skip_serializing_if = "ClusterSection::is_default")]
    pub cluster: ClusterSection,
    /// `[log]`: experiment-tracking outputs (TensorBoard).
    #[serde(skip_serializing_if = "LogSection::is_default")]
    pub log: LogSection,
    /// `[env]`: multi-turn episodes with tools (absent: one completion per sample).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvSection>,
    /// `[lora]`: train LoRA adapters with the base frozen (absent: every weight trains).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSection>,
    /// `[[faults]]`: failures to inject (none by default).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultSpec>,
}

/// Why a recipe could not be used. Each variant names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// The recipe file could not be read.
    #[error("cannot read recipe {path}: {source}")]
    Read {
        /// The recipe file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{path} is not valid TOML: {message}")]
    Syntax {
        /// The recipe file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A key is unknown or has the wrong type.
    #[error("{path}: key `{key}`: {message}")]
    Key {
        /// The recipe file.
        path: PathBuf,
        /// Dotted key path, e.g. `rl.clip_eps`.
        key: String,
        /// What was wrong and what was expected.
        message: String,
    },
    /// A `--set` override is malformed.
    #[error("--set {spec}: {message}")]
    Override {
        /// The override as given.
        spec: String,
        /// What was wrong.
        message: String,
    },
    /// `--resume` with a recipe whose changes are not allowed.
    #[error("{message}")]
    Resume {
        /// The changed keys (old → new) and what to do.
        message: String,
    },
    /// A value is well-typed but unusable (a missing folder, an unknown device, ...).
    #[error("{path}: key `{key}`: {message}")]
    Invalid {
        /// The recipe file.
        path: PathBuf,
        /// Dotted key path.
        key: String,
        /// What was wrong and what was expected.
        message: String,
    },
}

impl Recipe {
    /// Reads `path`, applies `overrides` (`key.path=value`, value in TOML syntax or a bare
    /// string), and types the result. Does not touch anything but the file itself.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, RecipeError> {
        let text = std::fs::read_to_string(path).map_err(|source| RecipeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path, overrides)
    }

    /// Parses recipe text; `path` is only used in messages. A key set in a section the run
    /// kind does not read is refused (`kind_sections.rs`).
    pub fn parse(text: &str, path: &Path, overrides: &[String]) -> Result<Self, RecipeError> {
        let mut tree: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| RecipeError::Syntax {
                    path: path.to_path_buf(),
                    message: e.to_string().trim_end().to_string(),
                })?;
        for spec in overrides {
            apply_override(&mut tree, spec)?;
        }
        let recipe: Self = serde_path_to_error::deserialize(toml::Value::Table(tree.clone()))
            .map_err(|e| {
                let key = e.path().to_string();
                RecipeError::Key {
                    path: path.to_path_buf(),
                    key: if key == "." {
                        "(top level)".into()
                    } else {
                        key
                    },
                    message: e.into_inner().to_string().trim_end().to_string(),
                }
            })?;
        kind_sections::check(&tree, &recipe, path)?;
        Ok(recipe)
    }

    /// The recipe as TOML, with every default filled in (what `runs/<name>/recipe.toml` holds).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# could not render recipe: {e}\n"))
    }

    /// `<out_dir>/<name>`: where this run writes.
    pub fn run_dir(&self) -> PathBuf {
        Path::new(&self.run.out_dir).join(&self.run.name)
    }

    /// The distribution the policy's and the reference's log-probs are scored under: in an
    /// RL run the rollout sampler's (`rl.temperature`, `top_k`, `top_p`), so they match the
    /// engine's sampling log-probs; in SFT, RM and DPO runs the model's own (T = 1, no
    /// truncation), whatever `[rl]` says, so DPO's policy and reference agree at the start.
    pub fn scoring_distribution(&self) -> oxalign_models::TokenDistribution {
        match self.run.kind {
            RunKind::Rl => self.rl.rollout_distribution(),
            RunKind::Sft | RunKind::Rm | RunKind::Dpo => oxalign_models::TokenDistribution::MODEL,
        }
    }
}

#[cfg(test)]
mod tests;

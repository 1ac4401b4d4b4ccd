//! The recipe keys of the runs that train from a data file instead of from rollouts:
//! `run.kind` picks the run, `[rm]` and `[dpo]` set their optimisation (SFT from a file uses
//! `[sft]`). Nothing here touches the disk.

use oxalign_rlhf::losses::DpoLossKind;
use serde::{Deserialize, Serialize};

/// What a run trains (`run.kind`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// Optional SFT warm-up on the prompts' answers, then RL (`[rl]`) from rollouts.
    #[default]
    Rl,
    /// Supervised fine-tuning on `data.path` (SFT schema), `[sft]` settings; the loss is on
    /// the response (every assistant turn of a message list) only.
    Sft,
    /// Bradley–Terry reward-model training on `data.path` (preference schema), `[rm]`
    /// settings; saves an HF `*ForSequenceClassification` folder.
    Rm,
    /// Direct preference optimisation of the policy on `data.path` (preference schema),
    /// `[dpo]` settings, against the frozen initial policy.
    Dpo,
}

/// `[rm]`: reward-model training (`run.kind = "rm"`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RmSection {
    /// Optimizer steps. Default `200`.
    pub steps: u64,
    /// Preference pairs per step. Default `32`.
    pub batch_size: usize,
    /// Peak learning rate (linear warm-up, then cosine decay to a tenth). Default `1e-4`.
    pub lr: f64,
    /// Warm-up steps. Default `10`.
    pub warmup_steps: u64,
    /// Held-out evaluation every this many steps (and at the start and the end); 0 = only
    /// at the start and the end. Default `50`.
    pub eval_every: u64,
}

impl Default for RmSection {
    fn default() -> Self {
        Self {
            steps: 200,
            batch_size: 32,
            lr: 1e-4,
            warmup_steps: 10,
            eval_every: 50,
        }
    }
}

/// `[dpo]`: direct preference optimisation (`run.kind = "dpo"`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DpoSection {
    /// Optimizer steps. Default `200`.
    pub steps: u64,
    /// Preference pairs per step. Default `32`.
    pub batch_size: usize,
    /// Peak learning rate (linear warm-up, then cosine decay to a tenth). Default `1e-5`.
    pub lr: f64,
    /// Warm-up steps. Default `10`.
    pub warmup_steps: u64,
    /// β, the strength of the implicit KL penalty to the reference (per nat of summed
    /// log-ratio). Default `0.1`.
    pub beta: f64,
    /// `sigmoid` (DPO, `−log σ(β h)` (Rafailov et al. 2023); cDPO with `label_smoothing`) or
    /// `ipo` (`(h − 1/(2β))²`, Azar et al. 2023). Default `"sigmoid"`.
    pub loss: DpoLossKind,
    /// cDPO's ε, the assumed probability that a label is flipped, in `[0, 0.5)`; `sigmoid`
    /// only. Default `0.0` (plain DPO).
    pub label_smoothing: f64,
    /// Held-out evaluation every this many steps (and at the start and the end); 0 = only
    /// at the start and the end. Default `50`.
    pub eval_every: u64,
}

impl Default for DpoSection {
    fn default() -> Self {
        Self {
            steps: 200,
            batch_size: 32,
            lr: 1e-5,
            warmup_steps: 10,
            beta: 0.1,
            loss: DpoLossKind::Sigmoid,
            label_smoothing: 0.0,
            eval_every: 50,
        }
    }
}

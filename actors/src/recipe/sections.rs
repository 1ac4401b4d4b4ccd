//! The sections of a training recipe, each with its documented defaults.
//!
//! Parsing and overrides live in `mod.rs`; checks that need the filesystem or the machine
//! (model folders, devices) live in `validate.rs`; `[reward]` lives in `reward.rs`. Nothing
//! here touches the disk.

use oxalign_models::engine::QuantMode;
use oxalign_rlhf::losses::{
    KlEstimator, KlMode, LossAggKind, PolicyObjective, RolloutCorrectionKind,
};
use serde::{Deserialize, Serialize};

/// The RL algorithm: which advantage estimator the loop uses.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// GAE advantages from a learned critic, PPO clipped surrogate.
    Ppo,
    /// Group-relative advantages, mean- and std-normalised per prompt.
    Grpo,
    /// Group-relative advantages without the std (Dr. GRPO).
    DrGrpo,
    /// Leave-one-out baseline.
    Rloo,
    /// REINFORCE++: discounted returns, global batch normalisation.
    ReinforcePp,
    /// On-policy distillation from `model.teacher_path`: the reference role is the frozen
    /// teacher and each token's advantage is `−(log π_old − log π_teacher)`.
    Distill,
}

/// What a response cut off by `rl.max_new_tokens` is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Truncation {
    /// The episode ended there: the response is scored as it stands.
    Terminal,
    /// It has not ended (PPO only): its score is not used, and GAE bootstraps from the
    /// critic's value of the state after the cut (time-limit bootstrapping, Pardo et al. 2018).
    Bootstrap,
}

/// How the policy's learning rate moves over the RL steps.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RlLrSchedule {
    /// `rl.lr` at every step.
    Constant,
    /// From `rl.lr` at the first RL step down to 0 after `run.steps` (TRL's default).
    Linear,
    /// Half a cosine from `rl.lr` down to 0 after `run.steps`.
    Cosine,
}

/// Where prompts come from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Generated `a+b=` prompts with exact answers.
    Arithmetic,
    /// Rows from the file `data.path`: JSONL, or Parquet when it ends in `.parquet`.
    Jsonl,
    /// The same as `jsonl` (the extension decides the format); reads better for Parquet.
    File,
}

/// `[run]`: naming, seeding, length and checkpointing of one training run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Run name; outputs go to `<out_dir>/<name>/`. Default `"run"`.
    pub name: String,
    /// Parent folder of run folders. Default `"runs"`.
    pub out_dir: String,
    /// Seed for data order, initialisation and sampling. Default `0`.
    pub seed: u64,
    /// Number of RL steps (one rollout batch and its updates each). Default `20`.
    pub steps: u64,
    /// Save a checkpoint every this many RL steps (and always at the end); 0 = only at the end.
    /// Default `0`.
    pub checkpoint_every: u64,
    /// Keep at most this many step checkpoints (oldest deleted first). Default `2`.
    pub keep_checkpoints: usize,
    /// What the run trains: `rl` (SFT warm-up then RL), `sft`, `rm` or `dpo` (from
    /// `data.path`). Default `"rl"`.
    pub kind: super::RunKind,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "run".into(),
            out_dir: "runs".into(),
            seed: 0,
            steps: 20,
            checkpoint_every: 0,
            keep_checkpoints: 2,
            kind: super::RunKind::Rl,
        }
    }
}

/// `[model]`: where the policy comes from.
///
/// Either `path` names an HF model folder, or `init_family`/`init_preset` build a fresh
/// random model inside the run folder (what the quickstart does).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// HF model folder (config.json, model.safetensors, tokenizer.json). Default: none.
    pub path: Option<String>,
    /// Family of a freshly initialised model when `path` is not set: an HF `model_type` of
    /// `oxalign-models` (`llama`, `qwen2`, `qwen3`, `mistral`, or the mixture-of-experts `qwen3_moe`,
    /// `qwen2_moe`, `mixtral`). Default `"llama"`.
    pub init_family: String,
    /// Preset of a freshly initialised model: `tiny` or `small`. Default `"tiny"`.
    pub init_preset: String,
    /// Reward model folder (HF `*ForSequenceClassification`) when `reward.kind = "model"`.
    pub reward_path: Option<String>,
    /// Critic folder; default: the critic starts from the policy's backbone with a zero value head.
    pub critic_path: Option<String>,
    /// Teacher folder (HF causal LM with the policy's tokenizer) of `rl.algorithm =
    /// "distill"`: the frozen reference role is loaded from it instead of the initial policy.
    pub teacher_path: Option<String>,
    /// Weight of the routers' load-balancing loss (Switch Transformer's, HF's
    /// `load_balancing_loss_func`) in the policy's SFT and RL losses; mixture-of-experts
    /// policies only. Default: the policy's `config.json` decides, as in HF and TRL:
    /// its `router_aux_loss_coef` when `output_router_logits` is true, else 0.
    pub router_aux_loss_coef: Option<f64>,
    /// The numbers every trainer (SFT, reward model, DPO, the RL policy and critic) computes
    /// in: `"f32"`, or `"bf16_mixed"` (also spelled `"bf16-mixed"`): the attention and MLP
    /// projections multiply bf16-rounded activations and weights with f32 sums, while the
    /// weights, gradients and AdamW moments stay f32 (master copy) and norms, softmax,
    /// attention, the LM head and log-probs stay f32. The reference and reward roles score
    /// in f32. `rl.trainer_precision`, when not `"f32"`, overrides it for the RL policy.
    /// Default `"f32"`.
    pub precision: oxalign_models::Precision,
    /// Activation checkpointing (HF's `gradient_checkpointing`) in every trainer: a
    /// training forward keeps only each decoder layer's input and the backward recomputes
    /// the layers one at a time, so the activations held through a step shrink to one
    /// `[B, T, H]` per layer, for one more forward of each layer. Same gradients. CPU
    /// devices, replicated training (a sharded one recomputes already), no expert
    /// parallelism, no `lora.dropout`. Default `false`: a replicated CPU trainer then runs
    /// the layerwise backward (no recompute; each layer's activations freed as soon as its
    /// backward is done, instead of all at the end).
    pub gradient_checkpointing: bool,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: None,
            init_family: "llama".into(),
            init_preset: "tiny".into(),
            reward_path: None,
            critic_path: None,
            teacher_path: None,
            router_aux_loss_coef: None,
            precision: oxalign_models::Precision::F32,
            gradient_checkpointing: false,
        }
    }
}

/// `[data]`: the prompts (and reference answers) the run trains on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// `arithmetic` (generated `a+b=` prompts with exact answers) or `file` / `jsonl` (rows
    /// from `path`, in the schema of `run.kind`: see docs/RECIPES.md). `sft`, `rm` and `dpo`
    /// runs always read `path`. Default `"arithmetic"`.
    pub task: TaskKind,
    /// Data file (JSONL, or Parquet when it ends in `.parquet`), or a folder of Parquet
    /// shards (the Hugging Face datasets layout: its `*.parquet` files, in name order, read
    /// as one dataset). Default: none.
    pub path: Option<String>,
    /// Held-out file (or folder of Parquet shards) of the same schema. Default: none (see
    /// `eval_fraction`).
    pub eval_path: Option<String>,
    /// Without `eval_path`: the fraction of `path`'s rows held out (seeded by `run.seed`),
    /// in `[0, 1)`. Default `0.0`.
    pub eval_fraction: f64,
    /// A malformed row: `fail` (stop, naming the file and row) or `skip` (skip it; the count
    /// is printed and written to summary.json). Default `"fail"`.
    pub on_bad_row: oxalign_data::OnBadRow,
    /// The column of a prompts file holding the reference answer (TRL datasets use
    /// `solution`, `ground_truth`, ...). A reward that compares with it refuses a file where
    /// no row has it. Default `"answer"`.
    pub answer_field: String,
    /// Largest operand of the arithmetic task (operands are drawn from `0..=max_operand`).
    /// Default `99`.
    pub max_operand: u32,
    /// Held-out prompts used for accuracy before and after RL. Default `200`.
    pub eval_size: usize,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            task: TaskKind::Arithmetic,
            path: None,
            eval_path: None,
            eval_fraction: 0.0,
            on_bad_row: oxalign_data::OnBadRow::Fail,
            answer_field: oxalign_data::DEFAULT_ANSWER_FIELD.into(),
            max_operand: 99,
            eval_size: 200,
        }
    }
}

/// `[sft]`: the supervised warm-up before RL (prompt masked out of the loss).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SftSection {
    /// Optimizer steps of supervised fine-tuning; 0 skips SFT. Default `0`.
    pub steps: u64,
    /// Sequences per step. Default `64`.
    pub batch_size: usize,
    /// Peak learning rate. Default `1e-3`.
    pub lr: f64,
    /// Linear warm-up steps before cosine decay. Default `20`.
    pub warmup_steps: u64,
    /// AdamW weight decay (not applied to norms, biases, embeddings). Default `0.0`.
    pub weight_decay: f64,
    /// Save a checkpoint (`checkpoints/sft_<N>/`) every this many SFT steps, so a run killed
    /// during SFT resumes there; 0 = none during SFT. The end of SFT is always saved, as
    /// `checkpoints/step_000000/`. Default `50`.
    pub checkpoint_every: u64,
    /// Pack each step's sequences into rows as long as its longest one (first-fit
    /// decreasing; attention and position ids per sequence), so padding costs no compute.
    /// Same loss and gradients as the padded batch, to f32 rounding. Default `false`.
    pub packing: bool,
    /// `run.kind = "sft"` only: held-out loss every this many steps (and at the start and
    /// the end); 0 = only at the start and the end. Default `50`.
    pub eval_every: u64,
    /// The warm-up before RL only: its labelled examples are the first `examples` rows of
    /// the training stream, cycled, so SFT sees a small demonstration set while RL draws its
    /// prompts from the whole stream (from its start). 0 = the warm-up reads fresh rows of
    /// the stream and RL continues after them. Default `0`.
    pub examples: u64,
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            steps: 0,
            batch_size: 64,
            lr: 1e-3,
            warmup_steps: 20,
            weight_decay: 0.0,
            checkpoint_every: 50,
            packing: false,
            eval_every: 50,
            examples: 0,
        }
    }
}

/// `[guard]`: divergence limits. A step whose loss, gradient or weights are not finite, or
/// whose loss or KL exceeds a limit here, stops the run before any weight or checkpoint
/// changes; the message names the role, the step, the phase and the value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GuardSection {
    /// Largest SFT loss (mean NLL per answer token, nats). Default `100`.
    pub max_sft_loss: f64,
    /// Largest |policy loss| of a PPO minibatch. Default `100`.
    pub max_policy_loss: f64,
    /// Largest critic value loss of a minibatch. Default `1e4`.
    pub max_value_loss: f64,
    /// Largest approximate KL (nats per token) between the rollout-time policy and the policy
    /// about to take a minibatch update: how far one RL step may move the policy. Default `1`.
    pub max_update_kl: f64,
    /// Largest mean KL (policy vs reference, nats per response token) of a rollout batch.
    /// Default `10`.
    pub max_kl: f64,
}

impl Default for GuardSection {
    fn default() -> Self {
        Self {
            max_sft_loss: 100.0,
            max_policy_loss: 100.0,
            max_value_loss: 1e4,
            max_update_kl: 1.0,
            max_kl: 10.0,
        }
    }
}

/// `[rl]`: the reinforcement-learning algorithm and its hyper-parameters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RlSection {
    /// `ppo` (GAE with a critic), `grpo`, `dr_grpo`, `rloo`, `reinforce_pp` or `distill`
    /// (on-policy distillation from `model.teacher_path`). Default `"ppo"`.
    pub algorithm: Algorithm,
    /// Prompts per RL step. Default `32`.
    pub prompts_per_step: usize,
    /// Samples generated per prompt (group size for GRPO/RLOO). Default `1`.
    pub samples_per_prompt: usize,
    /// Passes over each rollout batch. Default `1`.
    pub ppo_epochs: usize,
    /// Sequences per optimizer minibatch. Default `32`.
    pub minibatch_size: usize,
    /// Policy learning rate. Default `1e-5`.
    pub lr: f64,
    /// `constant`, `linear` or `cosine`: the policy's learning rate over the RL steps (the
    /// decays reach 0 after `run.steps`). Default `"constant"`.
    pub lr_schedule: RlLrSchedule,
    /// Critic learning rate. Default `1e-4`.
    pub critic_lr: f64,
    /// PPO clip range ε (the lower one, `1 − ε`). Default `0.2`.
    pub clip_eps: f64,
    /// Upper clip range ε_high (`1 + ε_high`), DAPO's clip-higher (e.g. `0.28`); none = `clip_eps`.
    pub clip_eps_high: Option<f64>,
    /// The surrogate: `ppo` (clipped token ratio), `gspo` (clipped sequence ratio
    /// `exp(mean_t log π/π_old)`; use small clip ranges, e.g. `clip_eps = 3e-4`,
    /// `clip_eps_high = 4e-4`, and `seq_mean_token_mean`) or `cispo` (REINFORCE with the
    /// ratio clipped to `[1 − clip_eps, 1 + clip_eps_high]` as a stop-gradient weight; e.g.
    /// `clip_eps = 1`, `clip_eps_high = 4`). Default `"ppo"`.
    pub policy_loss: PolicyObjective,
    /// Dual-clip constant c (> 1) for negative advantages; none by default.
    pub dual_clip: Option<f64>,
    /// Critic value clip range. Default `0.2`.
    pub value_clip: f64,
    /// Discount γ. Default `1.0`.
    pub gamma: f64,
    /// GAE λ. Default `0.95`.
    pub lam: f64,
    /// Entropy bonus coefficient. Default `0.0`.
    pub entropy_coef: f64,
    /// Initial KL coefficient β. Default `0.05`.
    pub kl_coef: f64,
    /// KL estimator: `k1`, `k2` or `k3`. Default `"k1"`.
    pub kl_estimator: KlEstimator,
    /// Where the KL goes: `reward` (per-token penalty) or `loss`. Default `"reward"`.
    pub kl_mode: KlMode,
    /// Adaptive KL target in nats per sequence (the summed per-token KL, Ziegler et al. 2019);
    /// none = fixed β.
    pub kl_target: Option<f64>,
    /// Adaptive KL horizon in samples. Default `10000`.
    pub kl_horizon: f64,
    /// Loss aggregation of the policy and the critic: `token_mean`, `seq_mean_token_sum`,
    /// `seq_mean_token_mean` or `seq_mean_token_sum_norm` (Σ over a sequence's tokens divided
    /// by `max_new_tokens`). Default: `seq_mean_token_sum_norm` for `dr_grpo` (its constant
    /// normaliser, Liu et al. 2025), `seq_mean_token_mean` with `policy_loss = "gspo"`,
    /// `token_mean` otherwise (see `RlSection::loss_agg`).
    #[serde(rename = "loss_agg")]
    pub loss_agg_choice: Option<LossAggKind>,
    /// Whiten advantages over the batch. Default `true`.
    pub whiten_advantages: bool,
    /// Global gradient-norm clip. Default `1.0`.
    pub max_grad_norm: f64,
    /// Truncated importance-sampling cap `C` of `rollout_correction = "token_tis"`; set alone
    /// it turns token TIS on (as before `rollout_correction` existed). None = off.
    pub tis_cap: Option<f64>,
    /// Correction of the engine/trainer mismatch (a quantized `[engine] quant`): `none`,
    /// `token_tis` (`min(w_t, tis_cap)`), `seq_mask` (drop sequences whose geometric-mean ratio
    /// leaves `[rollout_mask_low, rollout_mask_high]`) or `icepop` (zero the tokens whose ratio
    /// leaves it). Default: `token_tis` when `tis_cap` is set, else `none` (see
    /// `RlSection::rollout_correction`).
    #[serde(rename = "rollout_correction")]
    pub rollout_correction_choice: Option<RolloutCorrectionKind>,
    /// Lowest kept ratio π_old/π_engine of `seq_mask` and `icepop`, in `[0, 1]`. Default `0.5`.
    pub rollout_mask_low: Option<f64>,
    /// Highest kept ratio of `seq_mask` and `icepop`, ≥ 1. Default `2.0` for `seq_mask`,
    /// `5.0` for `icepop` (IcePop's β).
    pub rollout_mask_high: Option<f64>,
    /// Maximum new tokens per response. Default `16`.
    pub max_new_tokens: usize,
    /// A response cut off by `max_new_tokens` (finish reason `length`): `terminal` (scored as
    /// it stands) or `bootstrap` (PPO only: not scored, GAE bootstraps from the critic's value
    /// after the cut). Default `"terminal"`.
    pub truncated: Truncation,
    /// DAPO's soft overlong punishment: responses longer than `max_new_tokens −
    /// overlong_buffer` tokens lose up to `overlong_penalty` reward, linearly over the buffer
    /// (Yu et al. 2025). Tokens, `1..=max_new_tokens`; none = off.
    pub overlong_buffer: Option<usize>,
    /// The overlong penalty at `max_new_tokens`, in reward units (≥ 0). Default `1.0`.
    pub overlong_penalty: f64,
    /// `distill` only: weight λ of the task reward added to the distillation advantage,
    /// `A_t = −(log π_old − log π_teacher) + λ (r − mean_batch r)`; 0 = pure distillation.
    /// Default `0.0`.
    pub distill_reward_coef: f64,
    /// DAPO's dynamic sampling (group algorithms: `grpo`, `dr_grpo`, `rloo`): groups whose
    /// scores (after overlong shaping) are all equal have zero advantage and are dropped, and
    /// further rounds of `prompts_per_step` prompts are drawn until the batch holds
    /// `prompts_per_step` informative groups; at the round cap, the batch is filled with the
    /// earliest dropped groups. Each step reports `dynamic_rounds` and
    /// `dynamic_groups_dropped`. Default `false`.
    pub dynamic_sampling: bool,
    /// Most generation rounds of one step with `dynamic_sampling` (≥ 1). Default `3`.
    pub dynamic_sampling_max_rounds: Option<usize>,
    /// Sampling temperature for rollouts. Log-probs (π_old, π_θ, reference, entropy) are
    /// taken under the distribution sampled: `softmax(logits / temperature)` over the top-k /
    /// top-p kept set (see `RlSection::rollout_distribution`). Default `1.0`.
    pub temperature: f64,
    /// Nucleus sampling p. Default `1.0`.
    pub top_p: f64,
    /// Top-k sampling (0 = off). Default `0`.
    pub top_k: usize,
    /// How many policy versions a rollout batch may lag the trainer, `0..=MAX_STALENESS`.
    /// `0`: on-policy, each step generates and then trains. `k ≥ 1`: the engine generates
    /// step `s + k`'s batch while the trainer updates on step `s`'s (batch `j` comes from
    /// policy version `max(0, j − 1 − k)`), at most `k` batches wait, π_old is the trainer's
    /// own log-prob at the update, and the rollout correction against the engine's
    /// (behaviour) log-probs defaults to `token_tis` with cap 2. Default `0`.
    pub max_staleness: u64,
    /// Pack the sequences of each policy and critic minibatch into rows as long as its
    /// longest one (first-fit decreasing; attention and position ids per sequence), so
    /// padding costs no compute. Same losses and gradients as the padded minibatch, for every
    /// `loss_agg`, to f32 rounding. Default `false`.
    pub packing: bool,
    /// Rollout routing replay, for mixture-of-experts policies: the engine records the
    /// experts it routed every token to, and the policy trainer's forwards (π_old when the
    /// trainer scores it, and every update's π_θ) send each token to those experts instead
    /// of their own top-k, while the routing weights stay the trainer's own softmax (so
    /// the router still learns). The reference and the critic route on their own. Default
    /// `false`.
    pub routing_replay: bool,
    /// The numbers the policy trainer computes in: `f32` (then `model.precision` decides),
    /// `bf16_mixed` (see `model.precision`), or `fake_int8` with
    /// `engine.quant = "int8"` on CPU: every linear layer the engine quantizes runs the
    /// engine's own W8A8 kernel in the trainer's forwards (π_old, every update's π_θ, and the
    /// SFT warm-up), with straight-through gradients to the f32 weights
    /// (quantization-aware training). The policy being optimised is then the one the engine
    /// samples from, and the engine/trainer log-prob gap falls to f32 rounding on most
    /// tokens. The reference and the critic stay f32. Default `"f32"`.
    pub trainer_precision: oxalign_models::Precision,
    /// Held-out accuracy (greedy and sampled, the measurement taken before and after RL)
    /// every this many RL steps and after the last, on the engine's weights after the step's
    /// refit: `heldout_greedy` / `heldout_sampled` in `metrics.jsonl`, a line in the table,
    /// a chart on the dashboard and points of the end-of-run picture. It changes nothing the
    /// run trains on. 0 = only before and after RL. Default `0`.
    pub eval_every: u64,
    /// Rollout samples each RL step logs: the first this many of its batch (prompt, decoded
    /// completion, reward, reference answer, finish reason), one line each in the run's
    /// `samples.jsonl` and the dashboard's "Samples" table (TRL's `log_completions`).
    /// 0 = none. Default `4`.
    pub log_samples: usize,
}

/// Largest `rl.max_staleness`: each version of lag is one more batch held in memory.
pub(crate) const MAX_STALENESS: u64 = 8;

/// The truncated-IS cap of stale batches when the recipe sets none (veRL's and the TIS
/// paper's `C = 2`).
pub(crate) const STALE_TIS_CAP: f64 = 2.0;

impl RlSection {
    /// The loss aggregation in force: the recipe's, or the algorithm's own default.
    /// GSPO's sequence-level ratio comes with its sequence-level average
    /// (`seq_mean_token_mean`): token-mean would weight long responses more, the length
    /// bias GSPO removes.
    pub fn loss_agg(&self) -> LossAggKind {
        match (self.loss_agg_choice, self.algorithm, self.policy_loss) {
            (Some(a), _, _) => a,
            (None, Algorithm::DrGrpo, _) => LossAggKind::SeqMeanTokenSumNorm,
            (None, _, PolicyObjective::Gspo) => LossAggKind::SeqMeanTokenMean,
            (None, _, _) => LossAggKind::TokenMean,
        }
    }

    /// The round cap of dynamic sampling: the recipe's, or 3.
    pub fn dynamic_sampling_max_rounds(&self) -> usize {
        self.dynamic_sampling_max_rounds.unwrap_or(3)
    }

    /// The rollout correction in force: the recipe's, or `token_tis` when only `tis_cap` is
    /// set or the batches may be stale (`max_staleness ≥ 1`).
    pub fn rollout_correction(&self) -> RolloutCorrectionKind {
        match (self.rollout_correction_choice, self.tis_cap) {
            (Some(c), _) => c,
            (None, Some(_)) => RolloutCorrectionKind::TokenTis,
            (None, None) if self.max_staleness > 0 => RolloutCorrectionKind::TokenTis,
            (None, None) => RolloutCorrectionKind::None,
        }
    }

    /// The cap of `token_tis` in force: the recipe's, or [`STALE_TIS_CAP`] for the default
    /// correction of stale batches.
    pub fn tis_cap_in_force(&self) -> Option<f64> {
        let stale_tis =
            self.max_staleness > 0 && self.rollout_correction() == RolloutCorrectionKind::TokenTis;
        self.tis_cap.or(stale_tis.then_some(STALE_TIS_CAP))
    }

    /// The `[low, high]` band of kept ratios of `seq_mask` and `icepop`: the recipe's, or
    /// `[0.5, 2]` (`seq_mask`) and `[0.5, 5]` (`icepop`).
    pub fn rollout_mask_band(&self) -> (f64, f64) {
        let high = match self.rollout_correction() {
            RolloutCorrectionKind::Icepop => 5.0,
            _ => 2.0,
        };
        (
            self.rollout_mask_low.unwrap_or(0.5),
            self.rollout_mask_high.unwrap_or(high),
        )
    }

    /// The distribution rollouts are sampled from, the one every policy and reference
    /// log-prob of the step is taken under: `softmax(logits / temperature)` over the top-k /
    /// top-p kept set (the model's own distribution for greedy decoding).
    pub fn rollout_distribution(&self) -> oxalign_models::TokenDistribution {
        oxalign_models::TokenDistribution::of_sampling(self.temperature, self.top_k, self.top_p)
    }
}

impl Default for RlSection {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::Ppo,
            prompts_per_step: 32,
            samples_per_prompt: 1,
            ppo_epochs: 1,
            minibatch_size: 32,
            lr: 1e-5,
            lr_schedule: RlLrSchedule::Constant,
            critic_lr: 1e-4,
            clip_eps: 0.2,
            clip_eps_high: None,
            policy_loss: PolicyObjective::Ppo,
            dual_clip: None,
            value_clip: 0.2,
            gamma: 1.0,
            lam: 0.95,
            entropy_coef: 0.0,
            kl_coef: 0.05,
            kl_estimator: KlEstimator::K1,
            kl_mode: KlMode::Reward,
            kl_target: None,
            kl_horizon: 10000.0,
            loss_agg_choice: None,
            whiten_advantages: true,
            max_grad_norm: 1.0,
            tis_cap: None,
            rollout_correction_choice: None,
            rollout_mask_low: None,
            rollout_mask_high: None,
            max_new_tokens: 16,
            truncated: Truncation::Terminal,
            overlong_buffer: None,
            overlong_penalty: 1.0,
            distill_reward_coef: 0.0,
            dynamic_sampling: false,
            dynamic_sampling_max_rounds: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_staleness: 0,
            routing_replay: false,
            trainer_precision: oxalign_models::Precision::F32,
            packing: false,
            eval_every: 0,
            log_samples: 4,
        }
    }
}

/// `[placement]`: the device group of each role (`"cpu"`, `"cpu:0,cpu:1"`, `"cuda:0"`, ...).
///
/// Roles may share devices (colocation). With N devices a role runs N data-parallel replicas.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementSection {
    /// Default `"cpu"`.
    pub policy: String,
    /// Default `"cpu"`.
    pub reference: String,
    /// Default `"cpu"`.
    pub reward: String,
    /// Default `"cpu"`.
    pub critic: String,
    /// How the training roles (policy and critic) use their group: `"replicated"` (every
    /// replica holds the whole model, gradients and AdamW state; gradients are all-reduced) or
    /// `"sharded"` (FSDP / ZeRO-3 style: each replica holds 1/N of the parameters, gradients
    /// and AdamW state, gathers the model for each step and frees it after; gradients are
    /// reduce-scattered). Same updates either way, to f32 rounding. `"sharded"` needs CPU
    /// devices, `engine.quant = "none"` and `run.kind = "rl"` or `"sft"`. Default
    /// `"replicated"`.
    pub sharding: Sharding,
    /// Expert parallelism of a mixture-of-experts policy: with `N > 1` the policy's `N`
    /// devices each hold `1/N` of the routed experts (rank `r` the experts `e mod N == r`),
    /// its trainers exchange token rows with all-to-all in every sparse layer, and its
    /// engines hold the same experts and run every generation together, adding their
    /// experts' partial outputs with an all-reduce. Needs a MoE policy whose `num_experts`
    /// `N` divides, `placement.policy` with exactly `N` CPU devices, `sharding =
    /// "replicated"`, `engine.quant = "none"`, `run.kind = "rl"` or `"sft"`, and batches that
    /// give every rank rows. Default 1 (every device holds every expert).
    pub expert_parallel: usize,
    /// The policy's rollout engine as a role of its own (`"cpu"`, `"cpu:0,cpu:1"`, or on a
    /// worker node, `"node2:cpu"`), as veRL, OpenRLHF and slime place rollout engines apart
    /// from trainers: generation goes there, and each refit sends the trainer's weights in
    /// buckets of `cluster.refit_bucket_mb`, checksummed per tensor and verified by the
    /// log-prob probe. Needs `run.kind = "rl"`, a policy in this process, `expert_parallel =
    /// 1` and `rl.routing_replay = false`. Default none: the policy's engine lives with its
    /// trainers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// `placement.sharding`: replicated or sharded (FSDP) training roles.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Every replica holds everything; gradients are all-reduced.
    #[default]
    Replicated,
    /// Each replica holds 1/N of parameters, gradients and optimizer state.
    Sharded,
}

impl Default for PlacementSection {
    fn default() -> Self {
        Self {
            policy: "cpu".into(),
            reference: "cpu".into(),
            reward: "cpu".into(),
            critic: "cpu".into(),
            sharding: Sharding::Replicated,
            expert_parallel: 1,
            engine: None,
        }
    }
}

/// `[engine]`: the policy's generation engine (paged KV cache, continuous batching).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    /// Tokens per KV block. Default `16`.
    pub block_size: usize,
    /// KV cache budget per policy replica, in MiB. Default `256`.
    pub kv_memory_mb: usize,
    /// Most tokens (prefill chunks + decode) per engine step. Default `2048`.
    pub max_batched_tokens: usize,
    /// Most sequences running at once. Default `256`.
    pub max_running: usize,
    /// Keep the KV blocks of finished sequences, at the served weights, for later requests
    /// that start with the same tokens (the next turn of an episode, a shared system
    /// prompt). Default `true`; every refit clears them.
    pub prefix_cache: bool,
    /// Weight precision for rollouts: `none`, `bf16`, `int8` or `q4`. Default `"none"`.
    pub quant: QuantMode,
    /// Largest allowed |Δ log-prob| between engine and trainer on the refit probe, per nat
    /// of the log-prob's magnitude: `|Δ| ≤ refit_tolerance · max(1, |log-prob|)`. Default
    /// `1e-4` (f32); raise it for quantized engines.
    pub refit_tolerance: f64,
}

impl Default for EngineSection {
    fn default() -> Self {
        Self {
            block_size: 16,
            kv_memory_mb: 256,
            max_batched_tokens: 2048,
            max_running: 256,
            prefix_cache: true,
            quant: QuantMode::None,
            refit_tolerance: 1e-4,
        }
    }
}

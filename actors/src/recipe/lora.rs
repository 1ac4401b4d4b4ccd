//! `[lora]`: train LoRA adapters instead of every weight (PEFT's keys), and the door
//! checks of a recipe that has the section. The adapters themselves are
//! `oxalign_models::lora`; which trainers wear them is `controller/setup.rs`'s.

use super::{Recipe, RecipeError, Sharding};
use oxalign_models::{LoraConfig, Precision};
use serde::{Deserialize, Serialize};

/// `[lora]`: when present, every trainer of the run (SFT, reward model, DPO, the RL policy
/// and critic) trains adapters on its linear layers and keeps the base weights frozen.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    /// Rank of each adapter. Default 16.
    pub r: usize,
    /// The scale's numerator: updates are `(alpha / r)·B·A`. Default 32.
    #[serde(alias = "lora_alpha")]
    pub alpha: f64,
    /// Dropout on the adapter's input in the forwards of SFT, the reward model, DPO and the
    /// critic (never the RL policy's loss, whose ratio to π_old must be 1 on-policy), `0 <= p
    /// < 1`. Default 0.
    #[serde(alias = "lora_dropout")]
    pub dropout: f64,
    /// The linear layers with adapters: `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
    /// `up_proj`, `down_proj`, or `all-linear`. Default `["all-linear"]`.
    pub target_modules: Vec<String>,
    /// Head modules trained whole (e.g. `lm_head`); a reward model's or critic's `score`
    /// always is. Default none.
    pub modules_to_save: Vec<String>,
    /// rsLoRA's scale `alpha / √r`. Default false.
    pub use_rslora: bool,
    /// A PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) the
    /// policy starts from instead of fresh adapters; its own settings then apply. Default
    /// none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// The dtype the frozen base's projection weights are kept in: `"f32"`, or `"bf16"`
    /// (half their bytes; forwards widen them exactly to f32, adapters and their optimizer
    /// stay f32, merged weights are f32). Default `"f32"`.
    pub base_dtype: BaseDtype,
    /// Whether the SFT warm-up before RL trains adapters too. `false`: the warm-up trains
    /// every weight and RL's adapters start on its result (the frozen reference). Default
    /// true.
    pub warmup: bool,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.0,
            target_modules: vec!["all-linear".into()],
            modules_to_save: vec![],
            use_rslora: false,
            adapter: None,
            base_dtype: BaseDtype::F32,
            warmup: true,
        }
    }
}

/// `lora.base_dtype`: how the frozen base is stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BaseDtype {
    /// As loaded, f32.
    #[default]
    F32,
    /// The projections rounded to bf16 once, at load.
    Bf16,
}

impl BaseDtype {
    /// The tensor dtype.
    pub fn dtype(self) -> candle_core::DType {
        match self {
            BaseDtype::F32 => candle_core::DType::F32,
            BaseDtype::Bf16 => candle_core::DType::BF16,
        }
    }
}

impl Recipe {
    /// The recipe the SFT warm-up before RL trains with: without `[lora]` when
    /// `lora.warmup = false`.
    pub fn warmup_recipe(&self) -> std::borrow::Cow<'_, Recipe> {
        match &self.lora {
            Some(l) if !l.warmup => {
                let mut r = self.clone();
                r.lora = None;
                std::borrow::Cow::Owned(r)
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }
}

impl LoraSection {
    /// The adapter settings.
    pub fn config(&self) -> LoraConfig {
        LoraConfig {
            r: self.r,
            alpha: self.alpha,
            dropout: self.dropout,
            target_modules: self.target_modules.clone(),
            modules_to_save: self.modules_to_save.clone(),
            use_rslora: self.use_rslora,
        }
    }
}

/// Refuses bad adapter settings, an `adapter` that is no PEFT folder, and what LoRA does
/// not support yet: sharded training (the shards would be the adapters while the frozen
/// base streams).
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let Some(l) = &r.lora else {
        return Ok(());
    };
    if let Err(e) = l.config().check() {
        let (key, message) = match e {
            oxalign_models::LoraError::Setting { key, message } => (format!("lora.{key}"), message),
            other => ("lora".into(), other.to_string()),
        };
        return Err(bad(&key, message));
    }
    if let Some(a) = &l.adapter {
        let file = std::path::Path::new(a).join(oxalign_models::lora::ADAPTER_CONFIG_FILE);
        if !file.is_file() {
            return Err(bad(
                "lora.adapter",
                format!("{a}: no adapter_config.json (expected a PEFT LoRA adapter folder)"),
            ));
        }
    }
    if r.placement.sharding == Sharding::Sharded {
        return Err(bad(
            "lora",
            "LoRA with placement.sharding = \"sharded\" is not supported; use \"replicated\""
                .into(),
        ));
    }
    if l.base_dtype == BaseDtype::Bf16 && r.policy_precision() == Precision::FakeInt8 {
        return Err(bad(
            "lora.base_dtype",
            "a bf16 base with rl.trainer_precision = \"fake_int8\" is not supported (the \
             int8 fake quantization reads f32 weights); use base_dtype = \"f32\""
                .into(),
        ));
    }
    if policy_family(r) == Some(oxalign_models::Family::Phi3) {
        return Err(bad(
            "lora",
            "LoRA on Phi-3's fused qkv_proj / gate_up_proj is not supported yet; train every \
             weight (no [lora])"
                .into(),
        ));
    }
    Ok(())
}

/// The policy's family, from `model.path`'s config.json or `model.init_family`; `None`
/// when neither can be read (other checks name that).
fn policy_family(r: &Recipe) -> Option<oxalign_models::Family> {
    match &r.model.path {
        Some(p) => {
            oxalign_models::ModelConfig::from_file(&std::path::Path::new(p).join("config.json"))
                .ok()
                .map(|c| c.family)
        }
        None => r.model.init_family.parse().ok(),
    }
}

//! `RewardModel`: a sequence scorer in HF `*ForSequenceClassification` layout — the decoder plus
//! `score.weight` `[1, H]` (no bias), read at the last real token of each row. Trainable (for
//! Bradley–Terry training); the loss itself lives in `oxalign-rlhf`.

use crate::checkpoint::{read_checkpoint, write_checkpoint};
use crate::config::ModelConfig;
use crate::decoder::Decoder;
use crate::error::Result;
use crate::head_params::{check_one_label, classifier_config, head_store};
use crate::layers::linear;
use crate::mask::mask_to_host;
use crate::param_spec::{backbone_specs, init_tensors, reward_head_specs};
use crate::param_store::ParamStore;
use candle_core::{DType, Device, Tensor, Var, D};
use std::collections::HashMap;
use std::path::Path;

/// Decoder + scalar sequence score (`score.weight` `[1, H]`, no bias).
#[derive(Clone)]
pub struct RewardModel {
    config: ModelConfig,
    params: ParamStore,
    decoder: Decoder,
    score_w: Tensor,
}

impl RewardModel {
    fn build(config: ModelConfig, params: ParamStore) -> Result<RewardModel> {
        let decoder = Decoder::new(&config, &params)?;
        Ok(RewardModel {
            score_w: params.get("score.weight")?,
            config,
            params,
            decoder,
        })
    }

    /// Builds from named tensors (backbone `model.*` plus `score.weight`).
    pub fn from_weights(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<RewardModel> {
        let params = head_store(
            &config,
            &reward_head_specs(&config),
            tensors,
            Path::new("<weights map>"),
            None,
            dtype,
            device,
        )?;
        Self::build(config, params)
    }

    /// Builds from backbone tensors (`model.*`, e.g. an SFT policy's weights); `score.weight`
    /// is used when present, else initialised with `head_seed`.
    pub fn from_backbone(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        head_seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<RewardModel> {
        let params = head_store(
            &config,
            &reward_head_specs(&config),
            tensors,
            Path::new("<weights map>"),
            Some(head_seed),
            dtype,
            device,
        )?;
        Self::build(config, params)
    }

    /// Random init (f32): Normal(0, 0.02) weights, ones for norms, zero biases.
    pub fn init_random(config: &ModelConfig, seed: u64, device: &Device) -> Result<RewardModel> {
        Self::init_random_with_dtype(config, seed, DType::F32, device)
    }

    /// [`RewardModel::init_random`] in another dtype (f64 for gradient checks).
    pub fn init_random_with_dtype(
        config: &ModelConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<RewardModel> {
        config.validate()?;
        let mut specs = backbone_specs(config);
        specs.extend(reward_head_specs(config));
        let tensors = init_tensors(&specs, seed, dtype, device)?;
        Self::from_weights(config.clone(), &tensors, dtype, device)
    }

    /// Loads an HF `*ForSequenceClassification` folder with `num_labels = 1`.
    pub fn load(dir: &Path, device: &Device) -> Result<RewardModel> {
        let (config, tensors) = read_checkpoint(dir, device)?;
        check_one_label(&config, dir)?;
        let params = head_store(
            &config,
            &reward_head_specs(&config),
            &tensors,
            dir,
            None,
            DType::F32,
            device,
        )?;
        Self::build(config, params)
    }

    /// Loads the backbone of any HF folder of a supported family (e.g. an SFT model to start
    /// reward-model training from); a missing `score.weight` is initialised with `head_seed`.
    pub fn load_with_new_head(dir: &Path, head_seed: u64, device: &Device) -> Result<RewardModel> {
        let (config, tensors) = read_checkpoint(dir, device)?;
        let params = head_store(
            &config,
            &reward_head_specs(&config),
            &tensors,
            dir,
            Some(head_seed),
            DType::F32,
            device,
        )?;
        Self::build(config, params)
    }

    /// Writes an HF `*ForSequenceClassification` folder (num_labels = 1, f32). Set
    /// `config.pad_token_id` before saving if HF should score padded batches.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let arch = self.config.family.architecture("ForSequenceClassification");
        write_checkpoint(dir, &classifier_config(&self.config), &arch, &self.params)
    }

    /// Score of every position `[B, T]` (before pooling). Differentiable.
    pub fn token_scores(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let h = self.decoder.forward(input_ids, attention_mask, None)?;
        linear(&h, &self.score_w, None)?.squeeze(D::Minus1)
    }

    /// Sequence scores `[B]`: the score at the last position whose `attention_mask` is 1
    /// (the last position when no mask is given). Works for left and right padding.
    /// Differentiable.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let scores = self.token_scores(input_ids, attention_mask)?;
        let last: Vec<u32> = match attention_mask {
            None => vec![(t - 1) as u32; b],
            Some(m) => {
                let m = mask_to_host(m, b, t)?;
                (0..b)
                    .map(|r| {
                        let row = &m[r * t..(r + 1) * t];
                        row.iter().rposition(|&x| x != 0).unwrap_or(t - 1) as u32
                    })
                    .collect()
            }
        };
        let idx = Tensor::from_vec(last, (b, 1), scores.device())?;
        scores.gather(&idx, 1)?.squeeze(1)
    }

    /// The model config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The trainable parameters.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// `(name, Var)` for every trainable parameter, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.params.vars()
    }

    /// Detached copies of all weights, keyed by HF name.
    pub fn weights(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        self.params.snapshot()
    }

    /// Overwrites all weights in place (every parameter required, shapes checked).
    pub fn load_weights_from(&self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        self.params.load_from(tensors)
    }

    /// Device of the weights.
    pub fn device(&self) -> &Device {
        self.params.device()
    }

    /// Dtype of the weights.
    pub fn dtype(&self) -> DType {
        self.params.dtype()
    }
}

//! `ValueModel`: the critic — the decoder plus a `score` Linear(H, 1) with bias giving one
//! scalar per token, stored like HF `*ForTokenClassification` with `num_labels = 1`.
//! It does not compute returns or value losses (that is `oxalign-rlhf`).

use crate::checkpoint::{read_checkpoint, write_checkpoint};
use crate::config::ModelConfig;
use crate::decoder::Decoder;
use crate::error::Result;
use crate::head_params::{check_one_label, classifier_config, head_store};
use crate::layers::linear;
use crate::param_spec::{backbone_specs, init_tensors, value_head_specs};
use crate::param_store::ParamStore;
use candle_core::{DType, Device, Tensor, Var, D};
use std::collections::HashMap;
use std::path::Path;

/// Decoder + per-token scalar value head (`score.weight` `[1, H]`, `score.bias` `[1]`).
#[derive(Clone)]
pub struct ValueModel {
    config: ModelConfig,
    params: ParamStore,
    decoder: Decoder,
    score_w: Tensor,
    score_b: Tensor,
}

impl ValueModel {
    fn build(config: ModelConfig, params: ParamStore) -> Result<ValueModel> {
        let decoder = Decoder::new(&config, &params)?;
        Ok(ValueModel {
            score_w: params.get("score.weight")?,
            score_b: params.get("score.bias")?,
            config,
            params,
            decoder,
        })
    }

    /// Builds from named tensors (backbone `model.*` plus `score.weight`/`score.bias`).
    pub fn from_weights(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<ValueModel> {
        let params = head_store(
            &config,
            &value_head_specs(&config),
            tensors,
            Path::new("<weights map>"),
            None,
            dtype,
            device,
        )?;
        Self::build(config, params)
    }

    /// Builds from backbone tensors (`model.*`, e.g. a policy's or reward model's weights);
    /// `score.*` tensors are used when present, else initialised with `head_seed`.
    pub fn from_backbone(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        head_seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<ValueModel> {
        let params = head_store(
            &config,
            &value_head_specs(&config),
            tensors,
            Path::new("<weights map>"),
            Some(head_seed),
            dtype,
            device,
        )?;
        Self::build(config, params)
    }

    /// Random init (f32): Normal(0, 0.02) weights, ones for norms, zero biases.
    pub fn init_random(config: &ModelConfig, seed: u64, device: &Device) -> Result<ValueModel> {
        Self::init_random_with_dtype(config, seed, DType::F32, device)
    }

    /// [`ValueModel::init_random`] in another dtype (f64 for gradient checks).
    pub fn init_random_with_dtype(
        config: &ModelConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<ValueModel> {
        config.validate()?;
        let mut specs = backbone_specs(config);
        specs.extend(value_head_specs(config));
        let tensors = init_tensors(&specs, seed, dtype, device)?;
        Self::from_weights(config.clone(), &tensors, dtype, device)
    }

    /// Loads an HF `*ForTokenClassification` folder (`score.weight` and `score.bias` required).
    pub fn load(dir: &Path, device: &Device) -> Result<ValueModel> {
        let (config, tensors) = read_checkpoint(dir, device)?;
        check_one_label(&config, dir)?;
        let params = head_store(
            &config,
            &value_head_specs(&config),
            &tensors,
            dir,
            None,
            DType::F32,
            device,
        )?;
        Self::build(config, params)
    }

    /// Loads the backbone of any HF folder of a supported family (causal LM, reward model,
    /// critic); `score.*` tensors missing from it are initialised with `head_seed`.
    pub fn load_with_new_head(dir: &Path, head_seed: u64, device: &Device) -> Result<ValueModel> {
        let (config, tensors) = read_checkpoint(dir, device)?;
        let params = head_store(
            &config,
            &value_head_specs(&config),
            &tensors,
            dir,
            Some(head_seed),
            DType::F32,
            device,
        )?;
        Self::build(config, params)
    }

    /// Writes an HF `*ForTokenClassification` folder (num_labels = 1, f32).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let arch = self.config.family.architecture("ForTokenClassification");
        write_checkpoint(dir, &classifier_config(&self.config), &arch, &self.params)
    }

    /// Values `[B, T]` (one scalar per token; same masking/positions as
    /// `CausalLm::forward`). Differentiable.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let h = self.decoder.forward(input_ids, attention_mask, None)?;
        linear(&h, &self.score_w, Some(&self.score_b))?.squeeze(D::Minus1)
    }

    /// Values `[B, T]` of packed rows (`segments`: row-major `[B, T]` segment ids; see
    /// `Decoder::forward_packed`): each segment's values equal those of its sequence alone.
    pub fn forward_packed(
        &self,
        input_ids: &Tensor,
        segments: &[u32],
    ) -> candle_core::Result<Tensor> {
        let h = self.decoder.forward_packed(input_ids, segments)?;
        linear(&h, &self.score_w, Some(&self.score_b))?.squeeze(D::Minus1)
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

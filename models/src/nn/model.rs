//! `Model<H>`: one backbone (the decoder and its trainable weights) wearing a head `H`. Every
//! constructor (from tensors, random init, HF folders, a backbone with a new head), save,
//! and the weight accessors live here once; `CausalLm`, `ValueModel` and `RewardModel` are
//! this type with their head, and their files add only the head's forward math.

use crate::config::model_config::ModelConfig;
use crate::config::param_spec::{init_tensors, ParamSpec};
use crate::error::{ModelError, Result};
use crate::io::checkpoint::{read_checkpoint, write_checkpoint, CONFIG_FILE};
use crate::io::param_store::ParamStore;
use crate::lora::parts::LoraParts;
use crate::moe::expert_parallel::{gather_experts, ExpertNames, ExpertParallel};
use crate::nn::checkpointing::Checkpointing;
use crate::nn::decoder::Decoder;
use crate::nn::head::Head;
use crate::nn::precision::Precision;
use candle_core::{DType, Device, Tensor, Var};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

/// A decoder backbone with head `H`, HF tensor names throughout.
///
/// Weights are trainable `Var`s in a `candle_nn::VarMap` ([`Model::params`]); every forward
/// is differentiable with respect to them. `clone()` shares those weights (same `Var`s); use
/// [`Model::deep_clone`] for an independent copy (e.g. a frozen reference model).
#[derive(Clone)]
pub struct Model<H: Head> {
    pub(crate) config: ModelConfig,
    pub(crate) params: ParamStore,
    pub(crate) decoder: Decoder,
    pub(crate) head: H,
    /// The expert-parallel group when this rank holds only its share of the routed experts.
    pub(crate) ep: Option<ExpertParallel>,
    /// The numbers the linear layers compute in (the LM head's included).
    pub(crate) precision: Precision,
    /// With LoRA adapters: their settings and the frozen base weights (`params` then holds
    /// only what trains: the adapters and any module trained whole). See `lora_model.rs`.
    pub(crate) lora: Option<LoraParts>,
}

const WEIGHTS_MAP: &str = "<weights map>";

impl<H: Head> Model<H> {
    /// Every parameter of this model under `config`: the backbone's, then the head's, in the
    /// order random init draws them.
    pub fn param_specs(config: &ModelConfig) -> Vec<ParamSpec> {
        let mut specs = config.backbone_params().specs();
        specs.extend(H::params(config));
        specs
    }

    /// Builds the model over `params` (which hold exactly [`Model::param_specs`]).
    pub(crate) fn build(config: ModelConfig, params: ParamStore) -> Result<Self> {
        Self::build_with(config, params, None)
    }

    /// [`Self::build`] with the routed experts spread over `ep` (`params` holds this rank's).
    fn build_with(
        config: ModelConfig,
        params: ParamStore,
        ep: Option<ExpertParallel>,
    ) -> Result<Self> {
        let decoder = Decoder::with_experts(&config, &params, ep.as_ref())?;
        let head = H::bind(&config, &params, &decoder)?;
        Ok(Model {
            config,
            params,
            decoder,
            head,
            ep,
            precision: Precision::F32,
            lora: None,
        })
    }

    /// Makes every linear layer the engine may quantize (attention, MLPs, experts, the LM
    /// head) compute in `precision`; routers, norms and embeddings stay f32. With
    /// [`Precision::FakeInt8`] the forwards see the int8 engine's numbers and gradients pass
    /// straight through the rounding ([`crate::nn::fake_quant`]). CPU only.
    pub fn set_precision(&mut self, precision: Precision) {
        self.decoder.set_precision(precision);
        self.precision = precision;
    }

    /// Streams the decoder layers' weights through `residency` (a sharded trainer: each
    /// layer gathered just before it runs, forward and backward, and freed after; see
    /// [`Decoder::set_layer_residency`]). `None`: every weight always present. The embedding's
    /// and the LM head's weight gradients go back to candle's backward.
    pub fn set_layer_residency(
        &mut self,
        residency: Option<std::sync::Arc<dyn crate::nn::layer_residency::LayerResidency>>,
    ) {
        self.decoder.set_layer_residency(residency);
    }

    /// Turns on activation checkpointing (`nn/checkpointing.rs`): every forward without a
    /// KV cache keeps only each decoder layer's input, and the backward recomputes the
    /// layers one at a time. The returned handle collects the gradients of the trainable
    /// weights inside the layers; the trainer adds them to the loss's own. CPU only.
    pub fn checkpoint_activations(&mut self) -> std::sync::Arc<Checkpointing> {
        let vars = self.vars().into_iter().map(|(_, v)| v).collect();
        let checkpoint = std::sync::Arc::new(Checkpointing::new(vars));
        self.set_layer_residency(Some(checkpoint.clone()));
        self.collect_table_gradients(checkpoint.clone());
        checkpoint
    }

    /// Turns on the layerwise backward (`nn/checkpointing.rs`): every forward without a KV
    /// cache keeps each decoder layer's graph apart, and the backward frees each layer's
    /// activations as soon as that layer is done (no recompute: the same arithmetic as the
    /// plain backward). The returned handle collects the gradients of the trainable weights
    /// inside the layers; the trainer adds them to the loss's own. CPU only.
    pub fn layerwise_backward(&mut self) -> std::sync::Arc<Checkpointing> {
        let vars = self.vars().into_iter().map(|(_, v)| v).collect();
        let layerwise = std::sync::Arc::new(Checkpointing::layerwise(vars));
        self.set_layer_residency(Some(layerwise.clone()));
        self.collect_table_gradients(layerwise.clone());
        layerwise
    }

    /// Hands the embedding's and the LM head's weight gradients to `collector` instead of
    /// candle's accumulation (`zeros + grad`, three `[V, H]` tensors at once). Not for tied
    /// weights: there the table's two gradients must be summed in candle's order to stay the
    /// plain backward's to the bit.
    fn collect_table_gradients(&mut self, collector: std::sync::Arc<Checkpointing>) {
        if !self.config.tie_word_embeddings {
            self.decoder.set_gradient_sink(Some(collector));
        }
    }

    /// The numbers the linear layers compute in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// This model as rank `ep.rank()` of an expert-parallel group: a new store (copies of
    /// the weights) with every parameter except the routed experts other ranks own (rank `r`
    /// keeps experts `e mod world == r` of each sparse layer), and a forward that exchanges
    /// token rows with the other ranks in each sparse layer (every rank must run the same
    /// forwards). Errors ([`ModelError::ExpertParallel`]) for a dense model, a model already
    /// spread, or a group that does not divide the number of experts.
    pub fn with_expert_parallel(&self, ep: ExpertParallel) -> Result<Self> {
        let world = ep.world();
        let bad = |message: String| ModelError::ExpertParallel { world, message };
        if self.lora.is_some() {
            return Err(bad(
                "a model with LoRA adapters cannot spread its experts".into()
            ));
        }
        if self.ep.is_some() {
            return Err(bad("the model's experts are already spread".into()));
        }
        let Some(moe) = &self.config.moe else {
            return Err(bad("the model has no experts (not a MoE family)".into()));
        };
        if world == 0 || !moe.num_experts.is_multiple_of(world) {
            return Err(bad(format!(
                "num_experts = {} is not a multiple of the group size",
                moe.num_experts
            )));
        }
        let names = ExpertNames::of(&self.config);
        let specs: Vec<ParamSpec> = Self::param_specs(&self.config)
            .into_iter()
            .filter(|s| ep.keeps(&names, &s.name))
            .collect();
        let source = Path::new(WEIGHTS_MAP);
        let params = ParamStore::from_tensors(
            &specs,
            &self.weights()?,
            source,
            self.dtype(),
            self.device(),
        )?;
        Self::build_with(self.config.clone(), params, Some(ep))
    }

    /// The expert-parallel group, when this model holds only its rank's experts.
    pub fn expert_parallel(&self) -> Option<&ExpertParallel> {
        self.ep.as_ref()
    }

    /// Detached copies of all weights with every rank's experts (HF names, the whole model).
    /// Expert-parallel: every rank of the group must call it (an all-gather); otherwise the
    /// same as [`Model::weights`].
    pub fn full_weights(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        let mut all = self.weights()?;
        if let Some(ep) = &self.ep {
            let names = ExpertNames::of(&self.config);
            all.extend(gather_experts(ep, &names, &all)?);
        }
        Ok(all)
    }

    /// Builds the store from `tensors` (every parameter required) or, with
    /// `new_head_seed = Some(seed)`, initialises head tensors missing from `tensors`
    /// (present ones must still have the right shape). Errors name `source`.
    fn assemble(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        source: &Path,
        new_head_seed: Option<u64>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        config.validate()?;
        let specs = Self::param_specs(&config);
        let missing: Vec<ParamSpec> = match new_head_seed {
            None => vec![],
            Some(_) => H::params(&config)
                .into_iter()
                .filter(|s| !tensors.contains_key(&s.name))
                .collect(),
        };
        let params = match new_head_seed {
            Some(seed) if !missing.is_empty() => {
                let mut all = tensors.clone();
                all.extend(init_tensors(&missing, seed, dtype, device)?);
                ParamStore::from_tensors(&specs, &all, source, dtype, device)?
            }
            _ => ParamStore::from_tensors(&specs, tensors, source, dtype, device)?,
        };
        Self::build(config, params)
    }

    /// Builds a model from named tensors (HF names), converted to `dtype` on `device`.
    /// Errors name any missing tensor or shape mismatch; extra tensors are ignored.
    pub fn from_weights(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::assemble(config, tensors, Path::new(WEIGHTS_MAP), None, dtype, device)
    }

    /// Builds from backbone tensors (`model.*`, e.g. another head's weights); head tensors
    /// are used when present, else initialised with `head_seed`.
    pub fn from_backbone(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        head_seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let source = Path::new(WEIGHTS_MAP);
        Self::assemble(config, tensors, source, Some(head_seed), dtype, device)
    }

    /// An independent copy (own `Var`s, same values, same dtype and device; adapters and
    /// base both copied for a LoRA model).
    pub fn deep_clone(&self) -> Result<Self> {
        if self.lora.is_some() {
            return self.deep_clone_lora();
        }
        let specs: Vec<ParamSpec> = self.params.specs().to_vec();
        let source = Path::new(WEIGHTS_MAP);
        let params = ParamStore::from_tensors(
            &specs,
            &self.weights()?,
            source,
            self.dtype(),
            self.device(),
        )?;
        Self::build_with(self.config.clone(), params, self.ep.clone())
    }

    /// Random init with seed `seed` in f32: Normal(0, 0.02) for linear/embedding weights, ones
    /// for norms, zeros for biases (the kinds' rule, `param_spec.rs`).
    pub fn init_random(config: &ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        Self::init_random_with_dtype(config, seed, DType::F32, device)
    }

    /// [`Model::init_random`] in another dtype (f64 is used by gradient checks).
    pub fn init_random_with_dtype(
        config: &ModelConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        config.validate()?;
        let tensors = init_tensors(&Self::param_specs(config), seed, dtype, device)?;
        Self::from_weights(config.clone(), &tensors, dtype, device)
    }

    /// Loads an HF model folder of this head: `config.json` + `model.safetensors` (or the
    /// shards of `model.safetensors.index.json`), as f32 on `device`. Scalar heads check that
    /// the config describes one label.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let (config, tensors) = read_checkpoint(dir, device)?;
        if H::SCALAR {
            check_one_label(&config, dir)?;
        }
        Self::assemble(config, &tensors, dir, None, DType::F32, device)
    }

    /// Loads the backbone of any HF folder of a supported family (causal LM, reward model,
    /// critic); head tensors missing from it are initialised with `head_seed`.
    pub fn load_with_new_head(dir: &Path, head_seed: u64, device: &Device) -> Result<Self> {
        let (config, tensors) = read_checkpoint(dir, device)?;
        Self::assemble(config, &tensors, dir, Some(head_seed), DType::F32, device)
    }

    /// Writes `config.json` (`architectures: [<Family><Head>]`; one label for scalar heads),
    /// `model.safetensors` (f32) and `generation_config.json` into `dir` (created if needed),
    /// loadable by the matching `transformers.AutoModelFor*.from_pretrained`. With LoRA
    /// adapters the weights are the merged ones and PEFT's adapter files are written beside
    /// them (`lora_model.rs`).
    ///
    /// Expert-parallel: every rank of the group must call it; the experts are gathered
    /// ([`Model::full_weights`]) and rank 0 writes the whole model (the others write nothing).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let arch = self.config.family.architecture(H::ARCHITECTURE);
        let config = if H::SCALAR {
            classifier_config(&self.config)
        } else {
            self.config.clone()
        };
        let Some(ep) = &self.ep else {
            return match &self.lora {
                None => write_checkpoint(dir, &config, &arch, &self.params),
                Some(_) => self.save_lora(dir, &config, &arch),
            };
        };
        let all = self.full_weights()?;
        if ep.rank() != 0 {
            return Ok(());
        }
        let specs = Self::param_specs(&self.config);
        let store = ParamStore::from_tensors(
            &specs,
            &all,
            Path::new(WEIGHTS_MAP),
            self.dtype(),
            self.device(),
        )?;
        write_checkpoint(dir, &config, &arch, &store)
    }

    /// The model config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The trainable parameters (with LoRA: the adapters and the modules trained whole).
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The underlying `VarMap` (HF names).
    pub fn varmap(&self) -> &candle_nn::VarMap {
        self.params.varmap()
    }

    /// `(name, Var)` for every trainable parameter, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.params.vars()
    }

    /// Detached copies of all weights, keyed by HF name (for refit / checkpoints); with LoRA
    /// adapters, the merged weights `W + (α/r)·B·A` (the model's function as a plain model).
    pub fn weights(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        match &self.lora {
            Some(_) => self.merged_weights(),
            None => self.params.snapshot(),
        }
    }

    /// Overwrites all trainable weights in place from `tensors` (every parameter of
    /// [`Model::params`] required, shapes checked, extra entries ignored; with LoRA the
    /// adapters). Existing clones of this model see the new values.
    pub fn load_weights_from(&self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        self.params.load_from(tensors)
    }

    /// Device of the weights.
    pub fn device(&self) -> &Device {
        self.params.device()
    }

    /// Dtype of the weights (f32 unless built with `init_random_with_dtype`).
    pub fn dtype(&self) -> DType {
        self.params.dtype()
    }

    /// The decoder body.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }
}

/// `config` with the HF keys of a one-label classifier (`id2label`/`label2id`, i.e.
/// `num_labels = 1`).
fn classifier_config(config: &ModelConfig) -> ModelConfig {
    let mut c = config.clone();
    c.extra.remove("num_labels");
    c.extra.insert("id2label".into(), json!({"0": "LABEL_0"}));
    c.extra.insert("label2id".into(), json!({"LABEL_0": 0}));
    c
}

/// Checks that a checkpoint config describes one label (when it says anything about labels).
fn check_one_label(config: &ModelConfig, source: &Path) -> Result<()> {
    let n = match (config.extra.get("num_labels"), config.extra.get("id2label")) {
        (Some(n), _) => n.as_u64().map(|n| n as usize),
        (None, Some(map)) => map.as_object().map(|m| m.len()),
        (None, None) => return Ok(()),
    };
    if n == Some(1) {
        Ok(())
    } else {
        Err(ModelError::InvalidConfig {
            path: source.join(CONFIG_FILE),
            key: "num_labels".into(),
            message: format!("scalar heads need exactly 1 label, found {n:?}"),
        })
    }
}

//! A model wearing LoRA adapters: [`Model::with_lora`] (fresh adapters, PEFT's init),
//! [`Model::load_adapter`] (a PEFT folder), the merged weights, saving as an HF folder with
//! PEFT's files beside it, and [`Model::base_model`] (the same weights with the adapters
//! off: a reference policy that costs no second copy).
//!
//! The base weights stay in their own store and are frozen: the layers bind detached
//! tensors of them ([`ParamStore::overlay`]), so the backward computes no gradient for them
//! and the optimizer, which works over [`Model::params`], sees only the adapters (and the
//! modules trained whole).

use crate::config::layout::FeedForwardParams;
use crate::config::model_config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::io::checkpoint::write_checkpoint_tensors;
use crate::io::param_store::ParamStore;
use crate::lora::config::{LoraConfig, LoraError};
use crate::lora::dropout::{AdapterBinding, DropoutScope, LoraDropout};
use crate::lora::init::fresh_adapters;
use crate::lora::merge::AdapterMerge;
use crate::lora::parts::LoraParts;
use crate::lora::peft_files::{read_adapter, write_adapter, ADAPTER_SUBDIR};
use crate::lora::targets::{adapter_specs, saved_modules, targeted_linears};
use crate::nn::decoder::Decoder;
use crate::nn::head::Head;
use crate::nn::model::Model;
use candle_core::{DType, Tensor};
use std::collections::HashMap;
use std::path::Path;

const ADAPTERS: &str = "<LoRA adapters>";

impl<H: Head> Model<H> {
    /// This model with fresh adapters (`A` uniform in `±1/√in`, seeded by `seed`; `B` zero, so
    /// the function is unchanged) on the linear layers `lora` targets, and copies of the
    /// `modules_to_save` parameters trained whole. The base weights are shared with `self`
    /// and frozen. Errors: a model that already has adapters or spreads its experts, bad
    /// settings ([`LoraError`]).
    pub fn with_lora(&self, lora: &LoraConfig, seed: u64) -> Result<Self> {
        let lora = &head_trained_whole::<H>(lora);
        let linears = targeted_linears(&self.config, lora).map_err(lora_error)?;
        let specs = adapter_specs(&linears, lora.r);
        let mut tensors = fresh_adapters(&specs, seed, self.dtype(), self.device())?;
        for spec in saved_modules(lora, &H::params(&self.config)).map_err(lora_error)? {
            tensors.insert(spec.name.clone(), self.params.get(&spec.name)?.detach());
        }
        self.with_adapters(lora, &tensors, Path::new(ADAPTERS))
    }

    /// This model with the adapters of the PEFT folder `dir` (`adapter_config.json`,
    /// `adapter_model.safetensors`). Errors name the file and the setting or tensor that
    /// does not fit (a missing adapter, a wrong shape, a tensor the settings do not explain).
    pub fn load_adapter(&self, dir: &Path) -> Result<Self> {
        let (mut lora, tensors) = read_adapter(dir, self.device())?;
        // PEFT lists modules it would train whole for a task (`classifier` for SEQ_CLS)
        // whether the model has them or not; only those the file holds count.
        lora.modules_to_save.retain(|m| {
            let (inner, start) = (format!(".{m}."), format!("{m}."));
            tensors
                .keys()
                .any(|n| n.starts_with(&start) || n.contains(&inner))
        });
        let path = dir.join(crate::lora::peft_files::ADAPTER_WEIGHTS_FILE);
        let tensors = tensors
            .into_iter()
            .map(|(n, t)| Ok((n, t.to_dtype(self.dtype())?)))
            .collect::<candle_core::Result<HashMap<_, _>>>()?;
        self.with_adapters(&lora, &tensors, &path)
    }

    /// Builds the LoRA model over `self`'s weights with the adapter set `tensors` (which
    /// must hold exactly what `lora` declares on this model; `source` names it in errors).
    fn with_adapters(
        &self,
        lora: &LoraConfig,
        tensors: &HashMap<String, Tensor>,
        source: &Path,
    ) -> Result<Self> {
        if self.lora.is_some() {
            return Err(lora_error(LoraError::Mismatch(
                "the model already has adapters".into(),
            )));
        }
        if self.ep.is_some() {
            return Err(lora_error(LoraError::Mismatch(
                "the model spreads its experts over a group".into(),
            )));
        }
        let linears = targeted_linears(&self.config, lora).map_err(lora_error)?;
        let mut specs = adapter_specs(&linears, lora.r);
        specs.extend(saved_modules(lora, &H::params(&self.config)).map_err(lora_error)?);
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        if let Some(extra) = names
            .into_iter()
            .find(|n| !specs.iter().any(|s| &s.name == *n))
        {
            return Err(lora_error(LoraError::Mismatch(format!(
                "{}: tensor `{extra}` is not an adapter these settings put on this model",
                source.display()
            ))));
        }
        let trainable =
            ParamStore::from_tensors(&specs, tensors, source, self.dtype(), self.device())?;
        let dropout = LoraDropout::new(lora.dropout);
        let adapters = AdapterBinding {
            scale: lora.scale(),
            dropout: dropout.clone(),
        };
        let binding = ParamStore::overlay(&self.params, &trainable, adapters)?;
        let decoder = Decoder::with_experts(&self.config, &binding, None)?;
        let head = H::bind(&self.config, &binding, &decoder)?;
        let mut modules: Vec<String> = linears
            .iter()
            .filter_map(|l| l.weight.name.rsplit('.').nth(1).map(str::to_string))
            .collect();
        modules.sort();
        modules.dedup();
        let mut model = Model {
            config: self.config.clone(),
            params: trainable,
            decoder,
            head,
            ep: None,
            precision: self.precision,
            lora: Some(LoraParts {
                config: lora.clone(),
                base: self.params.clone(),
                modules,
                base_name: String::new(),
                base_dtype: DType::F32,
                dropout,
            }),
        };
        model.set_precision(self.precision);
        Ok(model)
    }

    /// This LoRA model with the frozen base's projection weights (the linear layers of
    /// attention and dense MLPs, adapted or not) kept in `dtype`: `BF16` halves their bytes,
    /// and every forward computes with them widened exactly to f32 (so in f32 precision the
    /// model is the f32 one with its base rounded to bf16 once). Embeddings, norms, heads,
    /// routers and experts stay f32, as do the adapters, their gradients and optimizer
    /// state; merged weights are f32. The adapters, settings, base name and dropout seed
    /// carry over. Errors for a model without adapters or a dtype other than f32/bf16.
    pub fn with_base_in(&self, dtype: DType) -> Result<Self> {
        let Some(l) = &self.lora else {
            return Err(lora_error(LoraError::Mismatch(
                "a base dtype applies to a model wearing adapters".into(),
            )));
        };
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(lora_error(LoraError::Setting {
                key: "base_dtype",
                message: format!("{dtype:?} is not supported; expected f32 or bf16"),
            }));
        }
        let names = projection_weights(&self.config);
        let store = l.base.with_dtype_of(&names, dtype)?;
        let mut base = Model::<H>::build(self.config.clone(), store)?;
        base.set_precision(self.precision);
        let mut model =
            base.with_adapters(&l.config, &self.params.snapshot()?, Path::new(ADAPTERS))?;
        if let Some(m) = &mut model.lora {
            m.base_name = l.base_name.clone();
            m.base_dtype = dtype;
            m.dropout.set_seed(l.dropout.seed());
        }
        Ok(model)
    }

    /// Records `name` (the base model's folder or hub id) as the adapter's
    /// `base_model_name_or_path` in the files [`Model::save`] writes. No-op without adapters.
    pub fn set_adapter_base(&mut self, name: &str) {
        if let Some(l) = &mut self.lora {
            l.base_name = name.to_string();
        }
    }

    /// The folder the adapters' base was loaded from, as [`Model::set_adapter_base`]
    /// recorded it (`None` without adapters or without a record).
    pub fn adapter_base(&self) -> Option<&str> {
        self.lora
            .as_ref()
            .map(|l| l.base_name.as_str())
            .filter(|n| !n.is_empty())
    }

    /// Seeds the masks of the adapters' dropout (no-op without adapters): a run that passes
    /// its seed draws the same masks when it is repeated or resumed.
    pub fn set_dropout_seed(&self, seed: u64) {
        if let Some(l) = &self.lora {
            l.dropout.set_seed(seed);
        }
    }

    /// Turns the adapters' dropout (`lora_dropout`) on for the forwards of optimizer step
    /// `step` while the returned scope lives: a trainer wraps the forward it differentiates
    /// in it. Outside a scope (scoring, references, evaluation) no element is dropped; a
    /// model without adapters or with `lora_dropout = 0` never drops any.
    pub fn dropout_scope(&self, step: u64) -> DropoutScope {
        match &self.lora {
            Some(l) => LoraDropout::scope(&l.dropout, step),
            None => DropoutScope::off(),
        }
    }

    /// The adapter settings, when the model wears adapters.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|l| &l.config)
    }

    /// The same model with the adapters off: the base weights (shared, not copied, and
    /// frozen: its forwards track no gradient), in the same precision. A model without
    /// adapters returns a clone of itself.
    pub fn base_model(&self) -> Result<Self> {
        let Some(l) = &self.lora else {
            return Ok(self.clone());
        };
        let mut base = Model::build(self.config.clone(), l.base.frozen_view())?;
        base.set_precision(self.precision);
        Ok(base)
    }

    /// The merged weights `W + (α/r)·B·A` of every adapted layer, the base's elsewhere,
    /// and the modules trained whole (detached copies, HF names).
    pub(crate) fn merged_weights(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        // The base never changes, so its tensors are shared, not copied: only the adapted
        // weights are new tensors (a refit or save of a LoRA model costs their size, not
        // the model's).
        let (mut all, merge) = self.weights_to_merge()?;
        if let Some(m) = merge {
            m.merge_all(&mut all)?;
        }
        Ok(all)
    }

    /// The merged weights as parts, for a reader that merges one weight at a time: the
    /// frozen base (shared, not copied) with the modules trained whole in place, and the
    /// adapters to merge into it (`None` without adapters: the weights themselves, copied).
    pub fn weights_to_merge(
        &self,
    ) -> candle_core::Result<(HashMap<String, Tensor>, Option<AdapterMerge>)> {
        let Some(l) = &self.lora else {
            return Ok((self.params.snapshot()?, None));
        };
        let mut base: HashMap<String, Tensor> = l
            .base
            .vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().detach()))
            .collect();
        let merge = AdapterMerge::new(&mut base, self.params.snapshot()?, l.config.scale());
        Ok((base, Some(merge)))
    }

    /// An independent copy of a LoRA model: base and adapters copied.
    pub(crate) fn deep_clone_lora(&self) -> Result<Self> {
        let Some(l) = &self.lora else {
            return self.deep_clone();
        };
        let base = Model::<H>::build(self.config.clone(), l.base.clone())?.deep_clone()?;
        let copy = base.with_adapters(&l.config, &self.params.snapshot()?, Path::new(ADAPTERS))?;
        copy.set_dropout_seed(l.dropout.seed());
        match l.base_dtype {
            DType::F32 => Ok(copy),
            dtype => copy.with_base_in(dtype),
        }
    }

    /// Writes the merged model as an HF folder (`config` and `architecture` as
    /// [`Model::save`] decided) and PEFT's adapter files in its [`ADAPTER_SUBDIR`].
    pub(crate) fn save_lora(&self, dir: &Path, config: &ModelConfig, arch: &str) -> Result<()> {
        let mut merged: Vec<(String, Tensor)> = self.merged_weights()?.into_iter().collect();
        merged.sort_by(|a, b| a.0.cmp(&b.0));
        write_checkpoint_tensors(dir, config, arch, &merged)?;
        let base = self.lora.as_ref().map_or("", |l| l.base_name.as_str());
        self.save_adapter(&dir.join(ADAPTER_SUBDIR), base)
    }

    /// Writes only PEFT's adapter files (`adapter_config.json`, `adapter_model.safetensors`)
    /// into `dir`; `base` is recorded as `base_model_name_or_path`. Errors for a model
    /// without adapters.
    pub fn save_adapter(&self, dir: &Path, base: &str) -> Result<()> {
        let Some(l) = &self.lora else {
            return Err(lora_error(LoraError::Mismatch(
                "the model has no adapters to save".into(),
            )));
        };
        let task = Self::peft_task_type();
        write_adapter(
            dir,
            &l.config,
            &l.modules,
            &self.params.snapshot()?,
            task,
            base,
        )
    }

    /// PEFT's `task_type` for this head: `CAUSAL_LM`, `SEQ_CLS` (reward model) or
    /// `TOKEN_CLS` (critic).
    pub fn peft_task_type() -> &'static str {
        match H::ARCHITECTURE {
            "ForSequenceClassification" => "SEQ_CLS",
            "ForTokenClassification" => "TOKEN_CLS",
            _ => "CAUSAL_LM",
        }
    }
}

/// `lora` with a scalar head (`score` of a reward model or critic) trained whole, as PEFT
/// does for `SEQ_CLS`: a head made fresh for the task cannot stay frozen at its init.
fn head_trained_whole<H: Head>(lora: &LoraConfig) -> LoraConfig {
    let mut lora = lora.clone();
    if H::SCALAR && !lora.modules_to_save.iter().any(|m| m == "score") {
        lora.modules_to_save.push("score".into());
    }
    lora
}

/// The weight names of every attention and dense-MLP projection of `config`'s decoder.
fn projection_weights(config: &ModelConfig) -> Vec<String> {
    let mut names = vec![];
    for layer in config.backbone_params().layers {
        let a = &layer.attn;
        names.extend([&a.q, &a.k, &a.v, &a.o].map(|l| l.weight.name.clone()));
        if let FeedForwardParams::Dense(m) = &layer.ffn {
            names.extend([&m.gate, &m.up, &m.down].map(|l| l.weight.name.clone()));
        }
    }
    names
}

/// A [`LoraError`] as the crate's error.
fn lora_error(e: LoraError) -> ModelError {
    ModelError::Lora(e)
}

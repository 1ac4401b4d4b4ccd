//! Where the engine's weights come from while [`super::weights::EngineWeights`] is built: the
//! update's tensors (HF names), each checked against its declaration and copied (f32, the
//! engine's own storage) only when the build reaches it, so a build holds one layer's
//! copies at a time, not the whole model's; the checksum of every copy is recorded for the
//! refit's verification. On a refit it also knows the checksums of the weights served now:
//! a part of the model whose every tensor's checksum equals the served one's is kept as it
//! is (a LoRA update leaves embeddings, norms and heads unchanged), not copied again.

use crate::config::layout::causal_lm_specs;
use crate::config::model_config::ModelConfig;
use crate::config::param_spec::ParamSpec;
use crate::engine::checksum::tensor_checksum;
use crate::engine::error::EngineResult;
use crate::error::ModelError;
use crate::lora::AdapterMerge;
use crate::moe::expert_parallel::{ExpertNames, ExpertParallel};
use candle_core::{DType, Device, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

/// The path named by missing-tensor and shape errors of the engine's weights (they come
/// from a map, not a file).
const WEIGHTS_MAP: &str = "<engine weights map>";

/// The tensors one build reads, and the checksums it has recorded.
pub(crate) struct WeightSource<'a> {
    tensors: &'a HashMap<String, Tensor>,
    /// Adapters merged into `tensors` as each weight is read (a LoRA refit).
    merge: Option<&'a AdapterMerge>,
    device: &'a Device,
    /// The checksums of the weights served now (a refit), by name.
    served: Option<&'a HashMap<String, u64>>,
    sums: RefCell<HashMap<String, u64>>,
}

impl<'a> WeightSource<'a> {
    pub(crate) fn new(
        (tensors, merge): (&'a HashMap<String, Tensor>, Option<&'a AdapterMerge>),
        device: &'a Device,
        served: Option<&'a HashMap<String, u64>>,
    ) -> WeightSource<'a> {
        WeightSource {
            tensors,
            merge,
            device,
            served,
            sums: RefCell::new(HashMap::new()),
        }
    }

    /// The update's weight for `spec` (merged with its adapter, if any), which must exist
    /// with the declared shape.
    fn checked(&self, spec: &ParamSpec) -> EngineResult<Tensor> {
        let t = self.declared(spec)?;
        match self.merge {
            Some(m) => Ok(m.weight(&spec.name, t)?),
            None => Ok(t.clone()),
        }
    }

    /// The update's tensor for `spec`, which must exist with the declared shape.
    fn declared(&self, spec: &ParamSpec) -> EngineResult<&'a Tensor> {
        let source = PathBuf::from(WEIGHTS_MAP);
        let t = self
            .tensors
            .get(&spec.name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: spec.name.clone(),
                path: source.clone(),
            })?;
        if t.dims() != spec.shape.as_slice() {
            return Err(ModelError::ShapeMismatch {
                name: spec.name.clone(),
                expected: spec.shape.clone(),
                found: t.dims().to_vec(),
                path: source,
            }
            .into());
        }
        Ok(t)
    }

    /// The engine's own f32 copy of `spec`'s tensor on the device, its checksum recorded.
    pub(crate) fn tensor(&self, spec: &ParamSpec) -> EngineResult<Tensor> {
        let t = self
            .checked(spec)?
            .detach()
            .to_dtype(DType::F32)?
            .to_device(self.device)?
            .contiguous()?;
        // `copy` gives the engine its own storage: a later in-place optimizer update of
        // the trainer's `Var` must not leak into the rollout weights without a refit. A
        // merged weight is already a tensor of its own.
        let merged = self.merge.is_some_and(|m| m.adapts(&spec.name));
        let t = if merged { t } else { t.copy()? };
        self.sums
            .borrow_mut()
            .insert(spec.name.clone(), tensor_checksum(&t)?);
        Ok(t)
    }

    /// A LoRA update's tensor for `spec` as it is, not copied, when it has no adapter: the
    /// frozen base (or a module trained whole, already a copy), which nothing writes; its
    /// checksum recorded. `None` for any other update (the caller copies the weight).
    pub(crate) fn frozen(&self, spec: &ParamSpec) -> EngineResult<Option<Tensor>> {
        let Some(merge) = self.merge else {
            return Ok(None);
        };
        if merge.adapts(&spec.name) {
            return Ok(None);
        }
        let t = self.declared(spec)?.clone();
        self.sums
            .borrow_mut()
            .insert(spec.name.clone(), tensor_checksum(&t)?);
        Ok(Some(t))
    }

    /// True when this is a refit and every tensor of `specs` has the checksum of the one
    /// served now; their checksums are then recorded (the served copies are the update's).
    pub(crate) fn unchanged(&self, specs: &[&ParamSpec]) -> EngineResult<bool> {
        let Some(served) = self.served else {
            return Ok(false);
        };
        let mut sums = Vec::with_capacity(specs.len());
        for spec in specs {
            let sum = tensor_checksum(&self.checked(spec)?)?;
            if served.get(&spec.name) != Some(&sum) {
                return Ok(false);
            }
            sums.push((spec.name.clone(), sum));
        }
        self.sums.borrow_mut().extend(sums);
        Ok(true)
    }

    /// Every recorded checksum, after checking (and summing) each declared tensor of `cfg`
    /// (with `ep`, only those this rank keeps) the build did not read.
    pub(crate) fn finish(
        self,
        cfg: &ModelConfig,
        ep: Option<&ExpertParallel>,
    ) -> EngineResult<HashMap<String, u64>> {
        let names = ExpertNames::of(cfg);
        let mut sums = self.sums.take();
        for spec in causal_lm_specs(cfg)
            .into_iter()
            .filter(|s| ep.is_none_or(|p| p.keeps(&names, &s.name)))
        {
            if let std::collections::hash_map::Entry::Vacant(slot) = sums.entry(spec.name.clone()) {
                slot.insert(tensor_checksum(&self.checked(&spec)?)?);
            }
        }
        Ok(sums)
    }
}

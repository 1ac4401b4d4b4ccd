//! `ParamStore`: the trainable weights of one model as `candle_core::Var`s in a
//! `candle_nn::VarMap`, keyed by exact HF tensor names. It validates names/shapes against the
//! model's declared `ParamSpec`s (kept, for the optimizer's decay rule and future sharding) and
//! copies weights in and out (refit); it holds no model logic.

use crate::config::layout::LinearParams;
use crate::config::param_spec::ParamSpec;
use crate::error::{ModelError, Result};
use crate::lora::dropout::AdapterBinding;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Named trainable parameters of a model (HF tensor names).
#[derive(Clone)]
pub struct ParamStore {
    varmap: VarMap,
    names: Vec<String>,
    /// The declaration of every parameter, sorted by name.
    specs: Vec<ParamSpec>,
    dtype: DType,
    device: Device,
    /// Names whose [`ParamStore::get`] hands out a detached tensor (same storage, no
    /// gradient): the frozen base of a LoRA model's binding store ([`ParamStore::overlay`]).
    frozen: Option<Arc<HashSet<String>>>,
    /// The scale and dropout of the LoRA adapters this store binds (see
    /// [`ParamStore::lora_pair`]).
    lora: Option<AdapterBinding>,
}

impl ParamStore {
    /// Builds a store holding exactly the parameters in `specs`, taken from `tensors`
    /// (converted to `dtype` and moved to `device`). Extra tensors are ignored.
    ///
    /// Errors: `MissingTensor` / `ShapeMismatch` naming the tensor and `source`.
    pub fn from_tensors(
        specs: &[ParamSpec],
        tensors: &HashMap<String, Tensor>,
        source: &Path,
        dtype: DType,
        device: &Device,
    ) -> Result<ParamStore> {
        let varmap = VarMap::new();
        let mut names = Vec::with_capacity(specs.len());
        {
            let mut data = varmap
                .data()
                .lock()
                .map_err(|_| candle_core::Error::Msg("VarMap lock poisoned".into()))?;
            for spec in specs {
                let t = checked(&spec.name, &spec.shape, tensors, source)?;
                let t = t.to_dtype(dtype)?.to_device(device)?.detach();
                // `Var::from_tensor` copies a non-variable tensor, so after `detach` the store
                // never aliases the caller's memory (or another model's `Var`).
                data.insert(spec.name.clone(), Var::from_tensor(&t)?);
                names.push(spec.name.clone());
            }
        }
        names.sort();
        let mut specs = specs.to_vec();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(ParamStore {
            varmap,
            names,
            specs,
            dtype,
            device: device.clone(),
            frozen: None,
            lora: None,
        })
    }

    /// The store a LoRA model's layers bind to: every parameter of `base` (frozen: its
    /// tensors come out detached, so no gradient is computed for them) with `top`'s on top
    /// (trainable: the adapters `*.lora_A.weight` / `*.lora_B.weight` and any module trained
    /// whole, which then hides the base's tensor of that name). Shares every `Var` with the
    /// two stores; `binding` is what [`ParamStore::lora_pair`] reports.
    pub(crate) fn overlay(
        base: &ParamStore,
        top: &ParamStore,
        binding: AdapterBinding,
    ) -> Result<ParamStore> {
        let varmap = VarMap::new();
        let lock = |m: &VarMap| {
            m.data()
                .lock()
                .map(|d| d.clone())
                .map_err(|_| candle_core::Error::Msg("VarMap lock poisoned".into()))
        };
        let top_vars = lock(&top.varmap)?;
        let mut all = lock(&base.varmap)?;
        let frozen: HashSet<String> = all
            .keys()
            .filter(|n| !top_vars.contains_key(*n))
            .cloned()
            .collect();
        all.extend(top_vars);
        let mut names: Vec<String> = all.keys().cloned().collect();
        names.sort();
        let mut specs: Vec<ParamSpec> = base
            .specs
            .iter()
            .filter(|s| frozen.contains(&s.name))
            .chain(top.specs.iter())
            .cloned()
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        *varmap
            .data()
            .lock()
            .map_err(|_| candle_core::Error::Msg("VarMap lock poisoned".into()))? = all;
        Ok(ParamStore {
            varmap,
            names,
            specs,
            dtype: base.dtype,
            device: base.device.clone(),
            frozen: Some(Arc::new(frozen)),
            lora: Some(binding),
        })
    }

    /// This store with the parameters `names` converted to `dtype` (new `Var`s; every other
    /// parameter shared): a frozen LoRA base kept in bf16. [`ParamStore::dtype`] stays the
    /// store's own.
    pub(crate) fn with_dtype_of(&self, names: &[String], dtype: DType) -> Result<ParamStore> {
        let varmap = VarMap::new();
        {
            let source = self
                .varmap
                .data()
                .lock()
                .map_err(|_| candle_core::Error::Msg("VarMap lock poisoned".into()))?;
            let mut data = varmap
                .data()
                .lock()
                .map_err(|_| candle_core::Error::Msg("VarMap lock poisoned".into()))?;
            for (name, var) in source.iter() {
                let var = match names.contains(name) {
                    true => Var::from_tensor(&var.as_tensor().detach().to_dtype(dtype)?)?,
                    false => var.clone(),
                };
                data.insert(name.clone(), var);
            }
        }
        Ok(ParamStore {
            varmap,
            ..self.clone()
        })
    }

    /// This store with every parameter frozen (same `Var`s; [`ParamStore::get`] hands out
    /// detached tensors): a model bound to it computes no gradient and keeps no graph.
    pub fn frozen_view(&self) -> ParamStore {
        let mut view = self.clone();
        view.frozen = Some(Arc::new(self.names.iter().cloned().collect()));
        view
    }

    /// The LoRA adapter of the linear layer whose weight is `weight_name`
    /// (`{prefix}.weight`): `(A [r, in], B [out, r], scale and dropout)` when this store
    /// binds one (`{prefix}.lora_A.weight` and `{prefix}.lora_B.weight`), else `None`.
    pub(crate) fn lora_pair(
        &self,
        weight_name: &str,
    ) -> candle_core::Result<Option<(Tensor, Tensor, AdapterBinding)>> {
        let Some(binding) = &self.lora else {
            return Ok(None);
        };
        let prefix = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
        let a_name = format!("{prefix}.lora_A.weight");
        if self.spec(&a_name).is_none() {
            return Ok(None);
        }
        let b_name = format!("{prefix}.lora_B.weight");
        Ok(Some((
            self.get(&a_name)?,
            self.get(&b_name)?,
            binding.clone(),
        )))
    }

    /// The tensor behind parameter `name` (shares storage with the `Var`, so it sees updates).
    pub fn get(&self, name: &str) -> candle_core::Result<Tensor> {
        let data = self
            .varmap
            .data()
            .lock()
            .map_err(|_| candle_core::Error::Msg("VarMap lock poisoned".into()))?;
        let frozen = self.frozen.as_ref().is_some_and(|f| f.contains(name));
        data.get(name)
            .map(|v| match frozen {
                true => v.as_tensor().detach(),
                false => v.as_tensor().clone(),
            })
            .ok_or_else(|| candle_core::Error::Msg(format!("no parameter named {name}")))
    }

    /// The bias tensor of `linear`, or `None` when the declaration has no bias.
    pub fn bias(&self, linear: &LinearParams) -> candle_core::Result<Option<Tensor>> {
        linear.bias.as_ref().map(|b| self.get(&b.name)).transpose()
    }

    /// The declaration of parameter `name` (kind, shape), if the store holds it.
    pub fn spec(&self, name: &str) -> Option<&ParamSpec> {
        self.specs
            .binary_search_by(|s| s.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.specs[i])
    }

    /// The declarations of every parameter, sorted by name.
    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// The underlying `VarMap` (HF tensor names -> `Var`).
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// Parameter dtype (f32 unless built otherwise, e.g. f64 for gradient checks).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Device holding the parameters.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Parameter names, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// `(name, Var)` pairs sorted by name, for the optimizer.
    pub fn vars(&self) -> Vec<(String, Var)> {
        let data = match self.varmap.data().lock() {
            Ok(d) => d,
            Err(poisoned) => poisoned.into_inner(),
        };
        self.names
            .iter()
            .filter_map(|n| data.get(n).map(|v| (n.clone(), v.clone())))
            .collect()
    }

    /// Total number of scalar parameters.
    pub fn num_parameters(&self) -> usize {
        self.vars().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// A detached copy of every parameter (safe to keep while training continues).
    pub fn snapshot(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        self.vars()
            .into_iter()
            .map(|(n, v)| Ok((n, v.as_tensor().detach().copy()?)))
            .collect()
    }

    /// Overwrites every parameter in place from `tensors` (refit). All parameters must be
    /// present with the right shape; extra entries are ignored. Values are converted to this
    /// store's dtype and device. On error nothing has been written.
    pub fn load_from(&self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        let source = PathBuf::from("<weights map>");
        let vars = self.vars();
        let mut staged = Vec::with_capacity(vars.len());
        for (name, var) in &vars {
            let t = checked(name, var.dims(), tensors, &source)?;
            staged.push(t.to_dtype(self.dtype)?.to_device(&self.device)?);
        }
        for ((_, var), t) in vars.iter().zip(staged) {
            var.set(&t)?;
        }
        Ok(())
    }

    /// Writes all parameters as float32 to one safetensors file with `{"format": "pt"}`
    /// metadata (what `transformers` expects).
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        write_safetensors(path, &self.f32_tensors()?)
    }

    /// Every parameter as a detached, contiguous f32 tensor, by name.
    pub(crate) fn f32_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let vars = self.vars();
        let tensors = vars
            .iter()
            .map(|(n, v)| {
                let t = v.as_tensor().detach().to_dtype(DType::F32)?.contiguous()?;
                Ok((n.clone(), t))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(tensors)
    }
}

/// Writes `(name, tensor)` pairs to a safetensors file with `{"format": "pt"}` metadata.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let data: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::serialize_to_file(data, Some(metadata), path).map_err(|e| write_error(e, path))
}

/// A failed safetensors write as a [`ModelError`]: an OS error (a full disk, a lost mount)
/// stays an I/O error, a failure of the run, so callers (and exit codes) can tell it from a
/// bad file.
fn write_error(e: safetensors::SafeTensorError, path: &Path) -> ModelError {
    match e {
        safetensors::SafeTensorError::IoError(source) => ModelError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        },
        e => ModelError::Safetensors {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
    }
}

/// `tensors[name]`, which must exist and have `shape`; errors name the tensor and `source`.
fn checked<'a>(
    name: &str,
    shape: &[usize],
    tensors: &'a HashMap<String, Tensor>,
    source: &Path,
) -> Result<&'a Tensor> {
    let t = tensors.get(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
        path: source.to_path_buf(),
    })?;
    if t.dims() != shape {
        return Err(ModelError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            found: t.dims().to_vec(),
            path: source.to_path_buf(),
        });
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full disk while saving is an I/O error (a failed run), not a bad safetensors file
    /// (bad input).
    #[test]
    fn a_full_disk_while_saving_is_an_io_error() {
        let enospc = std::io::Error::from_raw_os_error(28);
        let e = write_error(
            safetensors::SafeTensorError::IoError(enospc),
            Path::new("m"),
        );
        match e {
            ModelError::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(28)),
            other => panic!("expected an I/O error, got {other}"),
        }
        let e = write_error(safetensors::SafeTensorError::HeaderTooLarge, Path::new("m"));
        assert!(matches!(e, ModelError::Safetensors { .. }), "{e}");
    }
}

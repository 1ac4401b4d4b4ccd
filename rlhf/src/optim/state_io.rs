//! Saving and loading AdamW state: per-parameter moments in `optimizer.safetensors`
//! (`<name>.exp_avg`, `<name>.exp_avg_sq`, f32) and scalars in `optimizer.json`. Loading
//! validates every name and shape before touching the optimizer. Parameters are not saved here.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::error::{Result, RlhfError};
use crate::optim::adamw::{AdamW, AdamWConfig, ParamSlot};
use crate::optim::param_groups::ParamGroup;

/// File name of the moments inside a state directory.
pub(crate) const STATE_TENSORS_FILE: &str = "optimizer.safetensors";
/// File name of the scalar state inside a state directory.
pub(crate) const STATE_JSON_FILE: &str = "optimizer.json";
/// Value of the `format` key in [`STATE_JSON_FILE`].
pub(crate) const STATE_FORMAT: &str = "oxalign-adamw-v1";

/// Scalars of one parameter in [`STATE_JSON_FILE`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamScalars {
    step: u64,
    group: String,
}

/// Contents of [`STATE_JSON_FILE`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StateScalars {
    format: String,
    steps_taken: u64,
    lr: f64,
    config: AdamWConfig,
    groups: Vec<ParamGroup>,
    params: BTreeMap<String, ParamScalars>,
}

fn exp_avg_key(name: &str) -> String {
    format!("{name}.exp_avg")
}

fn exp_avg_sq_key(name: &str) -> String {
    format!("{name}.exp_avg_sq")
}

fn mismatch(path: &Path, reason: impl Into<String>) -> RlhfError {
    RlhfError::StateMismatch {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl AdamW {
    /// Writes the optimizer state into directory `dir` (created if missing):
    /// [`STATE_TENSORS_FILE`] with `<param>.exp_avg` / `<param>.exp_avg_sq` (f32, parameter
    /// shapes) and [`STATE_JSON_FILE`] with step counts, lr, config and groups.
    pub fn save_state(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| RlhfError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        let mut params = BTreeMap::new();
        for p in &self.params {
            tensors.insert(exp_avg_key(&p.name), p.exp_avg.clone());
            tensors.insert(exp_avg_sq_key(&p.name), p.exp_avg_sq.clone());
            params.insert(
                p.name.clone(),
                ParamScalars {
                    step: p.step,
                    group: self.groups[p.group].name.clone(),
                },
            );
        }
        let tensor_path = dir.join(STATE_TENSORS_FILE);
        candle_core::safetensors::save(&tensors, &tensor_path)?;
        let scalars = StateScalars {
            format: STATE_FORMAT.into(),
            steps_taken: self.steps_taken,
            lr: self.lr,
            config: self.config,
            groups: self.groups.clone(),
            params,
        };
        let json_path = dir.join(STATE_JSON_FILE);
        let text = serde_json::to_string_pretty(&scalars).map_err(|source| RlhfError::Json {
            path: json_path.clone(),
            source,
        })?;
        std::fs::write(&json_path, text).map_err(|source| RlhfError::Io {
            path: json_path,
            source,
        })
    }

    /// Restores a state written by [`AdamW::save_state`] into this optimizer.
    ///
    /// Every optimised parameter must appear in both files with tensors of its shape, and the
    /// files must hold no other parameter; otherwise [`RlhfError::StateMismatch`] names the file
    /// and the tensor, and the optimizer is left unchanged. Restores per-parameter steps and
    /// moments, the step counter and the lr; group hyper-parameters come from this optimizer.
    pub fn load_state(&mut self, dir: &Path) -> Result<()> {
        let json_path = dir.join(STATE_JSON_FILE);
        let scalars = read_scalars(&json_path)?;
        let tensor_path: PathBuf = dir.join(STATE_TENSORS_FILE);
        if !tensor_path.exists() {
            return Err(RlhfError::Io {
                path: tensor_path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
            });
        }
        let mut tensors = candle_core::safetensors::load(&tensor_path, &Device::Cpu)?;
        let files = StateFiles {
            json: &json_path,
            tensors: &tensor_path,
        };
        let restored = self.take_moments(&scalars, &mut tensors, files)?;
        self.check_nothing_left(&scalars, &tensors, files)?;

        for (slot, (step, m, v)) in self.params.iter_mut().zip(restored) {
            slot.step = step;
            slot.exp_avg = m;
            slot.exp_avg_sq = v;
        }
        self.steps_taken = scalars.steps_taken;
        self.lr = scalars.lr;
        Ok(())
    }

    /// Every parameter's `(step, exp_avg, exp_avg_sq)` (in parameter order, moments on the
    /// parameter's device), taking the moments out of `tensors`; fails if a parameter is
    /// missing from the scalars or its moments are missing or malformed.
    fn take_moments(
        &self,
        scalars: &StateScalars,
        tensors: &mut HashMap<String, Tensor>,
        files: StateFiles<'_>,
    ) -> Result<Vec<(u64, Tensor, Tensor)>> {
        let mut restored = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let Some(ps) = scalars.params.get(&p.name) else {
                return Err(mismatch(
                    files.json,
                    format!(
                        "parameter `{}` of the optimizer is missing from key `params`",
                        p.name
                    ),
                ));
            };
            let shape = p.var.as_tensor().dims().to_vec();
            let m = take_moment(tensors, files.tensors, exp_avg_key(&p.name), p, &shape)?;
            let v = take_moment(tensors, files.tensors, exp_avg_sq_key(&p.name), p, &shape)?;
            restored.push((ps.step, m, v));
        }
        Ok(restored)
    }

    /// Fails if a tensor left in `tensors` (after every parameter took its moments) or a
    /// parameter of the scalars does not belong to this optimizer.
    fn check_nothing_left(
        &self,
        scalars: &StateScalars,
        tensors: &HashMap<String, Tensor>,
        files: StateFiles<'_>,
    ) -> Result<()> {
        let mut extra: Vec<&String> = tensors.keys().collect();
        if !extra.is_empty() {
            extra.sort();
            return Err(mismatch(
                files.tensors,
                format!(
                    "tensor `{}` does not belong to any optimised parameter",
                    extra[0]
                ),
            ));
        }
        let known: std::collections::HashSet<&str> =
            self.params.iter().map(|p| p.name.as_str()).collect();
        if let Some(name) = scalars.params.keys().find(|n| !known.contains(n.as_str())) {
            return Err(mismatch(
                files.json,
                format!("parameter `{name}` in key `params` is not optimised by this optimizer"),
            ));
        }
        Ok(())
    }
}

/// The two files of a state directory being loaded, named by its errors.
#[derive(Clone, Copy)]
struct StateFiles<'a> {
    /// [`STATE_JSON_FILE`].
    json: &'a Path,
    /// [`STATE_TENSORS_FILE`].
    tensors: &'a Path,
}

/// Reads and parses [`STATE_JSON_FILE`] at `json_path` and checks its format tag.
fn read_scalars(json_path: &Path) -> Result<StateScalars> {
    let text = std::fs::read_to_string(json_path).map_err(|source| RlhfError::Io {
        path: json_path.to_path_buf(),
        source,
    })?;
    let scalars: StateScalars = serde_json::from_str(&text).map_err(|source| RlhfError::Json {
        path: json_path.to_path_buf(),
        source,
    })?;
    if scalars.format != STATE_FORMAT {
        return Err(mismatch(
            json_path,
            format!(
                "key `format` is {:?}, expected {STATE_FORMAT:?}",
                scalars.format
            ),
        ));
    }
    Ok(scalars)
}

/// Removes moment `key` of parameter `p` from `tensors` (read from `tensor_path`) and moves
/// it to the parameter's device; it must exist, have the parameter's `shape` and be f32.
fn take_moment(
    tensors: &mut HashMap<String, Tensor>,
    tensor_path: &Path,
    key: String,
    p: &ParamSlot,
    shape: &[usize],
) -> Result<Tensor> {
    let t = tensors
        .remove(&key)
        .ok_or_else(|| mismatch(tensor_path, format!("tensor `{key}` is missing")))?;
    if t.dims() != shape {
        return Err(mismatch(
            tensor_path,
            format!(
                "tensor `{key}` has shape {:?}, expected {shape:?} (the shape of parameter `{}`)",
                t.dims(),
                p.name
            ),
        ));
    }
    if t.dtype() != DType::F32 {
        return Err(mismatch(
            tensor_path,
            format!("tensor `{key}` has dtype {:?}, expected F32", t.dtype()),
        ));
    }
    Ok(t.to_device(p.var.as_tensor().device())?)
}

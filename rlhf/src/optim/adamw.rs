//! AdamW (Loshchilov & Hutter 2019) over named candle `Var`s with parameter groups, matching
//! `torch.optim.AdamW` (bias correction, decoupled weight decay, per-parameter step counts) with
//! f32 moments. It does not clip, accumulate or schedule (see the sibling modules).

use std::collections::HashSet;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use crate::error::{Result, RlhfError};
use crate::optim::param_groups::{default_group_of, default_groups, ParamGroup};

/// AdamW hyper-parameters (PyTorch names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// Base learning rate (a schedule may overwrite it with [`AdamW::set_lr`]).
    pub lr: f64,
    /// β1, first-moment decay in `[0, 1)`.
    pub beta1: f64,
    /// β2, second-moment decay in `[0, 1)`.
    pub beta2: f64,
    /// ε added to `sqrt(v̂)`, > 0.
    pub eps: f64,
    /// Weight decay of the default "decay" group (explicit groups carry their own).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    /// `torch.optim.AdamW` defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    fn validate(&self) -> Result<()> {
        crate::error::check_min("lr", self.lr, 0.0)?;
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(RlhfError::invalid(name, b, "must be in [0, 1)"));
            }
        }
        crate::error::check_above("eps", self.eps, 0.0)?;
        crate::error::check_min("weight_decay", self.weight_decay, 0.0)?;
        Ok(())
    }
}

/// One parameter and its state.
#[derive(Debug)]
pub(crate) struct ParamSlot {
    pub(crate) name: String,
    pub(crate) var: Var,
    pub(crate) group: usize,
    /// Number of updates applied to this parameter (PyTorch's `state["step"]`).
    pub(crate) step: u64,
    /// First moment m, f32, shape of the parameter.
    pub(crate) exp_avg: Tensor,
    /// Second moment v, f32, shape of the parameter.
    pub(crate) exp_avg_sq: Tensor,
}

/// AdamW over named parameters.
#[derive(Debug)]
pub struct AdamW {
    pub(crate) config: AdamWConfig,
    pub(crate) lr: f64,
    pub(crate) groups: Vec<ParamGroup>,
    pub(crate) params: Vec<ParamSlot>,
    pub(crate) steps_taken: u64,
}

impl AdamW {
    /// AdamW with the default groups ([`default_groups`]: weight decay `config.weight_decay`
    /// except for norms, biases and `embed_tokens`).
    ///
    /// `vars`: named trainable parameters (HF names), any float dtype. Errors on duplicate names.
    pub fn new(vars: Vec<(String, Var)>, config: AdamWConfig) -> Result<Self> {
        Self::with_groups(vars, config, default_groups(config.weight_decay), |n| {
            default_group_of(n)
        })
    }

    /// AdamW with explicit groups; `group_of(name)` returns an index into `groups`.
    /// Errors on an out-of-range index (naming the parameter), duplicate names or invalid
    /// hyper-parameters.
    pub fn with_groups(
        vars: Vec<(String, Var)>,
        config: AdamWConfig,
        groups: Vec<ParamGroup>,
        group_of: impl Fn(&str) -> usize,
    ) -> Result<Self> {
        config.validate()?;
        for g in &groups {
            crate::error::check_min(format!("groups.{}.lr_scale", g.name), g.lr_scale, 0.0)?;
            crate::error::check_min(
                format!("groups.{}.weight_decay", g.name),
                g.weight_decay,
                0.0,
            )?;
        }
        let mut seen = HashSet::new();
        let mut params = Vec::with_capacity(vars.len());
        for (name, var) in vars {
            if !seen.insert(name.clone()) {
                return Err(RlhfError::DuplicateParam(name));
            }
            let group = group_of(&name);
            if group >= groups.len() {
                return Err(RlhfError::invalid(
                    format!("group of parameter `{name}`"),
                    group,
                    format!("must be < {} (the number of groups)", groups.len()),
                ));
            }
            let shape = var.as_tensor().shape().clone();
            let device = var.as_tensor().device().clone();
            params.push(ParamSlot {
                name,
                group,
                step: 0,
                exp_avg: Tensor::zeros(&shape, DType::F32, &device)?,
                exp_avg_sq: Tensor::zeros(&shape, DType::F32, &device)?,
                var,
            });
        }
        Ok(Self {
            lr: config.lr,
            config,
            groups,
            params,
            steps_taken: 0,
        })
    }

    /// One AdamW step for every parameter that has a gradient in `grads` (others are left
    /// untouched, their step count unchanged, as PyTorch does for `grad is None`).
    ///
    /// Per parameter with group lr `η = lr·lr_scale` and decay λ, in f32:
    /// `p ← p·(1 − ηλ)`, `m ← β1 m + (1−β1) g`, `v ← β2 v + (1−β2) g²`,
    /// `p ← p − η/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + ε)`.
    /// Errors when a gradient's shape differs from its parameter's (naming it).
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        let (b1, b2, eps) = (self.config.beta1, self.config.beta2, self.config.eps);
        for slot in &mut self.params {
            let Some(grad) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            if grad.dims() != slot.var.as_tensor().dims() {
                return Err(RlhfError::Shape {
                    name: format!("gradient of `{}`", slot.name),
                    expected: format!("{:?} (the parameter's shape)", slot.var.as_tensor().dims()),
                    got: grad.dims().to_vec(),
                });
            }
            let group = &self.groups[slot.group];
            let lr = self.lr * group.lr_scale;
            let wd = group.weight_decay;
            slot.step += 1;
            let t = slot.step as i32;

            let g = grad.detach().to_dtype(DType::F32)?;
            slot.exp_avg = ((slot.exp_avg.affine(b1, 0.0)? + g.affine(1.0 - b1, 0.0)?)?).detach();
            slot.exp_avg_sq =
                ((slot.exp_avg_sq.affine(b2, 0.0)? + g.sqr()?.affine(1.0 - b2, 0.0)?)?).detach();

            let bias_correction1 = 1.0 - b1.powi(t);
            let bias_correction2_sqrt = (1.0 - b2.powi(t)).sqrt();
            let step_size = lr / bias_correction1;
            let denom = slot
                .exp_avg_sq
                .sqrt()?
                .affine(1.0 / bias_correction2_sqrt, eps)?;

            let dtype = slot.var.as_tensor().dtype();
            let mut p = slot.var.as_detached_tensor().to_dtype(DType::F32)?;
            if wd != 0.0 {
                p = p.affine(1.0 - lr * wd, 0.0)?;
            }
            let update = slot.exp_avg.div(&denom)?.affine(step_size, 0.0)?;
            let new_p = (p - update)?.to_dtype(dtype)?;
            slot.var.set(&new_p)?;
        }
        self.steps_taken += 1;
        Ok(())
    }

    /// Current base learning rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Sets the base learning rate (each group uses `lr · lr_scale`).
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// The hyper-parameters given at construction.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Number of [`AdamW::step`] calls so far (restored by `load_state`).
    pub fn steps_taken(&self) -> u64 {
        self.steps_taken
    }

    /// The parameter groups.
    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    /// The group of parameter `name`, if it is optimised here.
    pub fn group_of(&self, name: &str) -> Option<&ParamGroup> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| &self.groups[p.group])
    }

    /// The optimised parameters, in construction order.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.params.iter().map(|p| (p.name.as_str(), &p.var))
    }

    /// Per-parameter state `(name, step, m, v)` (m, v: f32, the parameter's shape).
    pub fn param_state(&self) -> impl Iterator<Item = (&str, u64, &Tensor, &Tensor)> {
        self.params
            .iter()
            .map(|p| (p.name.as_str(), p.step, &p.exp_avg, &p.exp_avg_sq))
    }
}

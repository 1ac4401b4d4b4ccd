//! AdamW (Loshchilov & Hutter 2019) over named candle `Var`s with parameter groups, matching
//! `torch.optim.AdamW` (bias correction, decoupled weight decay, per-parameter step counts) with
//! f32 moments. It does not clip, accumulate or schedule (see the sibling modules).

use std::collections::HashSet;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use oxalign_models::ParamStore;

use crate::error::{Result, RlhfError};
use crate::optim::fused_adamw::{self, MomentUpdate, ParamUpdate};
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

    /// AdamW over every parameter of a model's store, with the default groups decided by
    /// the model's declaration: weight decay for linear weights only (each parameter's
    /// `ParamKind::decays`), none for norms, biases and embeddings. A name the store does
    /// not declare falls back to [`default_group_of`].
    pub fn for_params(params: &ParamStore, config: AdamWConfig) -> Result<Self> {
        let group_of = |n: &str| match params.spec(n) {
            Some(spec) => usize::from(!spec.kind.decays()),
            None => default_group_of(n),
        };
        Self::with_groups(
            params.vars(),
            config,
            default_groups(config.weight_decay),
            group_of,
        )
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
        self.step_scaled(grads, None)
    }

    /// [`AdamW::step`] with every gradient multiplied by `grad_scale` first (the global-norm
    /// clip coefficient), without rescaling the gradients themselves. Same bits as scaling
    /// the gradients with `affine(scale, 0)` and calling [`AdamW::step`].
    ///
    /// Contiguous f32 parameters on the CPU are updated in place by fused kernels (three
    /// passes, no temporaries); others take the composed tensor path.
    pub fn step_scaled(&mut self, grads: &GradStore, grad_scale: Option<f64>) -> Result<()> {
        for i in 0..self.params.len() {
            let Some(grad) = grads.get(self.params[i].var.as_tensor()) else {
                continue;
            };
            let slot = &self.params[i];
            if grad.dims() != slot.var.as_tensor().dims() {
                return Err(RlhfError::Shape {
                    name: format!("gradient of `{}`", slot.name),
                    expected: format!("{:?} (the parameter's shape)", slot.var.as_tensor().dims()),
                    got: grad.dims().to_vec(),
                });
            }
            let group = &self.groups[slot.group];
            let hyper = StepHyper {
                lr: self.lr * group.lr_scale,
                weight_decay: group.weight_decay,
                beta1: self.config.beta1,
                beta2: self.config.beta2,
                eps: self.config.eps,
                grad_scale,
            };
            let slot = &mut self.params[i];
            slot.step += 1;
            let fused = [slot.var.as_tensor(), grad, &slot.exp_avg, &slot.exp_avg_sq]
                .iter()
                .all(|t| fused_adamw::fusable(t));
            if fused {
                fused_step(slot, grad, &hyper)?;
            } else {
                composed_step(slot, grad, &hyper)?;
            }
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

    /// Bytes held by the first and second moments, measured from their storage.
    pub fn moment_bytes(&self) -> usize {
        self.param_state()
            .map(|(_, _, m, v)| crate::fsdp::held_bytes(m) + crate::fsdp::held_bytes(v))
            .sum()
    }
}

/// The hyper-parameters of one parameter's update.
struct StepHyper {
    lr: f64,
    weight_decay: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    grad_scale: Option<f64>,
}

impl StepHyper {
    /// `(η / (1 − β1^t), 1 / sqrt(1 − β2^t))` at step `t`.
    fn corrections(&self, t: u64) -> (f64, f64) {
        let t = t as i32;
        let bias_correction1 = 1.0 - self.beta1.powi(t);
        let bias_correction2_sqrt = (1.0 - self.beta2.powi(t)).sqrt();
        (self.lr / bias_correction1, 1.0 / bias_correction2_sqrt)
    }
}

/// In place, on the parameter's and the moments' own storage.
fn fused_step(slot: &mut ParamSlot, grad: &Tensor, h: &StepHyper) -> Result<()> {
    let moment = |beta, squared| MomentUpdate {
        beta,
        squared,
        grad_scale: h.grad_scale,
    };
    slot.exp_avg.inplace_op2(grad, &moment(h.beta1, false))?;
    slot.exp_avg_sq.inplace_op2(grad, &moment(h.beta2, true))?;
    let (step_size, inv_bc2_sqrt) = h.corrections(slot.step);
    let update = ParamUpdate {
        decay: (h.weight_decay != 0.0).then_some(1.0 - h.lr * h.weight_decay),
        inv_bias_correction2_sqrt: inv_bc2_sqrt,
        eps: h.eps,
        step_size,
    };
    slot.var
        .as_tensor()
        .inplace_op3(&slot.exp_avg, &slot.exp_avg_sq, &update)?;
    Ok(())
}

/// With candle tensor ops (any dtype, any device).
fn composed_step(slot: &mut ParamSlot, grad: &Tensor, h: &StepHyper) -> Result<()> {
    let (b1, b2) = (h.beta1, h.beta2);
    let mut g = grad.detach().to_dtype(DType::F32)?;
    if let Some(s) = h.grad_scale {
        g = g.affine(s, 0.0)?;
    }
    slot.exp_avg = ((slot.exp_avg.affine(b1, 0.0)? + g.affine(1.0 - b1, 0.0)?)?).detach();
    slot.exp_avg_sq =
        ((slot.exp_avg_sq.affine(b2, 0.0)? + g.sqr()?.affine(1.0 - b2, 0.0)?)?).detach();
    let (step_size, inv_bc2_sqrt) = h.corrections(slot.step);
    let denom = slot.exp_avg_sq.sqrt()?.affine(inv_bc2_sqrt, h.eps)?;
    let dtype = slot.var.as_tensor().dtype();
    let mut p = slot.var.as_detached_tensor().to_dtype(DType::F32)?;
    if h.weight_decay != 0.0 {
        p = p.affine(1.0 - h.lr * h.weight_decay, 0.0)?;
    }
    let update = slot.exp_avg.div(&denom)?.affine(step_size, 0.0)?;
    let new_p = (p - update)?.to_dtype(dtype)?;
    slot.var.set(&new_p)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn slot(values: &[f32], seed: f32) -> ParamSlot {
        let n = values.len();
        let t =
            |f: &dyn Fn(usize) -> f32| Tensor::from_vec((0..n).map(f).collect(), n, &Device::Cpu);
        ParamSlot {
            name: "w".into(),
            var: Var::from_tensor(&Tensor::new(values, &Device::Cpu).unwrap()).unwrap(),
            group: 0,
            step: 3,
            exp_avg: t(&|i| (i as f32 * seed).sin() * 1e-3).unwrap(),
            exp_avg_sq: t(&|i| (i as f32 * seed).cos().abs() * 1e-6).unwrap(),
        }
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// The in-place kernels give exactly the composed path's bits, with and without a clip
    /// scale and weight decay.
    #[test]
    fn fused_step_equals_composed_step_bit_for_bit() {
        let values: Vec<f32> = (0..100_003).map(|i| ((i as f32) * 0.37).sin()).collect();
        let grad_values: Vec<f32> = (0..100_003)
            .map(|i| ((i as f32) * 0.11).cos() * 0.1)
            .collect();
        let grad = Tensor::new(grad_values.as_slice(), &Device::Cpu).unwrap();
        for (scale, wd) in [
            (None, 0.0),
            (Some(0.37), 0.01),
            (Some(0.9), 0.0),
            (None, 0.1),
        ] {
            let h = StepHyper {
                lr: 3e-4,
                weight_decay: wd,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                grad_scale: scale,
            };
            let mut a = slot(&values, 0.3);
            let mut b = slot(&values, 0.3);
            for _ in 0..2 {
                a.step += 1;
                b.step += 1;
                assert!(fused_adamw::fusable(a.var.as_tensor()));
                fused_step(&mut a, &grad, &h).unwrap();
                composed_step(&mut b, &grad, &h).unwrap();
            }
            assert_eq!(
                bits(a.var.as_tensor()),
                bits(b.var.as_tensor()),
                "params {scale:?} {wd}"
            );
            assert_eq!(bits(&a.exp_avg), bits(&b.exp_avg), "m");
            assert_eq!(bits(&a.exp_avg_sq), bits(&b.exp_avg_sq), "v");
        }
    }
}

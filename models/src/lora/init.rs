//! Fresh adapters as PEFT makes them (`init_lora_weights=True`): `A` uniform in
//! `±1/√in` (`kaiming_uniform_(a=√5)`), `B` zero, so a new adapter leaves the model's
//! function unchanged. Seeded: the same specs and seed give the same adapters.

use crate::config::param_spec::ParamSpec;
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// Draws the adapters of `specs` (from [`crate::lora::targets::adapter_specs`]: `A`s
/// `[r, in]` uniform in `±1/√in`, `B`s zero) in `dtype` on `device`.
pub(crate) fn fresh_adapters(
    specs: &[ParamSpec],
    seed: u64,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = HashMap::with_capacity(specs.len());
    for spec in specs {
        let t = if spec.name.ends_with(".lora_A.weight") {
            let bound = 1.0 / (spec.shape[1] as f32).sqrt();
            let values: Vec<f32> = (0..spec.numel())
                .map(|_| rng.random_range(-bound..bound))
                .collect();
            Tensor::from_vec(values, spec.shape.as_slice(), device)?.to_dtype(dtype)?
        } else {
            Tensor::zeros(spec.shape.as_slice(), dtype, device)?
        };
        out.insert(spec.name.clone(), t);
    }
    Ok(out)
}

//! The bounds of a config's numbers, checked when it is read (before any weight is
//! allocated): `rms_norm_eps` and `rope_theta` finite and positive, RoPE scaling factors
//! finite and positive, every size below a documented hard cap, and the parameters' f32 bytes
//! (computed in 128-bit integers) within the machine's memory. Errors name the key.

use crate::config::model_config::{ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use std::path::Path;

/// Most decoder layers.
pub(crate) const MAX_LAYERS: usize = 1 << 12;
/// Most hidden units (`hidden_size`, `head_dim` × heads).
pub(crate) const MAX_HIDDEN: usize = 1 << 16;
/// Most MLP units (`intermediate_size`, `moe_intermediate_size`).
pub(crate) const MAX_INTERMEDIATE: usize = 1 << 20;
/// Most attention heads (query or key/value) and `head_dim`.
pub(crate) const MAX_HEADS: usize = 1 << 12;
/// Most tokens of the vocabulary.
pub(crate) const MAX_VOCAB: usize = 1 << 24;

/// The first number of `cfg` out of its bounds; `total_memory` is the machine's memory in
/// bytes, when known.
pub(crate) fn check(cfg: &ModelConfig, path: &Path, total_memory: Option<u64>) -> Result<()> {
    let err = |key: &str, message: String| ModelError::InvalidConfig {
        path: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    if !(cfg.rms_norm_eps.is_finite() && cfg.rms_norm_eps > 0.0 && cfg.rms_norm_eps < 1.0) {
        let e = cfg.rms_norm_eps;
        return Err(err(
            "rms_norm_eps",
            format!("{e}: expected a number in (0, 1), e.g. 1e-6"),
        ));
    }
    if !(cfg.rope_theta.is_finite() && cfg.rope_theta > 0.0) {
        let t = cfg.rope_theta;
        return Err(err(
            "rope_theta",
            format!("{t}: expected a finite number > 0, e.g. 10000"),
        ));
    }
    for (key, v) in rope_factors(cfg.rope_scaling.as_ref()) {
        if !(v.is_finite() && v > 0.0) {
            return Err(err(key, format!("{v}: expected a finite number > 0")));
        }
    }
    for (key, v, max) in [
        ("num_hidden_layers", cfg.num_hidden_layers, MAX_LAYERS),
        ("hidden_size", cfg.hidden_size, MAX_HIDDEN),
        ("intermediate_size", cfg.intermediate_size, MAX_INTERMEDIATE),
        ("num_attention_heads", cfg.num_attention_heads, MAX_HEADS),
        ("num_key_value_heads", cfg.num_key_value_heads, MAX_HEADS),
        ("head_dim", cfg.head_dim, MAX_HEADS),
        ("vocab_size", cfg.vocab_size, MAX_VOCAB),
    ] {
        if v > max {
            return Err(err(key, format!("{v}: expected at most {max}")));
        }
    }
    if let Some(moe) = &cfg.moe {
        // Bounded first: `min_parameters` multiplies them.
        if moe.num_experts > MAX_HEADS || moe.moe_intermediate_size > MAX_INTERMEDIATE {
            return Err(err(
                "num_experts",
                format!(
                    "{} experts of {} units (moe_intermediate_size): expected at most \
                     {MAX_HEADS} experts of at most {MAX_INTERMEDIATE} units",
                    moe.num_experts, moe.moe_intermediate_size
                ),
            ));
        }
    }
    fits_in_memory(cfg, total_memory, &err)
}

/// `rope_scaling`'s factors, by key.
fn rope_factors(scaling: Option<&RopeScaling>) -> Vec<(&'static str, f64)> {
    match scaling {
        None => Vec::new(),
        Some(RopeScaling::Linear { factor }) => vec![("rope_scaling.factor", *factor)],
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => vec![
            ("rope_scaling.factor", *factor),
            ("rope_scaling.low_freq_factor", *low_freq_factor),
            ("rope_scaling.high_freq_factor", *high_freq_factor),
            (
                "rope_scaling.original_max_position_embeddings",
                *original_max_position_embeddings as f64,
            ),
        ],
    }
}

/// The parameters in f32 (4 bytes each, a lower bound counted in u128: embeddings, the
/// attention projections and the narrowest MLP of every layer) must fit in the machine's
/// memory.
fn fits_in_memory(
    cfg: &ModelConfig,
    total_memory: Option<u64>,
    err: &impl Fn(&str, String) -> ModelError,
) -> Result<()> {
    let Some(total) = total_memory else {
        return Ok(());
    };
    let params = min_parameters(cfg);
    let bytes = params * 4;
    if bytes <= total as u128 {
        return Ok(());
    }
    Err(err(
        "num_hidden_layers",
        format!(
            "{} layers of hidden_size {} (vocab_size {}) make at least {params} parameters, \
             {bytes} bytes in f32: more than this machine's {total} bytes of memory (MemTotal \
             in /proc/meminfo)",
            cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
        ),
    ))
}

/// A lower bound of the parameter count, in u128 (no overflow for any config).
pub(crate) fn min_parameters(cfg: &ModelConfig) -> u128 {
    let [v, h, l] = [cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers].map(|x| x as u128);
    let q = (cfg.num_attention_heads * cfg.head_dim) as u128;
    let kv = (cfg.num_key_value_heads * cfg.head_dim) as u128;
    let dense = cfg.intermediate_size as u128;
    let mlp_width = match &cfg.moe {
        Some(m) => dense.min(m.num_experts as u128 * m.moe_intermediate_size as u128),
        None => dense,
    };
    let per_layer = 2 * h * q + 2 * h * kv + 3 * h * mlp_width;
    v * h + l * per_layer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Family, Preset};

    fn tiny() -> ModelConfig {
        ModelConfig::preset(Family::Llama, Preset::Tiny, 64)
    }

    fn refused(cfg: &ModelConfig, memory: Option<u64>) -> String {
        check(cfg, Path::new("m/config.json"), memory)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn norm_eps_and_rope_theta_must_be_finite_and_positive() {
        assert!(check(&tiny(), Path::new("c"), Some(1 << 30)).is_ok());
        let mut c = tiny();
        c.rms_norm_eps = -1e-6;
        assert!(refused(&c, None).contains("`rms_norm_eps`"));
        for theta in [0.0, -5.0, f64::NAN] {
            let mut c = tiny();
            c.rope_theta = theta;
            let e = refused(&c, None);
            assert!(
                e.contains("`rope_theta`") && e.contains("m/config.json"),
                "{e}"
            );
        }
        let mut c = tiny();
        c.rope_scaling = Some(RopeScaling::Linear {
            factor: f64::INFINITY,
        });
        assert!(refused(&c, None).contains("rope_scaling.factor"));
    }

    #[test]
    fn absurd_sizes_are_refused_before_allocating() {
        let mut c = tiny();
        c.num_hidden_layers = 10_000_000;
        let e = refused(&c, None);
        assert!(
            e.contains("`num_hidden_layers`") && e.contains("10000000"),
            "{e}"
        );
        let mut c = tiny();
        c.num_hidden_layers = 4000;
        c.intermediate_size = 1 << 20;
        c.hidden_size = 1 << 14;
        let e = refused(&c, Some(24 << 30));
        assert!(
            e.contains("bytes in f32") && e.contains(&(24u64 << 30).to_string()),
            "{e}"
        );
        assert!(min_parameters(&tiny()) <= tiny().num_parameters() as u128);
    }
}

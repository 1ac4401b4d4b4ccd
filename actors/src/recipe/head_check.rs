//! `--check`'s look inside model folders whose head matters: a critic source must be a
//! scalar-head or causal-LM folder of a supported family (a reward model's `score.weight`
//! is reused, its missing bias starts at zero), a reward model must be an HF
//! `*ForSequenceClassification` folder with `score.weight`. It reads `config.json` and the
//! safetensors header only, never the weights. Also the keys of `sft`, `rm` and `dpo` runs.

use super::{Recipe, RecipeError, RunKind};
use std::io::Read;
use std::path::Path;

type Bad<'a> = &'a dyn Fn(&str, String) -> RecipeError;

/// The `architectures` entry of `dir/config.json` (empty when absent or unreadable).
fn architecture(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["architectures"][0]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Tensor names in the header of `dir/model.safetensors` (`None` when unreadable).
fn tensor_names(dir: &Path) -> Option<Vec<String>> {
    let mut f = std::fs::File::open(dir.join("model.safetensors")).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        return None;
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&header).ok()?;
    Some(v.as_object()?.keys().cloned().collect())
}

/// A critic folder: a token- or sequence-classification head, or a causal LM (new head).
pub(super) fn critic_source(key: &str, dir: &str, bad: Bad<'_>) -> Result<(), RecipeError> {
    let p = Path::new(dir);
    let arch = architecture(p);
    let known = [
        "ForTokenClassification",
        "ForSequenceClassification",
        "ForCausalLM",
    ];
    if !known.iter().any(|k| arch.ends_with(k)) {
        return Err(bad(
            key,
            format!("{dir}: architectures = {arch:?}; expected a *ForTokenClassification critic, a *ForSequenceClassification reward model or a *ForCausalLM"),
        ));
    }
    let names = tensor_names(p).ok_or_else(|| {
        bad(
            key,
            format!("{dir}: model.safetensors is missing or has no readable header"),
        )
    })?;
    if !arch.ends_with("ForCausalLM") && !names.iter().any(|n| n == "score.weight") {
        return Err(bad(
            key,
            format!("{dir}: {arch} without a score.weight tensor"),
        ));
    }
    Ok(())
}

/// A reward-model folder: `*ForSequenceClassification` with `score.weight`.
pub(super) fn reward_model(key: &str, dir: &str, bad: Bad<'_>) -> Result<(), RecipeError> {
    let p = Path::new(dir);
    let arch = architecture(p);
    if !arch.ends_with("ForSequenceClassification") {
        return Err(bad(
            key,
            format!("{dir}: architectures = {arch:?}; expected an HF *ForSequenceClassification reward model (e.g. what run.kind = \"rm\" saves in <run>/final)"),
        ));
    }
    match tensor_names(p) {
        Some(names) if names.iter().any(|n| n == "score.weight") => Ok(()),
        _ => Err(bad(
            key,
            format!("{dir}: model.safetensors has no score.weight"),
        )),
    }
}

/// The settings of `sft`, `rm` and `dpo` runs.
pub(super) fn offline_kind(r: &Recipe, bad: Bad<'_>) -> Result<(), RecipeError> {
    let positive = |key: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(bad(key, format!("{v}: expected a positive number")))
        }
    };
    match r.run.kind {
        RunKind::Rl => return Ok(()),
        RunKind::Sft => {
            positive("sft.steps", r.sft.steps as f64)?;
            positive("sft.batch_size", r.sft.batch_size as f64)?;
            positive("sft.lr", r.sft.lr)?;
        }
        RunKind::Rm => {
            positive("rm.steps", r.rm.steps as f64)?;
            positive("rm.batch_size", r.rm.batch_size as f64)?;
            positive("rm.lr", r.rm.lr)?;
        }
        RunKind::Dpo => {
            positive("dpo.steps", r.dpo.steps as f64)?;
            positive("dpo.batch_size", r.dpo.batch_size as f64)?;
            positive("dpo.lr", r.dpo.lr)?;
            positive("dpo.beta", r.dpo.beta)?;
            if !(0.0..0.5).contains(&r.dpo.label_smoothing) {
                return Err(bad(
                    "dpo.label_smoothing",
                    format!("{}: expected a number in [0, 0.5)", r.dpo.label_smoothing),
                ));
            }
        }
    }
    if !(0.0..1.0).contains(&r.data.eval_fraction) {
        return Err(bad(
            "data.eval_fraction",
            format!("{}: expected a number in [0, 1)", r.data.eval_fraction),
        ));
    }
    if r.data.path.is_none() {
        return Err(bad(
            "data.path",
            format!(
                "run.kind = {:?} trains on a data file: set data.path",
                r.run.kind
            ),
        ));
    }
    Ok(())
}

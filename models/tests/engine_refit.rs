//! Refit tests: after the trainer's weights change, a verified refit makes the engine produce
//! what a fresh engine / model with the new weights produces; a tensor corrupted in transit is
//! caught by its checksum, a wrong probe and a stale version are rejected, and a rejected refit
//! leaves the served weights and version untouched. The engine never aliases trainer storage
//! that can change (only a LoRA model's frozen base embedding is read in place).

mod common;

use candle_core::Device;
use common::{ids, tiny};
use oxalign_models::engine::{Engine, EngineConfig, EngineError, Probe, WeightUpdate};
use oxalign_models::{CausalLm, Family, GenerationRequest, SamplingParams};

fn reqs() -> Vec<GenerationRequest> {
    (0..3)
        .map(|i| {
            let mut r = GenerationRequest::new(ids(500 + i, 4 + i as usize, 64), 7);
            r.ignore_eos = true;
            r.sampling = SamplingParams {
                seed: i,
                ..SamplingParams::default()
            };
            r
        })
        .collect()
}

fn config() -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_blocks: Some(128),
        ..EngineConfig::default()
    }
}

#[test]
fn refit_serves_new_weights_and_rejects_bad_updates() {
    let cfg = tiny(Family::Llama);
    let trainer = CausalLm::init_random(&cfg, 1, &Device::Cpu).unwrap();
    let mut engine = Engine::from_model(&trainer, config()).unwrap();
    let before = engine.generate(&reqs()).unwrap();
    assert_eq!(engine.version(), 0);

    // "Training step": the trainer's weights change in place.
    let new = CausalLm::init_random(&cfg, 2, &Device::Cpu).unwrap();
    trainer.load_weights_from(&new.weights().unwrap()).unwrap();
    // Without a refit the engine still serves the old weights (no aliasing).
    assert_eq!(engine.generate(&reqs()).unwrap(), before);

    let probe_tokens = ids(9, 12, 64);
    let probe = Probe::from_model(&trainer, probe_tokens.clone(), 1e-5).unwrap();
    let update = WeightUpdate::from_model(1, &trainer).unwrap();
    let report = engine.refit(&update, Some(&probe)).unwrap();
    assert_eq!((report.version, report.previous_version), (1, 0));
    assert_eq!(report.tensors, report.checksums_ok);
    assert_eq!(report.tensors, trainer.vars().len());
    assert!(report.probe_max_abs_diff.unwrap() <= 1e-5);
    assert!(report.seconds >= report.verify_seconds);
    assert_eq!(engine.stats().version, 1);

    let after = engine.generate(&reqs()).unwrap();
    let mut fresh = Engine::from_model(&new, config()).unwrap();
    assert_eq!(after, fresh.generate(&reqs()).unwrap());
    let reference = new.generate(&reqs()).unwrap();
    for (a, b) in after.iter().zip(&reference) {
        assert_eq!(a.tokens, b.tokens);
    }
    assert_ne!(after, before);

    // A tensor corrupted after the sender checksummed it: rejected, nothing changes.
    let third = CausalLm::init_random(&cfg, 3, &Device::Cpu).unwrap();
    let mut bad = WeightUpdate::from_model(2, &third).unwrap();
    let name = "model.layers.1.mlp.down_proj.weight".to_string();
    let t = bad.tensors[&name].clone();
    let flipped = (t.clone() + t.ones_like().unwrap().affine(0.0, 1e-6).unwrap()).unwrap();
    bad.tensors.insert(name.clone(), flipped);
    match engine.refit(&bad, None) {
        Err(EngineError::RefitRejected {
            version,
            kept,
            reason,
        }) => {
            assert_eq!((version, kept), (2, 1));
            assert!(reason.contains(&name), "{reason}");
            assert!(reason.contains("1 of"), "{reason}");
        }
        other => panic!("corrupted tensor not detected: {other:?}"),
    }
    assert_eq!(engine.version(), 1);
    assert_eq!(engine.generate(&reqs()).unwrap(), after);

    // A probe from other weights (stale trainer log-probs) is rejected.
    let good = WeightUpdate::from_model(2, &third).unwrap();
    let err = engine.refit(&good, Some(&probe)).unwrap_err();
    assert!(err.to_string().contains("probe"), "{err}");
    assert_eq!(engine.version(), 1);

    // A stale version is rejected; the right probe passes.
    let stale = WeightUpdate::from_model(1, &third).unwrap();
    assert!(engine.refit(&stale, None).is_err());
    let probe3 = Probe::from_model(&third, probe_tokens, 1e-5).unwrap();
    assert_eq!(engine.refit(&good, Some(&probe3)).unwrap().version, 2);
    assert_eq!(engine.version(), 2);

    // Missing tensors are a clear error too.
    let mut missing = WeightUpdate::from_model(3, &third).unwrap();
    missing.tensors.remove("model.norm.weight");
    let err = engine.refit(&missing, None).unwrap_err();
    assert!(err.to_string().contains("model.norm.weight"), "{err}");
    assert_eq!(engine.version(), 2);
}

/// A peaked model (the final norm scaled up, as after a long RL run) puts the probe's
/// arbitrary tokens tens of nats down, where f32 rounding alone exceeds an absolute 1e-5;
/// the probe judges each token relative to its log-prob's magnitude, so a correct refit of
/// such weights is accepted, while weights from another model are still rejected.
#[test]
fn probe_tolerance_scales_with_the_log_prob() {
    let cfg = tiny(Family::Llama);
    let trainer = CausalLm::init_random(&cfg, 1, &Device::Cpu).unwrap();
    let mut engine = Engine::from_model(&trainer, config()).unwrap();
    let mut peaked = trainer.weights().unwrap();
    let norm = peaked["model.norm.weight"].affine(400.0, 0.0).unwrap();
    peaked.insert("model.norm.weight".into(), norm);
    trainer.load_weights_from(&peaked).unwrap();
    let probe = Probe::from_model(&trainer, ids(9, 12, 64), 1e-5).unwrap();
    let magnitude = probe
        .expected_logprobs
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()));
    assert!(magnitude > 20.0, "probe log-probs not peaked: {magnitude}");
    let update = WeightUpdate::from_model(1, &trainer).unwrap();
    let report = engine.refit(&update, Some(&probe)).unwrap();
    let diff = report.probe_max_abs_diff.unwrap();
    eprintln!("peaked probe: max |log-prob| {magnitude:.1} nats, max |Δ| {diff:e}");
    assert!(diff <= 1e-5 * magnitude, "{diff}");

    let other = CausalLm::init_random(&cfg, 2, &Device::Cpu).unwrap();
    let wrong = WeightUpdate::from_model(2, &other).unwrap();
    assert!(engine.refit(&wrong, Some(&probe)).is_err());
    assert_eq!(engine.version(), 1);
}

/// A refit where only some tensors changed (a LoRA update: the adapted projections move,
/// embeddings, norms and the LM head do not) serves exactly what a fresh engine on the new
/// weights serves, verified by the same checksums, in f32 and int8; the unchanged parts are
/// kept rather than copied (`weights_tests.rs` checks that).
#[test]
fn a_partial_update_serves_what_a_fresh_engine_serves() {
    use oxalign_models::engine::QuantMode;
    let cfg = tiny(Family::Llama);
    for quant in [QuantMode::None, QuantMode::Int8] {
        let trainer = CausalLm::init_random(&cfg, 1, &Device::Cpu).unwrap();
        let config = EngineConfig { quant, ..config() };
        let mut engine = Engine::from_model(&trainer, config.clone()).unwrap();
        let mut weights = trainer.weights().unwrap();
        let other = CausalLm::init_random(&cfg, 2, &Device::Cpu)
            .unwrap()
            .weights()
            .unwrap();
        for name in [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
        ] {
            weights.insert(name.into(), other[name].clone());
        }
        trainer.load_weights_from(&weights).unwrap();
        let update = WeightUpdate::from_model(1, &trainer).unwrap();
        let report = engine.refit(&update, None).unwrap();
        assert_eq!(report.checksums_ok, trainer.vars().len());
        let mut fresh = Engine::from_model(&trainer, config).unwrap();
        assert_eq!(
            engine.generate(&reqs()).unwrap(),
            fresh.generate(&reqs()).unwrap(),
            "{quant:?}"
        );
    }
}

/// A LoRA model's update shares the frozen base and carries the adapters: the engine merges
/// each adapted weight as it reads it (no merged copy of the model), checks it against the
/// sender's checksum of the merged weight, and then serves exactly what a fresh engine on
/// the eagerly merged weights serves. A base weight damaged in the update is refused.
#[test]
fn a_lora_update_is_merged_as_the_engine_reads_it() {
    use oxalign_models::engine::tensor_checksum;
    use oxalign_models::LoraConfig;
    let cfg = tiny(Family::Llama);
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["all-linear".into()],
        modules_to_save: vec![],
        use_rslora: false,
    };
    let trainer = CausalLm::init_random(&cfg, 1, &Device::Cpu)
        .unwrap()
        .with_lora(&lora, 3)
        .unwrap();
    let mut engine = Engine::from_model(&trainer, config()).unwrap();
    for (i, (name, var)) in trainer.vars().into_iter().enumerate() {
        if name.ends_with("lora_B.weight") {
            let v = (var.as_tensor().ones_like().unwrap() * (0.01 * (i % 5 + 1) as f64)).unwrap();
            var.set(&v).unwrap();
        }
    }
    let q = "model.layers.0.self_attn.q_proj.weight";
    let merged = trainer.weights().unwrap();
    let update = WeightUpdate::from_model(1, &trainer).unwrap();
    assert!(update.merge.is_some());
    let diff = |a: &candle_core::Tensor, b: &candle_core::Tensor| {
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        d.to_scalar::<f32>().unwrap()
    };
    assert!(
        diff(&update.tensors[q], &merged[q]) > 0.0,
        "the base, not a merged copy"
    );
    assert_eq!(update.checksums[q], tensor_checksum(&merged[q]).unwrap());

    let mut damaged = update.clone();
    let moved = (damaged.tensors[q].clone() + 1e-3).unwrap();
    damaged.tensors.insert(q.into(), moved);
    let err = engine.refit(&damaged, None).unwrap_err().to_string();
    assert!(
        err.contains(q) && err.contains("checksum mismatch"),
        "{err}"
    );
    assert_eq!(engine.version(), 0);

    let report = engine.refit(&update, None).unwrap();
    assert_eq!(report.checksums_ok, cfg_params(&cfg));
    let mut fresh = Engine::from_model(&trainer, config()).unwrap();
    assert_eq!(
        engine.generate(&reqs()).unwrap(),
        fresh.generate(&reqs()).unwrap()
    );
}

/// The number of weights of a plain model of `cfg`.
fn cfg_params(cfg: &oxalign_models::ModelConfig) -> usize {
    CausalLm::init_random(cfg, 0, &Device::Cpu)
        .unwrap()
        .vars()
        .len()
}

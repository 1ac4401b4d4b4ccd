//! Reduced-precision rollout weights (bf16, int8 = W8A8, 4-bit = Q4_0): the engine runs, its
//! log-prob mismatch against the f32 trainer is measured, small, and larger for 4-bit than
//! for int8; a refit re-quantizes and the probe reports the mismatch.

use candle_core::Device;
use oxalign_models::engine::{Engine, EngineConfig, Probe, QuantMode, WeightUpdate};
use oxalign_models::{CausalLm, Family, GenerationRequest, ModelConfig, Preset, SamplingParams};

fn config() -> ModelConfig {
    // Input sizes must be multiples of the quantization block (32).
    let mut c = ModelConfig::preset(Family::Llama, Preset::Tiny, 96);
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c
}

fn mismatch(m: &CausalLm, quant: QuantMode) -> f32 {
    let cfg = EngineConfig {
        block_size: 8,
        num_blocks: Some(64),
        quant,
        ..EngineConfig::default()
    };
    let mut e = Engine::from_model(m, cfg).unwrap();
    let seq: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 96).collect();
    let got = e.score(std::slice::from_ref(&seq)).unwrap().remove(0);
    let probe = Probe::from_model(m, seq, 1.0).unwrap();
    let mut r = GenerationRequest::new(vec![3, 4, 5], 6);
    r.sampling = SamplingParams::greedy();
    assert_eq!(e.generate(&[r]).unwrap()[0].tokens.len(), 6);
    got.iter()
        .zip(&probe.expected_logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn quantized_engines_have_small_measured_mismatch() {
    let m = CausalLm::init_random(&config(), 5, &Device::Cpu).unwrap();
    let f32_diff = mismatch(&m, QuantMode::None);
    let int8 = mismatch(&m, QuantMode::Int8);
    let q4 = mismatch(&m, QuantMode::Q4);
    let bf16 = mismatch(&m, QuantMode::Bf16);
    eprintln!("max |logprob - trainer|: f32 {f32_diff:e}, bf16 {bf16:e}, int8 {int8:e}, q4 {q4:e}");
    assert!(f32_diff <= 1e-5);
    assert!(bf16 > f32_diff && bf16 < 0.05, "bf16 mismatch {bf16}");
    assert!(int8 > 0.0 && int8 < 0.05, "int8 mismatch {int8}");
    assert!(q4 > int8 && q4 < 0.5, "q4 mismatch {q4}");

    // A quantized engine refits (re-quantizing) and its probe reports the mismatch.
    let cfg = EngineConfig {
        block_size: 8,
        num_blocks: Some(64),
        quant: QuantMode::Int8,
        ..EngineConfig::default()
    };
    let mut e = Engine::from_model(&m, cfg).unwrap();
    let m2 = CausalLm::init_random(&config(), 6, &Device::Cpu).unwrap();
    let probe = Probe::from_model(&m2, (1..30).collect(), 0.05).unwrap();
    let report = e
        .refit(&WeightUpdate::from_model(1, &m2).unwrap(), Some(&probe))
        .unwrap();
    let d = report.probe_max_abs_diff.unwrap();
    assert!(d > 0.0 && d < 0.05, "{d}");
}

#[test]
fn quantization_needs_block_aligned_sizes() {
    let mut c = config();
    c.intermediate_size = 48;
    let m = CausalLm::init_random(&c, 7, &Device::Cpu).unwrap();
    let cfg = EngineConfig {
        quant: QuantMode::Q4,
        num_blocks: Some(8),
        ..EngineConfig::default()
    };
    let err = Engine::from_model(&m, cfg).err().unwrap();
    assert!(err.to_string().contains("multiple of 32"), "{err}");
}

/// A bf16 engine holds half the linear-layer bytes of an f32 one, generates, and refits:
/// after a refit its probe gap is the bf16 rounding's, and its weights are the new ones.
#[test]
fn a_bf16_engine_halves_the_weight_bytes_and_refits() {
    let m = CausalLm::init_random(&config(), 8, &Device::Cpu).unwrap();
    let engine = |quant| {
        let cfg = EngineConfig {
            block_size: 8,
            num_blocks: Some(64),
            quant,
            ..EngineConfig::default()
        };
        Engine::from_model(&m, cfg).unwrap()
    };
    let (f32e, mut bf16e) = (engine(QuantMode::None), engine(QuantMode::Bf16));
    let (fb, bb) = (f32e.stats().weight_bytes, bf16e.stats().weight_bytes);
    // Linear layers halve; the norms (3 · 64 f32 per layer pair) stay f32.
    assert!(
        2 * bb < fb + 8 * 64 * 4 && 2 * bb > fb,
        "bf16 {bb} bytes against f32 {fb}"
    );

    let m2 = CausalLm::init_random(&config(), 9, &Device::Cpu).unwrap();
    let probe = Probe::from_model(&m2, (1..30).collect(), 0.05).unwrap();
    let report = bf16e
        .refit(&WeightUpdate::from_model(1, &m2).unwrap(), Some(&probe))
        .unwrap();
    let d = report.probe_max_abs_diff.unwrap();
    assert!(d > 0.0 && d < 0.02, "bf16 probe gap after refit {d}");
}

//! MoE parity with HF transformers on the committed fixtures of `tools/moe_reference.py`
//! (Qwen3-MoE with per-expert and packed checkpoints, Mixtral, Qwen2-MoE with its shared
//! expert): per-token log-probs of the training forward and of the engine within 1e-4 (alone
//! and left-padded), identical 16-token greedy continuations (KV-cached `generate` and the
//! engine), the load-balancing loss, and the gradient reaching the router through the routing
//! weights, against PyTorch's autograd.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{batch, batch1};
use oxalign_models::config::layout::FeedForwardParams;
use oxalign_models::engine::{Engine, EngineConfig};
use oxalign_models::moe::routing::RouterTrace;
use oxalign_models::{CausalLm, GenerationRequest, SamplingParams, TokenDistribution};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn golden(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn rows_of<T>(v: &Value, f: fn(&Value) -> Vec<T>) -> Vec<Vec<T>> {
    v.as_array().unwrap().iter().map(f).collect()
}

fn max_diff(got: &[f32], expect: &[f64]) -> f64 {
    assert_eq!(got.len(), expect.len());
    got.iter()
        .zip(expect)
        .map(|(a, b)| (*a as f64 - b).abs())
        .fold(0.0, f64::max)
}

fn engine(m: &CausalLm) -> Engine {
    let cfg = EngineConfig {
        block_size: 4,
        num_blocks: Some(256),
        max_batched_tokens: 7,
        ..EngineConfig::default()
    };
    Engine::from_model(m, cfg).unwrap()
}

fn greedy_request(prompt: &[u32]) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        max_new_tokens: 16,
        sampling: SamplingParams::greedy(),
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

/// Log-probs (unpadded, left-padded), trainer and engine, and greedy decoding.
fn check_logprobs_and_greedy(name: &str) {
    let dir = fixture(name);
    let g = golden(&dir);
    let m = CausalLm::load(&dir, &Device::Cpu).unwrap();
    let seqs = rows_of(&g["sequences"], u32s);
    let expect = rows_of(&g["logprobs"], f64s);
    let mut eng = engine(&m);
    let scored = eng.score(&seqs).unwrap();
    let (mut worst, mut worst_engine) = (0f64, 0f64);
    for ((row, want), eng_lp) in seqs.iter().zip(&expect).zip(&scored) {
        let lp = m.next_token_logprobs(&batch1(row), None).unwrap();
        worst = worst.max(max_diff(&lp.squeeze(0).unwrap().to_vec1().unwrap(), want));
        worst_engine = worst_engine.max(max_diff(eng_lp, want));
    }
    println!("{name}: log-prob max abs diff vs transformers: trainer {worst:.2e}, engine {worst_engine:.2e}");
    assert!(worst <= 1e-4, "{name}: trainer log-probs differ by {worst}");
    assert!(
        worst_engine <= 1e-4,
        "{name}: engine log-probs differ by {worst_engine}"
    );

    let mask_rows = rows_of(&g["padded_mask"], u32s);
    let got = m
        .next_token_logprobs(
            &batch(&rows_of(&g["padded_ids"], u32s)),
            Some(&batch(&mask_rows)),
        )
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut worst = 0f64;
    for ((got, want), mrow) in got
        .iter()
        .zip(rows_of(&g["padded_logprobs"], f64s))
        .zip(&mask_rows)
    {
        for t in (0..got.len()).filter(|&t| mrow[t] == 1) {
            worst = worst.max((got[t] as f64 - want[t]).abs());
        }
    }
    println!("{name}: left-padded log-prob max abs diff {worst:.2e}");
    assert!(
        worst <= 1e-4,
        "{name}: left-padded log-probs differ by {worst}"
    );

    let prompt = u32s(&g["greedy_prompt"]);
    let want = u32s(&g["greedy_tokens"]);
    let cached = m
        .generate(&[greedy_request(&prompt)])
        .unwrap()
        .remove(0)
        .tokens;
    assert_eq!(cached, want, "{name}: KV-cached greedy continuation");
    let engine_out = eng
        .generate(&[greedy_request(&prompt)])
        .unwrap()
        .remove(0)
        .tokens;
    assert_eq!(engine_out, want, "{name}: engine greedy continuation");
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

/// The load-balancing loss of the padded batch, and the gradient of HF's objective
/// `sum(log-probs of real tokens at real positions) + coef * aux` at layer 0's router.
fn check_aux_loss_and_router_grad(name: &str) {
    let dir = fixture(name);
    let g = golden(&dir);
    let m = CausalLm::load(&dir, &Device::Cpu).unwrap();
    let ids = batch(&rows_of(&g["padded_ids"], u32s));
    let mask = batch(&rows_of(&g["padded_mask"], u32s));
    let mut trace = RouterTrace::new();
    let out = m
        .next_token_outputs_traced(&ids, Some(&mask), TokenDistribution::MODEL, &mut trace)
        .unwrap();
    let aux = m.router_aux_loss(&trace, Some(&mask)).unwrap().unwrap();
    let want = g["aux_loss"].as_f64().unwrap();
    println!(
        "{name}: aux loss {:.6} vs transformers {want:.6}",
        scalar(&aux)
    );
    assert!(
        (scalar(&aux) - want).abs() <= 1e-5 * want.abs().max(1.0),
        "{name}: aux loss"
    );
    assert_eq!(
        m.router_aux_loss_coef(),
        g["router_aux_loss_coef"].as_f64().unwrap()
    );

    let t = ids.dim(1).unwrap();
    // Real tokens predicted at real positions (a pad row's own output is implementation-defined).
    let real = mask.to_dtype(DType::F32).unwrap();
    let target_mask =
        (real.narrow(1, 0, t - 1).unwrap() * real.narrow(1, 1, t - 1).unwrap()).unwrap();
    let objective = ((out.logprobs * target_mask).unwrap().sum_all().unwrap()
        + (aux * m.router_aux_loss_coef()).unwrap())
    .unwrap();
    let grads = objective.backward().unwrap();
    let decl = m.config().backbone_params();
    let FeedForwardParams::Sparse(moe) = &decl.layers[0].ffn else {
        panic!("{name}: layer 0 is sparse in the fixture")
    };
    let router = m.params().get(&moe.router.weight.name).unwrap();
    let got: Vec<f32> = grads
        .get(&router)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let want: Vec<f64> = rows_of(&g["router_grad"], f64s).concat();
    let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
    let worst = max_diff(&got, &want);
    println!("{name}: router gradient max abs diff {worst:.2e} (max |grad| {scale:.2e})");
    assert!(
        scale > 0.0 && worst <= 1e-4 * scale.max(1.0),
        "{name}: router gradient"
    );
}

#[test]
fn qwen3_moe_matches_transformers() {
    check_logprobs_and_greedy("qwen3_moe_tiny");
    check_aux_loss_and_router_grad("qwen3_moe_tiny");
}

#[test]
fn qwen3_moe_packed_checkpoint_matches_transformers() {
    check_logprobs_and_greedy("qwen3_moe_packed");
    let packed = CausalLm::load(&fixture("qwen3_moe_packed"), &Device::Cpu).unwrap();
    let split = CausalLm::load(&fixture("qwen3_moe_tiny"), &Device::Cpu).unwrap();
    let (a, b) = (packed.weights().unwrap(), split.weights().unwrap());
    assert_eq!(a.len(), b.len());
    for (name, t) in &b {
        assert_eq!(common::max_abs_diff(t, &a[name]), 0.0, "{name}");
    }
}

#[test]
fn mixtral_matches_transformers() {
    check_logprobs_and_greedy("mixtral_tiny");
    check_aux_loss_and_router_grad("mixtral_tiny");
}

#[test]
fn qwen2_moe_with_shared_expert_matches_transformers() {
    check_logprobs_and_greedy("qwen2_moe_tiny");
    check_aux_loss_and_router_grad("qwen2_moe_tiny");
}

#[test]
fn every_parameter_of_the_moe_fixtures_gets_a_gradient() {
    for name in ["qwen3_moe_tiny", "mixtral_tiny", "qwen2_moe_tiny"] {
        let m = CausalLm::load(&fixture(name), &Device::Cpu).unwrap();
        // 4 x 40 tokens: enough that every expert of every layer is chosen.
        let rows: Vec<Vec<u32>> = (0..4).map(|s| common::ids(90 + s, 40, 300)).collect();
        let ids = batch(&rows);
        let mut trace = RouterTrace::new();
        let out = m
            .next_token_outputs_traced(&ids, None, TokenDistribution::MODEL, &mut trace)
            .unwrap();
        let aux = m.router_aux_loss(&trace, None).unwrap().unwrap();
        let loss =
            (out.logprobs.sum_all().unwrap() + (aux * m.router_aux_loss_coef()).unwrap()).unwrap();
        let grads = loss.backward().unwrap();
        let vars = m.vars();
        assert_eq!(
            vars.len(),
            oxalign_models::config::layout::causal_lm_specs(m.config()).len()
        );
        for (pname, var) in &vars {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no gradient for {pname}"));
            let norm = scalar(&g.sqr().unwrap().sum_all().unwrap());
            assert!(
                norm.is_finite() && norm > 0.0,
                "{name}: zero gradient for {pname}"
            );
        }
    }
}

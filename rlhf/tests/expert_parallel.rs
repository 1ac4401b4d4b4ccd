//! Expert-parallel trainers: three SFT steps with the experts of a tiny Qwen3-MoE spread over
//! two ranks, each rank on its own half of the batch, leave the same weights (gathered) and
//! gradient norms as one trainer on the whole batch, within the data-parallel tolerance; each
//! rank holds half the expert parameters and AdamW moments (measured from the tensors'
//! storage); a dense model, FSDP and a step without the group are refused; the optimizer
//! state saves and loads back per rank.

mod common;

use common::max_weight_diff;

use candle_core::{Device, Tensor};
use oxalign_kernels::collective::{Collective, ThreadCollective};
use oxalign_models::{CausalLm, ExpertNames, ExpertParallel, Family, ModelConfig, Preset};
use oxalign_rlhf::trainer::{PolicyTrainer, Sharded, TokenBatch};
use std::collections::HashMap;
use std::sync::Arc;

fn config() -> ModelConfig {
    let mut c = ModelConfig::preset(Family::Qwen3Moe, Preset::Tiny, 64);
    c.num_hidden_layers = 2;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    let m = c.moe.as_mut().unwrap();
    m.num_experts = 4;
    m.num_experts_per_tok = 2;
    m.moe_intermediate_size = 16;
    m.router_aux_loss_coef = 0.0;
    c
}

/// Eight sequences of uneven prompt and response lengths.
fn batch(rows: std::ops::Range<usize>) -> TokenBatch {
    let all: Vec<(Vec<u32>, Vec<u32>)> = (0..8u32)
        .map(|i| {
            let p: Vec<u32> = (0..3 + i % 3).map(|j| (i * 7 + j * 3) % 60 + 1).collect();
            let r: Vec<u32> = (0..2 + (i * 5) % 4)
                .map(|j| (i * 11 + j * 13) % 60 + 1)
                .collect();
            (p, r)
        })
        .collect();
    let refs: Vec<(&[u32], &[u32])> = all[rows]
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    TokenBatch::new(&refs, 0, &Device::Cpu).unwrap()
}

fn policy() -> PolicyTrainer {
    let m = CausalLm::init_random(&config(), 5, &Device::Cpu).unwrap();
    for (_, v) in m.vars() {
        if v.rank() == 2 {
            v.set(&(v.as_tensor() * 4.0).unwrap()).unwrap();
        }
    }
    PolicyTrainer::new(m, 1e-3, 0.01).unwrap()
}

/// Bytes of expert and of other parameters, and of AdamW moments, held by `t`.
fn held(t: &PolicyTrainer) -> (usize, usize, usize) {
    let names = ExpertNames::of(t.model.config());
    let bytes = |experts: bool| -> usize {
        t.model
            .vars()
            .iter()
            .filter(|(n, _)| names.expert_of(n).is_some() == experts)
            .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
            .sum()
    };
    (bytes(true), bytes(false), t.memory().optimizer)
}

struct Run {
    weights: HashMap<String, Tensor>,
    norms: Vec<f64>,
    held: (usize, usize, usize),
}

fn sft(world: usize) -> Run {
    if world == 1 {
        let mut t = policy();
        let norms = (0..3)
            .map(|_| {
                t.sft_step(&batch(0..8), 1e-3, 1.0, 1.0, None)
                    .unwrap()
                    .1
                    .grad_norm
            })
            .collect();
        let held = held(&t);
        return Run {
            weights: t.model.weights().unwrap(),
            norms,
            held,
        };
    }
    let total = batch(0..8).response_tokens() as f64;
    let threads: Vec<_> = ThreadCollective::group(world)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank();
                let c: Arc<dyn Collective> = Arc::new(c);
                let mut t = policy();
                t.spread_experts(ExpertParallel::new(c.clone())).unwrap();
                let local = batch(rank * 4..rank * 4 + 4);
                let weight = local.response_tokens() as f64 / total * world as f64;
                let norms = (0..3)
                    .map(|_| {
                        let (_, s) = t
                            .sft_step(&local, 1e-3, 1.0, weight, Some(c.as_ref()))
                            .unwrap();
                        s.grad_norm
                    })
                    .collect();
                let held = held(&t);
                let dir =
                    std::env::temp_dir().join(format!("oxalign-ep-opt-{}", std::process::id()));
                t.save_optimizer(&dir).unwrap();
                t.load_optimizer(&dir).unwrap();
                let weights = t.model.full_weights().unwrap();
                c.barrier().unwrap();
                if rank == 0 {
                    std::fs::remove_dir_all(&dir).unwrap();
                }
                Run {
                    weights,
                    norms,
                    held,
                }
            })
        })
        .collect();
    let mut runs: Vec<Run> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for r in &runs[1..] {
        assert_eq!(r.norms, runs[0].norms, "every rank sees the global norm");
        assert_eq!(r.held, runs[0].held);
    }
    runs.swap_remove(0)
}

#[test]
fn ep2_sft_steps_match_one_trainer_on_the_whole_batch() {
    let one = sft(1);
    let init = policy().model.weights().unwrap();
    let moved = max_weight_diff(&one.weights, &init);
    assert!(moved > 5e-4, "the steps must change the weights ({moved})");
    let two = sft(2);
    let d = max_weight_diff(&one.weights, &two.weights);
    eprintln!("EP=2 vs EP=1 after 3 AdamW steps: max |diff| = {d:e} (moved {moved:e})");
    // The tolerance of the replicated data-parallel test (actors/tests/data_parallel.rs).
    assert!(d < 1e-5, "EP=2 differs by {d}");
    for (a, b) in one.norms.iter().zip(&two.norms) {
        assert!((a - b).abs() <= 1e-5 * a.max(1.0), "grad norms {a} vs {b}");
    }
    let ((e1, d1, o1), (e2, d2, o2)) = (one.held, two.held);
    eprintln!(
        "per-rank bytes: expert params EP=1 {e1}, EP=2 {e2}; other params {d1} / {d2}; \
         AdamW moments {o1} / {o2}"
    );
    assert_eq!(e2 * 2, e1, "each rank holds half the expert parameters");
    assert_eq!(d2, d1, "dense parameters are replicated");
    assert_eq!(o1 - o2, e1, "half the experts' two moments are gone");
}

#[test]
fn spreading_experts_is_refused_when_it_cannot_work() {
    let c: Arc<dyn Collective> = Arc::new(ThreadCollective::group(1).pop().unwrap());
    let mut dense = PolicyTrainer::new(
        CausalLm::init_random(
            &ModelConfig::preset(Family::Llama, Preset::Tiny, 64),
            1,
            &Device::Cpu,
        )
        .unwrap(),
        1e-3,
        0.0,
    )
    .unwrap();
    let e = dense
        .spread_experts(ExpertParallel::new(c.clone()))
        .unwrap_err();
    assert!(e.to_string().contains("no experts"), "{e}");
    let mut sharded = policy();
    sharded.shard(0, 1, None).unwrap();
    let e = sharded
        .spread_experts(ExpertParallel::new(c.clone()))
        .unwrap_err();
    assert!(e.to_string().contains("FSDP"), "{e}");
    let mut t = policy();
    t.spread_experts(ExpertParallel::new(c.clone())).unwrap();
    let e = t
        .spread_experts(ExpertParallel::new(c.clone()))
        .unwrap_err();
    assert!(e.to_string().contains("already spread"), "{e}");
    let e = t.shard(0, 1, None).unwrap_err();
    assert!(e.to_string().contains("expert parallelism"), "{e}");
    let e = t.sft_step(&batch(0..2), 1e-3, 1.0, 1.0, None).unwrap_err();
    assert!(e.to_string().contains("needs the group"), "{e}");
}

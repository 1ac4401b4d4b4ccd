//! Scheduler tests under a small KV block budget: preemption by recompute and prefix sharing
//! (forked samples, copy-on-write) must give exactly the outputs of an unconstrained run, and
//! the pool must be empty afterwards.

mod common;

use candle_core::Device;
use common::{ids, tiny};
use oxalign_models::engine::{Engine, EngineConfig};
use oxalign_models::{CausalLm, Completion, Family, GenerationRequest, SamplingParams};

/// Two prompts with 4 samples each (GRPO-style groups) plus two single prompts, sampled with
/// distinct seeds, and one greedy request.
fn workload() -> Vec<GenerationRequest> {
    let mut reqs = vec![];
    for (g, len) in [(0u64, 6usize), (1, 8)] {
        let prompt = ids(200 + g, len, 64);
        for k in 0..4 {
            let mut r = GenerationRequest::new(prompt.clone(), 10);
            r.ignore_eos = true;
            r.sampling = SamplingParams {
                seed: 10 * g + k,
                ..SamplingParams::default()
            };
            reqs.push(r);
        }
    }
    for s in 0..2 {
        let mut r = GenerationRequest::new(ids(300 + s, 5 + s as usize, 64), 11);
        r.ignore_eos = true;
        r.sampling.seed = 77 + s;
        reqs.push(r);
    }
    let mut r = GenerationRequest::new(ids(400, 9, 64), 8);
    r.sampling = SamplingParams::greedy();
    reqs.push(r);
    reqs
}

fn assert_same(a: &[Completion], b: &[Completion], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{what}: request {i} tokens differ");
        assert_eq!(x.finish_reason, y.finish_reason, "{what}: request {i}");
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!((p - q).abs() <= 1e-5, "{what}: request {i}: {p} vs {q}");
        }
    }
}

fn unconstrained(m: &CausalLm) -> Vec<Completion> {
    let cfg = EngineConfig {
        block_size: 4,
        num_blocks: Some(1024),
        prefix_sharing: false,
        ..EngineConfig::default()
    };
    let mut e = Engine::from_model(m, cfg).unwrap();
    let out = e.generate(&workload()).unwrap();
    let s = e.stats();
    assert_eq!(s.preemptions, 0);
    assert_eq!(s.forked_sequences, 0);
    out
}

#[test]
fn preemption_under_small_budget_gives_identical_outputs() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 81, &Device::Cpu).unwrap();
        let want = unconstrained(&m);
        // 6 blocks of 4 tokens: one sequence needs up to 5, eleven sequences compete.
        let cfg = EngineConfig {
            block_size: 4,
            num_blocks: Some(6),
            max_batched_tokens: 5,
            prefix_sharing: false,
            ..EngineConfig::default()
        };
        let mut e = Engine::from_model(&m, cfg).unwrap();
        let got = e.generate(&workload()).unwrap();
        let s = e.stats();
        assert!(
            s.preemptions > 0,
            "{family}: expected preemptions, stats {s:?}"
        );
        assert!(s.peak_blocks_used <= 6);
        assert_eq!(s.blocks_used, 0, "{family}: blocks leaked");
        assert_same(&got, &want, &format!("{family} preemption"));
    }
}

#[test]
fn prefix_sharing_forks_samples_and_copies_on_write() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 82, &Device::Cpu).unwrap();
        let want = unconstrained(&m);
        let cfg = EngineConfig {
            block_size: 4,
            num_blocks: Some(1024),
            ..EngineConfig::default()
        };
        let mut e = Engine::from_model(&m, cfg).unwrap();
        let got = e.generate(&workload()).unwrap();
        let s = e.stats();
        // 3 followers in each of the two groups.
        assert_eq!(s.forked_sequences, 6, "{family}: {s:?}");
        // Prompt of 6 tokens = 2 blocks, of 8 tokens = 2 blocks, shared by 3 followers each.
        assert_eq!(s.prefix_shared_blocks, 12, "{family}: {s:?}");
        // The 6-token prompt ends in a half-full shared block: 3 copy-on-write copies.
        assert_eq!(s.cow_copies, 3, "{family}: {s:?}");
        // Prompt tokens computed once per group: 6 + 8 + 5 + 6 + 9.
        assert_eq!(s.prefill_tokens, 34, "{family}: {s:?}");
        assert_eq!(s.blocks_used, 0);
        assert_same(&got, &want, &format!("{family} sharing"));
    }
}

#[test]
fn sharing_and_preemption_together_give_identical_outputs() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 83, &Device::Cpu).unwrap();
        let want = unconstrained(&m);
        for (blocks, budget, max_running) in [(5, 3, 256), (7, 64, 3), (9, 6, 5)] {
            let cfg = EngineConfig {
                block_size: 4,
                num_blocks: Some(blocks),
                max_batched_tokens: budget,
                max_running,
                ..EngineConfig::default()
            };
            let mut e = Engine::from_model(&m, cfg).unwrap();
            let got = e.generate(&workload()).unwrap();
            let s = e.stats();
            assert_eq!(s.blocks_used, 0, "{family}: blocks leaked, {s:?}");
            // Every setting both preempts and forks the sample groups.
            assert!(s.preemptions > 0, "{family} blocks={blocks}: {s:?}");
            assert_eq!(s.forked_sequences, 6, "{family} blocks={blocks}: {s:?}");
            assert!(s.peak_blocks_used <= blocks);
            assert_same(
                &got,
                &want,
                &format!("{family} blocks={blocks} budget={budget}"),
            );
        }
    }
}

#[test]
fn pool_is_sized_from_the_memory_budget() {
    let cfg = tiny(Family::Llama);
    let m = CausalLm::init_random(&cfg, 84, &Device::Cpu).unwrap();
    let ec = EngineConfig {
        block_size: 8,
        num_blocks: None,
        kv_memory_bytes: 100_000,
        ..EngineConfig::default()
    };
    // K and V, 2 layers, 2 kv heads, head_dim 8, 8 tokens, f32 = 2048 bytes per block.
    assert_eq!(ec.block_bytes(&cfg), 2048);
    let e = Engine::from_model(&m, ec.clone()).unwrap();
    assert_eq!(e.stats().num_blocks, 48);
    let too_small = EngineConfig {
        kv_memory_bytes: 1000,
        ..ec
    };
    let err = Engine::from_model(&m, too_small).err().unwrap();
    assert!(err.to_string().contains("kv_memory_bytes"), "{err}");
}

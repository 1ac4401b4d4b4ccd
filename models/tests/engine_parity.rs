//! Engine parity: for the same f32 weights, the engine's log-probs of its generated tokens
//! equal the trainer forward's within 1e-5, greedy output equals a no-cache recompute loop and
//! `CausalLm::generate` token for token, sampled output equals `CausalLm::generate` (same
//! seeds), and stop strings end a completion.

mod common;

use candle_core::{Device, Tensor, D};
use common::{batch1, ids, tiny};
use oxalign_models::engine::{Engine, EngineConfig, EngineRequest};
use oxalign_models::{
    CausalLm, Family, FinishReason, GenerationRequest, Sampler, SamplingParams, TokenDistribution,
};

fn engine_config() -> EngineConfig {
    // Small blocks and a small token budget: several blocks per sequence, chunked prefill.
    EngineConfig {
        block_size: 4,
        num_blocks: Some(256),
        max_batched_tokens: 7,
        ..EngineConfig::default()
    }
}

fn requests(greedy: bool) -> Vec<GenerationRequest> {
    (0..5)
        .map(|i| {
            let mut r = GenerationRequest::new(ids(40 + i, 3 + 2 * i as usize, 64), 9);
            r.ignore_eos = true;
            r.sampling = if greedy {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: if i < 3 { 0.7 } else { 1.0 },
                    top_k: if i % 2 == 0 { 0 } else { 20 },
                    top_p: if i == 3 { 0.9 } else { 1.0 },
                    seed: 100 + i,
                }
            };
            r
        })
        .collect()
}

/// Trainer-forward log-probs of `completion` after `prompt`, under `dist`.
fn trainer_logprobs(
    m: &CausalLm,
    prompt: &[u32],
    completion: &[u32],
    dist: TokenDistribution,
) -> Vec<f32> {
    let mut all = prompt.to_vec();
    all.extend_from_slice(completion);
    let lp = m
        .next_token_outputs(&batch1(&all), None, dist)
        .unwrap()
        .logprobs
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    lp[prompt.len() - 1..].to_vec()
}

#[test]
fn engine_logprobs_equal_trainer_forward() {
    for family in Family::ALL {
        for greedy in [true, false] {
            let m = CausalLm::init_random(&tiny(family), 71, &Device::Cpu).unwrap();
            let mut engine = Engine::from_model(&m, engine_config()).unwrap();
            let reqs = requests(greedy);
            let out = engine.generate(&reqs).unwrap();
            for (r, c) in reqs.iter().zip(&out) {
                assert_eq!(c.tokens.len(), 9);
                // Under the distribution sampled (T = 0.7, top-k 20, top-p 0.9 among them).
                let dist = Sampler::new(r.sampling.clone()).distribution();
                let want = trainer_logprobs(&m, &r.prompt, &c.tokens, dist);
                for (a, b) in c.logprobs.iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 1e-5,
                        "{family} greedy={greedy}: engine {a} vs trainer {b}"
                    );
                }
            }
            // Everything was returned to the pool.
            assert_eq!(engine.stats().blocks_used, 0);
        }
    }
}

/// The engine's default 16-position blocks (keys read four blocks at a time) and heads of 64
/// and 80 channels (values summed 64 channels at a time, then the 16-channel rest), over
/// contexts of up to seven blocks: log-probs equal the trainer's.
#[test]
fn wide_heads_in_default_blocks_equal_trainer_forward() {
    for head_dim in [64, 80] {
        let mut c = tiny(Family::Llama);
        (c.hidden_size, c.num_attention_heads, c.num_key_value_heads) = (2 * head_dim, 4, 2);
        c.head_dim = head_dim;
        c.max_position_embeddings = 256;
        let m = CausalLm::init_random(&c, 77, &Device::Cpu).unwrap();
        let config = EngineConfig {
            num_blocks: Some(64),
            ..EngineConfig::default()
        };
        assert_eq!(config.block_size, 16);
        let mut engine = Engine::from_model(&m, config).unwrap();
        let reqs: Vec<GenerationRequest> = (0..4)
            .map(|i| {
                let mut r = GenerationRequest::new(ids(50 + i, 5 + 28 * i as usize, 64), 9);
                r.ignore_eos = true;
                r.sampling = SamplingParams::greedy();
                r
            })
            .collect();
        let out = engine.generate(&reqs).unwrap();
        for (r, c) in reqs.iter().zip(&out) {
            let dist = Sampler::new(r.sampling.clone()).distribution();
            let want = trainer_logprobs(&m, &r.prompt, &c.tokens, dist);
            for (a, b) in c.logprobs.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "head_dim {head_dim}: engine {a} vs trainer {b}"
                );
            }
        }
    }
}

#[test]
fn engine_greedy_equals_no_cache_loop_and_generate() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 72, &Device::Cpu).unwrap();
        let mut engine = Engine::from_model(&m, engine_config()).unwrap();
        let reqs = requests(true);
        let out = engine.generate(&reqs).unwrap();
        let reference = m.generate(&reqs).unwrap();
        for ((r, c), g) in reqs.iter().zip(&out).zip(&reference) {
            // Plain recompute loop: full forward over the whole sequence every step.
            let mut seq = r.prompt.clone();
            for _ in 0..r.max_new_tokens {
                let logits = m.forward(&batch1(&seq), None).unwrap();
                let last = logits.narrow(1, seq.len() - 1, 1).unwrap();
                let next = last.argmax(D::Minus1).unwrap().flatten_all().unwrap();
                seq.push(next.to_vec1::<u32>().unwrap()[0]);
            }
            assert_eq!(c.tokens, seq[r.prompt.len()..].to_vec(), "{family}");
            assert_eq!(c.tokens, g.tokens, "{family}: engine vs CausalLm::generate");
        }
    }
}

#[test]
fn engine_sampling_equals_generate_with_same_seeds() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 73, &Device::Cpu).unwrap();
        let reqs = requests(false);
        let reference = m.generate(&reqs).unwrap();
        let mut engine = Engine::from_model(&m, engine_config()).unwrap();
        let out = engine.generate(&reqs).unwrap();
        for (c, g) in out.iter().zip(&reference) {
            assert_eq!(c.tokens, g.tokens, "{family}");
            for (a, b) in c.logprobs.iter().zip(&g.logprobs) {
                assert!((a - b).abs() <= 1e-5, "{family}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn stop_tokens_and_stop_strings_end_completions() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 74, &Device::Cpu).unwrap();
    let mut engine = Engine::from_model(&m, engine_config()).unwrap();
    let mut r = GenerationRequest::new(ids(9, 5, 64), 12);
    r.sampling = SamplingParams::greedy();
    r.ignore_eos = true;
    let free = engine.generate(std::slice::from_ref(&r)).unwrap().remove(0);
    assert_eq!(free.tokens.len(), 12);
    // Detokenizer: one letter per id.
    let detok = |t: &[u32]| -> String {
        t.iter()
            .map(|&i| char::from(b'A' + (i % 58) as u8))
            .collect()
    };
    let target = detok(&free.tokens[2..4]);
    let req = EngineRequest {
        request: r.clone(),
        stop_strings: vec![target.clone()],
    };
    let out = engine
        .generate_with_stops(std::slice::from_ref(&req), Some(&detok))
        .unwrap()
        .remove(0);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert!(detok(&out.tokens).ends_with(&target) || detok(&out.tokens).contains(&target));
    assert!(out.tokens.len() <= 4);
    assert_eq!(out.tokens[..], free.tokens[..out.tokens.len()]);
    // Stop strings without a detokenizer are a request error, not a panic.
    assert!(engine.generate_with_stops(&[req], None).is_err());

    // A stop token id ends the completion and is its last token.
    let mut r2 = r.clone();
    r2.stop_token_ids = vec![free.tokens[3]];
    let out = engine.generate(&[r2]).unwrap().remove(0);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    let first = free
        .tokens
        .iter()
        .position(|&t| t == free.tokens[3])
        .unwrap();
    assert_eq!(out.tokens, free.tokens[..=first].to_vec());
}

#[test]
fn engine_score_equals_trainer_and_bad_requests_are_errors() {
    let m = CausalLm::init_random(&tiny(Family::Qwen2), 75, &Device::Cpu).unwrap();
    let mut engine = Engine::from_model(&m, engine_config()).unwrap();
    let seq = ids(3, 19, 64);
    let got = engine.score(std::slice::from_ref(&seq)).unwrap().remove(0);
    let want = m
        .next_token_logprobs(
            &Tensor::from_vec(seq.clone(), (1, 19), &Device::Cpu).unwrap(),
            None,
        )
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(got.len(), 18);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    assert!(engine
        .generate(&[GenerationRequest::new(vec![], 3)])
        .is_err());
    assert!(engine
        .generate(&[GenerationRequest::new(vec![64], 3)])
        .is_err());
    // More tokens than the whole pool holds: a capacity error naming the request.
    let err = engine
        .generate(&[GenerationRequest::new(vec![1, 2], 5000)])
        .unwrap_err();
    assert!(err.to_string().contains("request 0 needs"), "{err}");
}

#[test]
fn batched_scoring_equals_trainer_for_mixed_lengths_and_frees_the_pool() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 76, &Device::Cpu).unwrap();
    // 12 blocks of 4 and a 7-token budget: batches flush on tokens and on blocks, and the
    // 19-token sequence is longer than the budget (scored alone, in chunks).
    let cfg = EngineConfig {
        num_blocks: Some(12),
        ..engine_config()
    };
    let mut engine = Engine::from_model(&m, cfg).unwrap();
    let seqs: Vec<Vec<u32>> = [2usize, 5, 19, 6, 3, 4, 8]
        .iter()
        .enumerate()
        .map(|(i, &n)| ids(200 + i as u64, n, 64))
        .collect();
    let got = engine.score(&seqs).unwrap();
    assert_eq!(got.len(), seqs.len());
    for (seq, lp) in seqs.iter().zip(&got) {
        let want = m
            .next_token_logprobs(&batch1(seq), None)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(lp.len(), seq.len() - 1);
        for (a, b) in lp.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5, "len {}: {a} vs {b}", seq.len());
        }
    }
    assert_eq!(
        engine.stats().blocks_used,
        0,
        "scoring must release its blocks"
    );
}

/// Scoring from a position on (a rollout's response) gives the tail of the full scoring, in
/// batches and in the long path's chunks, including a start inside a later chunk and a start
/// past the end (nothing scored), and frees the pool.
#[test]
fn scoring_from_a_position_is_the_tail_of_full_scoring() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 78, &Device::Cpu).unwrap();
    let cfg = EngineConfig {
        num_blocks: Some(12),
        ..engine_config()
    };
    let mut engine = Engine::from_model(&m, cfg).unwrap();
    let lens = [5usize, 19, 6, 19, 8, 3, 19];
    let from = [2usize, 3, 0, 12, 7, 9, 18];
    let seqs: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| ids(400 + i as u64, n, 64))
        .collect();
    let full = engine.score(&seqs).unwrap();
    let dist = TokenDistribution::MODEL;
    let tail = engine.score_from(&seqs, &from, dist).unwrap();
    for (i, (f, t)) in full.iter().zip(&tail).enumerate() {
        let start = from[i].min(f.len());
        assert_eq!(t.len(), f.len() - start, "sequence {i}");
        for (a, b) in t.iter().zip(&f[start..]) {
            assert!((a - b).abs() <= 1e-5, "sequence {i}: {a} vs {b}");
        }
    }
    assert_eq!(engine.stats().blocks_used, 0);
    let err = engine.score_from(&seqs, &from[..2], dist).unwrap_err();
    assert!(err.to_string().contains("2 scoring starts for 7"), "{err}");
}

/// Scoring under the rollouts' distribution (tempered, truncated; a scored token outside the
/// kept set widens it) equals the trainer's fused head under the same distribution.
#[test]
fn scoring_under_a_truncated_distribution_equals_trainer() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 77, &Device::Cpu).unwrap();
    let mut engine = Engine::from_model(&m, engine_config()).unwrap();
    let seqs: Vec<Vec<u32>> = (0..3).map(|i| ids(300 + i, 11, 64)).collect();
    for dist in [
        TokenDistribution::of_sampling(0.7, 20, 1.0),
        TokenDistribution::of_sampling(0.7, 0, 1.0),
        TokenDistribution::of_sampling(1.2, 5, 0.8),
    ] {
        let got = engine.score_under(&seqs, dist).unwrap();
        for (seq, lp) in seqs.iter().zip(&got) {
            let want = trainer_logprobs(&m, &seq[..1], &seq[1..], dist);
            for (a, b) in lp.iter().zip(&want) {
                assert!(
                    a.is_finite() && (a - b).abs() <= 1e-5,
                    "{dist:?}: {a} vs {b}"
                );
            }
        }
        // Random tokens are mostly outside a top-5 set: their log-probs differ from T = 1's.
        let plain = engine.score(&seqs).unwrap();
        assert!(got[0]
            .iter()
            .zip(&plain[0])
            .any(|(a, b)| (a - b).abs() > 1e-3));
    }
}

//! The prefix cache across `generate` calls: the next turn of an episode (the earlier turn's
//! prompt and completion, then a reply) prefills only what is new and completes as an engine
//! without a cache does; a refit empties the cache; a pool too small to keep everything evicts
//! and still gives the same completions, leaking no block.

mod common;

use candle_core::Device;
use common::{ids, tiny};
use oxalign_models::engine::{Engine, EngineConfig, WeightUpdate};
use oxalign_models::{CausalLm, Completion, Family, GenerationRequest};

const BLOCK: usize = 4;

fn config(prefix_cache: bool, num_blocks: usize) -> EngineConfig {
    EngineConfig {
        block_size: BLOCK,
        num_blocks: Some(num_blocks),
        prefix_sharing: false,
        prefix_cache,
        ..EngineConfig::default()
    }
}

/// Three episodes' first turns: prompts of 18, 21 and 9 tokens, 11 sampled tokens each.
fn first_turns() -> Vec<GenerationRequest> {
    [(1u64, 18usize), (2, 21), (3, 9)]
        .into_iter()
        .map(|(seed, len)| {
            let mut r = GenerationRequest::new(ids(500 + seed, len, 64), 11);
            r.ignore_eos = true;
            r.sampling.seed = seed;
            r
        })
        .collect()
}

/// The second turns: each first turn's prompt and completion, then a 5-token reply.
fn second_turns(first: &[GenerationRequest], out: &[Completion]) -> Vec<GenerationRequest> {
    first
        .iter()
        .zip(out)
        .enumerate()
        .map(|(i, (r, c))| {
            let mut prompt = r.prompt.clone();
            prompt.extend_from_slice(&c.tokens);
            prompt.extend(ids(600 + i as u64, 5, 64));
            let mut next = GenerationRequest::new(prompt, 7);
            next.ignore_eos = true;
            next.sampling.seed = 40 + i as u64;
            next
        })
        .collect()
}

fn assert_same(a: &[Completion], b: &[Completion], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{what}: request {i} tokens differ");
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!((p - q).abs() <= 1e-5, "{what}: request {i}: {p} vs {q}");
        }
    }
}

/// Full blocks a finished sequence leaves: its K/V cover every token but the last sampled.
fn full_blocks(prompt: usize, generated: usize) -> usize {
    (prompt + generated - 1) / BLOCK
}

#[test]
fn a_second_turn_prefills_only_the_reply_and_completes_as_without_a_cache() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 91, &Device::Cpu).unwrap();
        let first = first_turns();
        let mut plain = Engine::from_model(&m, config(false, 1024)).unwrap();
        let want_first = plain.generate(&first).unwrap();
        let second = second_turns(&first, &want_first);
        let want_second = plain.generate(&second).unwrap();
        assert_eq!(plain.stats().prefix_cache_hit_tokens, 0);

        let mut cached = Engine::from_model(&m, config(true, 1024)).unwrap();
        let got_first = cached.generate(&first).unwrap();
        assert_same(&got_first, &want_first, &format!("{family} first turn"));
        let kept: usize = first.iter().map(|r| full_blocks(r.prompt.len(), 11)).sum();
        let s = cached.stats();
        assert_eq!(s.cached_blocks, kept, "{family}: {s:?}");
        assert_eq!(
            s.blocks_used, 0,
            "{family}: cached blocks count as free: {s:?}"
        );
        assert_eq!(s.prefix_cache_hit_tokens, 0, "{family}: {s:?}");

        let prefill_before = s.prefill_tokens;
        let got_second = cached.generate(&second).unwrap();
        assert_same(&got_second, &want_second, &format!("{family} second turn"));
        let s = cached.stats();
        // Each second turn finds every full block of its first turn (at most all but the
        // block holding its last token) and prefills the rest.
        let hits: usize = first
            .iter()
            .zip(&second)
            .map(|(f, n)| full_blocks(f.prompt.len(), 11).min((n.prompt.len() - 1) / BLOCK))
            .sum::<usize>()
            * BLOCK;
        let prompts: usize = second.iter().map(|r| r.prompt.len()).sum();
        assert_eq!(s.prefix_cache_hit_tokens, hits as u64, "{family}: {s:?}");
        assert_eq!(
            s.prefill_tokens - prefill_before,
            (prompts - hits) as u64,
            "{family}: {s:?}"
        );
        assert!(
            hits * 2 > prompts,
            "{family}: most of the episode is reused"
        );
        assert_eq!(s.blocks_used, 0, "{family}: {s:?}");
    }
}

#[test]
fn a_refit_empties_the_cache() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 92, &Device::Cpu).unwrap();
    let first = first_turns();
    let mut e = Engine::from_model(&m, config(true, 1024)).unwrap();
    let out = e.generate(&first).unwrap();
    assert!(e.stats().cached_blocks > 0);
    let m2 = CausalLm::init_random(&tiny(Family::Llama), 93, &Device::Cpu).unwrap();
    e.refit(&WeightUpdate::from_model(1, &m2).unwrap(), None)
        .unwrap();
    let s = e.stats();
    assert_eq!(s.cached_blocks, 0, "{s:?}");
    assert_eq!(s.blocks_free, s.num_blocks, "{s:?}");
    // The next turn is computed by the new weights from its first token.
    let second = second_turns(&first, &out);
    let got = e.generate(&second).unwrap();
    assert_eq!(e.stats().prefix_cache_hit_tokens, 0);
    let mut fresh = Engine::from_model(&m2, config(false, 1024)).unwrap();
    assert_same(&got, &fresh.generate(&second).unwrap(), "after the refit");
}

#[test]
fn a_small_pool_evicts_old_prefixes_and_still_completes_the_same() {
    for family in [Family::Llama, Family::Qwen3] {
        let m = CausalLm::init_random(&tiny(family), 94, &Device::Cpu).unwrap();
        let mut plain = Engine::from_model(&m, config(false, 1024)).unwrap();
        // 14 blocks: one second turn needs up to 11, so the first turns' blocks cannot all
        // stay; rounds of new prompts push older ones out.
        let mut small = Engine::from_model(&m, config(true, 14)).unwrap();
        for round in 0..3u64 {
            let mut first = first_turns();
            for r in &mut first {
                r.prompt[0] = (round * 7 % 64) as u32;
            }
            let want = plain.generate(&first).unwrap();
            let got = small.generate(&first).unwrap();
            assert_same(&got, &want, &format!("{family} round {round} first"));
            let second = second_turns(&first, &want);
            let want = plain.generate(&second).unwrap();
            let got = small.generate(&second).unwrap();
            assert_same(&got, &want, &format!("{family} round {round} second"));
            let s = small.stats();
            assert_eq!(s.blocks_used, 0, "{family}: blocks leaked, {s:?}");
            assert!(s.cached_blocks <= 14, "{s:?}");
        }
        let s = small.stats();
        assert!(s.prefix_cache_hit_tokens > 0, "{family}: {s:?}");
        assert!(s.peak_blocks_used <= 14, "{s:?}");
    }
}

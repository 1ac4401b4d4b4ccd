//! Inference tests: KV-cached logits equal the full forward, left padding does not change the
//! logits of real tokens, the sliding window acts, and `generate` agrees with a plain greedy
//! loop over the full forward.

mod common;

use candle_core::{Device, Tensor, D};
use common::{batch, batch1, ids, max_abs_diff, tiny};
use oxalign_models::{CausalLm, Family, FinishReason, GenerationRequest, SamplingParams};

#[test]
fn cached_logits_equal_full_forward() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 21, &Device::Cpu).unwrap();
        let rows = [ids(3, 10, 64), ids(4, 10, 64)];
        let input = batch(&rows);
        let full = m.forward(&input, None).unwrap();
        let mut cache = m.new_cache();
        let mut parts = vec![m
            .forward_cached(&input.narrow(1, 0, 6).unwrap(), None, &mut cache)
            .unwrap()];
        for t in 6..10 {
            parts.push(
                m.forward_cached(&input.narrow(1, t, 1).unwrap(), None, &mut cache)
                    .unwrap(),
            );
        }
        assert_eq!(cache.len(), 10);
        let cached = Tensor::cat(&parts, 1).unwrap();
        let d = max_abs_diff(&full, &cached);
        assert!(d <= 1e-5, "{family}: cached vs full max abs diff {d}");

        // `forward_cached_last` gives the last row of the same logits.
        let mut cache = m.new_cache();
        let last = m.forward_cached_last(&input, None, &mut cache).unwrap();
        let d = max_abs_diff(&last, &full.narrow(1, 9, 1).unwrap().squeeze(1).unwrap());
        assert!(d <= 1e-5, "{family}: last-position logits differ by {d}");
    }
}

#[test]
fn left_padding_keeps_real_token_logits() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 22, &Device::Cpu).unwrap();
        let short = ids(5, 7, 64);
        let long = ids(6, 10, 64);
        let mut padded = vec![0u32; 3];
        padded.extend_from_slice(&short);
        let input = batch(&[padded, long.clone()]);
        let mask = Tensor::new(
            &[
                [0u32, 0, 0, 1, 1, 1, 1, 1, 1, 1],
                [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            ],
            &Device::Cpu,
        )
        .unwrap();
        let logits = m.forward(&input, Some(&mask)).unwrap();
        let alone = m.forward(&batch1(&short), None).unwrap();
        let d = max_abs_diff(
            &logits.narrow(0, 0, 1).unwrap().narrow(1, 3, 7).unwrap(),
            &alone,
        );
        assert!(d <= 1e-5, "{family}: padded row vs alone differ by {d}");
        let alone_long = m.forward(&batch(&[long]), None).unwrap();
        let d = max_abs_diff(&logits.narrow(0, 1, 1).unwrap(), &alone_long);
        assert!(d <= 1e-5, "{family}: unpadded row changed by batching: {d}");
        assert!(logits
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .all(|x| x.is_finite()));

        // Same through the cache: padded prompt prefill, then two decode steps.
        let mut cache = m.new_cache();
        let first = m
            .forward_cached(
                &input.narrow(1, 0, 8).unwrap(),
                Some(&mask.narrow(1, 0, 8).unwrap()),
                &mut cache,
            )
            .unwrap();
        let rest = m
            .forward_cached(&input.narrow(1, 8, 2).unwrap(), None, &mut cache)
            .unwrap();
        let cached = Tensor::cat(&[first, rest], 1).unwrap();
        let d = max_abs_diff(
            &cached.narrow(0, 0, 1).unwrap().narrow(1, 3, 7).unwrap(),
            &alone,
        );
        assert!(
            d <= 1e-5,
            "{family}: cached padded row vs alone differ by {d}"
        );
    }
}

#[test]
fn sliding_window_limits_attention() {
    let cfg = tiny(Family::Mistral);
    assert_eq!(cfg.sliding_window, Some(4));
    let windowed = CausalLm::init_random(&cfg, 23, &Device::Cpu).unwrap();
    let mut full_cfg = cfg.clone();
    full_cfg.sliding_window = None;
    let full = CausalLm::from_weights(
        full_cfg,
        &windowed.weights().unwrap(),
        candle_core::DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let input = batch(&[ids(7, 9, 64)]);
    let a = windowed.forward(&input, None).unwrap();
    let b = full.forward(&input, None).unwrap();
    // Positions < window see the same keys either way; later ones do not.
    assert!(max_abs_diff(&a.narrow(1, 0, 4).unwrap(), &b.narrow(1, 0, 4).unwrap()) <= 1e-6);
    assert!(max_abs_diff(&a.narrow(1, 4, 5).unwrap(), &b.narrow(1, 4, 5).unwrap()) > 1e-4);
    // Changing a token outside every window of the last position leaves its logits unchanged.
    let mut other = ids(7, 9, 64);
    other[0] = (other[0] % 60) + 2;
    let c = windowed.forward(&batch(&[other]), None).unwrap();
    assert!(max_abs_diff(&a.narrow(1, 8, 1).unwrap(), &c.narrow(1, 8, 1).unwrap()) <= 1e-6);
}

fn greedy_reference(m: &CausalLm, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let logits = m.forward(&batch1(&seq), None).unwrap();
        let last = logits
            .narrow(1, seq.len() - 1, 1)
            .unwrap()
            .squeeze(1)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let v = last.to_vec1::<f32>().unwrap();
        seq.push(oxalign_models::engine::sampler::argmax(&v) as u32);
    }
    seq[prompt.len()..].to_vec()
}

#[test]
fn batched_greedy_generation_matches_full_forward_loop() {
    for family in Family::ALL {
        let m = CausalLm::init_random(&tiny(family), 24, &Device::Cpu).unwrap();
        let prompts = [ids(8, 3, 64), ids(9, 7, 64), ids(10, 5, 64)];
        let reqs: Vec<GenerationRequest> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| GenerationRequest {
                prompt: p.clone(),
                max_new_tokens: 6 + i,
                sampling: SamplingParams::greedy(),
                stop_token_ids: vec![],
                ignore_eos: true,
            })
            .collect();
        let out = m.generate(&reqs).unwrap();
        for (i, (r, c)) in reqs.iter().zip(&out).enumerate() {
            assert_eq!(c.finish_reason, FinishReason::Length);
            assert_eq!(
                c.tokens,
                greedy_reference(&m, &r.prompt, r.max_new_tokens),
                "{family} row {i}"
            );
            // Log-probs are those of the temperature-1 policy at each step.
            let mut seq = r.prompt.clone();
            seq.extend_from_slice(&c.tokens);
            let lp = m
                .next_token_logprobs(&batch1(&seq), None)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let expect = &lp[r.prompt.len() - 1..];
            for (a, b) in c.logprobs.iter().zip(expect) {
                assert!(
                    (a - b).abs() <= 1e-4,
                    "{family} row {i}: logprob {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn sampling_is_seeded_per_request_and_stops_at_eos() {
    let mut cfg = tiny(Family::Llama);
    cfg.eos_token_id = vec![5, 6];
    let m = CausalLm::init_random(&cfg, 25, &Device::Cpu).unwrap();
    let req = |seed: u64, prompt: Vec<u32>| GenerationRequest {
        prompt,
        max_new_tokens: 40,
        sampling: SamplingParams {
            temperature: 1.5,
            top_k: 20,
            top_p: 0.95,
            seed,
        },
        stop_token_ids: vec![7],
        ignore_eos: false,
    };
    let a = m
        .generate(&[req(1, ids(11, 4, 64)), req(2, ids(12, 6, 64))])
        .unwrap();
    // Same request alone (different batch) gives the same completion: per-request RNG.
    let alone = m.generate(&[req(2, ids(12, 6, 64))]).unwrap();
    assert_eq!(a[1].tokens, alone[0].tokens);
    let again = m.generate(&[req(1, ids(11, 4, 64))]).unwrap();
    assert_eq!(a[0].tokens, again[0].tokens);
    let other_seed = m.generate(&[req(3, ids(11, 4, 64))]).unwrap();
    assert_ne!(a[0].tokens, other_seed[0].tokens);
    for c in a.iter().chain(&other_seed) {
        assert_eq!(c.tokens.len(), c.logprobs.len());
        assert!(c.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
        let stops = c.tokens.iter().filter(|t| [5, 6, 7].contains(*t)).count();
        match c.finish_reason {
            FinishReason::Stop => {
                assert_eq!(stops, 1);
                assert!([5, 6, 7].contains(c.tokens.last().unwrap()));
            }
            FinishReason::Length => {
                assert_eq!(stops, 0);
                assert_eq!(c.tokens.len(), 40);
            }
        }
    }
}

#[test]
fn top_k_one_is_greedy_and_top_p_truncates() {
    use oxalign_models::Sampler;
    let logits = [0.0f32, 3.0, 1.0, 2.9, -1.0];
    let mut s = Sampler::new(SamplingParams {
        temperature: 1.0,
        top_k: 1,
        top_p: 1.0,
        seed: 9,
    });
    for _ in 0..20 {
        assert_eq!(s.sample(&logits).0, 1);
    }
    // p(1) ~ 0.47, p(3) ~ 0.43: top_p 0.5 keeps {1, 3}.
    let mut s = Sampler::new(SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 0.5,
        seed: 9,
    });
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let (t, lp) = s.sample(&logits);
        seen.insert(t);
        // The log-prob is the sampled distribution's: renormalised over the kept {1, 3}.
        let lse = (logits[1].exp() + logits[3].exp()).ln();
        assert!((lp - (logits[t as usize] - lse)).abs() < 1e-5);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 3]);
    let probs = Tensor::new(&logits, &Device::Cpu).unwrap();
    assert_eq!(
        probs.argmax(D::Minus1).unwrap().to_scalar::<u32>().unwrap(),
        1
    );
}

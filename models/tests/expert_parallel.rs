//! Expert parallelism (EP): experts spread over a group of two ranks (threads with a
//! `ThreadCollective`), each rank routing its own rows and exchanging token rows with the
//! experts' owners. EP=2 equals EP=1 within the data-parallel tolerance in the forward
//! (log-probs), the backward (the gradient of every parameter, routers and experts included:
//! dense gradients averaged over ranks, expert gradients on their owner divided by the group
//! size) and the engine (greedy tokens identical, log-probs within 1e-5); a rank that sends
//! or receives no rows still takes part; each rank holds half the expert parameters; the
//! gathered weights and a saved checkpoint are the whole model.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{batch, ids, tiny};
use oxalign_kernels::collective::{Collective, ThreadCollective};
use oxalign_models::engine::{Engine, EngineConfig, Probe, WeightUpdate};
use oxalign_models::moe::routing::{ExpertChoices, RouterTrace};
use oxalign_models::{
    CausalLm, ExpertNames, ExpertParallel, Family, GenerationRequest, TokenDistribution,
};
use std::collections::HashMap;
use std::sync::Arc;

const ROWS: usize = 4;
const LEN: usize = 7;

fn model(family: Family) -> CausalLm {
    let m = CausalLm::init_random(&tiny(family), 11, &Device::Cpu).unwrap();
    // Larger weights: routers far from uniform, so the experts really differ per token.
    for (_, v) in m.vars() {
        if v.rank() == 2 {
            v.set(&(v.as_tensor() * 4.0).unwrap()).unwrap();
        }
    }
    m
}

fn rows() -> Vec<Vec<u32>> {
    (0..ROWS).map(|r| ids(40 + r as u64, LEN, 64)).collect()
}

/// Runs `f(rank, ep)` on one thread per rank of a fresh group of `world`.
fn on_ranks<R: Send + 'static>(
    world: usize,
    f: impl Fn(usize, ExpertParallel) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let threads: Vec<_> = ThreadCollective::group(world)
        .into_iter()
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || {
                let rank = c.rank();
                let comm: Arc<dyn Collective> = Arc::new(c);
                f(rank, ExpertParallel::new(comm))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Log-probs `[rows, LEN-1]` of `ids` (optionally with replayed experts).
fn logprobs(m: &CausalLm, ids: &Tensor, replay: Option<ExpertChoices>) -> Tensor {
    let mut trace = replay.map_or_else(RouterTrace::new, RouterTrace::replaying);
    m.next_token_outputs_traced(ids, None, TokenDistribution::MODEL, &mut trace)
        .unwrap()
        .logprobs
}

/// Each rank's half of the batch, as rank `rank` of 2.
fn half(rank: usize) -> Tensor {
    batch(&rows()[rank * ROWS / 2..(rank + 1) * ROWS / 2])
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn ep2_forward_matches_ep1_log_probs() {
    for family in [Family::Qwen3Moe, Family::Qwen2Moe, Family::Mixtral] {
        let base = model(family);
        let want = flat(&logprobs(&base, &batch(&rows()), None));
        let b = base.clone();
        let parts = on_ranks(2, move |rank, ep| {
            let m = b.with_expert_parallel(ep).unwrap();
            flat(&logprobs(&m, &half(rank), None))
        });
        let got = parts.concat();
        let d = max_diff(&want, &got);
        println!("{family}: EP=2 vs EP=1 log-probs max |diff| = {d:.2e}");
        assert!(d < 1e-5, "{family}: {d}");
    }
}

/// Choices that send every token of rank 0 to rank 1's experts and every token of rank 1 to
/// its own: rank 0 receives nothing, rank 1 sends nothing to rank 0.
fn lopsided(rank: usize, sparse_layers: usize) -> ExpertChoices {
    let tokens = ROWS / 2 * LEN;
    let pick = [[1u32, 3], [3, 1]];
    let layer: Vec<u32> = (0..tokens).flat_map(|t| pick[(t + rank) % 2]).collect();
    ExpertChoices {
        top_k: 2,
        layers: vec![layer; sparse_layers],
    }
}

#[test]
fn ranks_that_send_or_receive_nothing_still_exchange() {
    let base = model(Family::Qwen2Moe);
    let b = base.clone();
    let whole = (0..2)
        .flat_map(|r| lopsided(r, 2).layers[0].clone())
        .collect();
    let want = flat(&logprobs(
        &base,
        &batch(&rows()),
        Some(ExpertChoices {
            top_k: 2,
            layers: vec![whole; 2],
        }),
    ));
    let parts = on_ranks(2, move |rank, ep| {
        let m = b.with_expert_parallel(ep).unwrap();
        let lp = logprobs(&m, &half(rank), Some(lopsided(rank, 2)));
        // Backward reaches every exchange on both ranks (rank 0 holds experts 0 and 2, which
        // no token uses: they get no gradient; the others do).
        let grads = lp.sum_all().unwrap().backward().unwrap();
        let with_grad = m
            .vars()
            .iter()
            .filter(|(_, v)| grads.get(v.as_tensor()).is_some())
            .count();
        (flat(&lp), with_grad, m.vars().len())
    });
    let got: Vec<f32> = parts.iter().flat_map(|p| p.0.clone()).collect();
    assert!(max_diff(&want, &got) < 1e-5);
    assert!(
        parts[1].1 == parts[1].2,
        "rank 1's experts are used: all get gradients"
    );
    assert!(parts[0].1 < parts[0].2, "rank 0's experts are unused");
}

/// The loss both layouts train on: `Σ coef · log p` over the batch, divided by the token
/// count; a rank's share is its rows' sum times the group size over the same count, so the
/// mean over ranks is the whole batch's loss.
fn loss(lp: &Tensor, first_row: usize, world: usize) -> Tensor {
    let (r, t) = lp.dims2().unwrap();
    let coef: Vec<f32> = (0..r * t)
        .map(|i| ((first_row * t + i) % 5) as f32 - 2.0)
        .collect();
    let coef = Tensor::from_vec(coef, (r, t), &Device::Cpu).unwrap();
    let total = (ROWS * (LEN - 1)) as f64;
    ((lp * coef).unwrap().sum_all().unwrap() * (world as f64 / total)).unwrap()
}

/// Every parameter's gradient: `(name, values)` sorted by name.
fn gradients(m: &CausalLm, l: &Tensor) -> HashMap<String, Vec<f32>> {
    let grads = l.backward().unwrap();
    m.vars()
        .into_iter()
        .map(|(n, v)| {
            let g = grads.get(v.as_tensor()).cloned();
            let g = g.unwrap_or_else(|| v.as_tensor().zeros_like().unwrap());
            (n, flat(&g))
        })
        .collect()
}

#[test]
fn ep2_backward_matches_ep1_gradients_of_every_parameter() {
    for family in [Family::Qwen3Moe, Family::Qwen2Moe] {
        let base = model(family);
        let want = gradients(&base, &loss(&logprobs(&base, &batch(&rows()), None), 0, 1));
        let b = base.clone();
        let per_rank = on_ranks(2, move |rank, ep| {
            let comm = ep.comm().clone();
            let m = b.with_expert_parallel(ep).unwrap();
            let lp = logprobs(&m, &half(rank), None);
            let mut g = gradients(&m, &loss(&lp, rank * ROWS / 2, 2));
            // Dense parameters: the data-parallel mean. Experts: the owner's gradient is
            // already summed over both ranks' tokens; divided by the group size.
            let names = ExpertNames::of(m.config());
            let mut keys: Vec<String> = g.keys().cloned().collect();
            keys.sort();
            for name in keys {
                let v = g.get_mut(&name).unwrap();
                match names.expert_of(&name) {
                    Some(_) => v.iter_mut().for_each(|x| *x /= 2.0),
                    None => comm.all_reduce_mean_f32(&mut [v.as_mut_slice()]).unwrap(),
                }
            }
            g
        });
        let names = ExpertNames::of(base.config());
        let (mut worst, mut experts_seen, mut nonzero) = (0f32, 0, 0);
        for (name, w) in &want {
            let owners: Vec<&Vec<f32>> = per_rank.iter().filter_map(|g| g.get(name)).collect();
            let expected_owners = if names.expert_of(name).is_some() {
                1
            } else {
                2
            };
            assert_eq!(owners.len(), expected_owners, "{name}");
            experts_seen += usize::from(expected_owners == 1);
            let scale = w.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
            for got in owners {
                worst = worst.max(max_diff(w, got) / scale);
            }
            nonzero += usize::from(w.iter().any(|x| *x != 0.0));
        }
        println!("{family}: EP=2 vs EP=1 gradients, max relative diff {worst:.2e}");
        assert!(worst < 1e-4, "{family}: {worst}");
        assert!(
            experts_seen > 0 && nonzero == want.len(),
            "{family}: every parameter learns"
        );
    }
}

#[test]
fn each_rank_holds_half_the_expert_parameters_and_gathers_the_whole_model() {
    let base = model(Family::Qwen2Moe);
    let names = ExpertNames::of(base.config());
    let count = |m: &CausalLm, experts: bool| -> usize {
        m.vars()
            .iter()
            .filter(|(n, _)| names.expert_of(n).is_some() == experts)
            .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
            .sum()
    };
    let (full_experts, full_dense) = (count(&base, true), count(&base, false));
    let want = base.weights().unwrap();
    let b = base.clone();
    let dir = std::env::temp_dir().join(format!("oxalign-ep-save-{}", std::process::id()));
    let d = dir.clone();
    let held = on_ranks(2, move |_, ep| {
        let m = b.with_expert_parallel(ep).unwrap();
        let names = ExpertNames::of(m.config());
        let count = |experts: bool| -> usize {
            m.vars()
                .iter()
                .filter(|(n, _)| names.expert_of(n).is_some() == experts)
                .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
                .sum()
        };
        let full = m.full_weights().unwrap();
        m.save(&d).unwrap();
        (count(true), count(false), full)
    });
    println!(
        "expert parameter bytes: EP=1 {full_experts}, EP=2 per rank {:?}",
        [held[0].0, held[1].0]
    );
    for (experts, dense, full) in &held {
        assert_eq!(*experts * 2, full_experts);
        assert_eq!(*dense, full_dense);
        assert_eq!(full.len(), want.len());
        for (name, t) in &want {
            assert_eq!(flat(t), flat(&full[name]), "{name}");
        }
    }
    let saved = CausalLm::load(&dir, &Device::Cpu)
        .unwrap()
        .weights()
        .unwrap();
    for (name, t) in &want {
        assert_eq!(flat(t), flat(&saved[name]), "saved {name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn expert_parallel_refuses_a_dense_model_and_an_indivisible_group() {
    let dense = CausalLm::init_random(&tiny(Family::Qwen2), 1, &Device::Cpu).unwrap();
    let moe = model(Family::Qwen3Moe);
    let errs = on_ranks(3, move |rank, ep| match rank {
        0 => dense.with_expert_parallel(ep).err().map(|e| e.to_string()),
        _ => moe.with_expert_parallel(ep).err().map(|e| e.to_string()),
    });
    assert!(errs[0].as_ref().unwrap().contains("no experts"), "{errs:?}");
    assert!(
        errs[1].as_ref().unwrap().contains("num_experts = 4"),
        "{errs:?}"
    );
}

fn engine_config() -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_blocks: Some(128),
        max_batched_tokens: 9,
        ..EngineConfig::default()
    }
}

fn requests() -> Vec<GenerationRequest> {
    (0..3u64)
        .map(|i| {
            let mut r = GenerationRequest::new(ids(70 + i, 3 + i as usize, 64), 8);
            r.ignore_eos = true;
            r
        })
        .collect()
}

#[test]
fn ep2_engine_generates_and_scores_like_ep1() {
    for family in [Family::Qwen3Moe, Family::Qwen2Moe] {
        let base = model(family);
        let mut one = Engine::from_model(&base, engine_config()).unwrap();
        let want = one.generate(&requests()).unwrap();
        let seqs: Vec<Vec<u32>> = rows();
        let want_scores = one.score(&seqs).unwrap();
        let full_bytes = one.stats().weight_bytes;
        let b = base.clone();
        let got = on_ranks(2, move |_, ep| {
            // The engine's group; the trainer model here is a whole one.
            let mut e = Engine::from_model_with_experts(&b, engine_config(), ep).unwrap();
            let out = e.generate(&requests()).unwrap();
            let scores = e.score(&rows()).unwrap();
            (out, scores, e.stats().weight_bytes)
        });
        for (out, scores, bytes) in &got {
            for (w, g) in want.iter().zip(out) {
                assert_eq!(w.tokens, g.tokens, "{family}: greedy tokens");
                assert!(max_diff(&w.logprobs, &g.logprobs) < 1e-5, "{family}");
            }
            for (w, g) in want_scores.iter().zip(scores) {
                assert!(max_diff(w, g) < 1e-5, "{family}: scores");
            }
            assert!(
                *bytes < full_bytes,
                "{family}: an EP rank holds fewer weights"
            );
        }
        println!(
            "{family}: engine weight bytes EP=1 {full_bytes}, EP=2 per rank {:?}",
            got.iter().map(|g| g.2).collect::<Vec<_>>()
        );
    }
}

/// Five requests of different lengths (so the ranks finish at different steps), sampled.
fn uneven_requests() -> Vec<GenerationRequest> {
    (0..5u64)
        .map(|i| {
            let mut r =
                GenerationRequest::new(ids(90 + i, 2 + 2 * i as usize, 64), 2 + 3 * i as usize);
            r.ignore_eos = true;
            r.sampling = oxalign_models::SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: 40 + i,
            };
            r
        })
        .collect()
}

/// Expert-parallel engines dispatch tokens: each rank generates only its own share of the
/// requests (one rank may have none, or finish long before the other) and sends each
/// routed token row to the expert's owner; every share comes out as one engine holding
/// every expert would generate it.
#[test]
fn ep2_engines_each_generate_their_own_share_like_ep1() {
    for family in [Family::Qwen3Moe, Family::Mixtral] {
        let base = model(family);
        let mut one = Engine::from_model(&base, engine_config()).unwrap();
        let want = one.generate(&uneven_requests()).unwrap();
        for split in [1usize, 0, 4] {
            let b = base.clone();
            let got = on_ranks(2, move |rank, ep| {
                let mut e = Engine::from_model_with_experts(&b, engine_config(), ep).unwrap();
                let all = uneven_requests();
                let mine = match rank {
                    0 => &all[..split],
                    _ => &all[split..],
                };
                e.generate(mine).unwrap()
            });
            let got: Vec<_> = got.into_iter().flatten().collect();
            assert_eq!(got.len(), want.len());
            let mut worst = 0f32;
            for (w, g) in want.iter().zip(&got) {
                assert_eq!(
                    w.tokens, g.tokens,
                    "{family}, split {split}: sampled tokens"
                );
                worst = worst.max(max_diff(&w.logprobs, &g.logprobs));
            }
            println!("{family}, rank 0 takes {split} of 5: max |EP2 - EP1| log-prob {worst:e}");
            assert!(worst < 1e-5, "{family}, split {split}: {worst}");
        }
    }
}

/// Runs `f(rank, trainer_ep, engine_ep)` on one thread per rank of two fresh groups.
fn on_ranks_with_engines<R: Send + 'static>(
    world: usize,
    f: impl Fn(usize, ExpertParallel, ExpertParallel) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let engines = ThreadCollective::group(world);
    let threads: Vec<_> = ThreadCollective::group(world)
        .into_iter()
        .zip(engines)
        .map(|(c, e)| {
            let f = f.clone();
            std::thread::spawn(move || {
                let rank = c.rank();
                let (c, e): (Arc<dyn Collective>, Arc<dyn Collective>) = (Arc::new(c), Arc::new(e));
                f(rank, ExpertParallel::new(c), ExpertParallel::new(e))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn an_ep_engine_refits_from_its_ep_trainer_rank_verified() {
    let base = model(Family::Qwen3Moe);
    let b = base.clone();
    let probe_tokens: Vec<u32> = (0..12u32).map(|i| (i * 37 + 11) % 64).collect();
    let out = on_ranks_with_engines(2, move |_, trainer_ep, engine_ep| {
        let m = b.with_expert_parallel(trainer_ep).unwrap();
        let mut e = Engine::from_model_with_experts(&m, engine_config(), engine_ep).unwrap();
        // The trainer moves (every weight, its experts included), then refits its rank's engine.
        for (_, v) in m.vars() {
            v.set(&(v.as_tensor() * 0.9).unwrap()).unwrap();
        }
        let update = WeightUpdate::from_model(1, &m).unwrap();
        let probe = Probe::from_model(&m, probe_tokens.clone(), 1e-4).unwrap();
        let report = e.refit(&update, Some(&probe)).unwrap();
        let tokens = e.generate(&requests()).unwrap();
        (report, tokens, m.full_weights().unwrap())
    });
    let full = &out[0].2;
    let moved =
        CausalLm::from_weights(base.config().clone(), full, DType::F32, &Device::Cpu).unwrap();
    let want = Engine::from_model(&moved, engine_config())
        .unwrap()
        .generate(&requests())
        .unwrap();
    for (report, tokens, _) in &out {
        assert_eq!(report.version, 1);
        assert_eq!(report.checksums_ok, report.tensors);
        assert!(
            report.tensors < full.len(),
            "an EP rank takes only its experts"
        );
        assert!(report.probe_max_abs_diff.unwrap() < 1e-4);
        for (w, g) in want.iter().zip(tokens) {
            assert_eq!(w.tokens, g.tokens);
        }
    }
}

//! Sharded (FSDP) trainers: SFT and critic steps over 2 and 4 sharded replicas leave the same
//! weights as one replicated trainer on the whole batch; each replica holds about 1/N of
//! the parameters, gradients and AdamW state (measured from the tensors' storage); the
//! optimizer's shards save and load back with their layout; a released model is an error to
//! read, not a crash.

mod common;

use common::max_weight_diff;

use candle_core::{Device, Tensor};
use oxalign_kernels::collective::{Collective, ThreadCollective};
use oxalign_models::{CausalLm, Family, ModelConfig, Preset, ValueModel};
use oxalign_rlhf::fsdp::TrainMemory;
use oxalign_rlhf::losses::LossAgg;
use oxalign_rlhf::trainer::{CriticTrainer, PolicyTrainer, Sharded, TokenBatch};
use oxalign_rlhf::RlhfError;
use std::collections::HashMap;
use std::sync::Arc;

fn config() -> ModelConfig {
    config_with(2)
}

fn config_with(layers: usize) -> ModelConfig {
    let mut c = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
    c.num_hidden_layers = layers;
    c
}

/// Eight sequences of uneven prompt and response lengths.
fn pairs() -> Vec<(Vec<u32>, Vec<u32>)> {
    (0..8u32)
        .map(|i| {
            let p: Vec<u32> = (0..3 + i % 3).map(|j| (i * 7 + j * 3) % 60 + 1).collect();
            let r: Vec<u32> = (0..1 + (i * 5) % 4)
                .map(|j| (i * 11 + j * 13) % 60 + 1)
                .collect();
            (p, r)
        })
        .collect()
}

fn batch(rows: std::ops::Range<usize>) -> TokenBatch {
    let all = pairs();
    let refs: Vec<(&[u32], &[u32])> = all[rows]
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    TokenBatch::new(&refs, 0, &Device::Cpu).unwrap()
}

fn policy() -> PolicyTrainer {
    policy_with(2)
}

fn policy_with(layers: usize) -> PolicyTrainer {
    let m = CausalLm::init_random(&config_with(layers), 5, &Device::Cpu).unwrap();
    PolicyTrainer::new(m, 1e-4, 0.01).unwrap()
}

/// Rows of rank `rank` of `world` (contiguous, balanced).
fn rows_of(rank: usize, world: usize, n: usize) -> std::ops::Range<usize> {
    let (base, extra) = (n / world, n % world);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Weights after three SFT steps over `world` sharded replicas (`world = 0`: one replicated
/// trainer, no collective), with the memory rank 0 reports after the last step.
fn sft_with(world: usize) -> (HashMap<String, Tensor>, TrainMemory) {
    sft_on(world, 2)
}

/// [`sft_with`] on a model of `layers` decoder layers.
fn sft_on(world: usize, layers: usize) -> (HashMap<String, Tensor>, TrainMemory) {
    if world == 0 {
        let mut t = policy_with(layers);
        for _ in 0..3 {
            t.sft_step(&batch(0..8), 1e-4, 1.0, 1.0, None).unwrap();
        }
        return (t.model.weights().unwrap(), t.memory());
    }
    let total = batch(0..8).response_tokens() as f64;
    let group = ThreadCollective::group(world);
    let handles: Vec<_> = group
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let (rank, world) = (c.rank(), c.world_size());
                let c: Arc<dyn Collective> = Arc::new(c);
                let mut t = policy_with(layers);
                t.shard(rank, world, Some(c.clone())).unwrap();
                let local = batch(rows_of(rank, world, 8));
                let weight = local.response_tokens() as f64 / total * world as f64;
                for _ in 0..3 {
                    let (_, step) = t
                        .sft_step(&local, 1e-4, 1.0, weight, Some(c.as_ref()))
                        .unwrap();
                    assert!(!step.skipped);
                }
                let memory = t.memory();
                t.gather(Some(c.as_ref())).unwrap();
                let weights = t.model.weights().unwrap();
                t.release().unwrap();
                (weights, memory)
            })
        })
        .collect();
    let mut out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    out.swap_remove(0)
}

#[test]
fn sharded_sft_on_2_and_4_replicas_matches_one_replicated_trainer() {
    let (one, replicated) = sft_with(0);
    let init = policy().model.weights().unwrap();
    let moved = max_weight_diff(&one, &init);
    assert!(moved > 5e-5, "the steps must change the weights ({moved})");
    for world in [1, 2, 4] {
        let (sharded, memory) = sft_with(world);
        let d = max_weight_diff(&one, &sharded);
        eprintln!("sharded world {world}: max |sharded - replicated| = {d:e} (moved {moved:e})");
        // The tolerance of the replicated data-parallel test (actors/tests/data_parallel.rs).
        assert!(d < 1e-5, "sharded over {world} differs by {d}");
        let ratio = |a: usize, b: usize| a as f64 / b as f64;
        let (p, g, o) = (
            ratio(memory.params, replicated.params),
            ratio(memory.grads, replicated.grads),
            ratio(memory.optimizer, replicated.optimizer),
        );
        eprintln!(
            "world {world}: per-replica bytes params {} / {} ({p:.3}), grads {} / {} ({g:.3}), \
             optimizer {} / {} ({o:.3})",
            memory.params,
            replicated.params,
            memory.grads,
            replicated.grads,
            memory.optimizer,
            replicated.optimizer
        );
        let (peak, peak_replicated) = (memory.step_peak.unwrap(), replicated.step_peak.unwrap());
        eprintln!(
            "world {world}: step peak {peak} / {peak_replicated} ({:.3})",
            ratio(peak, peak_replicated)
        );
        assert!(peak <= one_layer_bound(&one, world), "{memory:?}");
        // 1/N plus the padding of the last shard of each parameter.
        let limit = 1.0 / world as f64 + 0.01;
        assert!(
            p <= limit && g <= limit && o <= limit,
            "world {world}: {memory:?}"
        );
        assert!(p >= 1.0 / world as f64 - 1e-9, "world {world}: {memory:?}");
    }
}

/// The most a sharded step may hold with layers gathered one at a time: the shards, their
/// gradients and AdamW's two moments (4/N of the model, plus a little padding), the
/// parameters outside the layers and their full gradients, and one layer with its full
/// gradients (f32 bytes).
fn one_layer_bound(weights: &HashMap<String, Tensor>, world: usize) -> usize {
    let mut layers: HashMap<String, usize> = HashMap::new();
    let (mut rest, mut total) = (0, 0);
    for (name, t) in weights {
        let bytes = t.elem_count() * 4;
        total += bytes;
        match name.split("layers.").nth(1) {
            Some(tail) => {
                *layers
                    .entry(tail.split('.').next().unwrap().into())
                    .or_default() += bytes
            }
            None => rest += bytes,
        }
    }
    let layer = layers.values().copied().max().unwrap_or(0);
    let padding = weights.len() * 4 * 4 * world;
    4 * total / world + padding + 2 * (rest + layer)
}

/// On a deeper model the step's peak falls towards 1/N of the replicated one: only one
/// layer (and the embedding, final norm and head) is ever gathered, with its gradients.
#[test]
fn a_sharded_step_holds_one_layer_at_a_time() {
    let layers = 8;
    let (one, replicated) = sft_on(0, layers);
    let peak_replicated = replicated.step_peak.unwrap();
    for world in [2, 4] {
        let (sharded, memory) = sft_on(world, layers);
        let d = max_weight_diff(&one, &sharded);
        assert!(
            d < 1e-5,
            "{layers} layers, sharded over {world} differs by {d}"
        );
        let peak = memory.step_peak.unwrap();
        let ratio = peak as f64 / peak_replicated as f64;
        eprintln!(
            "{layers} layers, world {world}: step peak {peak} / {peak_replicated} ({ratio:.3}), \
             bound {}",
            one_layer_bound(&one, world)
        );
        assert!(peak <= one_layer_bound(&one, world), "{memory:?}");
        // Gathering the whole model for the step holds the model and all its gradients on
        // top of the shards and moments: 2 + 3/N models.
        let model = replicated.params;
        let whole = 2 * model + 3 * model / world;
        assert!(peak * 4 < whole * 3, "world {world}: {peak} vs {whole}");
    }
}

#[test]
fn sharded_critic_steps_match_replicated() {
    let critic = || {
        let m = ValueModel::init_random(&config(), 9, &Device::Cpu).unwrap();
        CriticTrainer::new(m, 1e-4, 0.0).unwrap()
    };
    let targets = |b: &TokenBatch| {
        let (n, t) = b.ids.dims2().unwrap();
        let v: Vec<f32> = (0..n * (t - 1)).map(|i| (i as f32 * 0.37).sin()).collect();
        Tensor::from_vec(v, (n, t - 1), &Device::Cpu).unwrap()
    };
    let full = batch(0..8);
    let returns = targets(&full);
    let old = (&returns * 0.5).unwrap();
    let mut one = critic();
    one.step(
        &full,
        &old,
        &returns,
        Some(0.2),
        LossAgg::SeqMeanTokenMean,
        1e-4,
        1.0,
        1.0,
        None,
    )
    .unwrap();
    let want = one.model.weights().unwrap();
    let (returns, old) = (Arc::new(returns), Arc::new(old));
    let handles: Vec<_> = ThreadCollective::group(2)
        .into_iter()
        .map(|c| {
            let (returns, old) = (returns.clone(), old.clone());
            std::thread::spawn(move || {
                let rank = c.rank();
                let c: Arc<dyn Collective> = Arc::new(c);
                let mut t = critic();
                t.shard(rank, 2, Some(c.clone())).unwrap();
                let rows = rows_of(rank, 2, 8);
                let pick = |x: &Tensor| x.narrow(0, rows.start, rows.len()).unwrap();
                let local = batch(rows.clone());
                let weight = rows.len() as f64 / 8.0 * 2.0;
                let agg = LossAgg::SeqMeanTokenMean;
                t.step(
                    &local,
                    &pick(&old),
                    &pick(&returns),
                    Some(0.2),
                    agg,
                    1e-4,
                    1.0,
                    weight,
                    Some(c.as_ref()),
                )
                .unwrap();
                t.gather(Some(c.as_ref())).unwrap();
                t.model.weights().unwrap()
            })
        })
        .collect();
    for h in handles {
        let got = h.join().unwrap();
        let d = max_weight_diff(&want, &got);
        assert!(d < 1e-5, "sharded critic differs by {d}");
    }
}

#[test]
fn optimizer_shards_save_and_load_with_their_layout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let handles: Vec<_> = ThreadCollective::group(2)
        .into_iter()
        .map(|c| {
            let d = d.clone();
            std::thread::spawn(move || {
                let rank = c.rank();
                let c: Arc<dyn Collective> = Arc::new(c);
                let mut t = policy();
                t.shard(rank, 2, Some(c.clone())).unwrap();
                t.sft_step(
                    &batch(rows_of(rank, 2, 8)),
                    1e-4,
                    1.0,
                    1.0,
                    Some(c.as_ref()),
                )
                .unwrap();
                t.save_optimizer(&d).unwrap();
                let saved: Vec<Vec<f32>> = t
                    .opt
                    .param_state()
                    .map(|(_, _, m, _)| m.to_vec1::<f32>().unwrap())
                    .collect();
                let mut fresh = policy();
                fresh.shard(rank, 2, Some(c.clone())).unwrap();
                fresh.load_optimizer(&d).unwrap();
                let loaded: Vec<Vec<f32>> = fresh
                    .opt
                    .param_state()
                    .map(|(_, _, m, _)| m.to_vec1::<f32>().unwrap())
                    .collect();
                assert_eq!(saved, loaded);
                assert_eq!(fresh.opt.steps_taken(), 1);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(d.join("shard_1").join("shard_layout.json").exists());
    // Another group size: refused, naming the layout.
    let mut four = policy();
    four.shard(1, 4, None).unwrap();
    let err = four.load_optimizer(&d).unwrap_err().to_string();
    assert!(err.contains("shard layout"), "{err}");
    // A replicated trainer finds no replicated state there.
    assert!(policy().load_optimizer(&d).is_err());
}

#[test]
fn a_released_model_is_an_error_to_read_and_gathers_back() {
    let mut t = policy();
    let before = t.model.weights().unwrap();
    t.shard(0, 1, None).unwrap();
    assert!(t.is_sharded());
    assert_eq!(
        t.memory().params,
        t.memory().optimizer / 2,
        "only the shards are held"
    );
    let err = t.logprobs(&batch(0..2)).unwrap_err();
    assert!(matches!(err, RlhfError::Sharding(_)), "{err}");
    t.gather(None).unwrap();
    assert_eq!(max_weight_diff(&before, &t.model.weights().unwrap()), 0.0);
    assert!(t.logprobs(&batch(0..2)).is_ok());
    // Sharding twice, or without a collective for a group, is refused.
    assert!(t.shard(0, 1, None).is_err());
    let mut two = policy();
    two.shard(0, 2, None).unwrap();
    assert!(matches!(two.gather(None), Err(RlhfError::Sharding(_))));
}

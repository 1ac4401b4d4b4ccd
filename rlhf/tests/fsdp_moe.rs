//! Sharded (FSDP) training of a mixture-of-experts policy, whose decoder layers are gathered
//! one at a time and recomputed in backward: the routers' load-balancing loss keeps its
//! gradient through the streamed layers, and rollout routing replay replays the engine's
//! experts in the forward and in the recompute. Two sharded replicas end with the weights
//! and the metrics of two replicated ones on the same rows (the aux loss pools over each
//! replica's tokens, so the comparison is data-parallel against data-parallel).

mod common;

use common::max_weight_diff;

use candle_core::{Device, Tensor};
use common::tiny_moe::{ppo_loss, tiny_moe};
use oxalign_kernels::collective::{Collective, ThreadCollective};
use oxalign_models::engine::{Engine, EngineConfig, QuantMode};
use oxalign_models::moe::routing::ExpertChoices;
use oxalign_models::Completion;
use oxalign_rlhf::trainer::{Packing, PolicyTrainer, Sharded, TokenBatch};
use std::collections::HashMap;
use std::sync::Arc;

const ROWS: usize = 6;

/// Samples with the experts an int8 engine chose (they differ from the f32 trainer's on
/// some tokens, so the replay matters).
fn rollouts() -> Vec<(Completion, ExpertChoices)> {
    let cfg = EngineConfig {
        block_size: 4,
        num_blocks: Some(256),
        quant: QuantMode::Int8,
        ..EngineConfig::default()
    };
    let mut engine = Engine::from_model(&tiny_moe(33), cfg).unwrap();
    engine
        .generate_with_routing(&common::seeded_requests(ROWS as u64, 6, 700))
        .unwrap()
}

/// Rows `rows` of the rollout as a trainer batch that replays their experts.
fn batch(all: &[(Completion, ExpertChoices)], rows: std::ops::Range<usize>) -> TokenBatch {
    let reqs = common::seeded_requests(ROWS as u64, 6, 700);
    let pairs: Vec<(&[u32], &[u32])> = reqs[rows.clone()]
        .iter()
        .zip(&all[rows.clone()])
        .map(|(r, (c, _))| (r.prompt.as_slice(), c.tokens.as_slice()))
        .collect();
    let b = TokenBatch::new(&pairs, 0, &Device::Cpu).unwrap();
    b.with_routing(all[rows].iter().map(|(_, r)| r.clone()).collect())
        .unwrap()
}

/// What a rank reports: its weights after the steps, and per step the SFT NLL or the
/// policy loss, the routing overridden and the aux loss.
type RankResult = (HashMap<String, Tensor>, Vec<f64>);

/// An SFT step (packed rows) and a PPO update (padded, replaying the int8 engine's
/// experts), both with the load-balancing loss, over two replicas: sharded or replicated.
fn train(sharded: bool) -> Vec<RankResult> {
    let all = Arc::new(rollouts());
    let handles: Vec<_> = ThreadCollective::group(2)
        .into_iter()
        .map(|c| {
            let all = all.clone();
            std::thread::spawn(move || {
                let rank = c.rank();
                let c: Arc<dyn Collective> = Arc::new(c);
                let mut t = PolicyTrainer::new(tiny_moe(33), 1e-2, 0.0).unwrap();
                t.router_aux_loss_coef = 0.05;
                t.packing = Packing {
                    sft: true,
                    rl: false,
                };
                if sharded {
                    t.shard(rank, 2, Some(c.clone())).unwrap();
                }
                let local = batch(&all, rank * 3..rank * 3 + 3);
                let mut report = Vec::new();
                let (nll, _) = t
                    .sft_step(&local, 1e-2, 1.0, 1.0, Some(c.as_ref()))
                    .unwrap();
                report.push(nll);
                t.gather(Some(c.as_ref())).unwrap();
                let old = t.logprobs(&local).unwrap();
                t.release().unwrap();
                let (rows, cols) = old.dims2().unwrap();
                let adv: Vec<f32> = (0..rows * cols)
                    .map(|i| {
                        if (i / cols + rank) % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        }
                    })
                    .collect();
                let adv = Tensor::from_vec(adv, (rows, cols), &Device::Cpu).unwrap();
                let old = (old - 0.05).unwrap();
                let s = t
                    .ppo_step(
                        &local,
                        &old,
                        &adv,
                        None,
                        None,
                        &ppo_loss(),
                        1e-2,
                        1.0,
                        Some(c.as_ref()),
                    )
                    .unwrap();
                report.extend([
                    s.policy_loss,
                    s.routing_overridden,
                    s.router_aux_loss.unwrap(),
                    s.step.grad_norm,
                ]);
                if sharded {
                    // Streamed layers: less than the whole model and all its gradients on
                    // top of the shards and moments (2 + 3/N models).
                    let peak = t.memory().step_peak.unwrap();
                    let model: usize = tiny_moe(33)
                        .weights()
                        .unwrap()
                        .values()
                        .map(|w| w.elem_count() * 4)
                        .sum();
                    assert!(peak < 2 * model + 3 * model / 2, "{peak} vs model {model}");
                }
                t.gather(Some(c.as_ref())).unwrap();
                (t.model.weights().unwrap(), report)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn a_sharded_moe_policy_with_aux_loss_and_replay_trains_like_replicated() {
    let replicated = train(false);
    let sharded = train(true);
    let init = tiny_moe(33).weights().unwrap();
    let moved = max_weight_diff(&replicated[0].0, &init);
    assert!(moved > 1e-3, "the steps must move the weights ({moved})");
    for (rank, (r, s)) in replicated.iter().zip(&sharded).enumerate() {
        let d = max_weight_diff(&r.0, &s.0);
        eprintln!(
            "rank {rank}: max |sharded - replicated| = {d:e} (moved {moved:e}); \
             replicated {:?}, sharded {:?}",
            r.1, s.1
        );
        // The tolerance of the replicated data-parallel tests.
        assert!(d < 1e-5, "rank {rank}: sharded differs by {d}");
        for (a, b) in r.1.iter().zip(&s.1) {
            assert!(
                (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                "{:?} vs {:?}",
                r.1,
                s.1
            );
        }
    }
    // The replay really overrode the trainer's routers somewhere, and the aux loss is live.
    let overridden = replicated[0].1[2] + replicated[1].1[2];
    assert!(overridden > 0.0, "{:?}", replicated);
    // Every router moved (the load-balancing loss and the policy loss reach it).
    for (name, w) in &sharded[0].0 {
        if name.ends_with("mlp.gate.weight") {
            let before = &init[name];
            let d = (w - before).unwrap().abs().unwrap().sum_all().unwrap();
            assert!(d.to_scalar::<f32>().unwrap() > 0.0, "{name} did not move");
        }
    }
}

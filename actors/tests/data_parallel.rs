//! Data parallelism: one PPO update (and one SFT step) with the batch split over two CPU
//! replicas leaves the same weights as one replica on the whole batch, also when each replica
//! packs its shard (`rl.packing`), and also when the replicas are sharded (FSDP: 2 and 4
//! replicas, each holding 1/N of the parameters, gradients and optimizer state).

use candle_core::{DType, Device, Tensor};
use oxalign_actors::batch::{ExperienceBatch, TokenArray};
use oxalign_actors::executor::ExecutorPool;
use oxalign_actors::monitor::MonitorHandle;
use oxalign_actors::replicas::Replicas;
use oxalign_actors::roles::{
    spawn_local_policy, EngineReplica, PolicyReplica, PolicyWork, Sequences, ENGINE_LANE,
};
use oxalign_kernels::device::DeviceSpec;
use oxalign_models::engine::EngineConfig;
use oxalign_models::{CausalLm, Family, ModelConfig, Preset};
use oxalign_rlhf::losses::{KlEstimator, LossAgg, PpoConfig};
use oxalign_rlhf::trainer::{Packing, PolicyLossConfig, PolicyTrainer, Sharded};
use std::collections::HashMap;

/// The time limit of each role call.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

fn config() -> ModelConfig {
    let mut c = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
    c.num_hidden_layers = 2;
    c
}

fn sequences() -> Sequences {
    // Uneven prompt and response lengths, so replicas see different token counts.
    let pairs = (0..8u32)
        .map(|i| {
            let p: Vec<u32> = (0..3 + i % 3).map(|j| (i * 7 + j * 3) % 60 + 1).collect();
            let r: Vec<u32> = (0..1 + (i * 5) % 4)
                .map(|j| (i * 11 + j * 13) % 60 + 1)
                .collect();
            (p, r)
        })
        .collect();
    Sequences {
        pairs,
        pad_id: 0,
        routing: None,
        observations: None,
    }
}

/// The weights after one PPO update on `world` replicas (on packed rows when `packed`).
async fn update_with(world: usize, agg: LossAgg, packed: bool) -> HashMap<String, Tensor> {
    update_on(world, agg, packed, false).await
}

/// [`update_with`], with the trainers sharded (FSDP) over the replicas when `sharded`; the
/// save then also writes every rank's optimizer shard.
async fn update_on(
    world: usize,
    agg: LossAgg,
    packed: bool,
    sharded: bool,
) -> HashMap<String, Tensor> {
    let specs: Vec<DeviceSpec> = (0..world).map(DeviceSpec::cpu).collect();
    let pool = ExecutorPool::new();
    // The trainers' group exists before them: sharded trainers stream their layers over it.
    let group =
        (world > 1).then(|| oxalign_actors::replicas::collective_group(&specs, &pool).unwrap());
    let (trainers, engines): (Vec<_>, Vec<_>) = (0..world)
        .map(|rank| {
            let mut trainer = PolicyTrainer::new(
                CausalLm::init_random(&config(), 5, &Device::Cpu).unwrap(),
                1e-4,
                0.01,
            )
            .unwrap();
            trainer.packing = Packing {
                sft: false,
                rl: packed,
            };
            let engine = EngineReplica::new(&trainer.model, EngineConfig::default()).unwrap();
            let mut replica = PolicyReplica::new(trainer, 1e-4);
            if sharded {
                let handle = group.as_ref().map(|g| g[rank].clone());
                replica.trainer.shard(rank, world, handle).unwrap();
            }
            (replica, engine)
        })
        .unzip();
    let probe = CausalLm::init_random(&config(), 5, &Device::Cpu).unwrap();
    let seqs = sequences();
    let batch = seqs.batch(&Device::Cpu).unwrap();
    let old = probe
        .next_token_logprobs(&batch.ids, Some(&batch.attention_mask))
        .unwrap()
        .detach();
    let (b, t) = old.dims2().unwrap();
    let adv = seeded_normal(1, b, t, 1.0);
    // Make the old log-probs differ from the current ones so clipping is exercised.
    let old_shifted = (&old + seeded_normal(2, b, t, 0.3)).unwrap();
    let replicas = Replicas::with_group("policy", specs.clone(), trainers, pool.clone(), group);
    let engines = Replicas::new("policy", specs, engines, pool)
        .unwrap()
        .on_lane(ENGINE_LANE);
    let monitor = MonitorHandle::disabled();
    let policy = spawn_local_policy(None, replicas, Some(engines), monitor, LIMIT)
        .await
        .unwrap();
    let array = |t: &Tensor| TokenArray::from_tensor(t).unwrap();
    let work = PolicyWork {
        batch: ExperienceBatch {
            seqs: seqs.clone(),
            policy_version: 0,
            old_logprobs: array(&old_shifted),
            advantages: array(&adv),
            ref_logprobs: array(&old),
            rollout_logprobs: array(&old),
            old_values: None,
            returns: None,
        },
        cfg: PolicyLossConfig {
            objective: oxalign_rlhf::losses::PolicyObjective::Ppo,
            ppo: PpoConfig {
                clip_low: 0.2,
                clip_high: 0.2,
                dual_clip: Some(3.0),
                agg,
            },
            kl_loss_coef: 0.05,
            kl_estimator: KlEstimator::K3,
            entropy_coef: 0.01,
            rollout_correction: oxalign_rlhf::losses::RolloutCorrection::TokenTis { cap: 2.0 },
            max_grad_norm: 1.0,
        },
        lr: 1e-4,
        epochs: 2,
        minibatch_size: 4,
        shuffle_seed: 9,
    };
    let summary = policy.train(work).await.unwrap();
    assert_eq!(summary.updates, 4);
    assert_eq!(summary.skipped, 0);
    // The engine refits to the updated weights, verified by checksums and the probe.
    let report = policy.refit(1).await.unwrap();
    assert_eq!(report.version, 1);
    assert_eq!(report.checksums_ok, report.tensors);
    assert!(report.probe_max_abs_diff.unwrap() < 1e-4);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    policy.save("save", d, sharded).await.unwrap();
    if sharded {
        for rank in 0..world {
            let shard = dir.path().join(format!("optimizer/shard_{rank}"));
            assert!(shard.join("shard_layout.json").is_file(), "{shard:?}");
        }
        let d = dir.path().to_path_buf();
        policy.load_optimizer(d).await.unwrap();
    }
    policy.stop(LIMIT).await.unwrap();
    CausalLm::load(dir.path(), &Device::Cpu)
        .unwrap()
        .weights()
        .unwrap()
}

fn seeded_normal(seed: u64, b: usize, t: usize, std: f32) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v: Vec<f32> = (0..b * t)
        .map(|_| (rng.random::<f32>() - 0.5) * 3.46 * std)
        .collect();
    Tensor::from_vec(v, (b, t), &Device::Cpu).unwrap()
}

fn max_diff(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .map(|(k, x)| {
            let y = &b[k];
            (x - y)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        })
        .fold(0.0, f32::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_match_one_on_the_same_global_batch() {
    for agg in [LossAgg::TokenMean, LossAgg::SeqMeanTokenMean] {
        let one = update_with(1, agg, false).await;
        let two = update_with(2, agg, false).await;
        let init = CausalLm::init_random(&config(), 5, &Device::Cpu)
            .unwrap()
            .weights()
            .unwrap();
        let moved = max_diff(&one, &init);
        assert!(moved > 5e-5, "the update must change the weights ({moved})");
        // Float reassociation (different matmul shapes per replica) leaves ~1e-8 relative
        // noise in the gradients; AdamW's normalisation turns noise on near-zero gradients
        // into steps of up to lr, hence a realistic PPO lr (1e-4) for this comparison.
        let d = max_diff(&one, &two);
        eprintln!("{agg:?}: weights moved up to {moved:e}; max |DP2 - DP1| = {d:e}");
        assert!(d < 1e-5, "{agg:?}: DP=2 differs from DP=1 by {d}");
        // Each replica packing its shard's sequences changes nothing either.
        let packed = max_diff(&one, &update_with(2, agg, true).await);
        assert!(
            packed < 1e-5,
            "{agg:?}: packed DP=2 differs from DP=1 by {packed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_two_and_four_replicas_match_one_replicated() {
    for agg in [LossAgg::TokenMean, LossAgg::SeqMeanTokenMean] {
        let one = update_with(1, agg, false).await;
        for world in [2, 4] {
            let sharded = update_on(world, agg, false, true).await;
            let d = max_diff(&one, &sharded);
            eprintln!("{agg:?}: max |sharded DP{world} - DP1| = {d:e}");
            assert!(
                d < 1e-5,
                "{agg:?}: sharded DP={world} differs from DP=1 by {d}"
            );
        }
    }
    // Packed rows on sharded replicas change nothing either.
    let one = update_with(1, LossAgg::TokenMean, false).await;
    let packed = max_diff(&one, &update_on(2, LossAgg::TokenMean, true, true).await);
    assert!(packed < 1e-5, "packed sharded DP=2 differs by {packed}");
}

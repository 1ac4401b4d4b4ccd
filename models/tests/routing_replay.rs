//! Rollout routing replay: the engine records the experts each token was routed to while it
//! generates, and the trainer's forward replays them. With f32 rollout weights the
//! engine/trainer log-prob mismatch on MoE policies is then within 1e-5 (alone and in a
//! left-padded batch); with int8 rollout weights the engine routes differently from the f32
//! trainer, and replay makes the trainer use exactly the rollout's experts. Both mismatches,
//! with and without replay, are printed.

mod common;

use candle_core::{Device, Tensor};
use common::{batch, ids};
use oxalign_models::engine::{Engine, EngineConfig, QuantMode};
use oxalign_models::moe::routing::{ExpertChoices, RouterTrace, FREE};
use oxalign_models::{
    CausalLm, Completion, Family, GenerationRequest, ModelConfig, Preset, SamplingParams,
    TokenDistribution,
};

/// A small MoE config of `family` with widths that int8 accepts (multiples of 32).
fn config(family: Family) -> ModelConfig {
    let mut c = ModelConfig::preset(family, Preset::Tiny, 96);
    c.hidden_size = 64;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    let m = c.moe.as_mut().unwrap();
    m.num_experts = 8;
    m.num_experts_per_tok = 2;
    m.moe_intermediate_size = if family == Family::Mixtral { 64 } else { 32 };
    m.shared_expert_intermediate_size = m.shared_expert_intermediate_size.map(|_| 32);
    c
}

/// Random weights scaled up so distributions and routers are far from uniform.
fn model(family: Family, seed: u64) -> CausalLm {
    let m = CausalLm::init_random(&config(family), seed, &Device::Cpu).unwrap();
    for (_, v) in m.vars() {
        if v.rank() == 2 {
            v.set(&(v.as_tensor() * 4.0).unwrap()).unwrap();
        }
    }
    m
}

fn requests() -> Vec<GenerationRequest> {
    (0..6u64)
        .map(|i| {
            // Requests 4 and 5 share request 3's prompt (prefix sharing forks them).
            let prompt = ids(10 + i.min(3), 4 + 3 * i.min(3) as usize, 96);
            let mut r = GenerationRequest::new(prompt, 10);
            r.ignore_eos = true;
            r.sampling = SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: 500 + i,
            };
            r
        })
        .collect()
}

fn rollout(m: &CausalLm, quant: QuantMode) -> Vec<(Completion, ExpertChoices)> {
    let cfg = EngineConfig {
        block_size: 4,
        num_blocks: Some(256),
        max_batched_tokens: 9,
        quant,
        ..EngineConfig::default()
    };
    let mut e = Engine::from_model(m, cfg).unwrap();
    e.generate_with_routing(&requests()).unwrap()
}

/// The trainer's log-probs of one completion (alone, one row) and the experts it used.
fn trainer(m: &CausalLm, seq: &[u32], replay: Option<&ExpertChoices>) -> (Vec<f32>, ExpertChoices) {
    let mut trace = match replay {
        Some(r) => RouterTrace::replaying(ExpertChoices::for_batch(&[(r, 0)], seq.len())),
        None => RouterTrace::new(),
    };
    let row = Tensor::from_slice(seq, (1, seq.len()), &Device::Cpu).unwrap();
    let out = m
        .next_token_outputs_traced(&row, None, TokenDistribution::MODEL, &mut trace)
        .unwrap();
    (
        out.logprobs.squeeze(0).unwrap().to_vec1().unwrap(),
        trace.chosen,
    )
}

/// Max |engine − trainer| over the completion tokens of `rollouts`, and the fraction of
/// (token, layer) routings where the trainer's experts differ from the rollout's.
fn mismatch(m: &CausalLm, rollouts: &[(Completion, ExpertChoices)], replay: bool) -> (f32, f64) {
    let (mut worst, mut differ, mut n) = (0f32, 0f64, 0usize);
    for (req, (c, record)) in requests().iter().zip(rollouts) {
        let mut seq = req.prompt.clone();
        seq.extend_from_slice(&c.tokens);
        let (lp, used) = trainer(m, &seq, replay.then_some(record));
        let p = req.prompt.len();
        for (i, &e) in c.logprobs.iter().enumerate() {
            worst = worst.max((e - lp[p - 1 + i]).abs());
        }
        let recorded = ExpertChoices::for_batch(&[(record, 0)], seq.len());
        differ += recorded.disagreement(&used).unwrap() * (seq.len() - 1) as f64;
        n += seq.len() - 1;
    }
    (worst, differ / n as f64)
}

#[test]
fn replay_brings_the_f32_engine_trainer_mismatch_within_1e_5() {
    for family in [Family::Qwen3Moe, Family::Qwen2Moe, Family::Mixtral] {
        let m = model(family, 21);
        let rollouts = rollout(&m, QuantMode::None);
        for ((c, record), req) in rollouts.iter().zip(requests()) {
            assert_eq!(record.num_tokens(), req.prompt.len() + c.tokens.len() - 1);
            assert!(
                !record.layers.iter().flatten().any(|&x| x == FREE),
                "{family}: gaps"
            );
        }
        let (without, routing_diff) = mismatch(&m, &rollouts, false);
        let (with, replayed_diff) = mismatch(&m, &rollouts, true);
        println!(
            "{family} f32 rollout: engine/trainer max |Δ log-prob| without replay {without:.2e} \
             (routing differs on {:.2}% of token-layers), with replay {with:.2e}",
            100.0 * routing_diff
        );
        assert_eq!(
            replayed_diff, 0.0,
            "{family}: the trainer used the rollout's experts"
        );
        assert!(with <= 1e-5, "{family}: mismatch with replay {with}");
    }
}

#[test]
fn replay_follows_the_int8_rollouts_experts() {
    for family in [Family::Qwen3Moe, Family::Qwen2Moe, Family::Mixtral] {
        let m = model(family, 22);
        let rollouts = rollout(&m, QuantMode::Int8);
        let (without, routing_diff) = mismatch(&m, &rollouts, false);
        let (with, replayed_diff) = mismatch(&m, &rollouts, true);
        println!(
            "{family} int8 rollout: engine/trainer max |Δ log-prob| without replay {without:.2e} \
             (routing differs on {:.2}% of token-layers), with replay {with:.2e}",
            100.0 * routing_diff
        );
        assert!(
            routing_diff > 0.0,
            "{family}: int8 routing should differ somewhere"
        );
        assert_eq!(
            replayed_diff, 0.0,
            "{family}: the trainer used the rollout's experts"
        );
        assert!(
            with <= without,
            "{family}: replay should not widen the mismatch"
        );
    }
}

#[test]
fn replay_in_a_left_padded_batch_matches_replay_alone() {
    let m = model(Family::Qwen3Moe, 23);
    let rollouts = rollout(&m, QuantMode::None);
    let seqs: Vec<Vec<u32>> = requests()
        .iter()
        .zip(&rollouts)
        .map(|(r, (c, _))| [r.prompt.clone(), c.tokens.clone()].concat())
        .collect();
    let t = seqs.iter().map(Vec::len).max().unwrap();
    let pads: Vec<usize> = seqs.iter().map(|s| t - s.len()).collect();
    let rows: Vec<Vec<u32>> = seqs
        .iter()
        .zip(&pads)
        .map(|(s, &p)| [vec![0; p], s.clone()].concat())
        .collect();
    let mask: Vec<Vec<u32>> = pads
        .iter()
        .map(|&p| [vec![0; p], vec![1; t - p]].concat())
        .collect();
    let records: Vec<(&ExpertChoices, usize)> = rollouts
        .iter()
        .map(|(_, r)| r)
        .zip(pads.iter().copied())
        .collect();
    let mut trace = RouterTrace::replaying(ExpertChoices::for_batch(&records, t));
    let lp = m
        .next_token_outputs_traced(
            &batch(&rows),
            Some(&batch(&mask)),
            TokenDistribution::MODEL,
            &mut trace,
        )
        .unwrap()
        .logprobs
        .to_vec2::<f32>()
        .unwrap();
    let mut worst = 0f32;
    for (b, (s, (_, record))) in seqs.iter().zip(&rollouts).enumerate() {
        let (alone, _) = trainer(&m, s, Some(record));
        for (i, a) in alone.iter().enumerate() {
            worst = worst.max((a - lp[b][pads[b] + i]).abs());
        }
    }
    println!("left-padded batch with replay vs alone: max |Δ log-prob| {worst:.2e}");
    assert!(worst <= 1e-5);
}

/// The refit probe of an MoE model carries the trainer's experts and the engine scores the
/// probe with them: correct experts pass at f32 tolerance, other experts are caught (so the
/// engine really follows them), and an int8 engine's probe gap is then the quantization's,
/// not a routing flip's (printed, with the gap of the engine's own routing).
#[test]
fn the_refit_probe_scores_with_the_trainers_experts() {
    use oxalign_models::engine::{Probe, WeightUpdate};
    let m = model(Family::Mixtral, 24);
    let tokens = ids(40, 24, 96);
    let probe = Probe::from_model(&m, tokens.clone(), 1e-5).unwrap();
    let routing = probe
        .routing
        .clone()
        .expect("an MoE probe records its experts");
    assert_eq!(routing.num_tokens(), tokens.len());
    let mut engine = Engine::from_model(&m, EngineConfig::default()).unwrap();
    let update = WeightUpdate::from_model(1, &m).unwrap();
    let report = engine.refit(&update, Some(&probe)).unwrap();
    assert!(report.probe_max_abs_diff.unwrap() <= 1e-5);
    let mut wrong = probe.clone();
    let k = routing.top_k;
    let n = config(Family::Mixtral).moe.unwrap().num_experts as u32;
    for layer in wrong.routing.as_mut().unwrap().layers.iter_mut() {
        for c in layer.iter_mut() {
            *c = (*c + k as u32) % n;
        }
    }
    let update = WeightUpdate::from_model(2, &m).unwrap();
    let e = engine.refit(&update, Some(&wrong)).unwrap_err().to_string();
    assert!(e.contains("probe log-probs differ"), "{e}");

    let int8 = EngineConfig {
        quant: QuantMode::Int8,
        ..EngineConfig::default()
    };
    let (mut replayed, mut own) = (0f32, 0f32);
    for seed in 0..12u64 {
        let probe = Probe::from_model(&m, ids(60 + seed, 40, 96), 10.0).unwrap();
        let mut free = probe.clone();
        free.routing = None;
        for (p, worst) in [(&probe, &mut replayed), (&free, &mut own)] {
            let mut e = Engine::from_model(&m, int8.clone()).unwrap();
            let r = e.refit(&WeightUpdate::from_model(1, &m).unwrap(), Some(p));
            *worst = worst.max(r.unwrap().probe_max_abs_diff.unwrap());
        }
    }
    println!(
        "int8 refit probe, 12 probes of 40 tokens: max |Δ log-prob| with the trainer's experts \
         {replayed:.2e}, with the engine's own routing {own:.2e}"
    );
    assert!(replayed <= own);
}

/// Per completion token of `rollouts`, |engine − trainer| log-prob (the trainer replaying
/// the rollout's experts).
fn token_gaps(m: &CausalLm, rollouts: &[(Completion, ExpertChoices)]) -> Vec<f32> {
    let mut gaps = Vec::new();
    for (req, (c, record)) in requests().iter().zip(rollouts) {
        let mut seq = req.prompt.clone();
        seq.extend_from_slice(&c.tokens);
        let (lp, _) = trainer(m, &seq, Some(record));
        let p = req.prompt.len();
        gaps.extend(
            c.logprobs
                .iter()
                .enumerate()
                .map(|(i, &e)| (e - lp[p - 1 + i]).abs()),
        );
    }
    gaps
}

/// Under int8 rollout weights, a trainer computing in the engine's int8 numbers
/// ([`oxalign_models::Precision::FakeInt8`]: the engine's int8 kernel in every linear layer
/// it quantizes, its f32 kernel in the routers and shared-expert gates, and the engine's
/// arithmetic in the attention and SwiGLU) with the rollout's experts replayed runs the
/// engine's decoder bit for bit, so no activation rounds to a different int8 value on one
/// side only; the log-probs then differ only by the LM head's summation order (the fused
/// head adds the dequantized products in f32, the engine sums integers). Over 3 families ×
/// 4 seeds × 60 tokens: asserted, every token within 1e-5, and the f32 forward (printed for
/// comparison) is never closer.
#[test]
fn an_int8_trainer_forward_with_replay_matches_the_int8_engine() {
    let (mut fake_all, mut f32_all) = (Vec::new(), Vec::new());
    for family in [Family::Qwen3Moe, Family::Qwen2Moe, Family::Mixtral] {
        for seed in [22, 23, 24, 25] {
            let m = model(family, seed);
            let rollouts = rollout(&m, QuantMode::Int8);
            let mut fake = m.clone();
            fake.set_precision(oxalign_models::Precision::FakeInt8);
            let (_, routing_diff) = mismatch(&fake, &rollouts, false);
            let fake_gaps = token_gaps(&fake, &rollouts);
            let f32_gaps = token_gaps(&m, &rollouts);
            let worst = |g: &[f32]| g.iter().fold(0f32, |a, &x| a.max(x));
            println!(
                "{family} seed {seed}: int8 engine vs trainer with replay, max |Δ log-prob| \
                 int8 forward {:.2e}, f32 forward {:.2e}; the int8 forward's own routing \
                 differs on {:.2}% of token-layers",
                worst(&fake_gaps),
                worst(&f32_gaps),
                100.0 * routing_diff
            );
            assert!(
                worst(&fake_gaps) <= worst(&f32_gaps),
                "{family} seed {seed}"
            );
            fake_all.extend(fake_gaps);
            f32_all.extend(f32_gaps);
        }
    }
    let within = |g: &[f32]| g.iter().filter(|&&x| x <= 1e-5).count() as f64 / g.len() as f64;
    let worst = fake_all.iter().fold(0f32, |a, &x| a.max(x));
    println!(
        "{} tokens: within 1e-5 with the int8 forward {:.1}% (worst {worst:.2e}), with the f32 \
         forward {:.1}%",
        fake_all.len(),
        100.0 * within(&fake_all),
        100.0 * within(&f32_all)
    );
    assert!(worst <= 1e-5, "worst token {worst:.2e}");
}

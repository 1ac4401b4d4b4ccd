//! The routers' load-balancing loss in the policy trainer's losses: its default weight
//! follows HF's rule (`router_aux_loss_coef` when `output_router_logits`), an update reports
//! the loss it added (padded and packed rows pool the same tokens), and SFT with the loss
//! balances the experts where SFT without it does not.

mod common;

use candle_core::{Device, Tensor};
use common::tiny_moe::{tiny_moe, tiny_moe_with};
use oxalign_kernels::ops::TokenDistribution;
use oxalign_models::moe::routing::RouterTrace;
use oxalign_rlhf::trainer::{Packing, PolicyLossConfig, PolicyTrainer, TokenBatch};

/// Eight prompt/response pairs of different lengths over the tiny vocabulary.
fn batch() -> TokenBatch {
    let rows: Vec<(Vec<u32>, Vec<u32>)> = (0..8usize)
        .map(|i| {
            let prompt = (0..2 + i % 4).map(|j| ((5 + 11 * i + 3 * j) % 90 + 3) as u32);
            let response = (0..3 + i % 3).map(|j| ((17 + 7 * i + 5 * j) % 90 + 3) as u32);
            (prompt.collect(), response.collect())
        })
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    TokenBatch::new(&pairs, 0, &Device::Cpu).unwrap()
}

/// The load-balancing loss of the trainer's current routers over `b`'s real tokens.
fn balance_loss(t: &PolicyTrainer, b: &TokenBatch) -> f64 {
    let mut trace = RouterTrace::new();
    t.model
        .next_token_outputs_traced(
            &b.ids,
            Some(&b.attention_mask),
            TokenDistribution::MODEL,
            &mut trace,
        )
        .unwrap();
    let aux = t.model.router_aux_loss(&trace, Some(&b.attention_mask));
    aux.unwrap().unwrap().to_scalar::<f32>().unwrap() as f64
}

fn loss_config() -> PolicyLossConfig {
    common::tiny_moe::ppo_loss()
}

#[test]
fn the_default_weight_follows_output_router_logits() {
    let off = PolicyTrainer::new(tiny_moe(1), 1e-3, 0.0).unwrap();
    assert_eq!(off.router_aux_loss_coef, 0.0, "HF adds nothing by default");
    let on = tiny_moe_with(1, |c| {
        let m = c.moe.as_mut().unwrap();
        m.output_router_logits = true;
        m.router_aux_loss_coef = 0.02;
    });
    let on = PolicyTrainer::new(on, 1e-3, 0.0).unwrap();
    assert_eq!(on.router_aux_loss_coef, 0.02);
}

/// A PPO update reports the loss it added: the one the routers give before the update, the
/// same on packed rows; with weight 0 it reports none.
#[test]
fn an_update_reports_the_balance_loss_it_added_padded_and_packed() {
    let b = batch();
    for packed in [false, true] {
        let mut t = PolicyTrainer::new(tiny_moe(7), 1e-3, 0.0).unwrap();
        t.packing = Packing {
            sft: false,
            rl: packed,
        };
        let old = t.logprobs(&b).unwrap();
        let adv = Tensor::ones(old.dims2().unwrap(), candle_core::DType::F32, &Device::Cpu);
        let adv = adv.unwrap();
        let cfg = loss_config();
        let none = t.ppo_step(&b, &old, &adv, None, None, &cfg, 0.0, 1.0, None);
        assert_eq!(none.unwrap().router_aux_loss, None, "weight 0 adds nothing");
        let want = balance_loss(&t, &b);
        t.router_aux_loss_coef = 0.1;
        let s = t.ppo_step(&b, &old, &adv, None, None, &cfg, 1e-3, 1.0, None);
        let got = s.unwrap().router_aux_loss.expect("the loss was added");
        println!("packed {packed}: balance loss {got:.6} (forward alone {want:.6})");
        assert!(
            (got - want).abs() < 1e-5,
            "packed {packed}: {got} vs {want}"
        );
        assert!(want > 1.0, "routers scaled ×4 start unbalanced: {want}");
    }
}

/// SFT with the loss weighted in balances the experts: the load-balancing loss falls well
/// below where SFT alone leaves it, while the NLL still falls.
#[test]
fn sft_with_the_balance_loss_spreads_tokens_over_the_experts() {
    let b = batch();
    let run = |coef: f64| {
        let mut t = PolicyTrainer::new(tiny_moe(11), 3e-3, 0.0).unwrap();
        t.router_aux_loss_coef = coef;
        let start = balance_loss(&t, &b);
        let mut nll = Vec::new();
        for _ in 0..40 {
            nll.push(t.sft_step(&b, 3e-3, 1.0, 1.0, None).unwrap().0);
        }
        (start, balance_loss(&t, &b), nll[0], *nll.last().unwrap())
    };
    let (start, without, nll0, nll_without) = run(0.0);
    let (_, with, _, nll_with) = run(1.0);
    println!(
        "balance loss {start:.4} -> {without:.4} without, {with:.4} with (NLL {nll0:.3} -> \
         {nll_without:.3} / {nll_with:.3})"
    );
    assert!(with < without - 0.05, "{with} vs {without}");
    assert!(with < start - 0.05, "{with} vs {start}");
    assert!(nll_with < nll0 && nll_without < nll0);
}

//! Gradient tests: every trainable parameter of each model gets a non-zero gradient, and the
//! backprop gradient matches central finite differences (f64) on a tiny config.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::{batch, ids, tiny};
use oxalign_models::{CausalLm, Family, RewardModel, ValueModel};

/// A fixed random weighting so the scalar loss touches every output.
fn weights_like(t: &Tensor, seed: u64) -> Tensor {
    let n = t.elem_count();
    let vals: Vec<f64> = ids(seed, n, 1000)
        .iter()
        .map(|&x| x as f64 / 500.0 - 1.0)
        .collect();
    Tensor::from_vec(vals, t.dims(), t.device())
        .unwrap()
        .to_dtype(t.dtype())
        .unwrap()
}

fn inputs() -> (Tensor, Tensor) {
    // Row 0 is left-padded (2 pads), row 1 is full.
    let mut r0 = ids(1, 7, 64);
    r0[0] = 0;
    r0[1] = 0;
    let r1 = ids(2, 7, 64);
    let mask = Tensor::new(
        &[[0u32, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]],
        &Device::Cpu,
    )
    .unwrap();
    (batch(&[r0, r1]), mask)
}

fn assert_all_grads_nonzero(vars: &[(String, Var)], loss: &Tensor) {
    let grads = loss.backward().unwrap();
    assert!(!vars.is_empty());
    for (name, var) in vars {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let norm = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(
            norm.is_finite() && norm > 0.0,
            "gradient of {name} is zero or not finite: {norm}"
        );
    }
}

#[test]
fn every_causal_lm_parameter_gets_a_gradient() {
    let (ids, mask) = inputs();
    for family in Family::ALL {
        let cfg = tiny(family);
        let m = CausalLm::init_random(&cfg, 3, &Device::Cpu).unwrap();
        let logits = m.forward(&ids, Some(&mask)).unwrap();
        let loss = (logits.clone() * weights_like(&logits, 5))
            .unwrap()
            .sum_all()
            .unwrap();
        let vars = m.vars();
        let n_expected = oxalign_models::config::layout::causal_lm_specs(&cfg).len();
        assert_eq!(vars.len(), n_expected, "{family}");
        assert_all_grads_nonzero(&vars, &loss);
    }
}

#[test]
fn every_value_and_reward_parameter_gets_a_gradient() {
    let (ids, mask) = inputs();
    for family in [Family::Llama, Family::Qwen2] {
        let cfg = tiny(family);
        let v = ValueModel::init_random(&cfg, 4, &Device::Cpu).unwrap();
        let values = v.forward(&ids, Some(&mask)).unwrap();
        assert_eq!(values.dims(), &[2, 7]);
        let loss = (values.clone() * weights_like(&values, 6))
            .unwrap()
            .sum_all()
            .unwrap();
        assert!(v.vars().iter().any(|(n, _)| n == "score.bias"));
        assert_all_grads_nonzero(&v.vars(), &loss);

        let r = RewardModel::init_random(&cfg, 5, &Device::Cpu).unwrap();
        let scores = r.forward(&ids, Some(&mask)).unwrap();
        assert_eq!(scores.dims(), &[2]);
        let loss = (scores.narrow(0, 0, 1).unwrap() - scores.narrow(0, 1, 1).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        assert!(!r.vars().iter().any(|(n, _)| n == "score.bias"));
        assert_all_grads_nonzero(&r.vars(), &loss);
    }
}

/// Central finite differences in f64 against backprop for a few entries of several parameters.
fn finite_difference_check(family: Family) {
    let cfg = tiny(family);
    let m = CausalLm::init_random_with_dtype(&cfg, 11, DType::F64, &Device::Cpu).unwrap();
    // Larger weights than the 0.02 init so the check is not dominated by near-linear behaviour.
    for (i, (_, var)) in m.vars().iter().enumerate() {
        let t = var.as_tensor();
        if t.rank() == 2 {
            let w = (weights_like(t, 100 + i as u64) * 0.3).unwrap();
            var.set(&w).unwrap();
        }
    }
    let (ids, mask) = inputs();
    let probe = {
        let l = m.forward(&ids, Some(&mask)).unwrap();
        weights_like(&l, 7)
    };
    let loss_of = |m: &CausalLm| -> Tensor {
        let logits = m.forward(&ids, Some(&mask)).unwrap();
        (logits * &probe).unwrap().sum_all().unwrap()
    };
    let grads = loss_of(&m).backward().unwrap();
    let vars = m.vars();
    let picks = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
    ];
    let mut picked = picks
        .iter()
        .filter(|s| vars.iter().any(|(n, _)| n == *s))
        .map(|s| s.to_string())
        .collect::<Vec<_>>();
    picked.extend(moe_picks(&cfg));
    if cfg.qkv_bias() {
        picked.push("model.layers.0.self_attn.k_proj.bias".into());
    }
    if !cfg.tie_word_embeddings {
        picked.push("lm_head.weight".into());
    }
    let h = 1e-5;
    let mut checked = 0;
    for name in &picked {
        let (_, var) = vars.iter().find(|(n, _)| n == name).unwrap();
        let g = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let base = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let n = base.len();
        for k in 0..3u64 {
            let idx = ((k * 7919 + name.len() as u64 * 104729) % n as u64) as usize;
            let eval = |delta: f64| -> f64 {
                let mut v = base.clone();
                v[idx] += delta;
                var.set(&Tensor::from_vec(v, var.as_tensor().dims(), &Device::Cpu).unwrap())
                    .unwrap();
                loss_of(&m).to_scalar::<f64>().unwrap()
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h);
            var.set(&Tensor::from_vec(base.clone(), var.as_tensor().dims(), &Device::Cpu).unwrap())
                .unwrap();
            let tol = 1e-6 + 1e-5 * fd.abs().max(g[idx].abs());
            assert!(
                (fd - g[idx]).abs() <= tol,
                "{family} {name}[{idx}]: finite difference {fd} vs backprop {}",
                g[idx]
            );
            checked += 1;
        }
    }
    assert!(checked >= 27);
}

/// The MoE tensors a finite-difference check probes: the first sparse layer's router, two
/// experts, the shared expert and its gate, and the q/k norms.
fn moe_picks(cfg: &oxalign_models::ModelConfig) -> Vec<String> {
    use oxalign_models::config::layout::FeedForwardParams;
    let decl = cfg.backbone_params();
    let mut out: Vec<String> = decl.layers[0]
        .attn
        .q_norm
        .iter()
        .chain(&decl.layers[0].attn.k_norm)
        .map(|s| s.name.clone())
        .collect();
    let sparse = decl.layers.iter().find_map(|l| match &l.ffn {
        FeedForwardParams::Sparse(m) => Some(m.clone()),
        FeedForwardParams::Dense(_) => None,
    });
    if let Some(m) = sparse {
        out.push(m.router.weight.name.clone());
        out.push(m.experts[0].gate.weight.name.clone());
        out.push(m.experts[m.experts.len() - 1].down.weight.name.clone());
        if let Some(s) = &m.shared {
            out.push(s.gate.weight.name.clone());
            out.push(s.mlp.up.weight.name.clone());
        }
    }
    out
}

#[test]
fn finite_differences_match_backprop_llama() {
    finite_difference_check(Family::Llama);
}

#[test]
fn finite_differences_match_backprop_qwen2() {
    finite_difference_check(Family::Qwen2);
}

#[test]
fn finite_differences_match_backprop_mistral_sliding_window() {
    finite_difference_check(Family::Mistral);
}

#[test]
fn finite_differences_match_backprop_qwen3_moe_router_and_qk_norm() {
    finite_difference_check(Family::Qwen3Moe);
}

#[test]
fn finite_differences_match_backprop_qwen2_moe_shared_expert() {
    finite_difference_check(Family::Qwen2Moe);
}

#[test]
fn finite_differences_match_backprop_mixtral() {
    finite_difference_check(Family::Mixtral);
}

/// Gemma 3: `(1 + w)` norms (the gradient reaches `w`), the norms after attention and
/// around the MLP, the GELU-tanh gate, the scaled embedding and the q rescale.
#[test]
fn finite_differences_match_backprop_gemma3() {
    finite_difference_check(Family::Gemma3);
}

/// Gemma 2: soft-capped attention scores and final logits (the composed attention and head).
#[test]
fn finite_differences_match_backprop_gemma2() {
    finite_difference_check(Family::Gemma2);
}

/// The head run only at chosen positions (`next_token_outputs_at_traced`, the policy
/// trainer's response targets) gives the full head's log-probs and entropies there, 0
/// elsewhere, and the same gradient in every parameter for a loss over those positions.
#[test]
fn the_head_at_chosen_positions_is_the_full_head_there() {
    use oxalign_kernels::ops::TokenDistribution;
    use oxalign_models::moe::routing::RouterTrace;
    let (ids, mask) = inputs();
    let m = CausalLm::init_random(&tiny(Family::Llama), 3, &Device::Cpu).unwrap();
    let dist = TokenDistribution::MODEL;
    // Row-major [2, 6] grid: the last four targets of each row.
    let kept: Vec<u32> = vec![2, 3, 4, 5, 8, 9, 10, 11];
    let at = Tensor::new(kept.as_slice(), &Device::Cpu).unwrap();
    let keep = {
        let v: Vec<f32> = (0..12u32).map(|i| kept.contains(&i) as u8 as f32).collect();
        Tensor::from_vec(v, (2, 6), &Device::Cpu).unwrap()
    };
    let loss_of = |out: &oxalign_kernels::ops::HeadOutputs| {
        let w = weights_like(&out.logprobs, 9);
        ((&out.logprobs + &out.entropy).unwrap() * w)
            .unwrap()
            .mul(&keep)
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let full = m
        .next_token_outputs_traced(&ids, Some(&mask), dist, &mut RouterTrace::new())
        .unwrap();
    let part = m
        .next_token_outputs_at_traced(&ids, Some(&mask), dist, &mut RouterTrace::new(), &at)
        .unwrap();
    for (a, b) in [
        (&full.logprobs, &part.logprobs),
        (&full.entropy, &part.entropy),
    ] {
        let (a, b) = (a.to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap());
        for i in 0..12 {
            let (x, y) = (a[i / 6][i % 6], b[i / 6][i % 6]);
            if kept.contains(&(i as u32)) {
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                    "position {i}: {x} vs {y}"
                );
            } else {
                assert_eq!(y, 0.0, "position {i} is not kept");
            }
        }
    }
    let (gf, gp) = (
        loss_of(&full).backward().unwrap(),
        loss_of(&part).backward().unwrap(),
    );
    for (name, var) in m.vars() {
        let (a, b) = (
            gf.get(var.as_tensor()).unwrap(),
            gp.get(var.as_tensor()).unwrap(),
        );
        let scale = common::max_abs_diff(a, &a.zeros_like().unwrap()).max(1e-6);
        let diff = common::max_abs_diff(a, b);
        assert!(
            diff <= 1e-4 * scale,
            "{name}: gradients differ by {diff} (scale {scale})"
        );
    }
}

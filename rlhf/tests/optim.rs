//! Optimizer behaviour beyond the torch reference: default groups, state save/load
//! (round trip and mismatch errors), gradient accumulation and clipping edge cases.

mod common;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use common::*;
use oxalign_rlhf::optim::{
    clip_grad_norm, default_group_of, is_no_decay, AdamW, AdamWConfig, GradAccumulator,
};
use oxalign_rlhf::RlhfError;

fn named(seed: u64, spec: &[(&str, &[usize])]) -> Vec<(String, Var)> {
    let mut rng = SplitMix::new(seed);
    spec.iter()
        .map(|(n, shape)| {
            let count = shape.iter().product();
            let t = from_vec(rng.normals(count, 1.0), shape, DType::F32);
            (n.to_string(), Var::from_tensor(&t).unwrap())
        })
        .collect()
}

const SPEC: &[(&str, &[usize])] = &[
    ("model.embed_tokens.weight", &[5, 3]),
    ("model.layers.0.self_attn.q_proj.weight", &[3, 3]),
    ("model.layers.0.post_attention_layernorm.weight", &[3]),
    ("score.bias", &[1]),
];

fn grads_for(vars: &[(String, Var)], rng: &mut SplitMix) -> GradStore {
    let mut g = GradStore::default();
    for (_, v) in vars {
        let n = v.as_tensor().elem_count();
        g.insert(
            v.as_tensor(),
            from_vec(rng.normals(n, 1.0), v.as_tensor().dims(), DType::F32),
        );
    }
    g
}

#[test]
fn default_groups_exclude_norms_biases_embeddings() {
    assert!(is_no_decay("model.embed_tokens.weight"));
    assert!(is_no_decay("model.norm.weight"));
    assert!(is_no_decay("model.layers.3.input_layernorm.weight"));
    assert!(is_no_decay("model.layers.3.self_attn.q_proj.bias"));
    assert!(!is_no_decay("model.layers.3.self_attn.q_proj.weight"));
    assert!(!is_no_decay("lm_head.weight"));
    assert_eq!(default_group_of("lm_head.weight"), 0);
    let opt = AdamW::new(
        named(1, SPEC),
        AdamWConfig {
            weight_decay: 0.05,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        opt.group_of("model.layers.0.self_attn.q_proj.weight")
            .unwrap()
            .weight_decay,
        0.05
    );
    assert_eq!(
        opt.group_of("model.embed_tokens.weight")
            .unwrap()
            .weight_decay,
        0.0
    );
    assert_eq!(opt.group_of("score.bias").unwrap().name, "no_decay");
}

#[test]
fn weight_decay_is_decoupled() {
    // With a zero gradient Adam's update is 0/(0+eps) = 0: only p ← p(1 − lr·λ) remains.
    let vars = named(2, &[("w", &[4])]);
    let before = host(vars[0].1.as_tensor());
    let mut opt = AdamW::new(
        vars.clone(),
        AdamWConfig {
            lr: 0.1,
            weight_decay: 0.5,
            ..Default::default()
        },
    )
    .unwrap();
    let mut g = GradStore::default();
    g.insert(
        vars[0].1.as_tensor(),
        Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap(),
    );
    opt.step(&g).unwrap();
    let want: Vec<f64> = before.iter().map(|p| p * (1.0 - 0.1 * 0.5)).collect();
    assert_close("decayed", &host(vars[0].1.as_tensor()), &want, 1e-6);
}

#[test]
fn state_round_trip_resumes_identically() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = AdamWConfig {
        lr: 3e-3,
        weight_decay: 0.1,
        ..Default::default()
    };
    let a_vars = named(4, SPEC);
    let mut a = AdamW::new(a_vars.clone(), cfg).unwrap();
    let mut rng = SplitMix::new(9);
    for _ in 0..3 {
        let g = grads_for(&a_vars, &mut rng);
        a.step(&g).unwrap();
    }
    a.set_lr(1.5e-3);
    a.save_state(dir.path()).unwrap();

    // A fresh optimizer over copies of the current parameters, then load.
    let b_vars: Vec<(String, Var)> = a_vars
        .iter()
        .map(|(n, v)| {
            (
                n.clone(),
                Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap(),
            )
        })
        .collect();
    let mut b = AdamW::new(b_vars.clone(), cfg).unwrap();
    b.load_state(dir.path()).unwrap();
    assert_eq!(b.steps_taken(), 3);
    assert_eq!(b.lr(), 1.5e-3);
    for _ in 0..2 {
        let ga = grads_for(&a_vars, &mut SplitMix::new(77));
        let gb = grads_for(&b_vars, &mut SplitMix::new(77));
        a.step(&ga).unwrap();
        b.step(&gb).unwrap();
    }
    for ((n, va), (_, vb)) in a_vars.iter().zip(&b_vars) {
        assert_eq!(
            host(va.as_tensor()),
            host(vb.as_tensor()),
            "{n} diverged after resume"
        );
    }
}

#[test]
fn loading_mismatched_state_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let opt = AdamW::new(named(5, SPEC), AdamWConfig::default()).unwrap();
    opt.save_state(dir.path()).unwrap();

    // Different shape of one parameter.
    let mut spec = SPEC.to_vec();
    spec[1] = ("model.layers.0.self_attn.q_proj.weight", &[3, 4]);
    let mut other = AdamW::new(named(5, &spec), AdamWConfig::default()).unwrap();
    let err = other.load_state(dir.path()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, RlhfError::StateMismatch { .. }), "{msg}");
    assert!(
        msg.contains("model.layers.0.self_attn.q_proj.weight.exp_avg") && msg.contains("[3, 4]"),
        "{msg}"
    );
    assert!(msg.contains("optimizer.safetensors"), "{msg}");

    // A parameter the state does not know.
    let mut spec = SPEC.to_vec();
    spec.push(("lm_head.weight", &[5, 3]));
    let mut other = AdamW::new(named(5, &spec), AdamWConfig::default()).unwrap();
    let msg = other.load_state(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("`lm_head.weight`") && msg.contains("optimizer.json"),
        "{msg}"
    );

    // A state with a parameter the optimizer lacks.
    let mut other = AdamW::new(named(5, &SPEC[..3]), AdamWConfig::default()).unwrap();
    let before: Vec<u64> = other.param_state().map(|p| p.1).collect();
    let msg = other.load_state(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("score.bias"), "{msg}");
    assert_eq!(
        before,
        other.param_state().map(|p| p.1).collect::<Vec<_>>(),
        "unchanged on error"
    );

    // Missing directory.
    let msg = other
        .load_state(&dir.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("optimizer.json"), "{msg}");
}

#[test]
fn duplicate_names_and_bad_groups_are_errors() {
    let mut vars = named(6, &SPEC[..2]);
    vars.push(vars[0].clone());
    assert!(
        matches!(AdamW::new(vars, AdamWConfig::default()), Err(RlhfError::DuplicateParam(n)) if n == "model.embed_tokens.weight")
    );
    let err =
        AdamW::with_groups(named(6, SPEC), AdamWConfig::default(), vec![], |_| 0).unwrap_err();
    assert!(
        err.to_string().contains("model.embed_tokens.weight"),
        "{err}"
    );
    let err = AdamW::new(
        named(6, SPEC),
        AdamWConfig {
            beta2: 1.0,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("beta2"), "{err}");
}

#[test]
fn accumulated_micro_batches_equal_the_full_batch() {
    // loss = mean over rows of (x·w)²: two halves with scale 1/2 give the full-batch gradient.
    let w = Var::from_tensor(&from_vec(vec![0.3, -0.7, 1.1], &[3, 1], DType::F32)).unwrap();
    let x = from_vec(SplitMix::new(8).normals(12, 1.0), &[4, 3], DType::F32);
    let loss_of = |x: &Tensor| {
        x.matmul(w.as_tensor())
            .unwrap()
            .sqr()
            .unwrap()
            .mean_all()
            .unwrap()
    };
    let full = host(loss_of(&x).backward().unwrap().get(w.as_tensor()).unwrap());
    let mut acc = GradAccumulator::new([&w]);
    for half in 0..2 {
        let g = loss_of(&x.narrow(0, half * 2, 2).unwrap())
            .backward()
            .unwrap();
        acc.add(&g, 0.5).unwrap();
    }
    assert_eq!(acc.micro_batches(), 2);
    let store = acc.take();
    assert_eq!(acc.micro_batches(), 0);
    assert_close(
        "accumulated",
        &host(store.get(w.as_tensor()).unwrap()),
        &full,
        1e-6,
    );
    assert!(acc.take().get(w.as_tensor()).is_none(), "take() resets");
}

#[test]
fn clipping_below_max_is_a_no_op_and_non_finite_is_reported() {
    let v = Var::zeros(3, DType::F32, &Device::Cpu).unwrap();
    let mut g = GradStore::default();
    g.insert(
        v.as_tensor(),
        from_vec(vec![0.3, 0.4, 0.0], &[3], DType::F32),
    );
    let norm = clip_grad_norm(&mut g, [&v], 1.0).unwrap();
    assert_close1("norm", norm, 0.5, 1e-6);
    assert_eq!(
        host(g.get(v.as_tensor()).unwrap()),
        host(&from_vec(vec![0.3, 0.4, 0.0], &[3], DType::F32))
    );
    g.insert(
        v.as_tensor(),
        from_vec(vec![f64::INFINITY, 0.0, 1.0], &[3], DType::F32),
    );
    assert!(clip_grad_norm(&mut g, [&v], 1.0).unwrap().is_infinite());
    assert!(clip_grad_norm(&mut g, [&v], 0.0).is_err());
}

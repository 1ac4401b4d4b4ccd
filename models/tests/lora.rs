//! LoRA adapters on the decoders: a fresh adapter leaves the function unchanged; only the
//! adapters (and modules trained whole) get gradients, and those match finite differences;
//! the merged weights compute what the adapter path computes; saved folders load back (the
//! merged HF folder and PEFT's adapter files); bad settings and files are refused by name.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{batch, ids, max_abs_diff, tiny};
use oxalign_models::{CausalLm, Family, LoraConfig, RewardModel};

fn inputs() -> (Tensor, Tensor) {
    let rows = [ids(1, 7, 64), ids(2, 7, 64)];
    let mask = Tensor::new(&[[0u32, 1, 1, 1, 1, 1, 1], [1; 7]], &Device::Cpu).unwrap();
    (batch(&rows), mask)
}

fn lora(targets: &[&str]) -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
        modules_to_save: vec![],
        use_rslora: false,
    }
}

/// Gives every `B` (zero when fresh) seeded values so the adapters change the function.
fn perturb_b(m: &CausalLm, scale: f64) {
    for (i, (name, var)) in m.vars().into_iter().enumerate() {
        if name.ends_with("lora_B.weight") {
            let n = var.elem_count();
            let v: Vec<f64> = ids(40 + i as u64, n, 1000)
                .iter()
                .map(|&x| (x as f64 / 500.0 - 1.0) * scale)
                .collect();
            let t = Tensor::from_vec(v, var.dims(), &Device::Cpu)
                .unwrap()
                .to_dtype(var.dtype())
                .unwrap();
            var.set(&t).unwrap();
        }
    }
}

#[test]
fn a_fresh_adapter_leaves_the_function_unchanged_and_only_adapters_train() {
    let (x, mask) = inputs();
    for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        let base = CausalLm::init_random(&tiny(family), 3, &Device::Cpu).unwrap();
        let adapted = base.with_lora(&lora(&["all-linear"]), 7).unwrap();
        let want = base.forward(&x, Some(&mask)).unwrap();
        let got = adapted.forward(&x, Some(&mask)).unwrap();
        assert_eq!(max_abs_diff(&want, &got), 0.0, "{family}");

        let layers = tiny(family).num_hidden_layers;
        let vars = adapted.vars();
        assert_eq!(
            vars.len(),
            layers * 7 * 2,
            "{family}: A and B for 7 linears a layer"
        );
        assert!(vars.iter().all(|(n, _)| n.contains(".lora_")));
        let loss = got.sqr().unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        // B is zero, so only B's gradient is non-zero (A's is B^T·(...) = 0).
        for (name, var) in &vars {
            let g = grads.get(var.as_tensor()).expect(name);
            let norm = g
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(
                name.ends_with("lora_B.weight"),
                norm > 0.0,
                "{family} {name}: {norm}"
            );
        }
        for (name, var) in base.vars() {
            assert!(
                grads.get(var.as_tensor()).is_none(),
                "{family}: frozen {name} has a gradient"
            );
        }
    }
}

#[test]
fn adapter_gradients_match_finite_differences() {
    let cfg = tiny(Family::Llama);
    let base = CausalLm::init_random_with_dtype(&cfg, 11, DType::F64, &Device::Cpu).unwrap();
    let m = base
        .with_lora(&lora(&["q_proj", "v_proj", "down_proj"]), 5)
        .unwrap();
    perturb_b(&m, 0.3);
    let (x, mask) = inputs();
    let probe = Tensor::randn(0f64, 1.0, (2, 7, cfg.vocab_size), &Device::Cpu).unwrap();
    let loss_of = |m: &CausalLm| -> f64 {
        let l = m.forward(&x, Some(&mask)).unwrap();
        (l * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let l = m.forward(&x, Some(&mask)).unwrap();
    let grads = (l * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let eps = 1e-5;
    for (name, var) in m.vars().into_iter().take(6) {
        let g: Vec<f64> = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let orig: Vec<f64> = var.flatten_all().unwrap().to_vec1().unwrap();
        for idx in [0, orig.len() / 2, orig.len() - 1] {
            let at = |delta: f64| {
                let mut v = orig.clone();
                v[idx] += delta;
                var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
                    .unwrap();
                loss_of(&m)
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            var.set(&Tensor::from_vec(orig.clone(), var.dims(), &Device::Cpu).unwrap())
                .unwrap();
            let err = (fd - g[idx]).abs() / (1.0 + fd.abs());
            assert!(
                err < 1e-6,
                "{name}[{idx}]: backprop {} vs finite difference {fd}",
                g[idx]
            );
        }
    }
}

#[test]
fn merged_weights_compute_the_adapter_path_and_the_base_model_has_adapters_off() {
    let cfg = tiny(Family::Qwen2);
    let base = CausalLm::init_random(&cfg, 4, &Device::Cpu).unwrap();
    let m = base.with_lora(&lora(&["all-linear"]), 9).unwrap();
    perturb_b(&m, 0.05);
    let (x, mask) = inputs();
    let adapted = m.forward(&x, Some(&mask)).unwrap();
    let plain = base.forward(&x, Some(&mask)).unwrap();
    assert!(
        max_abs_diff(&adapted, &plain) > 1e-3,
        "the adapters must change the function"
    );
    let merged =
        CausalLm::from_weights(cfg.clone(), &m.weights().unwrap(), DType::F32, &Device::Cpu)
            .unwrap()
            .forward(&x, Some(&mask))
            .unwrap();
    assert!(
        max_abs_diff(&adapted, &merged) < 1e-5,
        "{}",
        max_abs_diff(&adapted, &merged)
    );
    let off = m.base_model().unwrap();
    assert_eq!(
        max_abs_diff(&off.forward(&x, Some(&mask)).unwrap(), &plain),
        0.0
    );
    // The base is shared, not copied: the model with adapters off sees a change to it.
    let (_, embed) = base
        .vars()
        .into_iter()
        .find(|(n, _)| n.contains("embed"))
        .unwrap();
    embed.set(&embed.zeros_like().unwrap()).unwrap();
    let moved = off.forward(&x, Some(&mask)).unwrap();
    assert!(max_abs_diff(&moved, &plain) > 1e-3);
    assert_eq!(
        max_abs_diff(&moved, &base.forward(&x, Some(&mask)).unwrap()),
        0.0
    );
}

#[test]
fn a_saved_lora_model_is_a_merged_hf_folder_with_peft_files_that_load_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(Family::Llama);
    let base = CausalLm::init_random(&cfg, 6, &Device::Cpu).unwrap();
    let mut m = base
        .with_lora(&lora(&["q_proj", "o_proj", "up_proj"]), 2)
        .unwrap();
    m.set_adapter_base("my-base");
    perturb_b(&m, 0.05);
    m.save(dir.path()).unwrap();
    let (x, mask) = inputs();
    let want = m.forward(&x, Some(&mask)).unwrap();

    let merged = CausalLm::load(dir.path(), &Device::Cpu).unwrap();
    assert!(merged.lora().is_none());
    assert!(max_abs_diff(&want, &merged.forward(&x, Some(&mask)).unwrap()) < 1e-5);

    let adapter = dir.path().join("adapter");
    let text = std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["peft_type"], "LORA");
    assert_eq!(doc["task_type"], "CAUSAL_LM");
    assert_eq!(doc["base_model_name_or_path"], "my-base");
    assert_eq!(
        doc["target_modules"],
        serde_json::json!(["o_proj", "q_proj", "up_proj"])
    );
    let reloaded = base.load_adapter(&adapter).unwrap();
    let (got, set) = (reloaded.lora().unwrap(), m.lora().unwrap());
    assert_eq!(
        (got.r, got.alpha, got.use_rslora),
        (set.r, set.alpha, set.use_rslora)
    );
    assert_eq!(
        max_abs_diff(&want, &reloaded.forward(&x, Some(&mask)).unwrap()),
        0.0
    );
}

#[test]
fn a_reward_model_trains_its_score_head_whole() {
    let cfg = tiny(Family::Llama);
    let base = RewardModel::init_random(&cfg, 8, &Device::Cpu).unwrap();
    // PEFT's SEQ_CLS rule: the head is trained whole without being asked.
    let m = base.with_lora(&lora(&["q_proj", "v_proj"]), 1).unwrap();
    assert_eq!(m.lora().unwrap().modules_to_save, ["score"]);
    assert!(m.vars().iter().any(|(n, _)| n == "score.weight"));
    let (x, mask) = inputs();
    let scores = m.forward(&x, Some(&mask)).unwrap();
    let grads = scores.sum_all().unwrap().backward().unwrap();
    let (_, score) = m
        .vars()
        .into_iter()
        .find(|(n, _)| n == "score.weight")
        .unwrap();
    assert!(grads.get(score.as_tensor()).is_some());
    // The trained copy is the model's own: changing it leaves the base untouched.
    score.set(&score.zeros_like().unwrap()).unwrap();
    let base_score = base
        .vars()
        .into_iter()
        .find(|(n, _)| n == "score.weight")
        .unwrap()
        .1;
    assert!(
        base_score
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            > 0.0
    );
}

#[test]
fn bad_settings_and_adapter_files_are_refused_by_name() {
    let cfg = tiny(Family::Llama);
    let base = CausalLm::init_random(&cfg, 6, &Device::Cpu).unwrap();
    let err = |s: LoraConfig| base.with_lora(&s, 0).err().unwrap().to_string();
    assert!(err(lora(&["qkv"])).contains("unknown module \"qkv\""));
    let mut s = lora(&["q_proj"]);
    s.r = 0;
    assert!(err(s).contains("lora.r"));
    let mut s = lora(&["q_proj"]);
    s.dropout = 1.0;
    assert!(err(s).contains("lora.dropout: must be in [0, 1)"));
    let mut s = lora(&["q_proj"]);
    s.modules_to_save = vec!["score".into()];
    assert!(err(s).contains("\"score\" names no parameter"));

    // An adapter saved for other layers does not fit, and PEFT settings oxalign lacks are named.
    let dir = tempfile::tempdir().unwrap();
    let m = base.with_lora(&lora(&["q_proj", "k_proj"]), 1).unwrap();
    m.save_adapter(dir.path(), "b").unwrap();
    let cfg_path = dir.path().join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(&cfg_path, text.replace("\"k_proj\"", "\"v_proj\"")).unwrap();
    let e = base.load_adapter(dir.path()).err().unwrap().to_string();
    assert!(
        e.contains("k_proj.lora_A.weight") && e.contains("not an adapter"),
        "{e}"
    );
    std::fs::write(
        &cfg_path,
        text.replace("\"use_dora\": false", "\"use_dora\": true"),
    )
    .unwrap();
    let e = base.load_adapter(dir.path()).err().unwrap().to_string();
    assert!(
        e.contains("use_dora") && e.contains("adapter_config.json"),
        "{e}"
    );
    let e = base
        .load_adapter(&dir.path().join("nope"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
}

/// PEFT's own numbers (`tools/peft_parity.py`: a tiny Llama, an adapter on all seven
/// projections with every A and B drawn at random): the adapter folder PEFT wrote loads,
/// the next-token log-probs with the adapter on and off match transformers + PEFT, and the
/// gradient of their sum with respect to every A and B matches torch's.
#[test]
fn a_peft_adapter_loads_and_matches_peft_logprobs_and_gradients() {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora_llama_tiny");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("golden.json")).unwrap()).unwrap();
    let base = CausalLm::load(&root.join("base"), &Device::Cpu).unwrap();
    let m = base.load_adapter(&root.join("adapter")).unwrap();
    assert_eq!(
        m.lora().unwrap().scale(),
        golden["lora_scale"].as_f64().unwrap()
    );
    let rows: Vec<Vec<u32>> = serde_json::from_value(golden["rows"].clone()).unwrap();
    let mut total: Option<Tensor> = None;
    for (which, model) in [("logprobs", &m), ("logprobs_base", &base)] {
        for (i, lp) in row_logprob_tensors(model, &rows).into_iter().enumerate() {
            let got: Vec<f32> = lp.flatten_all().unwrap().to_vec1().unwrap();
            let want: Vec<f64> = serde_json::from_value(golden[which][i].clone()).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-4,
                    "{which} row {i}: {g} vs PEFT {w}"
                );
            }
            if which == "logprobs" {
                let s = lp.sum_all().unwrap();
                total = Some(match total {
                    None => s,
                    Some(t) => (t + s).unwrap(),
                });
            }
        }
    }
    let total = total.unwrap();
    let loss = total.to_scalar::<f32>().unwrap() as f64;
    assert!(
        (loss - golden["loss"].as_f64().unwrap()).abs() < 1e-3,
        "{loss}"
    );
    let grads = total.backward().unwrap();
    let want =
        candle_core::safetensors::load(root.join("grads.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(want.len(), m.vars().len());
    for (name, var) in m.vars() {
        let w = &want[&format!("base_model.model.{name}")];
        let d = max_abs_diff(grads.get(var.as_tensor()).unwrap(), w);
        assert!(d < 1e-4, "gradient of {name} differs from torch's by {d}");
    }
}

/// Per-row next-token log-probs of `rows` under `m`, each row alone (differentiable).
fn row_logprob_tensors(m: &CausalLm, rows: &[Vec<u32>]) -> Vec<Tensor> {
    let ids = |ids: &[u32]| {
        Tensor::new(ids, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap()
    };
    rows.iter()
        .map(|row| {
            let (x, y) = (ids(&row[..row.len() - 1]), ids(&row[1..]));
            let logits = m.forward(&x, None).unwrap();
            oxalign_models::nn::layers::token_logprobs(&logits, &y).unwrap()
        })
        .collect()
}

/// [`row_logprob_tensors`] as numbers.
fn row_logprobs(m: &CausalLm, rows: &[Vec<u32>]) -> Vec<Vec<f32>> {
    row_logprob_tensors(m, rows)
        .iter()
        .map(|lp| lp.flatten_all().unwrap().to_vec1().unwrap())
        .collect()
}

/// The other direction: adapters oxalign trained-like (random B) and saved load in PEFT on
/// the transformers model, and the merged folder loads in transformers, both computing
/// oxalign's log-probs within 1e-4. Run with `OXALIGN_PYTHON=<python with torch,
/// transformers, peft> cargo test -p oxalign-models --test lora -- --ignored`.
#[test]
#[ignore = "needs python3 with torch + transformers + peft"]
fn oxalign_adapters_load_in_peft_and_merged_folders_in_transformers() {
    let python = std::env::var("OXALIGN_PYTHON").unwrap_or_else(|_| "python3".into());
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = manifest.join("../tools/peft_parity.py");
    let root = manifest.join("tests/fixtures/lora_llama_tiny");
    let base_dir = root.join("base");
    let golden = root.join("golden.json");
    let base = CausalLm::load(&base_dir, &Device::Cpu).unwrap();
    let m = base
        .with_lora(&lora(&["q_proj", "v_proj", "gate_proj", "down_proj"]), 3)
        .unwrap();
    perturb_b(&m, 0.1);
    let out = tempfile::tempdir().unwrap();
    m.save(out.path()).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&golden).unwrap()).unwrap();
    let rows: Vec<Vec<u32>> = serde_json::from_value(doc["rows"].clone()).unwrap();
    let want = row_logprobs(&m, &rows);
    for (mode, dir) in [
        ("--check-adapter", out.path().join("adapter")),
        ("--check-merged", out.path().to_path_buf()),
    ] {
        let report = out.path().join("report.json");
        let mut cmd = std::process::Command::new(&python);
        cmd.arg(&script)
            .arg(mode)
            .arg(&dir)
            .arg("--rows-from")
            .arg(&golden)
            .arg("--out")
            .arg(&report);
        if mode == "--check-adapter" {
            cmd.arg("--base").arg(&base_dir);
        }
        assert!(
            cmd.status().unwrap().success(),
            "peft_parity.py {mode} failed"
        );
        let got: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let got: Vec<Vec<f64>> = serde_json::from_value(got["logprobs"].clone()).unwrap();
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!(
                (g - *w as f64).abs() < 1e-4,
                "{mode}: transformers {g} vs oxalign {w}"
            );
        }
    }
}

/// The fused LM head's backward for a frozen head (no weight gradient computed) gives the
/// adapters the same gradients as the composed logits path.
#[test]
fn a_frozen_fused_head_passes_the_same_gradients_to_the_adapters() {
    let cfg = tiny(Family::Llama);
    let base = CausalLm::init_random(&cfg, 12, &Device::Cpu).unwrap();
    let m = base.with_lora(&lora(&["all-linear"]), 4).unwrap();
    perturb_b(&m, 0.05);
    let (x, mask) = inputs();
    let dist = oxalign_models::TokenDistribution::MODEL;
    let fused = m
        .next_token_outputs(&x, Some(&mask), dist)
        .unwrap()
        .logprobs;
    let logits = m.forward(&x, Some(&mask)).unwrap().narrow(1, 0, 6).unwrap();
    let targets = x.narrow(1, 1, 6).unwrap();
    let composed = oxalign_models::nn::layers::token_logprobs(&logits, &targets).unwrap();
    assert!(max_abs_diff(&fused, &composed) < 1e-4);
    let (g1, g2) = (
        fused.sum_all().unwrap().backward().unwrap(),
        composed.sum_all().unwrap().backward().unwrap(),
    );
    for (name, var) in m.vars() {
        let d = max_abs_diff(
            g1.get(var.as_tensor()).unwrap(),
            g2.get(var.as_tensor()).unwrap(),
        );
        assert!(d < 1e-4, "{name}: fused head gradient differs by {d}");
    }
}

/// `lora_dropout` drops elements of the adapters' input only inside a trainer's dropout
/// scope: outside it (scoring, references) the model is the dropout-free one; inside, the
/// function changes and its gradients reach the adapters; with `B = 0` the adapters add
/// nothing, dropped or not, so the base product never sees a mask; the same seed and step
/// draw the same masks.
#[test]
fn lora_dropout_acts_on_the_adapter_path_inside_a_training_scope_only() {
    let (x, mask) = inputs();
    let base = CausalLm::init_random(&tiny(Family::Llama), 3, &Device::Cpu).unwrap();
    let mut with = lora(&["all-linear"]);
    with.dropout = 0.3;
    let dropped = base.with_lora(&with, 7).unwrap();
    dropped.set_dropout_seed(11);
    let plain = base.with_lora(&lora(&["all-linear"]), 7).unwrap();

    let fresh = dropped.forward(&x, Some(&mask)).unwrap();
    let in_scope = {
        let _on = dropped.dropout_scope(5);
        dropped.forward(&x, Some(&mask)).unwrap()
    };
    assert_eq!(
        max_abs_diff(&fresh, &in_scope),
        0.0,
        "B = 0: nothing to drop"
    );

    perturb_b(&dropped, 0.5);
    perturb_b(&plain, 0.5);
    let outside = dropped.forward(&x, Some(&mask)).unwrap();
    assert_eq!(
        max_abs_diff(&outside, &plain.forward(&x, Some(&mask)).unwrap()),
        0.0
    );
    let train = |step| {
        let _on = dropped.dropout_scope(step);
        dropped.forward(&x, Some(&mask)).unwrap()
    };
    let first = train(1);
    assert!(
        max_abs_diff(&first, &outside) > 1e-4,
        "dropout changed nothing"
    );
    assert!(
        max_abs_diff(&train(2), &first) > 1e-4,
        "another step, other masks"
    );
    assert_eq!(
        max_abs_diff(&train(1), &first),
        0.0,
        "step 1 again: same masks"
    );
    assert_eq!(
        max_abs_diff(&dropped.forward(&x, Some(&mask)).unwrap(), &outside),
        0.0
    );

    let loss = {
        let _on = dropped.dropout_scope(3);
        dropped
            .forward(&x, Some(&mask))
            .unwrap()
            .sqr()
            .unwrap()
            .mean_all()
            .unwrap()
    };
    let grads = loss.backward().unwrap();
    let (name, a) = dropped
        .vars()
        .into_iter()
        .find(|(n, _)| n.ends_with("q_proj.lora_A.weight"))
        .unwrap();
    let g = grads.get(a.as_tensor()).expect(&name);
    assert!(
        g.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            > 0.0
    );
}

/// A frozen base kept in bf16 (`with_base_in(BF16)`): the projections' `Var`s are bf16 (half
/// the bytes), everything else and the adapters f32; the model computes exactly what the
/// f32 model whose projections were rounded to bf16 once computes, forward and adapter
/// gradients; its merged weights are f32 and carry the adapters' update unrounded; the
/// base model (the reference) and a deep clone keep the bf16 base.
#[test]
fn a_bf16_base_computes_as_the_f32_model_with_its_projections_rounded_once() {
    let cfg = tiny(Family::Llama);
    let base = CausalLm::init_random(&cfg, 4, &Device::Cpu).unwrap();
    let m = base.with_lora(&lora(&["q_proj", "v_proj"]), 9).unwrap();
    perturb_b(&m, 0.05);
    let half = m.with_base_in(DType::BF16).unwrap();
    let rounded: std::collections::HashMap<String, Tensor> = base
        .weights()
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let r = match n.contains("_proj.") {
                true => t
                    .to_dtype(DType::BF16)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap(),
                false => t,
            };
            (n, r)
        })
        .collect();
    let twin = CausalLm::from_weights(cfg.clone(), &rounded, DType::F32, &Device::Cpu)
        .unwrap()
        .with_lora(&lora(&["q_proj", "v_proj"]), 9)
        .unwrap();
    perturb_b(&twin, 0.05);
    let (x, mask) = inputs();
    let got = half.forward(&x, Some(&mask)).unwrap();
    assert_eq!(
        max_abs_diff(&got, &twin.forward(&x, Some(&mask)).unwrap()),
        0.0
    );
    assert!(max_abs_diff(&got, &m.forward(&x, Some(&mask)).unwrap()) > 0.0);

    let grads_of = |model: &CausalLm| {
        let loss = model
            .forward(&x, Some(&mask))
            .unwrap()
            .sqr()
            .unwrap()
            .mean_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        model
            .vars()
            .into_iter()
            .map(|(n, v)| (n, grads.get(v.as_tensor()).unwrap().clone()))
            .collect::<Vec<_>>()
    };
    for ((n, a), (_, b)) in grads_of(&half).iter().zip(grads_of(&twin).iter()) {
        assert_eq!(a.dtype(), DType::F32, "{n}");
        assert_eq!(max_abs_diff(a, b), 0.0, "{n}");
    }

    let merged = half.weights().unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight";
    assert_eq!(merged[q].dtype(), DType::F32);
    assert_eq!(max_abs_diff(&merged[q], &twin.weights().unwrap()[q]), 0.0);
    let frozen = "model.layers.0.self_attn.k_proj.weight";
    assert_eq!(merged[frozen].dtype(), DType::BF16);
    assert_eq!(merged["model.embed_tokens.weight"].dtype(), DType::F32);

    let off = half.base_model().unwrap().forward(&x, Some(&mask)).unwrap();
    let twin_off = twin.base_model().unwrap().forward(&x, Some(&mask)).unwrap();
    assert_eq!(max_abs_diff(&off, &twin_off), 0.0);
    let copy = half.deep_clone().unwrap();
    assert_eq!(
        max_abs_diff(&copy.forward(&x, Some(&mask)).unwrap(), &got),
        0.0
    );
    assert_eq!(copy.weights().unwrap()[frozen].dtype(), DType::BF16);
}

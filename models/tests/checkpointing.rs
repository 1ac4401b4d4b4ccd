//! Activation checkpointing (`Model::checkpoint_activations`): the same function and the
//! same gradients as the plain model (full fine-tuning and LoRA adapters; dense, Gemma's
//! block and a mixture of experts, whose recompute replays the forward's routing), with the
//! layers' weight gradients reaching the trainer through the checkpoint's handle; a cached
//! forward (generation) still runs. The layerwise backward (`Model::layerwise_backward`:
//! each layer's forward graph kept and dropped after its backward) gives the plain
//! backward's gradients to the bit, and a second backward over the same loss (the kept
//! graphs gone) recomputes them.

mod common;

use candle_core::{Device, Tensor};
use common::{batch, ids, max_abs_diff, tiny};
use oxalign_models::{CausalLm, Family, KvCache, LoraConfig};

fn inputs() -> (Tensor, Tensor) {
    let rows = [ids(1, 9, 64), ids(2, 9, 64)];
    let mask = Tensor::new(&[[0u32, 0, 1, 1, 1, 1, 1, 1, 1], [1; 9]], &Device::Cpu).unwrap();
    (batch(&rows), mask)
}

/// `(name, gradient)` of every trainable weight of `m` for a fixed loss.
fn gradients(
    m: &CausalLm,
    extra: Option<&oxalign_models::nn::checkpointing::Checkpointing>,
) -> (Tensor, Vec<(String, Tensor)>) {
    let (x, mask) = inputs();
    let logits = m.forward(&x, Some(&mask)).unwrap();
    let loss = (logits.sqr().unwrap().mean_all().unwrap()
        + logits.narrow(2, 0, 7).unwrap().mean_all().unwrap())
    .unwrap();
    let mut grads = loss.backward().unwrap();
    if let Some(c) = extra {
        c.add_taken_to(&mut grads).unwrap();
    }
    let out = m
        .vars()
        .into_iter()
        .map(|(n, v)| {
            let g = grads
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{n}: no gradient (checkpointed: {})", extra.is_some()));
            (n, g.clone())
        })
        .collect();
    (logits, out)
}

/// How the copy under test holds its activations.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Recompute,
    Layerwise,
}

fn assert_same(plain: &CausalLm, what: &str, mode: Mode) {
    let mut copy = plain.deep_clone().unwrap();
    let checkpoint = match mode {
        Mode::Recompute => copy.checkpoint_activations(),
        Mode::Layerwise => copy.layerwise_backward(),
    };
    // The layerwise backward runs the plain backward's arithmetic: equal to the bit.
    let tolerance = match mode {
        Mode::Recompute => 1e-5,
        Mode::Layerwise => 0.0,
    };
    let what = format!("{what} {mode:?}");
    let (want_logits, want) = gradients(plain, None);
    let (got_logits, got) = gradients(&copy, Some(&checkpoint));
    assert_eq!(
        max_abs_diff(&want_logits, &got_logits),
        0.0,
        "{what}: forward"
    );
    assert_eq!(want.len(), got.len());
    for ((name, a), (_, b)) in want.iter().zip(&got) {
        let scale = a
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            .max(1e-6);
        let d = max_abs_diff(a, b);
        assert!(
            d <= tolerance * scale,
            "{what}: {name} differs by {d} (scale {scale})"
        );
    }
}

#[test]
fn checkpointed_layers_give_the_plain_models_gradients() {
    for family in [Family::Llama, Family::Gemma3, Family::Qwen3Moe] {
        let m = CausalLm::init_random(&tiny(family), 5, &Device::Cpu).unwrap();
        for mode in [Mode::Recompute, Mode::Layerwise] {
            assert_same(&m, &format!("{family} full"), mode);
        }
        let lora = LoraConfig::all_linear(4, 8.0);
        let adapted = m.with_lora(&lora, 3).unwrap();
        for (name, var) in adapted.vars() {
            if name.ends_with("lora_B.weight") {
                let t = (var.as_tensor().ones_like().unwrap() * 0.01).unwrap();
                var.set(&t).unwrap();
            }
        }
        for mode in [Mode::Recompute, Mode::Layerwise] {
            assert_same(&adapted, &format!("{family} LoRA"), mode);
        }
    }
}

#[test]
fn a_second_layerwise_backward_recomputes_the_dropped_layers() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 5, &Device::Cpu).unwrap();
    let mut copy = m.deep_clone().unwrap();
    let layerwise = copy.layerwise_backward();
    let (x, mask) = inputs();
    let loss = copy
        .forward(&x, Some(&mask))
        .unwrap()
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap();
    let mut taken = Vec::new();
    for _ in 0..2 {
        let mut grads = loss.backward().unwrap();
        layerwise.add_taken_to(&mut grads).unwrap();
        let (name, w) = &copy.vars()[3];
        assert!(name.contains("layers."), "{name}");
        taken.push(grads.get(w.as_tensor()).unwrap().clone());
    }
    let d = max_abs_diff(&taken[0], &taken[1]);
    let scale = taken[0].abs().unwrap().max_all().unwrap();
    let scale = scale.to_scalar::<f32>().unwrap();
    assert!(d <= 1e-5 * scale, "second backward differs by {d}");
}

#[test]
fn a_cached_forward_runs_the_layers_as_usual() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 5, &Device::Cpu).unwrap();
    let mut copy = m.deep_clone().unwrap();
    let _checkpoint = copy.checkpoint_activations();
    let x = Tensor::new(&[[3u32, 4, 5, 6]], &Device::Cpu).unwrap();
    let mut cache = KvCache::new(m.config().num_hidden_layers);
    let mut cache2 = KvCache::new(m.config().num_hidden_layers);
    let want = m.forward_cached(&x, None, &mut cache).unwrap();
    let got = copy.forward_cached(&x, None, &mut cache2).unwrap();
    assert_eq!(max_abs_diff(&want, &got), 0.0);
}

/// Under the layerwise backward the embedding's and the LM head's weight gradients skip
/// candle's accumulation: the loss's own backward holds neither, the handle hands both to
/// the trainer, and they equal the plain model's to the bit (fused LM head, untied tables,
/// the fused RoPE and residual projections of a bias-free model).
#[test]
fn the_table_gradients_reach_the_trainer_through_the_handle() {
    let cfg = tiny(Family::Mistral);
    assert!(!cfg.tie_word_embeddings);
    let plain = CausalLm::init_random(&cfg, 7, &Device::Cpu).unwrap();
    let mut copy = plain.deep_clone().unwrap();
    let layerwise = copy.layerwise_backward();
    let (x, mask) = inputs();
    let loss = |m: &CausalLm| {
        let lp = m.next_token_logprobs(&x, Some(&mask)).unwrap();
        (lp.sqr().unwrap().sum_all().unwrap() + lp.sum_all().unwrap()).unwrap()
    };
    let want = loss(&plain).backward().unwrap();
    let mut got = loss(&copy).backward().unwrap();
    let tables = ["model.embed_tokens.weight", "lm_head.weight"];
    let by_name = |m: &CausalLm, name: &str| {
        let vars = m.vars();
        let (_, v) = vars.into_iter().find(|(n, _)| n == name).unwrap();
        v
    };
    for name in tables {
        assert!(
            got.get(by_name(&copy, name).as_tensor()).is_none(),
            "{name} in candle's store"
        );
    }
    layerwise.add_taken_to(&mut got).unwrap();
    for ((name, a), (_, b)) in plain.vars().iter().zip(copy.vars().iter()) {
        let ga = want.get(a.as_tensor()).unwrap();
        let gb = got
            .get(b.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient"));
        assert_eq!(max_abs_diff(ga, gb), 0.0, "{name}");
    }
}

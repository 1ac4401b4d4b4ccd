//! A refit build keeps what did not change: the embedding, the LM head and every linear
//! layer whose tensors have the served checksums are the served ones (same allocation), and
//! only the changed layers are new.

use super::*;
use crate::config::layout::causal_lm_specs;
use crate::config::model_config::Family;
use crate::config::param_spec::init_tensors;
use crate::config::preset::Preset;
use candle_core::DType;

#[test]
fn a_refit_build_keeps_the_unchanged_parts() {
    let cfg = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
    let specs = causal_lm_specs(&cfg);
    let dev = Device::Cpu;
    let mut tensors = init_tensors(&specs, 1, DType::F32, &dev).unwrap();
    let (served, sums) =
        EngineWeights::build(&cfg, (&tensors, None), QuantMode::None, &dev, None, None).unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight";
    let moved = (tensors[q].clone() + 1.0).unwrap();
    tensors.insert(q.into(), moved);
    let (next, next_sums) = EngineWeights::build(
        &cfg,
        (&tensors, None),
        QuantMode::None,
        &dev,
        None,
        Some((&served, &sums)),
    )
    .unwrap();
    assert!(served.embed.same(&next.embed));
    let packed = |l: &Linear| match l {
        Linear::Packed(w, _) => Arc::as_ptr(w) as usize,
        other => panic!("expected a packed f32 weight, got {other:?}"),
    };
    assert_eq!(packed(&served.lm_head), packed(&next.lm_head));
    assert_eq!(packed(&served.layers[0].o), packed(&next.layers[0].o));
    assert_eq!(packed(&served.layers[1].qkv), packed(&next.layers[1].qkv));
    assert_ne!(packed(&served.layers[0].qkv), packed(&next.layers[0].qkv));
    assert_eq!(next_sums.len(), sums.len());
    for (name, sum) in &next_sums {
        assert_eq!(sum == &sums[name], name != q, "{name}");
    }
}

/// A LoRA model's engine reads the frozen base embedding in place (no second copy of the
/// largest unpacked tensor); a plain model's engine copies it, so that an optimizer's
/// in-place update never reaches the rollouts without a refit.
#[test]
fn only_a_frozen_base_embedding_is_shared() {
    use crate::engine::checksum::tensor_checksum;
    use crate::engine::embed_table::host_ptr;
    use crate::lora::LoraConfig;
    use crate::nn::causal_lm::CausalLm;
    let cfg = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
    let dev = Device::Cpu;
    let plain = CausalLm::init_random(&cfg, 1, &dev).unwrap();
    let lora = LoraConfig {
        r: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: vec!["all-linear".into()],
        modules_to_save: vec![],
        use_rslora: false,
    };
    let adapted = plain.with_lora(&lora, 2).unwrap();
    let embed = "model.embed_tokens.weight";
    for (model, shared) in [(&plain, false), (&adapted, true)] {
        let (tensors, merge) = model.weights_to_merge().unwrap();
        let (w, sums) = EngineWeights::build(
            &cfg,
            (&tensors, merge.as_ref()),
            QuantMode::None,
            &dev,
            None,
            None,
        )
        .unwrap();
        let base = model.vars().into_iter().chain(adapted_base(model));
        let trainer_embed = base
            .filter(|(n, _)| n == embed)
            .map(|(_, v)| v)
            .next()
            .unwrap();
        let same = match &w.embed {
            EmbedTable::Frozen(t) => host_ptr(t) == host_ptr(trainer_embed.as_tensor()),
            EmbedTable::Own(_) => false,
        };
        assert_eq!(same, shared);
        assert_eq!(
            sums[embed],
            tensor_checksum(trainer_embed.as_tensor()).unwrap()
        );
    }
}

/// The frozen base's variables of a LoRA model (none for a plain one).
fn adapted_base(model: &crate::nn::causal_lm::CausalLm) -> Vec<(String, candle_core::Var)> {
    match model.lora() {
        Some(_) => model.base_model().unwrap().vars(),
        None => vec![],
    }
}

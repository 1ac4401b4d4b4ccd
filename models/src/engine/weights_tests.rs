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
    assert!(Arc::ptr_eq(&served.embed, &next.embed));
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

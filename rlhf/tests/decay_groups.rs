//! The optimizer's weight-decay groups come from each model's parameter declaration
//! (`ParamKind::decays`); they must agree with the name rule (`is_no_decay`) they replaced,
//! for every family and head, so a trainer's updates are unchanged.

use candle_core::Device;
use oxalign_models::{CausalLm, Family, ModelConfig, ParamStore, Preset, RewardModel, ValueModel};
use oxalign_rlhf::optim::is_no_decay;

fn check(params: &ParamStore) {
    assert!(!params.specs().is_empty());
    for (name, _) in params.vars() {
        let spec = params.spec(&name).expect("every parameter is declared");
        assert_eq!(spec.kind.decays(), !is_no_decay(&name), "{name}");
    }
}

#[test]
fn declared_decay_matches_the_name_rule() {
    for family in Family::ALL {
        let mut cfg = ModelConfig::preset(family, Preset::Tiny, 64);
        cfg.num_hidden_layers = 1;
        if family == Family::Llama {
            cfg.attention_bias = true;
            cfg.mlp_bias = true;
        }
        let dev = Device::Cpu;
        check(CausalLm::init_random(&cfg, 0, &dev).unwrap().params());
        check(ValueModel::init_random(&cfg, 0, &dev).unwrap().params());
        check(RewardModel::init_random(&cfg, 0, &dev).unwrap().params());
        cfg.tie_word_embeddings = !cfg.tie_word_embeddings;
        check(CausalLm::init_random(&cfg, 0, &dev).unwrap().params());
    }
}

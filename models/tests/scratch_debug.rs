mod common;
use candle_core::{DType, Device, Tensor};
use oxalign_models::{CausalLm, Family};
fn check(label: &str, cfg: oxalign_models::ModelConfig, use_mask: bool, name: &str) {
    let m = CausalLm::init_random_with_dtype(&cfg, 11, DType::F64, &Device::Cpu).unwrap();
    for (_, var) in m.vars().iter() {
        let t = var.as_tensor();
        if t.rank() == 2 { let w = (Tensor::randn(0f64, 0.3, t.dims(), &Device::Cpu).unwrap()); var.set(&w).unwrap(); }
    }
    let ids = common::batch(&[common::ids(1, 7, 64), common::ids(2, 7, 64)]);
    let mask = Tensor::new(&[[0u32, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], &Device::Cpu).unwrap();
    let probe = Tensor::randn(0f64, 1.0, (2, 7, 64), &Device::Cpu).unwrap();
    let loss_of = |m: &CausalLm| { let l = m.forward(&ids, if use_mask { Some(&mask) } else { None }).unwrap(); (l * &probe).unwrap().sum_all().unwrap() };
    let grads = loss_of(&m).backward().unwrap();
    let vars = m.vars();
    let (_, var) = vars.iter().find(|(n, _)| n == name).unwrap();
    let g = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let base = var.as_tensor().flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let mut worst = 0f64;
    for idx in (0..base.len()).step_by(37) {
        let ev = |d: f64| { let mut v = base.clone(); v[idx] += d; var.set(&Tensor::from_vec(v, var.as_tensor().dims(), &Device::Cpu).unwrap()).unwrap(); loss_of(&m).to_scalar::<f64>().unwrap() };
        let fd = (ev(1e-5) - ev(-1e-5)) / 2e-5;
        var.set(&Tensor::from_vec(base.clone(), var.as_tensor().dims(), &Device::Cpu).unwrap()).unwrap();
        worst = worst.max((fd - g[idx]).abs());
    }
    println!("{label} {name}: worst abs err {worst:e}");
}
#[test]
fn dbg() {
    let base = common::tiny(Family::Qwen2);
    check("qwen2 gqa mask", base.clone(), true, "model.layers.0.self_attn.q_proj.weight");
    check("qwen2 gqa nomask", base.clone(), false, "model.layers.0.self_attn.q_proj.weight");
    let mut c = base.clone(); c.num_key_value_heads = 4;
    check("qwen2 mha nomask", c.clone(), false, "model.layers.0.self_attn.q_proj.weight");
    let mut c1 = c.clone(); c1.num_hidden_layers = 1;
    check("qwen2 mha 1layer nomask", c1.clone(), false, "model.layers.0.self_attn.q_proj.weight");
    check("qwen2 mha 1layer nomask k", c1.clone(), false, "model.layers.0.self_attn.k_proj.weight");
    check("qwen2 mha 1layer nomask v", c1.clone(), false, "model.layers.0.self_attn.v_proj.weight");
}

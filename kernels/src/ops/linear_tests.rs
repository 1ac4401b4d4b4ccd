//! The linear op against candle's composed matmul (f32) and against f32 products of
//! bf16-rounded operands (bf16, every path this CPU has): forward and both gradients.

use super::*;
use candle_core::{Device, Var};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn rounded(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
    d.max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// `(x [2, rows/2, k], w, g [2, rows/2, n])` and the three reference products of `(x, w, g)`
/// as `[rows, ..]` matrices: `x · wᵀ`, `g · w`, `gᵀ · x`.
struct Case {
    x: Var,
    w: Var,
    g: Tensor,
}

fn case() -> Case {
    let dev = Device::Cpu;
    let (rows, k, n) = (38, 70, 45);
    Case {
        x: Var::from_vec(values(rows * k, 1), (2, rows / 2, k), &dev).unwrap(),
        w: Var::from_vec(values(n * k, 7), (n, k), &dev).unwrap(),
        g: Tensor::from_vec(values(rows * n, 3), (2, rows / 2, n), &dev).unwrap(),
    }
}

/// Runs `linear` forward and backward on the case and compares with the composed products
/// of `(x, w, g)` after `round`.
fn check(
    name: &str,
    linear: impl Fn(&Tensor, &Tensor) -> Result<Tensor>,
    round: fn(&Tensor) -> Tensor,
    tol: f32,
) {
    let c = case();
    let flat = |t: &Tensor| t.flatten_to(1).unwrap();
    let (xr, wr, gr) = (round(&flat(&c.x)), round(&c.w), round(&flat(&c.g)));
    let y = linear(&c.x, &c.w).unwrap();
    assert_eq!(y.dims(), &[2, 19, 45]);
    assert!(
        max_diff(&flat(&y), &xr.matmul(&wr.t().unwrap()).unwrap()) < tol,
        "{name} y"
    );
    let grads = (y * &c.g).unwrap().sum_all().unwrap().backward().unwrap();
    let gx = grads.get(&c.x).unwrap();
    assert_eq!(gx.dims(), c.x.dims());
    assert!(
        max_diff(&flat(gx), &gr.matmul(&wr).unwrap()) < tol,
        "{name} dx"
    );
    let gw = grads.get(&c.w).unwrap();
    assert!(
        max_diff(gw, &gr.t().unwrap().matmul(&xr).unwrap()) < tol,
        "{name} dW"
    );
}

#[test]
fn the_f32_op_matches_the_composed_matmul_forward_and_backward() {
    check("f32", linear_f32, |t| t.clone(), 1e-4);
}

/// Forward and both gradients equal f32 products of the bf16-rounded operands (up to f32
/// summation order), on every path this CPU has; and the rounding is really there.
#[test]
fn bf16_forward_and_gradients_are_products_of_bf16_rounded_operands() {
    for path in Bf16Path::available() {
        let name = format!("{path:?}");
        check(&name, |x, w| linear_bf16_on(path, x, w), rounded, 1e-4);
        let c = case();
        let y = linear_bf16_on(path, &c.x, &c.w).unwrap();
        let exact = linear_f32(&c.x, &c.w).unwrap();
        assert!(max_diff(&y, &exact) > 1e-4, "{name}: no bf16 rounding seen");
    }
}

#[test]
fn f64_runs_the_composed_ops() {
    let dev = Device::Cpu;
    let x = Tensor::ones((3, 4), DType::F64, &dev).unwrap();
    let w = Tensor::ones((2, 4), DType::F64, &dev).unwrap();
    let y = linear_f32(&x, &w).unwrap();
    assert_eq!(y.to_vec2::<f64>().unwrap(), vec![vec![4.0; 2]; 3]);
}

#[test]
fn non_f32_inputs_to_bf16_are_refused_with_the_argument_named() {
    let dev = Device::Cpu;
    let x = Tensor::zeros((2, 3), DType::F64, &dev).unwrap();
    let w = Tensor::zeros((4, 3), DType::F32, &dev).unwrap();
    let e = linear_bf16(&x, &w).unwrap_err().to_string();
    assert!(e.contains("`x` must be f32"), "{e}");
}

/// A frozen weight kept in bf16 (a LoRA base): both ops widen it exactly, so the forward
/// and the input gradient equal those of its f32 widening (f32 op: bit for bit; bf16 op:
/// the rounding of an already-bf16 weight changes nothing), and a bf16 weight that is
/// tracked for a gradient is refused.
#[test]
fn a_frozen_bf16_weight_computes_as_its_f32_widening() {
    let c = case();
    let w16 = c.w.as_tensor().to_dtype(DType::BF16).unwrap().detach();
    let wide = w16.to_dtype(DType::F32).unwrap().detach();
    type Op = fn(&Tensor, &Tensor) -> Result<Tensor>;
    for (name, op) in [("f32", linear_f32 as Op), ("bf16", linear_bf16 as Op)] {
        let got = op(c.x.as_tensor(), &w16).unwrap();
        let want = op(c.x.as_tensor(), &wide).unwrap();
        assert_eq!(max_diff(&got, &want), 0.0, "{name} forward");
        let gx = |w: &Tensor| {
            let y = op(c.x.as_tensor(), w).unwrap();
            let grads = (y * &c.g).unwrap().sum_all().unwrap().backward().unwrap();
            grads.get(c.x.as_tensor()).unwrap().clone()
        };
        assert_eq!(
            max_diff(&gx(&w16), &gx(&wide)),
            0.0,
            "{name} input gradient"
        );
        let tracked = Var::from_tensor(&w16).unwrap();
        let y = op(c.x.as_tensor(), tracked.as_tensor()).unwrap();
        let e = y.sum_all().unwrap().backward().unwrap_err().to_string();
        assert!(e.contains("frozen"), "{name}: {e}");
    }
}

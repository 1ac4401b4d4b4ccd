//! GPU tests (feature `cuda`): each fused op's CUDA forward and backward against the CPU
//! implementation on the same inputs. They skip, with a message, when no GPU can be opened.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Result, Tensor, Var};
use oxalign_kernels::ops::{compile_cuda_kernels, entropy, rms_norm, rope, token_logprobs};

fn gpu() -> Option<Device> {
    match oxalign_kernels::parse_device("cuda:0") {
        Ok(dev) => Some(dev),
        Err(e) => {
            eprintln!("skipping CUDA test: {e}");
            None
        }
    }
}

/// Deterministic pseudo-random f32 values in [-scale, scale).
fn values(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor(dims: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    Tensor::from_vec(
        values(dims.iter().product(), scale, seed),
        dims,
        &Device::Cpu,
    )
}

fn assert_close(gpu: &Tensor, cpu: &Tensor, tol: f32, what: &str) -> Result<()> {
    assert_eq!(gpu.dims(), cpu.dims(), "{what}: shapes");
    let a = gpu
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let b = cpu.flatten_all()?.to_vec1::<f32>()?;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}: element {i}: cuda {x} vs cpu {y}"
        );
    }
    Ok(())
}

/// Runs `loss(x)` forward and backward on CPU and on the GPU; compares outputs and grads.
fn compare(
    dev: &Device,
    x_cpu: &Tensor,
    f: impl Fn(&Tensor) -> Result<Tensor>,
    tol: f32,
    what: &str,
) -> Result<()> {
    let vc = Var::from_tensor(x_cpu)?;
    let vg = Var::from_tensor(&x_cpu.to_device(dev)?)?;
    let yc = f(vc.as_tensor())?;
    let yg = f(vg.as_tensor())?;
    assert!(yg.device().is_cuda(), "{what}: result left the GPU");
    assert_close(&yg, &yc, tol, &format!("{what} forward"))?;
    // A non-uniform upstream gradient with some zeros (masked positions).
    let wc = Tensor::from_vec(values(yc.elem_count(), 1.0, 77), yc.dims(), &Device::Cpu)?.relu()?;
    let wg = wc.to_device(dev)?;
    let gc = yc.mul(&wc)?.sum_all()?.backward()?;
    let gg = yg.mul(&wg)?.sum_all()?.backward()?;
    let gc = gc.get(vc.as_tensor()).expect("cpu grad");
    let gg = gg.get(vg.as_tensor()).expect("gpu grad");
    assert_close(gg, gc, tol, &format!("{what} backward"))
}

#[test]
fn nvrtc_compiles_every_module() -> Result<()> {
    if gpu().is_none() {
        return Ok(());
    }
    let modules = compile_cuda_kernels()?;
    assert_eq!(modules.len(), 4);
    assert!(modules.iter().all(|(_, bytes)| *bytes > 0));
    Ok(())
}

#[test]
fn token_logprobs_cuda_matches_cpu() -> Result<()> {
    let Some(dev) = gpu() else { return Ok(()) };
    for &(b, t, v) in &[(2, 7, 1000), (1, 1, 1), (3, 5, 32003)] {
        let ids: Vec<u32> = values(b * t, 1.0, 5)
            .iter()
            .map(|x| ((x.abs() * v as f32) as u32).min(v as u32 - 1))
            .collect();
        let tc = Tensor::from_vec(ids, (b, t), &Device::Cpu)?;
        let tg = tc.to_device(&dev)?;
        let x = tensor(&[b, t, v], 4.0, v as u64)?;
        compare(
            &dev,
            &x,
            |x| {
                let targets = if x.device().is_cuda() { &tg } else { &tc };
                token_logprobs(x, targets)
            },
            1e-4,
            "token_logprobs",
        )?;
    }
    Ok(())
}

#[test]
fn entropy_cuda_matches_cpu() -> Result<()> {
    let Some(dev) = gpu() else { return Ok(()) };
    for &(b, t, v) in &[(2, 7, 1000), (1, 1, 1), (3, 5, 32003)] {
        let x = tensor(&[b, t, v], 4.0, 3 + v as u64)?;
        compare(&dev, &x, entropy, 1e-4, "entropy")?;
    }
    Ok(())
}

#[test]
fn rms_norm_cuda_matches_cpu() -> Result<()> {
    let Some(dev) = gpu() else { return Ok(()) };
    for dims in [&[2, 9, 512][..], &[1, 1, 7], &[300, 4096]] {
        let d = *dims.last().expect("dims");
        let x = tensor(dims, 2.0, d as u64)?;
        let w_cpu = tensor(&[d], 1.0, 11)?;
        let w_gpu = Var::from_tensor(&w_cpu.to_device(&dev)?)?;
        let w_cpu = Var::from_tensor(&w_cpu)?;
        compare(
            &dev,
            &x,
            |x| {
                let w = if x.device().is_cuda() { &w_gpu } else { &w_cpu };
                rms_norm(x, w.as_tensor(), 1e-6)
            },
            1e-4,
            "rms_norm",
        )?;
        // Weight gradient on its own (the x gradient is checked by `compare`).
        let g = tensor(dims, 1.0, 12)?;
        let gw_cpu = rms_norm(&x, w_cpu.as_tensor(), 1e-6)?
            .mul(&g)?
            .sum_all()?
            .backward()?;
        let gw_gpu = rms_norm(&x.to_device(&dev)?, w_gpu.as_tensor(), 1e-6)?
            .mul(&g.to_device(&dev)?)?
            .sum_all()?
            .backward()?;
        assert_close(
            gw_gpu.get(w_gpu.as_tensor()).expect("gpu dw"),
            gw_cpu.get(w_cpu.as_tensor()).expect("cpu dw"),
            1e-3,
            "rms_norm weight grad",
        )?;
    }
    Ok(())
}

#[test]
fn rope_cuda_matches_cpu() -> Result<()> {
    let Some(dev) = gpu() else { return Ok(()) };
    for &(b, h, t, d) in &[(2, 3, 5, 8), (1, 1, 1, 2), (2, 8, 64, 128)] {
        let x = tensor(&[b, h, t, d], 1.0, (t * d) as u64)?;
        for per_batch in [false, true] {
            let table: &[usize] = if per_batch {
                &[b, t, d / 2]
            } else {
                &[t, d / 2]
            };
            let theta = tensor(table, 3.0, 9)?;
            let (cc, sc) = (theta.cos()?, theta.sin()?);
            let (cg, sg) = (cc.to_device(&dev)?, sc.to_device(&dev)?);
            compare(
                &dev,
                &x,
                |x| {
                    if x.device().is_cuda() {
                        rope(x, &cg, &sg)
                    } else {
                        rope(x, &cc, &sc)
                    }
                },
                1e-5,
                "rope",
            )?;
        }
    }
    Ok(())
}

#[test]
fn non_f32_inputs_are_rejected_on_cuda() -> Result<()> {
    let Some(dev) = gpu() else { return Ok(()) };
    let x = Tensor::zeros((1, 2, 3), DType::BF16, &dev)?;
    let err = entropy(&x).unwrap_err().to_string();
    assert!(err.contains("must be f32 on CUDA"), "{err}");
    Ok(())
}

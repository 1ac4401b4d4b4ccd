//! The fused attention of the training forward against the composed path: `forward` (no KV
//! cache: fused kernel) and `forward_cached` on an empty cache (same positions and masks,
//! composed candle ops) give the same logits at every position, pads included, for every
//! family (mistral with its sliding window), with left padding and a hole in the mask.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{batch, ids, max_abs_diff, tiny};
use oxalign_models::{CausalLm, Family};

fn padded_batch() -> (Tensor, Tensor) {
    let t = 10;
    let rows = [ids(31, t, 64), ids(32, t, 64), ids(33, t, 64)];
    // Row 0: 3 left pads (dead query rows); row 1: full; row 2: right-padded with a hole.
    let mask = Tensor::new(
        &[
            [0u32, 0, 0, 1, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            [1, 1, 0, 1, 1, 1, 1, 1, 0, 0],
        ],
        &Device::Cpu,
    )
    .unwrap();
    (batch(&rows), mask)
}

#[test]
fn fused_training_forward_equals_composed_path() {
    let (input, mask) = padded_batch();
    for family in Family::ALL {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-10)] {
            let m =
                CausalLm::init_random_with_dtype(&tiny(family), 41, dtype, &Device::Cpu).unwrap();
            for mask in [Some(&mask), None] {
                let fused = m.forward(&input, mask).unwrap();
                let mut cache = m.new_cache();
                let composed = m.forward_cached(&input, mask, &mut cache).unwrap();
                let d = max_abs_diff(&fused, &composed) as f64;
                assert!(
                    d <= tol,
                    "{family} {dtype:?} mask {}: fused vs composed max abs diff {d}",
                    mask.is_some()
                );
                let finite = fused.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
                let finite = finite.to_vec1::<f32>().unwrap();
                assert!(finite.iter().all(|x| x.is_finite()), "{family}: non-finite");
            }
        }
    }
}

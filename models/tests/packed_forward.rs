//! The packed training forward against the padded one: several sequences per row (segment
//! ids, positions restarting per segment) give, for every sequence, the same next-token
//! log-probs and entropies as the right-padded batch of the same sequences, for every
//! family (mistral with its sliding window), and the critic's values likewise.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{ids, tiny};
use oxalign_models::{CausalLm, Family, TokenDistribution, ValueModel};

const LENS: [usize; 5] = [5, 9, 3, 7, 4];

fn sequences() -> Vec<Vec<u32>> {
    LENS.iter()
        .enumerate()
        .map(|(i, &n)| ids(50 + i as u64, n, 64))
        .collect()
}

/// Right-padded `[5, 9]` ids and mask.
fn padded(seqs: &[Vec<u32>]) -> (Tensor, Tensor) {
    let t = LENS.iter().copied().max().unwrap_or(0);
    let (mut ids, mut mask) = (vec![0u32; seqs.len() * t], vec![0u32; seqs.len() * t]);
    for (r, s) in seqs.iter().enumerate() {
        ids[r * t..r * t + s.len()].copy_from_slice(s);
        mask[r * t..r * t + s.len()].fill(1);
    }
    let dev = &Device::Cpu;
    let shape = (seqs.len(), t);
    (
        Tensor::from_vec(ids, shape, dev).unwrap(),
        Tensor::from_vec(mask, shape, dev).unwrap(),
    )
}

/// Rows of 12: [seq 1 | seq 2], [seq 3 | seq 4 | pad], [seq 0 | pad]; returns the ids, the
/// segment ids (pads in a run of their own) and each sequence's (row, start).
fn packed(seqs: &[Vec<u32>]) -> (Tensor, Vec<u32>, Vec<(usize, usize)>) {
    let (l, rows) = (12, [vec![1, 2], vec![3, 4], vec![0]]);
    let mut ids = vec![0u32; rows.len() * l];
    let mut seg = vec![u32::MAX; rows.len() * l];
    let mut at = vec![(0, 0); seqs.len()];
    for (r, members) in rows.iter().enumerate() {
        let mut start = 0;
        for &s in members {
            let n = seqs[s].len();
            ids[r * l + start..r * l + start + n].copy_from_slice(&seqs[s]);
            seg[r * l + start..r * l + start + n].fill(s as u32);
            at[s] = (r, start);
            start += n;
        }
    }
    let ids = Tensor::from_vec(ids, (rows.len(), l), &Device::Cpu).unwrap();
    (ids, seg, at)
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap()
}

/// Asserts that sequence `s`'s first `n` entries agree in the padded row `s` and the packed
/// row at `at[s]`.
fn assert_same(
    what: &str,
    padded: &[Vec<f64>],
    packed: &[Vec<f64>],
    at: &[(usize, usize)],
    n: impl Fn(usize) -> usize,
    tol: f64,
) {
    for (s, &(r, start)) in at.iter().enumerate() {
        for i in 0..n(s) {
            let (a, b) = (padded[s][i], packed[r][start + i]);
            assert!(
                (a - b).abs() <= tol * (1.0 + a.abs()),
                "{what}: sequence {s} position {i}: padded {a} vs packed {b}"
            );
        }
    }
}

#[test]
fn packed_logprobs_equal_padded_logprobs() {
    let seqs = sequences();
    let (ids, mask) = padded(&seqs);
    let (pids, seg, at) = packed(&seqs);
    for family in Family::ALL {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-10)] {
            let m =
                CausalLm::init_random_with_dtype(&tiny(family), 7, dtype, &Device::Cpu).unwrap();
            let want = m
                .next_token_outputs(&ids, Some(&mask), TokenDistribution::MODEL)
                .unwrap();
            let got = m
                .next_token_outputs_packed(&pids, &seg, TokenDistribution::MODEL)
                .unwrap();
            let targets = |s: usize| LENS[s] - 1;
            let what = format!("{family} {dtype:?}");
            let (wl, gl) = (rows(&want.logprobs), rows(&got.logprobs));
            assert_same(&format!("{what} logprobs"), &wl, &gl, &at, targets, tol);
            let (we, ge) = (rows(&want.entropy), rows(&got.entropy));
            assert_same(&format!("{what} entropy"), &we, &ge, &at, targets, tol);
        }
    }
}

#[test]
fn packed_values_equal_padded_values() {
    let seqs = sequences();
    let (ids, mask) = padded(&seqs);
    let (pids, seg, at) = packed(&seqs);
    for family in [Family::Llama, Family::Qwen2] {
        let m = ValueModel::init_random(&tiny(family), 9, &Device::Cpu).unwrap();
        let want = rows(&m.forward(&ids, Some(&mask)).unwrap());
        let got = rows(&m.forward_packed(&pids, &seg).unwrap());
        assert_same(
            &format!("{family} values"),
            &want,
            &got,
            &at,
            |s| LENS[s],
            1e-5,
        );
    }
}

#[test]
fn packed_forward_rejects_a_wrong_segment_count() {
    let m = CausalLm::init_random(&tiny(Family::Llama), 7, &Device::Cpu).unwrap();
    let (pids, _, _) = packed(&sequences());
    let err = m
        .next_token_outputs_packed(&pids, &[0, 0], TokenDistribution::MODEL)
        .unwrap_err();
    assert!(err.to_string().contains("segment ids"), "{err}");
}

//! All-gather and reduce-scatter of [`ThreadCollective`]: results, rank-order determinism,
//! the tensor conveniences, and failure (a leaving rank, a timeout, mismatched calls).

mod common;

use candle_core::{DType, Device, Tensor};
use common::run_group;
use oxalign_kernels::collective::{Collective, CollectiveError, ThreadCollective};
use std::time::{Duration, Instant};

#[test]
fn all_gather_concatenates_in_rank_order_for_1_to_4_ranks() {
    for n in 1..=4 {
        let results = run_group(ThreadCollective::group(n), move |c| {
            let r = c.rank() as f32;
            let a = [r, r + 0.5];
            let b = [10.0 * r];
            let mut out_a = vec![0.0; 2 * n];
            let mut out_b = vec![0.0; n];
            c.all_gather_f32(&[&a, &b], &mut [&mut out_a, &mut out_b])
                .unwrap();
            (out_a, out_b)
        });
        let want_a: Vec<f32> = (0..n).flat_map(|r| [r as f32, r as f32 + 0.5]).collect();
        let want_b: Vec<f32> = (0..n).map(|r| 10.0 * r as f32).collect();
        for (a, b) in results {
            assert_eq!(a, want_a, "n={n}");
            assert_eq!(b, want_b, "n={n}");
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_chunk_of_the_mean() {
    for n in 1..=4 {
        let results = run_group(ThreadCollective::group(n), move |c| {
            let r = c.rank() as f32;
            // Element j of rank r's input is r * 100 + j.
            let input: Vec<f32> = (0..3 * n).map(|j| r * 100.0 + j as f32).collect();
            let mut out = vec![0.0; 3];
            c.reduce_scatter_mean_f32(&[&input], &mut [&mut out])
                .unwrap();
            (c.rank(), out)
        });
        let mean_r = (0..n).map(|r| r as f32 * 100.0).sum::<f32>() / n as f32;
        for (rank, out) in results {
            let want: Vec<f32> = (0..3).map(|j| mean_r + (rank * 3 + j) as f32).collect();
            assert_eq!(out, want, "n={n} rank={rank}");
        }
    }
}

#[test]
fn reduce_scatter_sums_in_rank_order_and_matches_all_reduce() {
    // Values whose float sum depends on the order: rank order gives one fixed answer, the
    // same as all_reduce_mean's.
    let vals = [1.0e8f32, 1.0, -1.0e8, 1.0];
    let expected = (((vals[0] + vals[1]) + vals[2]) + vals[3]) / 4.0;
    for _ in 0..5 {
        let results = run_group(ThreadCollective::group(4), move |c| {
            let input = vec![vals[c.rank()]; 8];
            let mut out = vec![0.0; 2];
            c.reduce_scatter_mean_f32(&[&input], &mut [&mut out])
                .unwrap();
            let mut all = input.clone();
            c.all_reduce_mean_f32(&mut [&mut all]).unwrap();
            (out, all)
        });
        for (out, all) in results {
            assert_eq!(out, vec![expected; 2]);
            assert_eq!(all, vec![expected; 8]);
        }
    }
}

#[test]
fn gather_after_scatter_is_an_all_reduce() {
    let results = run_group(ThreadCollective::group(3), |c| {
        let r = c.rank() as f64;
        let g = Tensor::new(&[[r, 1.0, 2.0 * r], [3.0, r * r, 0.5]], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let shard = c.reduce_scatter_mean(std::slice::from_ref(&g)).unwrap();
        assert_eq!(shard[0].dims(), &[2]);
        let full = c.all_gather(&shard).unwrap();
        let reduced = c.all_reduce_mean(&[g]).unwrap();
        (
            full[0].dtype(),
            full[0].to_vec1::<f32>().unwrap(),
            reduced[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        )
    });
    for (dtype, full, reduced) in results {
        assert_eq!(dtype, DType::F32);
        assert_eq!(full, reduced);
    }
}

#[test]
fn tensor_reduce_scatter_refuses_a_size_the_group_does_not_divide() {
    let results = run_group(ThreadCollective::group(2), |c| {
        let t = Tensor::new(&[1.0f32, 2.0, 3.0], &Device::Cpu).unwrap();
        c.reduce_scatter_mean(&[t]).map(|_| ())
    });
    for r in results {
        let err = r.unwrap_err();
        assert!(
            matches!(err, CollectiveError::Mismatch { .. }),
            "expected a mismatch, got {err}"
        );
        assert!(err.to_string().contains("not a multiple"), "{err}");
    }
}

#[test]
fn wrong_output_lengths_fail_the_group_at_once() {
    let start = Instant::now();
    let results = run_group(ThreadCollective::group(2), |c| {
        let shard = [1.0f32, 2.0];
        // Rank 1 passes an output one element short; rank 0 is already waiting.
        let mut out = vec![0.0; if c.rank() == 1 { 3 } else { 4 }];
        c.all_gather_f32(&[&shard], &mut [&mut out])
    });
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(results.iter().all(Result::is_err));
    let err = results[1].as_ref().unwrap_err().to_string();
    assert!(err.contains("output lengths"), "{err}");
}

#[test]
fn a_rank_that_leaves_during_a_gather_fails_the_others_promptly() {
    let start = Instant::now();
    let results = run_group(ThreadCollective::group(3), |c| {
        if c.rank() == 2 {
            drop(c);
            return None;
        }
        let mut out = vec![0.0; 3];
        Some(c.all_gather_f32(&[&[1.0]], &mut [&mut out]))
    });
    assert!(start.elapsed() < Duration::from_secs(30));
    for r in results.into_iter().flatten() {
        let err = r.unwrap_err();
        assert!(matches!(err, CollectiveError::Aborted { .. }), "{err}");
        assert!(err.to_string().contains("rank 2 left the group"), "{err}");
    }
}

#[test]
fn a_missing_rank_times_out_a_reduce_scatter() {
    let group = ThreadCollective::group_with_timeout(2, Duration::from_millis(200));
    let mut it = group.into_iter();
    let c0 = it.next().unwrap();
    let _c1_never_calls = it.next().unwrap();
    let mut out = vec![0.0; 1];
    let err = c0
        .reduce_scatter_mean_f32(&[&[1.0, 2.0]], &mut [&mut out])
        .unwrap_err();
    match &err {
        CollectiveError::Timeout { op, missing, .. } => {
            assert_eq!((*op, missing.as_slice()), ("reduce_scatter_mean", &[1][..]));
        }
        other => panic!("expected a timeout, got {other}"),
    }
}

#[test]
fn a_gather_and_a_scatter_called_together_are_a_mismatch() {
    let results = run_group(ThreadCollective::group(2), |c| {
        let mut out = vec![0.0; 2];
        if c.rank() == 0 {
            c.all_gather_f32(&[&[1.0]], &mut [&mut out])
        } else {
            let mut one = vec![0.0; 1];
            c.reduce_scatter_mean_f32(&[&[1.0, 2.0]], &mut [&mut one])
        }
    });
    assert!(results.iter().all(Result::is_err));
}

//! All-reduce, broadcast and barrier of [`ThreadCollective`]: results for 1 to 4 ranks,
//! shapes and dtypes of the tensor conveniences, rank-order determinism, and failure (a
//! leaving or panicking rank, a timeout, mismatched calls, an explicit abort).

mod common;

use candle_core::{DType, Device, Tensor};
use common::run_group;
use oxalign_kernels::collective::{Collective, CollectiveError, ThreadCollective};
use std::thread;
use std::time::{Duration, Instant};

#[test]
fn all_reduce_mean_for_1_2_3_ranks() {
    for n in 1..=3 {
        let results = run_group(ThreadCollective::group(n), move |c| {
            let r = c.rank() as f32;
            let mut a = vec![r, 10.0 * r, 1.0];
            let mut b = vec![r * r; 5];
            c.all_reduce_mean_f32(&mut [&mut a, &mut b]).unwrap();
            // Reuse the group several times.
            let mut again = vec![r + 1.0];
            c.all_reduce_mean_f32(&mut [&mut again]).unwrap();
            c.barrier().unwrap();
            (a, b, again)
        });
        let ranks: Vec<f32> = (0..n).map(|r| r as f32).collect();
        let mean = ranks.iter().sum::<f32>() / n as f32;
        let mean_sq = ranks.iter().map(|r| r * r).sum::<f32>() / n as f32;
        for (a, b, again) in results {
            assert_eq!(a, vec![mean, 10.0 * mean, 1.0], "n={n}");
            assert_eq!(b, vec![mean_sq; 5], "n={n}");
            assert_eq!(again, vec![mean + 1.0], "n={n}");
        }
    }
}

#[test]
fn tensor_all_reduce_keeps_shapes_and_dtypes() {
    let results = run_group(ThreadCollective::group(3), |c| {
        let r = c.rank() as f64;
        let t32 = Tensor::new(&[[r, 2.0 * r], [3.0, r]], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let t64 = Tensor::new(&[r + 0.5], &Device::Cpu).unwrap();
        let out = c.all_reduce_mean(&[t32, t64]).unwrap();
        (
            out[0].dtype(),
            out[0].to_vec2::<f32>().unwrap(),
            out[1].dtype(),
            out[1].to_vec1::<f64>().unwrap(),
        )
    });
    for (dt0, v0, dt1, v1) in results {
        assert_eq!(dt0, DType::F32);
        assert_eq!(v0, vec![vec![1.0, 2.0], vec![3.0, 1.0]]);
        assert_eq!(dt1, DType::F64);
        assert_eq!(v1, vec![1.5]);
    }
}

#[test]
fn sums_are_reproducible_in_rank_order() {
    // Values whose float sum depends on the order: rank order gives one fixed answer.
    let vals = [1.0e8f32, 1.0, -1.0e8, 1.0];
    let expected = (((vals[0] + vals[1]) + vals[2]) + vals[3]) / 4.0;
    for _ in 0..5 {
        let results = run_group(ThreadCollective::group(4), move |c| {
            let mut buf = vec![vals[c.rank()]; 3];
            c.all_reduce_mean_f32(&mut [&mut buf]).unwrap();
            buf
        });
        for buf in results {
            assert_eq!(buf, vec![expected; 3]);
        }
    }
}

#[test]
fn broadcast_copies_roots_values() {
    let results = run_group(ThreadCollective::group(3), |c| {
        let mut buf = vec![c.rank() as f32; 4];
        c.broadcast_f32(&mut [&mut buf], 2).unwrap();
        let t = Tensor::new(&[c.rank() as f32], &Device::Cpu).unwrap();
        let t = c.broadcast(&[t], 1).unwrap();
        (buf, t[0].to_vec1::<f32>().unwrap())
    });
    for (buf, t) in results {
        assert_eq!(buf, vec![2.0; 4]);
        assert_eq!(t, vec![1.0]);
    }
}

#[test]
fn a_rank_that_leaves_fails_the_others_promptly() {
    let start = Instant::now();
    let results = run_group(ThreadCollective::group(3), |c| {
        if c.rank() == 1 {
            // Simulates a replica dying mid-step: its handle is dropped, never reduced.
            drop(c);
            return None;
        }
        let mut buf = vec![1.0f32];
        Some(c.all_reduce_mean_f32(&mut [&mut buf]))
    });
    assert!(start.elapsed() < Duration::from_secs(30));
    for r in results.into_iter().flatten() {
        let err = r.unwrap_err();
        assert!(matches!(err, CollectiveError::Aborted { .. }), "{err}");
        assert!(err.to_string().contains("rank 1 left the group"), "{err}");
    }
}

#[test]
fn a_panicking_rank_fails_the_others() {
    let group = ThreadCollective::group(2);
    let mut it = group.into_iter();
    let (c0, c1) = (it.next().unwrap(), it.next().unwrap());
    let t1 = thread::spawn(move || {
        let _c = c1;
        panic!("replica 1 failed on purpose");
    });
    let err = c0.barrier().unwrap_err();
    assert!(
        err.to_string().contains("rank 1 left the group (panicked)"),
        "{err}"
    );
    assert!(t1.join().is_err());
}

#[test]
fn a_missing_rank_times_out() {
    let group = ThreadCollective::group_with_timeout(2, Duration::from_millis(200));
    let mut it = group.into_iter();
    let c0 = it.next().unwrap();
    let _c1_never_calls = it.next().unwrap();
    let err = c0.barrier().unwrap_err();
    match &err {
        CollectiveError::Timeout {
            rank, missing, op, ..
        } => {
            assert_eq!((*rank, missing.as_slice(), *op), (0, &[1][..], "barrier"));
        }
        other => panic!("expected timeout, got {other}"),
    }
    // The group stays failed.
    assert!(matches!(c0.barrier(), Err(CollectiveError::Aborted { .. })));
}

#[test]
fn mismatched_calls_are_errors_on_every_rank() {
    let results = run_group(ThreadCollective::group(2), |c| {
        let mut buf = vec![0.0f32; 2 + c.rank()];
        c.all_reduce_mean_f32(&mut [&mut buf])
    });
    for r in results {
        let err = r.unwrap_err().to_string();
        assert!(
            err.contains("buffer lengths") || err.contains("aborted"),
            "{err}"
        );
    }
    let results = run_group(ThreadCollective::group(2), |c| {
        if c.rank() == 0 {
            c.barrier()
        } else {
            c.all_reduce_mean_f32(&mut [&mut [1.0f32][..]])
        }
    });
    assert!(results.iter().all(|r| r.is_err()));
}

#[test]
fn explicit_abort_reaches_waiting_ranks() {
    let results = run_group(ThreadCollective::group(2), |c| {
        if c.rank() == 0 {
            thread::sleep(Duration::from_millis(50));
            c.abort("loss was NaN");
            Ok(())
        } else {
            c.barrier()
        }
    });
    let err = results[1].as_ref().unwrap_err().to_string();
    assert!(err.contains("rank 0 aborted: loss was NaN"), "{err}");
}

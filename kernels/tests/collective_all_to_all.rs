//! All-to-all of [`ThreadCollective`]: variable lengths per peer (zero included) for 1 to 4
//! ranks, the row-tensor convenience, and failure (a leaving rank, a timeout, a wrong number
//! of send buffers, mismatched calls, an explicit abort).

mod common;

use candle_core::{DType, Device, Tensor};
use common::run_group;
use oxalign_kernels::collective::{Collective, CollectiveError, ThreadCollective};
use std::time::{Duration, Instant};

/// What rank `s` sends to rank `d` in the tests: `(s + 2d) % 3` values (zero for some
/// pairs), each naming its source, destination and position.
fn payload(s: usize, d: usize) -> Vec<f32> {
    (0..(s + 2 * d) % 3)
        .map(|j| (100 * s + 10 * d + j) as f32)
        .collect()
}

#[test]
fn all_to_all_delivers_each_peers_buffer_for_1_to_4_ranks() {
    for n in 1..=4 {
        let results = run_group(ThreadCollective::group(n), move |c| {
            let s = c.rank();
            let first = c.all_to_all_f32((0..n).map(|d| payload(s, d)).collect());
            // The group stays usable, and a second exchange gets its own buffers.
            let second = c.all_to_all_f32((0..n).map(|d| vec![(s * n + d) as f32]).collect());
            (first.unwrap(), second.unwrap())
        });
        for (r, (first, second)) in results.into_iter().enumerate() {
            let want: Vec<Vec<f32>> = (0..n).map(|s| payload(s, r)).collect();
            assert_eq!(first, want, "n={n} rank {r}");
            let want: Vec<Vec<f32>> = (0..n).map(|s| vec![(s * n + r) as f32]).collect();
            assert_eq!(second, want, "n={n} rank {r}");
        }
    }
}

#[test]
fn all_to_all_with_nothing_to_send_still_completes() {
    let results = run_group(ThreadCollective::group(3), |c| {
        let send = match c.rank() {
            1 => vec![Vec::new(); 3],
            r => vec![vec![r as f32; 2], Vec::new(), vec![r as f32]],
        };
        c.all_to_all_f32(send).unwrap()
    });
    assert_eq!(results[0], vec![vec![0.0, 0.0], vec![], vec![2.0, 2.0]]);
    assert_eq!(results[1], vec![Vec::<f32>::new(); 3]);
    assert_eq!(results[2], vec![vec![0.0], vec![], vec![2.0]]);
}

#[test]
fn row_all_to_all_keeps_columns_dtype_and_empty_blocks() {
    let results = run_group(ThreadCollective::group(2), |c| {
        let r = c.rank() as f64;
        let dev = Device::Cpu;
        // Rank 0 sends one row to itself and none to rank 1; rank 1 sends two to rank 0.
        let send = match c.rank() {
            0 => vec![
                Tensor::new(&[[r, 1.0, 2.0]], &dev).unwrap(),
                Tensor::zeros((0, 3), DType::F64, &dev).unwrap(),
            ],
            _ => vec![
                Tensor::new(&[[r, 3.0, 4.0], [r, 5.0, 6.0]], &dev).unwrap(),
                Tensor::zeros((0, 3), DType::F64, &dev).unwrap(),
            ],
        };
        let recv = c.all_to_all_rows(&send).unwrap();
        recv.iter()
            .map(|t| (t.dtype(), t.dims().to_vec(), t.to_vec2::<f64>().unwrap()))
            .collect::<Vec<_>>()
    });
    assert_eq!(results[0][0].0, DType::F64);
    assert_eq!(results[0][0].2, vec![vec![0.0, 1.0, 2.0]]);
    assert_eq!(
        results[0][1].2,
        vec![vec![1.0, 3.0, 4.0], vec![1.0, 5.0, 6.0]]
    );
    assert_eq!(results[1][0].1, vec![0, 3]);
    assert_eq!(results[1][1].1, vec![0, 3]);
}

#[test]
fn row_all_to_all_refuses_blocks_of_different_widths() {
    let c = ThreadCollective::group(1).pop().unwrap();
    let a = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    let b = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
    let err = c.all_to_all_rows(&[a, b]).unwrap_err().to_string();
    assert!(
        err.contains("tensor for rank 1") && err.contains("[2, 4]"),
        "{err}"
    );
}

#[test]
fn a_wrong_number_of_send_buffers_fails_every_rank() {
    let results = run_group(ThreadCollective::group(2), |c| {
        let n = if c.rank() == 0 { 1 } else { 2 };
        c.all_to_all_f32(vec![vec![1.0]; n])
    });
    let e0 = results[0].as_ref().unwrap_err().to_string();
    assert!(e0.contains("1 send buffers in a group of 2"), "{e0}");
    let e1 = results[1].as_ref().unwrap_err().to_string();
    assert!(
        e1.contains("aborted") || e1.contains("send buffers"),
        "{e1}"
    );
}

#[test]
fn all_to_all_against_another_op_is_a_mismatch() {
    let results = run_group(ThreadCollective::group(2), |c| {
        if c.rank() == 0 {
            c.all_to_all_f32(vec![vec![1.0], vec![]]).map(|_| ())
        } else {
            c.barrier()
        }
    });
    for r in &results {
        let e = r.as_ref().unwrap_err().to_string();
        assert!(e.contains("AllToAll") || e.contains("aborted"), "{e}");
    }
}

#[test]
fn a_rank_that_leaves_during_all_to_all_fails_the_others() {
    let start = Instant::now();
    let results = run_group(ThreadCollective::group(3), |c| {
        if c.rank() == 2 {
            drop(c);
            return None;
        }
        Some(c.all_to_all_f32(vec![vec![1.0]; 3]))
    });
    assert!(start.elapsed() < Duration::from_secs(30));
    for r in results.into_iter().flatten() {
        let err = r.unwrap_err();
        assert!(matches!(err, CollectiveError::Aborted { .. }), "{err}");
        assert!(err.to_string().contains("rank 2 left the group"), "{err}");
    }
}

#[test]
fn a_missing_rank_times_out_in_all_to_all() {
    let mut group = ThreadCollective::group_with_timeout(2, Duration::from_millis(200));
    let _c1_never_calls = group.pop().unwrap();
    let c0 = group.pop().unwrap();
    match c0.all_to_all_f32(vec![vec![], vec![2.0]]).unwrap_err() {
        CollectiveError::Timeout {
            rank, missing, op, ..
        } => assert_eq!((rank, missing.as_slice(), op), (0, &[1][..], "all_to_all")),
        other => panic!("expected timeout, got {other}"),
    }
    assert!(matches!(
        c0.all_to_all_f32(vec![vec![], vec![]]),
        Err(CollectiveError::Aborted { .. })
    ));
}

#[test]
fn an_abort_reaches_a_rank_waiting_in_all_to_all() {
    let results = run_group(ThreadCollective::group(2), |c| {
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(50));
            c.abort("expert forward failed");
            Ok(Vec::new())
        } else {
            c.all_to_all_f32(vec![vec![1.0], vec![2.0]])
        }
    });
    let err = results[1].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("rank 0 aborted: expert forward failed"),
        "{err}"
    );
}

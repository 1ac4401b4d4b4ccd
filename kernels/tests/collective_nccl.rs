//! GPU tests (feature `cuda`) of [`NcclCollective`]: every operation with one rank (one GPU)
//! and, when two GPUs can be opened, with two ranks, against the values the in-process group
//! gives; CUDA tensors stay on the GPU; a rank whose peer never calls gets a timeout naming
//! the op and the rank. They skip, with a message, when no GPU (or, for two ranks, no second
//! GPU) can be opened.
#![cfg(feature = "cuda")]

use candle_core::{Device, Tensor};
use oxalign_kernels::collective::{
    Collective, CollectiveError, NcclCollective, NcclGroup, NcclUniqueId,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn gpus(n: usize) -> bool {
    for i in 0..n {
        if let Err(e) = oxalign_kernels::parse_device(&format!("cuda:{i}")) {
            eprintln!("skipping NCCL test (needs {n} GPU(s)): {e}");
            return false;
        }
    }
    true
}

fn group(world: usize, timeout: Duration) -> Vec<NcclCollective> {
    let id = NcclUniqueId::generate().expect("ncclGetUniqueId");
    let ordinals: Vec<usize> = (0..world).collect();
    NcclGroup::create(id, &ordinals, timeout).expect("NCCL communicators")
}

/// Runs `f` on one thread per rank; results in rank order.
fn each<R: Send + 'static>(
    g: Vec<NcclCollective>,
    f: impl Fn(&NcclCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let hs: Vec<_> = g
        .into_iter()
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || f(&c))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("rank")).collect()
}

/// Every host-slice operation once; returns what the rank saw.
fn every_op(c: &NcclCollective) -> Vec<Vec<f32>> {
    let (r, w) = (c.rank() as f32, c.world_size());
    let mut a = vec![r, 2.0 * r, 1.0];
    c.all_reduce_mean_f32(&mut [&mut a]).unwrap();
    let mut b = vec![r + 5.0; 4];
    c.broadcast_f32(&mut [&mut b], 0).unwrap();
    c.barrier().unwrap();
    let shard = [r, r + 0.5];
    let mut gathered = vec![0.0; 2 * w];
    c.all_gather_f32(&[&shard], &mut [&mut gathered]).unwrap();
    let input: Vec<f32> = (0..2 * w).map(|i| i as f32 + r).collect();
    let mut chunk = vec![0.0; 2];
    c.reduce_scatter_mean_f32(&[&input], &mut [&mut chunk])
        .unwrap();
    // Rank r sends d + 1 copies of r to rank d (rank 0 sends nothing to itself when w > 1).
    let send = (0..w)
        .map(|d| vec![r; if d == 0 && w > 1 { 0 } else { d + 1 }])
        .collect();
    let recv = c.all_to_all_f32(send).unwrap().concat();
    vec![a, b, gathered, chunk, recv]
}

fn expected(rank: usize, w: usize) -> Vec<Vec<f32>> {
    let mean = (0..w).map(|r| r as f32).sum::<f32>() / w as f32;
    let gathered = (0..w).flat_map(|r| [r as f32, r as f32 + 0.5]).collect();
    let chunk = (0..2).map(|i| (2 * rank + i) as f32 + mean).collect();
    let n = if rank == 0 && w > 1 { 0 } else { rank + 1 };
    let recv = (0..w).flat_map(|s| vec![s as f32; n]).collect();
    vec![
        vec![mean, 2.0 * mean, 1.0],
        vec![5.0; 4],
        gathered,
        chunk,
        recv,
    ]
}

fn check_every_op(world: usize) {
    let got = each(group(world, Duration::from_secs(60)), every_op);
    for (rank, g) in got.iter().enumerate() {
        assert_eq!(g, &expected(rank, world), "rank {rank} of {world}");
    }
}

#[test]
fn nccl_every_op_with_one_rank() {
    if gpus(1) {
        check_every_op(1);
    }
}

#[test]
fn nccl_every_op_with_two_ranks() {
    if gpus(2) {
        check_every_op(2);
    }
}

#[test]
fn nccl_tensor_ops_stay_on_the_gpu() {
    if !gpus(1) {
        return;
    }
    let g = group(1, Duration::from_secs(60));
    let c = &g[0];
    let dev = Device::new_cuda(0).unwrap();
    let x = Tensor::arange(0f32, 6.0, &dev)
        .unwrap()
        .reshape((2, 3))
        .unwrap();
    let x16 = x.to_dtype(candle_core::DType::BF16).unwrap();
    let mean = c.all_reduce_mean(&[x.clone(), x16]).unwrap();
    assert!(mean[0].device().is_cuda() && mean[1].device().is_cuda());
    assert_eq!(mean[0].dims(), &[2, 3]);
    assert_eq!(mean[1].dtype(), candle_core::DType::BF16);
    let back: Vec<f32> = mean[0].flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(back, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    // The result is usable with tensors of the caller's device.
    let sum = (&mean[0] + &x).unwrap();
    assert_eq!(
        sum.flatten_all().unwrap().to_vec1::<f32>().unwrap()[5],
        10.0
    );
    let gathered = c.all_gather(std::slice::from_ref(&x)).unwrap();
    assert_eq!(gathered[0].dims(), &[6]);
    let scattered = c.reduce_scatter_mean(std::slice::from_ref(&x)).unwrap();
    assert_eq!(scattered[0].to_vec1::<f32>().unwrap().len(), 6);
    let b = c.broadcast(&[x], 0).unwrap();
    assert!(b[0].device().is_cuda());
}

#[test]
fn nccl_a_missing_peer_is_a_timeout_not_a_hang() {
    if !gpus(2) {
        return;
    }
    let g = group(2, Duration::from_millis(500));
    let started = Instant::now();
    let got = each(g, |c| {
        if c.rank() == 1 {
            return None; // rank 1 never joins the all-reduce
        }
        Some(
            c.all_reduce_mean_f32(&mut [&mut [1.0f32; 8][..]])
                .unwrap_err(),
        )
    });
    assert!(started.elapsed() < Duration::from_secs(30), "it hung");
    match &got[0] {
        Some(CollectiveError::Timeout { rank: 0, op, .. }) => assert_eq!(*op, "all_reduce_mean"),
        other => panic!("expected rank 0's timeout, got {other:?}"),
    }
}

#[test]
fn nccl_a_group_over_a_missing_gpu_fails_at_once() {
    if !gpus(1) || gpus(2) {
        return;
    }
    let id = NcclUniqueId::generate().unwrap();
    let started = Instant::now();
    let e = NcclGroup::create(id, &[0, 1], Duration::from_secs(20))
        .err()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "{e}");
    assert!(e.to_string().contains("rank 1"), "{e}");
}

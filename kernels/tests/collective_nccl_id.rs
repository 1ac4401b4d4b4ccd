//! CPU tests of the NCCL group's pieces that need no GPU: the unique id as a message
//! (MessagePack and JSON round trips, a wrong length refused) and the deadline its waits use
//! (a wait that never completes becomes a timeout naming the op and the rank).

use oxalign_kernels::collective::{CollectiveError, Deadline, NcclUniqueId, NCCL_UNIQUE_ID_BYTES};
use std::time::{Duration, Instant};

fn sample_id() -> NcclUniqueId {
    let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    NcclUniqueId::from_bytes(bytes)
}

#[test]
fn a_unique_id_round_trips_through_messagepack_and_json() {
    let id = sample_id();
    let bytes = rmp_serde::to_vec_named(&id).unwrap();
    // A byte string: 128 bytes plus a 2-byte `bin 8` header.
    assert_eq!(bytes.len(), NCCL_UNIQUE_ID_BYTES + 2);
    let back: NcclUniqueId = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(back, id);
    let json = serde_json::to_string(&id).unwrap();
    assert_eq!(serde_json::from_str::<NcclUniqueId>(&json).unwrap(), id);
    assert!(
        format!("{id:?}").starts_with("NcclUniqueId(030a1118"),
        "{id:?}"
    );
}

#[test]
fn an_id_of_the_wrong_length_is_refused() {
    let short = rmp_serde::to_vec(&serde_bytes_like(&[1u8; 16])).unwrap();
    let e = rmp_serde::from_slice::<NcclUniqueId>(&short).unwrap_err();
    assert!(e.to_string().contains("128 bytes"), "{e}");
    let e = serde_json::from_str::<NcclUniqueId>("[1,2,3]").unwrap_err();
    assert!(e.to_string().contains("128 bytes"), "{e}");
}

/// `bytes` serialized as a byte string (what a peer with a bad id would send).
fn serde_bytes_like(bytes: &[u8]) -> impl serde::Serialize + '_ {
    struct B<'a>(&'a [u8]);
    impl serde::Serialize for B<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
    B(bytes)
}

#[test]
fn a_wait_that_never_completes_times_out_naming_op_and_rank() {
    let d = Deadline::new(3, "all_reduce_mean", Duration::from_millis(30));
    let started = Instant::now();
    let mut polls = 0;
    let e = d
        .wait(|| {
            polls += 1;
            Ok(false)
        })
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(30));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited far too long"
    );
    assert!(polls > 1, "polled {polls} times");
    match &e {
        CollectiveError::Timeout {
            rank, op, waited, ..
        } => {
            assert_eq!((*rank, *op), (3, "all_reduce_mean"));
            assert!(*waited >= Duration::from_millis(30));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("rank 3") && msg.contains("all_reduce_mean"),
        "{msg}"
    );
}

#[test]
fn a_wait_ends_when_done_and_passes_errors_on() {
    let d = Deadline::new(0, "barrier", Duration::from_secs(60));
    let mut left = 5;
    d.wait(|| {
        left -= 1;
        Ok(left == 0)
    })
    .unwrap();
    assert_eq!(left, 0);
    assert!(d.remaining() > Duration::from_secs(50));
    let e = d
        .wait(|| {
            Err(CollectiveError::Device {
                rank: 0,
                op: "barrier",
                message: "CUDA_ERROR_LAUNCH_FAILED".into(),
            })
        })
        .unwrap_err();
    assert!(matches!(e, CollectiveError::Device { .. }), "{e:?}");
}

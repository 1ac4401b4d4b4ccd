//! The bucket codec: round trips, the size limit, chunked tensors, and damaged buckets
//! refused with the tensor and the bucket named.

use super::*;

fn tensor(name: &str, shape: &[usize], seed: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor {
        name: name.into(),
        shape: shape.to_vec(),
        values: (0..n).map(|i| seed + i as f32 * 0.25 - 3.0).collect(),
    }
}

fn weights() -> Vec<HostTensor> {
    vec![
        tensor("lm_head.weight", &[64, 32], 1.0),
        tensor("model.embed_tokens.weight", &[64, 32], 2.0),
        tensor("model.layers.0.mlp.down_proj.weight", &[32, 48], 3.0),
        tensor("model.norm.weight", &[32], 4.0),
        tensor("model.empty", &[0], 5.0),
    ]
}

fn assemble(version: u64, buckets: &[WeightBucket]) -> Result<Arrived, BucketError> {
    let mut a = Assembly::new(version);
    for b in buckets {
        a.add(b)?;
    }
    a.finish()
}

fn sorted(mut v: Vec<HostTensor>) -> Vec<HostTensor> {
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

#[test]
fn buckets_round_trip_whole_tensors_within_the_limit() {
    let w = weights();
    let limit = 20_000;
    let buckets = pack(&w, limit).unwrap();
    assert!(buckets.len() > 1, "{} buckets", buckets.len());
    for (i, b) in buckets.iter().enumerate() {
        assert!(
            b.bytes.len() <= limit,
            "bucket {i}: {} bytes",
            b.bytes.len()
        );
        assert_eq!((b.index, b.count), (i, buckets.len()));
    }
    let got = assemble(7, &buckets).unwrap();
    assert_eq!(got.tensors, sorted(w.clone()));
    for t in &w {
        assert_eq!(got.checksums[&t.name], checksum_f32(&t.values));
    }
}

#[test]
fn a_tensor_bigger_than_a_bucket_travels_in_chunks() {
    let w = vec![
        tensor("big.weight", &[100, 50], 0.5),
        tensor("small", &[3], 1.0),
    ];
    let limit = 4_096;
    let buckets = pack(&w, limit).unwrap();
    // 20 000 bytes of values need at least five buckets of 4 KiB.
    assert!(buckets.len() >= 5, "{} buckets", buckets.len());
    assert!(buckets.iter().all(|b| b.bytes.len() <= limit));
    assert_eq!(assemble(1, &buckets).unwrap().tensors, sorted(w));
}

#[test]
fn one_bucket_when_everything_fits() {
    let w = weights();
    let buckets = pack(&w, 256 << 20).unwrap();
    assert_eq!(buckets.len(), 1);
    assert_eq!(assemble(2, &buckets).unwrap().tensors, sorted(w));
}

#[test]
fn a_flipped_byte_is_refused_naming_the_tensor_and_the_bucket() {
    let w = weights();
    let mut buckets = pack(&w, 20_000).unwrap();
    let last = buckets.len() - 1;
    // Flip a byte of the last value of the last bucket (after the header).
    let b = &mut buckets[last];
    let at = b.bytes.len() - 2;
    b.bytes[at] ^= 0x40;
    let err = assemble(3, &buckets).unwrap_err();
    match &err {
        BucketError::Checksum { bucket, count, .. } => {
            assert_eq!((*bucket, *count), (last, buckets.len()));
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("bucket {last} of {}", buckets.len())),
        "{msg}"
    );
    assert!(msg.contains("tensor \""), "{msg}");
}

#[test]
fn a_damaged_header_or_a_missing_bucket_is_refused() {
    let w = weights();
    let mut buckets = pack(&w, 20_000).unwrap();
    let mut broken = buckets[0].clone();
    broken.bytes[0] ^= 0xFF;
    assert!(matches!(
        Assembly::new(1).add(&broken),
        Err(BucketError::Malformed { bucket: 0, .. })
    ));
    buckets.pop();
    let err = assemble(1, &buckets).unwrap_err();
    assert!(matches!(err, BucketError::Incomplete { .. }), "{err}");
    let mut twice = Assembly::new(1);
    twice.add(&buckets[0]).unwrap();
    assert!(twice.add(&buckets[0]).is_err());
}

#[test]
fn a_limit_too_small_for_one_value_is_refused() {
    let err = pack(&weights(), 300).unwrap_err();
    assert!(
        matches!(err, BucketError::TooSmall { limit: 300, .. }),
        "{err}"
    );
}

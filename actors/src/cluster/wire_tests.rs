//! Call messages round-trip bit for bit with their arrays as safetensors, the arrays leave
//! the MessagePack part, and a blob with a wrong dtype, shape, length or name is refused
//! with the tensor named. An inventory request and its answer (a worker's devices and holds)
//! round-trip.

use super::call::{decode_request, decode_response, encode_request, encode_response};
use super::error::{DecodeError, TensorError};
use super::{Held, Inventory, Request, Response};
use crate::batch::{
    ExperienceBatch, Finish, RolloutBatch, RolloutRequest, Sample, SampleRequest, Sampling,
    Sequences, TokenArray,
};
use crate::roles::CriticWork;
use oxalign_kernels::device::DeviceSpec;

fn seqs() -> Sequences {
    Sequences {
        pairs: vec![(vec![1, 2, 3], vec![4, 5]), (vec![6], vec![u32::MAX, 0, 9])],
        pad_id: 7,
        routing: None,
        observations: None,
    }
}

/// Values whose bits a lossy path would change: NaN payloads, -0.0, subnormals.
fn odd(n: usize) -> Vec<f32> {
    let bits = [
        0x7fc0_0001u32,
        0x8000_0000,
        0x0000_0001,
        0x3f80_0000,
        0xff80_0000,
    ];
    (0..n)
        .map(|i| f32::from_bits(bits[i % bits.len()]))
        .collect()
}

fn array(rows: usize, cols: usize) -> TokenArray {
    TokenArray::new(rows, cols, odd(rows * cols)).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn batch() -> RolloutBatch {
    let sample = |id: u64, response: Vec<u32>| Sample {
        sample_id: id,
        group_id: id / 2,
        prompt: vec![10, 11, id as u32],
        logprobs: odd(response.len()),
        response,
        finish: Finish::Length,
        routing: None,
        observations: Vec::new(),
    };
    RolloutBatch {
        policy_version: 3,
        samples: vec![sample(0, vec![1, 2]), sample(1, vec![]), sample(2, vec![5])],
    }
}

fn critic_work() -> CriticWork {
    CriticWork {
        batch: ExperienceBatch {
            seqs: seqs(),
            policy_version: 2,
            old_logprobs: array(2, 4),
            advantages: array(2, 4),
            ref_logprobs: array(2, 4),
            rollout_logprobs: array(2, 4),
            old_values: Some(array(2, 4)),
            returns: None,
        },
        clip: Some(0.2),
        agg: Default::default(),
        lr: 1e-3,
        max_grad_norm: 1.0,
        epochs: 1,
        minibatch_size: 2,
        shuffle_seed: 9,
    }
}

#[test]
fn requests_round_trip_bit_for_bit() {
    let bytes = encode_request(5, Request::Values(seqs())).unwrap();
    let back = decode_request(&bytes).unwrap();
    assert_eq!(back.id, 5);
    assert!(matches!(back.body, Request::Values(s) if s == seqs()));

    let work = critic_work();
    let bytes = encode_request(6, Request::TrainCritic(Box::new(work.clone()))).unwrap();
    let Request::TrainCritic(w) = decode_request(&bytes).unwrap().body else {
        panic!("not a critic update")
    };
    let (a, b) = (&w.batch, &work.batch);
    assert_eq!(a.seqs, b.seqs);
    for (x, y) in [
        (&a.old_logprobs, &b.old_logprobs),
        (&a.advantages, &b.advantages),
        (
            a.old_values.as_ref().unwrap(),
            b.old_values.as_ref().unwrap(),
        ),
    ] {
        assert_eq!((x.rows(), x.cols()), (y.rows(), y.cols()));
        assert_eq!(bits(x.data()), bits(y.data()));
    }
    assert!(a.returns.is_none() && w.clip == Some(0.2) && w.shuffle_seed == 9);

    let request = RolloutRequest {
        samples: vec![SampleRequest {
            sample_id: 1,
            group_id: 0,
            prompt: vec![3, 1, 4],
            max_new_tokens: 8,
            sampling: Sampling::greedy(),
            stop_token_ids: Vec::new(),
        }],
    };
    let generate = Request::Generate {
        request: request.clone(),
        label: "generate step 1".into(),
    };
    let back = decode_request(&encode_request(7, generate).unwrap()).unwrap();
    assert!(matches!(back.body, Request::Generate { request: r, .. } if r == request));
}

#[test]
fn answers_round_trip_bit_for_bit() {
    let back = decode_response(&encode_response(1, Response::Batch(Box::new(batch()))).unwrap());
    let Response::Batch(b) = back.unwrap().body else {
        panic!("not a batch")
    };
    for (x, y) in b.samples.iter().zip(&batch().samples) {
        assert_eq!(
            (x.sample_id, &x.prompt, &x.response),
            (y.sample_id, &y.prompt, &y.response)
        );
        assert_eq!(bits(&x.logprobs), bits(&y.logprobs));
    }
    let back = decode_response(&encode_response(2, Response::Tokens(array(3, 2))).unwrap());
    assert!(
        matches!(back.unwrap().body, Response::Tokens(t) if bits(t.data()) == bits(array(3, 2).data()))
    );
    let back = decode_response(&encode_response(3, Response::Rewards(odd(4))).unwrap());
    assert!(matches!(back.unwrap().body, Response::Rewards(r) if bits(&r) == bits(&odd(4))));
    let back = decode_response(&encode_response(4, Response::Done).unwrap()).unwrap();
    assert!(matches!(back.body, Response::Done));
}

#[test]
fn an_inventory_request_and_its_answer_round_trip() {
    let back = decode_request(&encode_request(8, Request::Inventory).unwrap()).unwrap();
    assert_eq!(back.id, 8);
    assert!(matches!(back.body, Request::Inventory));
    assert_eq!(back.body.kind(), "inventory");
    let inventory = Inventory {
        devices: vec![DeviceSpec::cpu(0), DeviceSpec::cuda(0), DeviceSpec::cuda(1)],
        held: vec![
            Held {
                role: "reference".into(),
                device: DeviceSpec::cuda(1),
            },
            Held {
                role: "reward".into(),
                device: DeviceSpec::cpu(0),
            },
        ],
    };
    let bytes = encode_response(9, Response::Inventory(inventory.clone())).unwrap();
    let back = decode_response(&bytes).unwrap();
    assert_eq!(back.id, 9);
    assert_eq!(back.body.kind(), "inventory");
    assert!(matches!(back.body, Response::Inventory(i) if i == inventory));
    // No arrays: the whole answer is MessagePack (an empty tensor part after it).
    let head = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 4 + head);
}

#[test]
fn ids_take_the_narrowest_dtype_that_holds_them() {
    for (top, bytes_per_id) in [(255u32, 1), (256, 2), (65_535, 2), (65_536, 4)] {
        let s = Sequences {
            pairs: vec![(vec![top; 1000], vec![top])],
            pad_id: 0,
            routing: None,
            observations: None,
        };
        let bytes = encode_request(1, Request::Values(s.clone())).unwrap();
        let head = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        let body = bytes.len() - 4 - head;
        let ids = 1001 * bytes_per_id;
        assert!(
            (ids..ids + 400).contains(&body),
            "max id {top}: {body} bytes"
        );
        let back = decode_request(&bytes).unwrap();
        assert!(
            matches!(back.body, Request::Values(b) if b == s),
            "max id {top}"
        );
    }
}

#[test]
fn the_arrays_leave_the_messagepack_part() {
    let big = TokenArray::new(64, 100, vec![0.1; 6400]).unwrap();
    let bytes = encode_response(1, Response::Tokens(big)).unwrap();
    let head = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert!(head < 64, "the MessagePack part is {head} bytes");
    let body = bytes.len() - 4 - head;
    assert!(
        (6400 * 4..6400 * 4 + 256).contains(&body),
        "{body} bytes of tensors"
    );
}

/// `bytes` with the first `from` replaced by `to` (same length) in the tensors' header.
fn patched(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from} not in the message"));
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to.as_bytes());
    out
}

fn tensor_error(bytes: &[u8]) -> TensorError {
    match decode_request(bytes) {
        Err(DecodeError::Tensors {
            id: 5,
            call: "values",
            source,
        }) => source,
        other => panic!("expected a tensor error of call 5, got {other:?}"),
    }
}

#[test]
fn a_malformed_blob_is_refused_naming_the_tensor() {
    let good = encode_request(5, Request::Values(seqs())).unwrap();
    let truncated = &good[..good.len() - 3];
    assert!(matches!(tensor_error(truncated), TensorError::Malformed(_)));
    let e = tensor_error(&patched(&good, "\"U32\"", "\"F32\""));
    assert!(
        matches!(
            &e,
            TensorError::Dtype {
                expected: "U8, U16 or U32",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("seqs.response_ids"), "{e}");
    let e = tensor_error(&patched(&good, "\"U8\"", "\"I8\""));
    assert!(
        e.to_string()
            .contains("expected dtype U8, U16 or U32, got I8"),
        "{e}"
    );
    let e = tensor_error(&patched(
        &good,
        "seqs.prompt_ids.lens",
        "seqs.prompt_idX.lens",
    ));
    assert!(
        e.to_string().contains("seqs.prompt_ids.lens is missing"),
        "{e}"
    );
    let no_blob = {
        let head = u32::from_le_bytes(good[..4].try_into().unwrap()) as usize;
        good[..4 + head].to_vec()
    };
    assert!(matches!(
        tensor_error(&no_blob),
        TensorError::Missing { .. }
    ));
    // A length that does not add up: the first prompt's length 3 → 4 (a u32 in the data).
    let e = decode_request(&lens_patched(&good)).unwrap_err();
    assert!(
        e.to_string().contains("seqs.prompt_ids.lens adds up to"),
        "{e}"
    );
    let cut = encode_request(5, Request::Values(seqs())).unwrap();
    assert!(matches!(
        decode_request(&cut[..2]),
        Err(DecodeError::Layout { .. })
    ));
}

/// `good` with the first row length of `seqs.prompt_ids.lens` raised by one.
fn lens_patched(good: &[u8]) -> Vec<u8> {
    let head = u32::from_le_bytes(good[..4].try_into().unwrap()) as usize;
    let blob = &good[4 + head..];
    let st = safetensors::SafeTensors::deserialize(blob).unwrap();
    let lens = st.tensor("seqs.prompt_ids.lens").unwrap();
    let data_start = blob.len()
        - st.tensors()
            .iter()
            .map(|(_, v)| v.data().len())
            .sum::<usize>();
    let offset = lens.data().as_ptr() as usize - blob.as_ptr() as usize;
    assert!(offset >= data_start);
    let mut out = good.to_vec();
    out[4 + head + offset] += 1;
    out
}

/// A refit bucket goes through the run folder's spool and arrives checked.
#[test]
fn a_refit_bucket_travels_through_the_spool_and_arrives_checked() {
    use crate::batch::{pack, Assembly, HostTensor};
    let w = vec![HostTensor {
        name: "lm_head.weight".into(),
        shape: vec![4, 8],
        values: odd(32)
            .into_iter()
            .map(|x| if x.is_nan() { 1.5 } else { x })
            .collect(),
    }];
    let bucket = pack(&w, 1 << 20).unwrap().remove(0);
    let run = tempfile::tempdir().unwrap();
    let spooled = super::spool::Spool::new(run.path())
        .write(9, 4, &bucket)
        .unwrap();
    let req = Request::RefitBucket {
        version: 4,
        spooled: spooled.clone(),
    };
    let bytes = encode_request(9, req).unwrap();
    // The bucket's bytes stay off the session: only its name, length and checksum travel.
    assert!(bytes.len() < 400, "{} bytes", bytes.len());
    let env = decode_request(&bytes).unwrap();
    let Request::RefitBucket {
        version,
        spooled: got,
    } = env.body
    else {
        panic!("{:?}", env.body.kind())
    };
    assert_eq!((version, &got), (4, &spooled));
    let got = super::spool::read(&got, 1 << 20).unwrap();
    assert_eq!(got, bucket);
    let mut a = Assembly::new(4);
    a.add(&got).unwrap();
    assert_eq!(a.finish().unwrap().tensors, w);
}

//! Round trips: every batch through serde (JSON), the per-token arrays through safetensors
//! bytes and through candle tensors, all bit for bit.

use super::*;
use candle_core::{Device, Tensor};

fn array(rows: usize, cols: usize, seed: f32) -> TokenArray {
    let data = (0..rows * cols)
        .map(|i| (i as f32 * 0.37 + seed).sin() * 3.1)
        .collect();
    TokenArray::new(rows, cols, data).unwrap()
}

fn rollout() -> RolloutBatch {
    RolloutBatch {
        policy_version: 7,
        samples: (0..3)
            .map(|i| Sample {
                sample_id: i,
                group_id: i / 2,
                prompt: vec![1, 2 + i as u32],
                response: vec![5; 1 + i as usize],
                logprobs: vec![-0.25 - i as f32; 1 + i as usize],
                finish: if i == 2 { Finish::Length } else { Finish::Stop },
                routing: None,
                observations: Vec::new(),
            })
            .collect(),
    }
}

fn experience() -> ExperienceBatch {
    ExperienceBatch {
        seqs: rollout().sequences(0),
        policy_version: 7,
        old_logprobs: array(3, 4, 0.1),
        advantages: array(3, 4, 0.2),
        ref_logprobs: array(3, 4, 0.3),
        rollout_logprobs: array(3, 4, 0.4),
        old_values: Some(array(3, 4, 0.5)),
        returns: None,
    }
}

fn json_round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(x: &T) -> T {
    serde_json::from_str(&serde_json::to_string(x).unwrap()).unwrap()
}

#[test]
fn batches_round_trip_through_serde() {
    let r = rollout();
    assert_eq!(json_round_trip(&r), r);
    let scored = ScoredBatch {
        rollout: r.clone(),
        rewards: vec![1.0, 0.0, -0.5],
        ref_logprobs: array(3, 4, 1.0),
        old_logprobs: array(3, 4, 2.0),
        trainer_scored_old: true,
        rollout_logprobs: r.sequences(0).place_response_values(&[
            vec![-0.25],
            vec![-1.25; 2],
            vec![-2.25; 3],
        ]),
        values: Some(array(3, 4, 0.5)),
        last_values: Some(vec![0.1, 0.2, 0.3]),
    };
    assert_eq!(json_round_trip(&scored), scored);
    let e = experience();
    assert_eq!(json_round_trip(&e), e);
    let req = RolloutRequest {
        samples: vec![SampleRequest {
            sample_id: 0,
            group_id: 0,
            prompt: vec![3, 4],
            max_new_tokens: 8,
            sampling: Sampling::greedy(),
            stop_token_ids: Vec::new(),
        }],
    };
    assert_eq!(json_round_trip(&req), req);
}

#[test]
fn arrays_round_trip_through_safetensors_and_tensors() {
    let e = experience();
    let bytes = e.arrays_to_safetensors().unwrap();
    let back = TokenArray::from_safetensors(&bytes).unwrap();
    let names: Vec<&str> = back.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "advantages",
            "old_logprobs",
            "old_values",
            "ref_logprobs",
            "rollout_logprobs"
        ]
    );
    assert_eq!(back[0].1, e.advantages);
    assert_eq!(back[2].1, *e.old_values.as_ref().unwrap());
    let t = e.advantages.to_tensor(&Device::Cpu).unwrap();
    assert_eq!(TokenArray::from_tensor(&t).unwrap(), e.advantages);
    let joined = TokenArray::concat_rows(vec![array(1, 4, 0.2), array(2, 4, 0.9)]).unwrap();
    let want = Tensor::cat(
        &[
            array(1, 4, 0.2).to_tensor(&Device::Cpu).unwrap(),
            array(2, 4, 0.9).to_tensor(&Device::Cpu).unwrap(),
        ],
        0,
    )
    .unwrap();
    assert_eq!(joined, TokenArray::from_tensor(&want).unwrap());
    assert!(TokenArray::concat_rows(vec![array(1, 4, 0.0), array(1, 3, 0.0)]).is_err());
    assert!(TokenArray::new(2, 2, vec![0.0; 3]).is_err());
}

#[test]
fn response_values_sit_at_the_response_positions() {
    let seqs = Sequences {
        pairs: vec![(vec![1, 2, 3], vec![4, 5]), (vec![1], vec![6])],
        pad_id: 0,
        routing: None,
        observations: None,
    };
    let a = seqs.place_response_values(&[vec![-1.0, -2.0], vec![-3.0]]);
    assert_eq!((a.rows(), a.cols()), (2, 4));
    assert_eq!(a.data(), &[0.0, 0.0, -1.0, -2.0, -3.0, 0.0, 0.0, 0.0]);
}

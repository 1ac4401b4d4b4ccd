//! The turn loop against a scripted policy: token-exact trajectories under a chat template
//! that strips earlier reasoning, and the limits that end episodes.

use super::*;
use crate::batch::{Finish, RolloutBatch, RolloutRequest, Sample, SampleRequest, Sampling};
use crate::error::RoleError;
use crate::roles::Generate;
use oxalign_models::text::byte_tokenizer::{self, ENDOFTEXT_ID, IM_END_ID};
use oxalign_models::text::chat_template::{ChatMessage, ChatTemplate};
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_models::text::tool_call::ToolCallFormat;
use std::sync::Mutex;
use std::time::Duration;

const TEMPLATE: &str = include_str!("../../tests/fixtures/think_stripping_chatml.jinja");

/// Answers turn `k` of every episode with `turns[k]` (ended by `<|im_end|>`) and records
/// the prompts it was asked to continue.
struct Scripted {
    tok: Tokenizer,
    turns: Vec<&'static str>,
    prompts: Mutex<Vec<Vec<Vec<u32>>>>,
}

impl Scripted {
    fn ids(&self, turn: usize) -> Vec<u32> {
        let text = self.turns[turn];
        // A turn written with its own stop token keeps it; others end the chat turn.
        let mut ids = self.tok.encode(text, false).unwrap();
        if !text.ends_with("<|endoftext|>") {
            ids.push(IM_END_ID);
        }
        ids
    }
}

#[async_trait]
impl Generate for Scripted {
    async fn generate(&self, req: RolloutRequest, _: String) -> Result<RolloutBatch, RoleError> {
        let mut prompts = self.prompts.lock().unwrap();
        let turn = prompts.len();
        prompts.push(req.samples.iter().map(|s| s.prompt.clone()).collect());
        let samples = req
            .samples
            .iter()
            .map(|r| {
                let mut response = self.ids(turn);
                response.truncate(r.max_new_tokens);
                let finish = if matches!(response.last(), Some(&IM_END_ID | &ENDOFTEXT_ID)) {
                    Finish::Stop
                } else {
                    Finish::Length
                };
                Sample {
                    sample_id: r.sample_id,
                    group_id: r.group_id,
                    prompt: r.prompt.clone(),
                    logprobs: vec![-0.5; response.len()],
                    response,
                    finish,
                    routing: None,
                    observations: Vec::new(),
                }
            })
            .collect();
        Ok(RolloutBatch {
            policy_version: 3,
            samples,
        })
    }
}

fn tokenizer() -> Tokenizer {
    let mut tok = byte_tokenizer::build();
    tok.set_chat_template(Some(ChatTemplate::new(TEMPLATE).unwrap()));
    tok
}

fn request(tok: &Tokenizer, n: usize, per_turn: usize) -> RolloutRequest {
    let text = tok
        .apply_chat_template(&[ChatMessage::user("What is 123*45+678?")], true)
        .unwrap();
    let prompt = tok.encode(&text, false).unwrap();
    RolloutRequest {
        samples: (0..n)
            .map(|i| SampleRequest {
                sample_id: i as u64,
                group_id: 0,
                prompt: prompt.clone(),
                max_new_tokens: per_turn,
                sampling: Sampling::greedy(),
                stop_token_ids: Vec::new(),
            })
            .collect(),
    }
}

fn limits(max_turns: usize, max_tokens: usize) -> EpisodeLimits {
    EpisodeLimits {
        max_turns,
        max_tokens,
        deadline: Duration::from_secs(30),
        chat: true,
    }
}

const ROW: EpisodeRow<'static> = EpisodeRow {
    prompt: "What is 123*45+678?",
    answer: Some("6213"),
    columns: None,
};

fn calculator() -> ToolRunner {
    ToolRunner::new(
        vec![Box::new(Calculator)],
        ToolCallFormat::Hermes,
        Duration::from_secs(5),
    )
}

const CALL: &str =
    "<think>\nFirst the product.\n</think>\n<tool_call>\n{\"name\": \"calculator\", \
                    \"arguments\": {\"expression\": \"123*45+678\"}}\n</tool_call>";
const ANSWER: &str = "<think>\nThe tool said 6213.\n</think>\n6213";

#[tokio::test]
async fn trained_ids_are_the_sampled_and_appended_ids_on_every_turn() {
    let mut tok = tokenizer();
    tok.set_tools(Some(calculator().schemas()));
    let policy = Scripted {
        tok: tok.clone(),
        turns: vec![CALL, ANSWER],
        prompts: Mutex::new(Vec::new()),
    };
    let req = request(&tok, 1, 200);
    let out = run_episodes(
        &policy,
        &calculator(),
        &tok,
        &req,
        &[ROW],
        limits(4, 1000),
        "t",
    )
    .await
    .unwrap();
    let (sample, record) = (&out.batch.samples[0], &out.records[0]);
    assert_eq!(record.end, EpisodeEnd::Done);
    assert_eq!(
        (record.turns, record.tool_calls, record.tool_errors),
        (2, 1, 0)
    );

    // The response is turn 1 as sampled, the tool's reply, turn 2 as sampled.
    let reply = "\n<|im_start|>user\n<tool_response>\n6213\n</tool_response><|im_end|>\n\
                 <|im_start|>assistant\n";
    let reply_ids = tok.encode(reply, false).unwrap();
    let want: Vec<u32> = [policy.ids(0), reply_ids.clone(), policy.ids(1)].concat();
    assert_eq!(sample.response, want);
    let obs_start = policy.ids(0).len();
    assert_eq!(
        sample.observations,
        vec![obs_start..obs_start + reply_ids.len()]
    );
    assert_eq!(record.last_turn, obs_start + reply_ids.len()..want.len());
    // Turn 2 continued exactly the ids sampled and appended, not a re-rendering.
    let prompts = policy.prompts.lock().unwrap();
    assert_eq!(
        prompts[1][0],
        [
            &req.samples[0].prompt[..],
            &want[..obs_start + reply_ids.len()]
        ]
        .concat()
    );
    assert_eq!(sample.logprobs.len(), want.len());
    assert!(sample.logprobs[obs_start..obs_start + reply_ids.len()]
        .iter()
        .all(|&l| l == 0.0));

    // Rendering the conversation again would train on other ids: the template drops turn
    // 1's reasoning.
    let conversation = [
        ChatMessage::user(ROW.prompt),
        ChatMessage::assistant(CALL),
        ChatMessage::new("tool", "6213"),
        ChatMessage::assistant(ANSWER),
    ];
    let rerendered = tok
        .encode(
            &tok.apply_chat_template(&conversation, false).unwrap(),
            false,
        )
        .unwrap();
    let trained = [&req.samples[0].prompt[..], &want[..]].concat();
    assert_ne!(rerendered, trained);
    let decoded = |ids: &[u32]| tok.decode(ids, false).unwrap();
    assert!(decoded(&trained).contains("First the product."));
    assert!(!decoded(&rerendered).contains("First the product."));

    // The trainer's mask covers exactly the model's tokens.
    let seqs = out.batch.sequences(0);
    let batch = seqs.batch(&candle_core::Device::Cpu).unwrap();
    let mask = batch.response_mask.to_vec2::<f32>().unwrap();
    let p = req.samples[0].prompt.len();
    for (j, _) in want.iter().enumerate() {
        let in_reply = (obs_start..obs_start + reply_ids.len()).contains(&j);
        assert_eq!(
            mask[0][p - 1 + j],
            if in_reply { 0.0 } else { 1.0 },
            "position {j}"
        );
    }
    assert_eq!(batch.response_tokens(), want.len() - reply_ids.len());
}

/// Episodes of `n` rows whose turns are `turns`, each turn limited to `per_turn` tokens.
async fn scripted_run(
    turns: Vec<&'static str>,
    n: usize,
    per_turn: usize,
    l: EpisodeLimits,
) -> EpisodeOutcome {
    let tok = tokenizer();
    let policy = Scripted {
        tok: tok.clone(),
        turns,
        prompts: Mutex::new(Vec::new()),
    };
    let req = request(&tok, n, per_turn);
    let rows = vec![ROW; n];
    run_episodes(&policy, &calculator(), &tok, &req, &rows, l, "t")
        .await
        .unwrap()
}

#[tokio::test]
async fn turn_limit_token_budget_and_cut_turns_end_episodes() {
    let out = scripted_run(vec![CALL, CALL, CALL], 2, 200, limits(2, 1000)).await;
    assert_eq!(out.records[0].end, EpisodeEnd::TurnLimit);
    assert_eq!((out.records[1].turns, out.records[1].end_turn), (2, 1));
    assert!(out.batch.samples.iter().all(|s| s.finish == Finish::Length));
    let out = scripted_run(vec![CALL, CALL], 1, 200, limits(4, 120)).await;
    assert_eq!(out.records[0].end, EpisodeEnd::TokenBudget);
    assert!(out.batch.samples[0].response.len() <= 120);
    let out = scripted_run(vec![CALL], 1, 10, limits(4, 1000)).await;
    assert_eq!(out.records[0].end, EpisodeEnd::TurnLength);
    assert_eq!(out.batch.samples[0].response.len(), 10);
    // A call ended by the end of text cannot be answered in the chat: the episode is over,
    // by a rule, not failed.
    const CALL_EOT: &str = "<tool_call>{\"name\": \"calculator\", \"arguments\":                             {\"expression\": \"1+1\"}}</tool_call><|endoftext|>";
    let out = scripted_run(vec![CALL_EOT], 1, 200, limits(4, 1000)).await;
    assert_eq!(out.records[0].end, EpisodeEnd::EndOfText);
    assert!(!out.records[0].end.failed());
    assert_eq!(out.batch.samples[0].finish, Finish::Stop);
}

/// An environment whose episodes never answer.
struct Silent;

#[async_trait]
impl Environment for Silent {
    async fn reset(&self, _: EpisodeRow<'_>) -> Result<Box<dyn Episode>, EnvError> {
        Ok(Box::new(Silent))
    }
}

#[async_trait]
impl Episode for Silent {
    async fn step(&mut self, _: usize, _: &str) -> Result<Transition, EnvError> {
        futures::future::pending().await
    }
}

#[tokio::test]
async fn a_silent_environment_times_out_at_the_deadline() {
    let tok = tokenizer();
    let policy = Scripted {
        tok: tok.clone(),
        turns: vec![CALL],
        prompts: Mutex::new(Vec::new()),
    };
    let req = request(&tok, 1, 200);
    let mut l = limits(4, 1000);
    l.deadline = Duration::from_millis(300);
    let began = std::time::Instant::now();
    let out = run_episodes(&policy, &Silent, &tok, &req, &[ROW], l, "t")
        .await
        .unwrap();
    assert!(began.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(out.records[0].end, EpisodeEnd::TimedOut(_)),
        "{:?}",
        out.records[0]
    );
    assert!(out.records[0].end.failed());
    assert_eq!(out.batch.samples[0].response, policy.ids(0));
}

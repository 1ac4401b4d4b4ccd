//! Multi-turn episodes (`[env]`) in a real run: a fresh tiny model learns in a short SFT
//! warm-up to open each chat turn with a calculator call, then GRPO generates episodes with
//! the engine: the calculator answers inside the loop, the reply is appended as tokens, and
//! the step reports turns and tool calls. Bad `[env]` keys are refused with exit 2.

mod cli_support;
use cli_support::{ok, oxalign};
use serde_json::{json, Value};
use std::path::Path;

/// Prompts asking for products, each with a calculator call as its SFT "answer" (the turn
/// the warm-up teaches; `<|im_end|>` ends the chat turn).
fn write_prompts(dir: &Path) {
    let rows: String = (0..8)
        .map(|i| {
            let (a, b) = (12 + i, 34 + 3 * i);
            let call = format!(
                "<tool_call>\n{{\"name\": \"calculator\", \"arguments\": {{\"expression\": \"{a}*{b}\"}}}}\n</tool_call><|im_end|>"
            );
            let row = json!({
                "messages": [{"role": "user", "content": format!("What is {a}*{b}?")}],
                "answer": call,
            });
            format!("{row}\n")
        })
        .collect();
    std::fs::write(dir.join("prompts.jsonl"), rows).unwrap();
}

const RECIPE: &str = r#"
[run]
name = "episodes"
seed = 3
steps = 2
checkpoint_every = 2

[model]
init_family = "llama"
init_preset = "tiny"

[data]
task = "file"
path = "prompts.jsonl"
eval_fraction = 0.0

[sft]
steps = 60
batch_size = 8
lr = 3e-3
warmup_steps = 2
examples = 8

[rl]
algorithm = "grpo"
prompts_per_step = 4
samples_per_prompt = 2
minibatch_size = 8
max_new_tokens = 100
temperature = 0.3
log_samples = 4

[env]
tools = ["calculator"]
max_turns = 3
max_tokens = 300
"#;

fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|m: &Value| m.get("episode_turns_mean").is_some())
        .collect()
}

#[test]
fn grpo_episodes_call_the_calculator_inside_the_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_prompts(dir);
    std::fs::write(dir.join("r.toml"), RECIPE).unwrap();
    ok(dir, &["train", "r.toml", "--quiet"]);
    let run = dir.join("runs/episodes");
    let steps = metrics(&run);
    assert_eq!(steps.len(), 2, "both RL steps report episodes");
    for m in &steps {
        assert!(m["episode_tool_calls_mean"].as_f64().unwrap() > 0.0, "{m}");
        assert!(m["episode_turns_mean"].as_f64().unwrap() > 1.0, "{m}");
        assert_eq!(m["episode_timed_out"].as_f64(), Some(0.0), "{m}");
    }
    let samples = std::fs::read_to_string(run.join("samples.jsonl")).unwrap();
    let logged: Vec<Value> = samples
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let with_call = logged
        .iter()
        .filter(|s| s["episode"]["tool_calls"].as_u64() > Some(0))
        .collect::<Vec<_>>();
    assert!(!with_call.is_empty(), "{samples}");
    let mut checked = 0;
    for s in with_call {
        let transcript = s["episode"]["transcript"].as_str().unwrap();
        // The calculator's answer to the call the model wrote follows it, as the chat
        // template wraps a tool turn (calls of the form `a*b` are checked).
        let expr = transcript
            .split("\"expression\": \"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("");
        let factors: Option<Vec<u64>> = expr.split('*').map(|f| f.parse().ok()).collect();
        let Some(factors) = factors.filter(|f| f.len() == 2) else {
            continue;
        };
        let value: u64 = factors.iter().product();
        let reply = format!(
            "</tool_call><|im_end|>\n<|im_start|>tool\n{value}<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(
            transcript.contains(&reply),
            "{transcript:?} lacks {reply:?}"
        );
        checked += 1;
    }
    assert!(checked > 0, "no call of the form a*b:\n{samples}");
}

#[test]
fn bad_env_keys_are_refused_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_prompts(dir);
    for (set, says) in [
        ("env.tools=[\"browser\"]", "unknown tool \"browser\""),
        ("env.max_turns=0", "env.max_turns"),
        ("env.max_tokens=50", "below rl.max_new_tokens"),
        ("env.tool_timeout_s=0", "env.tool_timeout_s"),
        (
            "env.http_tools=[{name=\"calculator\", url=\"http://127.0.0.1:9/call\"}]",
            "no other tool has",
        ),
        (
            "env.http_tools=[{name=\"lookup\", url=\"file:///etc/passwd\"}]",
            "env.http_tools[0].url",
        ),
    ] {
        std::fs::write(dir.join("r.toml"), RECIPE).unwrap();
        let out = oxalign(dir, &["train", "r.toml", "--check", "--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{set}: {err}");
        assert!(err.contains(says), "{set}: {err}");
    }
}

//! Multi-turn episodes against an environment server (`env.kind = "http"`): a Python
//! environment class served by `tools/env_server.py` drives a GRPO run end to end (its
//! replies go into the episodes, its rewards into the scores); an environment that hangs on
//! some prompts does not stall the run: those episodes end as timed out and the steps
//! complete; an environment server that is down fails the run within its retry budget with
//! a message naming the URL, and no step is trained on made-up rewards.

mod child_support;
use child_support::{spawn_announced, KillOnDrop};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The environment: the first turn gets a `user` reply and 0.25, the second ends the
/// episode with 0.5; a prompt with "hang" in it never gets an answer.
const PYTHON_ENV: &str = r#"
import time

class Drill:
    def __init__(self, prompt, answer=None, **columns):
        self.prompt = prompt
        self.turns = 0
        print("episode for", prompt)

    def step(self, turn):
        if "hang" in self.prompt:
            time.sleep(3600)
        self.turns += 1
        if self.turns == 1:
            return {"reply": "Check it once more.", "reward": 0.25, "done": False}
        return {"reward": 0.5, "done": True}
"#;

/// 8 chat prompts, those at `hang` rows asking the environment to hang; each row's SFT
/// "answer" is a short turn ended by `<|im_end|>`.
fn write_prompts(dir: &Path, hang: &[usize]) {
    let rows: String = (0..8)
        .map(|i| {
            let verb = if hang.contains(&i) { "hang" } else { "add" };
            let row = json!({
                "messages": [{"role": "user", "content": format!("Please {verb} {i} and {i}.")}],
                "answer": format!("{}<|im_end|>", 2 * i),
            });
            format!("{row}\n")
        })
        .collect();
    std::fs::write(dir.join("prompts.jsonl"), rows).unwrap();
}

/// A GRPO recipe with episodes served at `url`, `extra` appended to `[env]`.
fn recipe(url: &str, extra: &str) -> String {
    format!(
        r#"
[run]
name = "env"
seed = 4
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
steps = 40
batch_size = 8
lr = 3e-3
warmup_steps = 2
examples = 8

[rl]
algorithm = "grpo"
prompts_per_step = 4
samples_per_prompt = 2
minibatch_size = 8
max_new_tokens = 16
temperature = 0.3
log_samples = 8

[env]
kind = "http"
max_turns = 3
max_tokens = 80
{extra}

[env.http]
url = "{url}"
timeout_s = 3
max_retries = 1
backoff_min_s = 0.05
backoff_max_s = 0.1
retry_budget_s = 2
"#
    )
}

/// `tools/env_server.py` serving [`PYTHON_ENV`] (written into `dir`) on a free port.
fn env_server(dir: &Path) -> (KillOnDrop, String) {
    std::fs::write(dir.join("drill.py"), PYTHON_ENV).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/env_server.py");
    spawn_announced(
        Command::new("python3")
            .arg(script)
            .args(["--file", "drill.py", "--class", "Drill", "--port", "0"])
            .current_dir(dir),
    )
}

fn oxalign(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run oxalign")
}

fn rl_metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("runs/env/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|m: &Value| m.get("episode_turns_mean").is_some())
        .collect()
}

#[test]
fn a_python_environment_drives_episodes_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_prompts(dir, &[]);
    let (_server, url) = env_server(dir);
    std::fs::write(dir.join("r.toml"), recipe(&url, "")).unwrap();
    let out = oxalign(dir, &["train", "r.toml", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let steps = rl_metrics(dir);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        assert!(m["episode_turns_mean"].as_f64().unwrap() > 1.0, "{m}");
        // The environment's rewards are in the scores: 0.25 after the first turn.
        assert!(m["reward_mean"].as_f64().unwrap() >= 0.25, "{m}");
        assert_eq!(m["episode_env_failed"].as_f64(), Some(0.0), "{m}");
    }
    let samples = std::fs::read_to_string(dir.join("runs/env/samples.jsonl")).unwrap();
    assert!(
        samples.contains("<|im_start|>user\\nCheck it once more.<|im_end|>"),
        "the reply is in the transcripts:\n{samples}"
    );
}

#[test]
fn a_hanging_environment_times_out_its_episodes_and_the_steps_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_prompts(dir, &[1, 2]);
    let (_server, url) = env_server(dir);
    let extra = "on_failure = \"score\"\nfailure_reward = -1.0\ntimeout_s = 30";
    std::fs::write(dir.join("r.toml"), recipe(&url, extra)).unwrap();
    let began = Instant::now();
    let out = oxalign(dir, &["train", "r.toml", "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(began.elapsed() < Duration::from_secs(120));
    let steps = rl_metrics(dir);
    assert_eq!(steps.len(), 2);
    // Step 1 reads prompts 0..4: rows 1 and 2 hang, two samples each.
    assert_eq!(
        steps[0]["episode_timed_out"].as_f64(),
        Some(4.0),
        "{}",
        steps[0]
    );
    let samples = std::fs::read_to_string(dir.join("runs/env/samples.jsonl")).unwrap();
    let hung: Vec<Value> = samples
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|s| s["prompt"].as_str().unwrap().contains("hang"))
        .collect();
    assert!(!hung.is_empty());
    for s in hung {
        let end = s["episode"]["end"].as_str().unwrap();
        assert!(end.starts_with("timed out"), "{s}");
        assert_eq!(s["reward"].as_f64(), Some(-1.0), "{s}");
    }
}

#[test]
fn an_environment_server_that_is_down_fails_the_run_within_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_prompts(dir, &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    std::fs::write(dir.join("r.toml"), recipe(&url, "")).unwrap();
    let began = Instant::now();
    let out = oxalign(dir, &["train", "r.toml", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(began.elapsed() < Duration::from_secs(120));
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(&format!("{url}/reset")), "{err}");
    assert!(err.contains("nothing is left to train on"), "{err}");
    let trained = dir.join("runs/env/metrics.jsonl");
    let lines = std::fs::read_to_string(trained).unwrap_or_default();
    assert!(
        !lines.contains("episode_turns_mean"),
        "no RL step was trained:\n{lines}"
    );
}

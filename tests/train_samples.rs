//! `rl.log_samples`: every RL step writes its first k rollout samples to `samples.jsonl`
//! (prompt, decoded completion, reward, reference answer, finish reason), and each reward is
//! the exact-match verdict on its completion.

mod cli_support;
mod recipe_support;
use cli_support::ok;
use recipe_support::{tiny_start, TINY_PPO};
use serde_json::Value;

#[test]
fn each_rl_step_logs_its_first_samples_with_their_rewards() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = tiny_start("s", "2", 2, 4, "") + TINY_PPO;
    std::fs::write(dir.path().join("r.toml"), recipe).unwrap();
    ok(
        dir.path(),
        &["train", "r.toml", "--quiet", "--set", "rl.log_samples=3"],
    );
    let text = std::fs::read_to_string(dir.path().join("runs/s/samples.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("whole JSON lines only"))
        .collect();
    assert_eq!(lines.len(), 2 * 3, "3 samples per step:\n{text}");
    for (i, line) in lines.iter().enumerate() {
        for key in [
            "step",
            "prompt",
            "completion",
            "reward",
            "answer",
            "finish_reason",
        ] {
            assert!(line.get(key).is_some(), "{key} missing in {line}");
        }
        assert_eq!(line["step"].as_u64(), Some(1 + i as u64 / 3), "{line}");
        let completion = line["completion"].as_str().unwrap();
        let answer = line["answer"]
            .as_str()
            .expect("arithmetic rows have answers");
        let first = completion.split('\n').next().unwrap_or("").trim();
        let want = if first == answer.trim() { 1.0 } else { -0.5 };
        assert_eq!(line["reward"].as_f64(), Some(want), "{line}");
        let finish = line["finish_reason"].as_str().unwrap();
        assert!(finish == "stop" || finish == "length", "{line}");
        assert!(!line["prompt"].as_str().unwrap().is_empty(), "{line}");
    }
}

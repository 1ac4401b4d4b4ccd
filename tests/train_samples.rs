//! What a run logs beside `metrics.jsonl`. `rl.log_samples`: every RL step writes its
//! first k rollout samples to `samples.jsonl` (prompt, decoded completion, reward, reference
//! answer, finish reason), and each reward is the exact-match verdict on its completion.
//! `log.tensorboard`: an event file holds every metric of every step.

mod cli_support;
mod recipe_support;
use cli_support::{ok, oxalign};
use oxalign_actors::monitor::tensorboard::{read_records, Event};
use prost::Message;
use recipe_support::{tiny_start, TINY_PPO};
use serde_json::Value;
use std::collections::BTreeMap;

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

/// (metric, step) -> value of a run's TensorBoard folder, every record's checksums checked.
fn tensorboard_scalars(run: &std::path::Path) -> BTreeMap<(String, u64), f32> {
    let files: Vec<_> = std::fs::read_dir(run.join("tensorboard"))
        .expect("a tensorboard folder")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one event file per process: {files:?}");
    let bytes = std::fs::read(&files[0]).unwrap();
    let mut out = BTreeMap::new();
    for record in read_records(&bytes).expect("intact records") {
        let event = Event::decode(record).expect("an Event");
        for v in event.summary.iter().flat_map(|s| &s.value) {
            let step = u64::try_from(event.step).unwrap();
            let value = v.simple_value.expect("scalars only");
            assert!(
                out.insert((v.tag.clone(), step), value).is_none(),
                "{v:?} twice"
            );
        }
    }
    out
}

#[test]
fn log_tensorboard_writes_every_metric_of_every_step_as_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = tiny_start("tb", "2", 2, 4, "") + TINY_PPO;
    std::fs::write(dir.path().join("r.toml"), recipe).unwrap();
    ok(
        dir.path(),
        &[
            "train",
            "r.toml",
            "--quiet",
            "--set",
            "log.tensorboard=true",
        ],
    );
    let run = dir.path().join("runs/tb");
    let mut want = BTreeMap::new();
    for line in std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
    {
        let m: BTreeMap<String, Value> = serde_json::from_str(line).unwrap();
        let step = m["step"].as_u64().unwrap();
        for (k, v) in m.iter().filter(|(k, _)| *k != "step" && *k != "unix_ms") {
            let v = v.as_f64().map_or(f32::NAN, |v| v as f32);
            want.insert((k.clone(), step), v);
        }
    }
    let got = tensorboard_scalars(&run);
    assert!(want.keys().any(|(k, _)| k == "reward_mean"), "{want:?}");
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (key, w) in &want {
        let g = got[key];
        assert!(g == *w || (g.is_nan() && w.is_nan()), "{key:?}: {g} vs {w}");
    }
    let recipe = std::fs::read_to_string(run.join("recipe.toml")).unwrap();
    assert!(recipe.contains("tensorboard = true"), "{recipe}");
}

#[test]
fn log_completions_every_prints_the_logged_samples_under_every_nth_step() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = tiny_start("c", "2", 2, 4, "") + TINY_PPO;
    std::fs::write(dir.path().join("r.toml"), recipe).unwrap();
    let set = [
        "--set",
        "rl.log_samples=3",
        "--set",
        "log.completions_every=2",
    ];
    let out = ok(dir.path(), &[&["train", "r.toml"][..], &set].concat());
    let shown: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("    sample: "))
        .collect();
    assert_eq!(shown.len(), 3, "step 2's 3 samples, none of step 1:\n{out}");
    let samples = std::fs::read_to_string(dir.path().join("runs/c/samples.jsonl")).unwrap();
    for (line, record) in shown.iter().zip(samples.lines().skip(3)) {
        let r: Value = serde_json::from_str(record).unwrap();
        assert_eq!(r["step"], 2);
        let prompt = format!("{:?}", r["prompt"].as_str().unwrap());
        let reward = format!("reward {:.3}", r["reward"].as_f64().unwrap());
        assert!(
            line.contains(&prompt) && line.contains(&reward),
            "{line} vs {r}"
        );
    }
    let refused = oxalign(
        dir.path(),
        &[
            "train",
            "r.toml",
            "--check",
            "--set",
            "log.completions_every=1",
            "--set",
            "rl.log_samples=0",
        ],
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("log.completions_every") && err.contains("rl.log_samples"),
        "{err}"
    );
}

//! `oxalign train` with an HTTP reward service on 127.0.0.1: a service that scores exact
//! match gives the run the same rewards, losses and checkpoints as the built-in exact-match
//! reward (without the accuracy, which only a verifier defines), and a service that dies
//! mid-run fails it with exit code 1, a message naming the URL, the attempts and the last
//! failure, and no checkpoint past the last good step. A verifier sum of one exact-match
//! verifier is the built-in reward, accuracy included. `--check` names bad reward settings.
//! TRL-style Python reward functions served by `tools/reward_server.py` train like the
//! built-in reward, and one that raises fails the run with the Python error in the message;
//! a prompt file's own columns reach the function as keyword arguments. `reward.kind =
//! "python"` starts that server itself and trains the same way.

mod child_support;
mod recipe_support;
use axum::routing::post;
use axum::{Json, Router};
use child_support::{spawn_announced, KillOnDrop};
use recipe_support::tiny_start;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Tiny GRPO (no critic): a short SFT warm-up so some answers are right, then 3 RL steps of
/// 16 responses, each checkpointed.
fn recipe() -> String {
    tiny_start("h", "3", 1, 40, "")
        + r#"
[rl]
algorithm = "grpo"
prompts_per_step = 8
samples_per_prompt = 2
minibatch_size = 8
lr = 3e-4
kl_coef = 0.02
max_new_tokens = 3
"#
}

/// `[reward.http]` for `url`: 8 rows per request (two requests a step, both at once) and
/// quick retries.
fn http_reward(url: &str) -> String {
    format!(
        "\n[reward]\nkind = \"http\"\n\n[reward.http]\nurl = \"{url}\"\ntimeout_s = 2\n\
         max_retries = 2\nbackoff_min_s = 0.05\nbackoff_max_s = 0.1\nretry_budget_s = 2\n\
         rows_per_request = 8\nconcurrency = 2\n"
    )
}

/// An exact-match reward service (1 when the response's first line, trimmed, equals the
/// answer, else 0) that answers `serve_for` requests, then shuts down. Returns its URL.
fn exact_match_service(serve_for: usize) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let served = Arc::new(AtomicUsize::new(0));
            let done = Arc::new(tokio::sync::Notify::new());
            let (s, d) = (served.clone(), done.clone());
            let app = Router::new().route(
                "/score",
                post(move |Json(body): Json<Value>| async move {
                    if s.fetch_add(1, Ordering::SeqCst) + 1 >= serve_for {
                        d.notify_one();
                    }
                    Json(json!({ "rewards": exact_match(&body) }))
                }),
            );
            let stop = async move { done.notified().await };
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
                .unwrap();
        });
    });
    format!("http://{}/score", rx.recv().unwrap())
}

fn exact_match(body: &Value) -> Vec<f64> {
    let rows = |k: &str| body[k].as_array().cloned().unwrap_or_default();
    rows("responses")
        .iter()
        .zip(rows("answers"))
        .map(|(r, a)| {
            let line = r.as_str().unwrap_or("").split('\n').next().unwrap_or("");
            let ok = a.as_str().is_some_and(|a| line.trim() == a.trim());
            f64::from(u8::from(ok))
        })
        .collect()
}

struct Run {
    out: Output,
    metrics: Vec<Value>,
    summary: Option<Value>,
    checkpoints: Vec<String>,
}

fn train(dir: &Path, recipe: &str, args: &[&str]) -> Run {
    std::fs::write(dir.join("r.toml"), recipe).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(["train", "r.toml", "--quiet"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run oxalign");
    let run = dir.join("runs/h");
    let read = |f: &str| std::fs::read_to_string(run.join(f)).ok();
    let metrics = read("metrics.jsonl")
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let summary = read("summary.json").map(|t| serde_json::from_str(&t).unwrap());
    let mut checkpoints: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    checkpoints.sort();
    Run {
        out,
        metrics,
        summary,
        checkpoints,
    }
}

/// [`train`] with the reward service at `url`.
fn train_scored_by(dir: &Path, url: &str, args: &[&str]) -> Run {
    train(dir, &format!("{}{}", recipe(), http_reward(url)), args)
}

/// `run` succeeded and trained as the built-in reward's `local` run did: every metric of
/// [`SAME`] equal step for step, the same checkpoints.
fn assert_trained_like(local: &Run, run: &Run) {
    assert!(run.out.status.success(), "run: {}", stderr(run));
    assert_eq!(run.metrics.len(), 3);
    for (x, y) in local.metrics.iter().zip(&run.metrics) {
        for k in SAME {
            assert_eq!(x[k], y[k], "step {}: {k} differs", x["step"]);
        }
    }
    assert_eq!(local.checkpoints, run.checkpoints);
}

fn stderr(r: &Run) -> String {
    String::from_utf8_lossy(&r.out.stderr).into_owned()
}

/// Metrics that the reward source must not change.
const SAME: &[&str] = &[
    "reward_mean",
    "reward_std",
    "kl",
    "policy_loss",
    "entropy",
    "grad_norm",
    "adv_mean",
    "adv_std",
    "response_len",
    "policy_version",
];

/// The run with the built-in exact-match reward, shared by the tests.
fn local() -> &'static Run {
    static LOCAL: OnceLock<(tempfile::TempDir, Run)> = OnceLock::new();
    let (_, run) = LOCAL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let run = train(dir.path(), &recipe(), &[]);
        assert!(run.out.status.success(), "local run: {}", stderr(&run));
        (dir, run)
    });
    run
}

#[test]
fn a_service_scoring_exact_match_trains_like_the_built_in_reward() {
    let l = local();
    let served = tempfile::tempdir().unwrap();
    let url = exact_match_service(usize::MAX);
    let h = train_scored_by(served.path(), &url, &[]);
    assert_trained_like(l, &h);
    let rewarded: f64 = l
        .metrics
        .iter()
        .map(|m| m["reward_mean"].as_f64().unwrap())
        .sum();
    assert!(
        rewarded > 0.0,
        "the warm-up earns some reward, so the comparison means something"
    );
    for (x, y) in l.metrics.iter().zip(&h.metrics) {
        assert!(
            x["accuracy"].is_number(),
            "exact match defines accuracy: {x}"
        );
        assert!(y.get("accuracy").is_none(), "a service defines none: {y}");
    }
    let (ls, hs) = (l.summary.as_ref().unwrap(), h.summary.as_ref().unwrap());
    assert!(ls["accuracy_final"].is_number(), "{ls}");
    assert!(
        hs["accuracy_final"].is_null(),
        "no accuracy without a verifier: {hs}"
    );
    assert_eq!(ls["reward_last"], hs["reward_last"]);
}

#[test]
fn one_exact_match_verifier_is_the_exact_match_reward() {
    let dir = tempfile::tempdir().unwrap();
    let verifiers =
        "\n[reward]\nkind = \"verifiers\"\n\n[[reward.verifiers]]\nkind = \"exact_match\"\n";
    let v = train(dir.path(), &format!("{}{verifiers}", recipe()), &[]);
    assert!(v.out.status.success(), "verifiers run: {}", stderr(&v));
    let l = local();
    assert_eq!(v.metrics.len(), l.metrics.len());
    for (x, y) in l.metrics.iter().zip(&v.metrics) {
        for k in SAME.iter().chain(&["accuracy"]) {
            assert_eq!(x[k], y[k], "step {}: {k} differs", x["step"]);
        }
    }
    let (ls, vs) = (l.summary.as_ref().unwrap(), v.summary.as_ref().unwrap());
    assert_eq!(ls["accuracy_final"], vs["accuracy_final"]);
}

#[test]
fn a_service_that_dies_fails_the_run_after_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // Two requests a step: steps 1 and 2 are scored, then the service is gone.
    let url = exact_match_service(4);
    let r = train_scored_by(dir.path(), &url, &["--set", "supervision.max_restarts=1"]);
    let err = stderr(&r);
    assert_eq!(r.out.status.code(), Some(1), "{err}");
    for want in [
        "RL step 3: reward, reward",
        &format!("reward service {url}: a request of 8 rows failed after 3 attempt(s)"),
        "last failure:",
        "restarting reward",
        "restart budget is spent",
        "--resume",
    ] {
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(r.metrics.len(), 2, "steps 1 and 2 only");
    assert_eq!(
        r.checkpoints,
        ["step_000000", "step_000001", "step_000002"],
        "nothing saved past the last good step"
    );
    assert!(r.summary.is_none());
}

/// TRL-style reward functions: `exact` scores as the built-in exact match; `broken` raises.
const PYTHON_REWARDS: &str = r#"
print("rewards.py imported")  # users print; the server's stdout must stay its address

def exact(prompts, completions, answer, **kwargs):
    print("scoring", len(completions), "rows")
    return [
        1.0 if a is not None and c.split("\n")[0].strip() == a.strip() else 0.0
        for c, a in zip(completions, answer)
    ]

def broken(prompts, completions, **kwargs):
    raise ZeroDivisionError("the user's bug")

def by_columns(prompts, completions, solution, bonus, **kwargs):
    # TRL passes dataset columns as keyword arguments, one value per row, in row order
    for p, b in zip(prompts, bonus):
        if b != int(p.split("+")[0]):
            raise ValueError(f"bonus {b!r} is not the row of {p!r}")
    return [
        1.0 + 0.5 * (c.split("\n")[0].strip() == s) for c, s in zip(completions, solution)
    ]
"#;

/// `tools/reward_server.py` serving `function` of [`PYTHON_REWARDS`] (written into `dir`) on a
/// free port of 127.0.0.1; killed when dropped. Returns it and its URL.
fn python_service(dir: &Path, function: &str) -> (KillOnDrop, String) {
    let file = dir.join("rewards.py");
    std::fs::write(&file, PYTHON_REWARDS).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/reward_server.py");
    let (server, url) = spawn_announced(
        Command::new("python3")
            .arg(script)
            .args(["--file", file.to_str().unwrap(), "--function", function])
            .args(["--port", "0"])
            .stderr(std::process::Stdio::null()),
    );
    assert!(url.starts_with("http://127.0.0.1:"), "server said {url:?}");
    (server, url)
}

#[test]
fn a_python_reward_function_trains_like_the_built_in_reward() {
    let l = local();
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = python_service(dir.path(), "exact");
    let p = train_scored_by(dir.path(), &url, &[]);
    assert_trained_like(l, &p);
}

#[test]
fn a_python_reward_function_that_raises_fails_the_run_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = python_service(dir.path(), "broken");
    let r = train_scored_by(dir.path(), &url, &["--set", "supervision.max_restarts=0"]);
    let err = stderr(&r);
    assert_eq!(r.out.status.code(), Some(1), "{err}");
    for want in [
        "500",
        "reward function 'broken' raised ZeroDivisionError: the user's bug",
    ] {
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }
    assert!(r.metrics.is_empty(), "no step trains on a failed reward");
    assert!(r.summary.is_none());
}

/// A TRL-style prompt file (`solution` as the answer column, a `bonus` column) scored by a
/// Python function that reads both by name: every sample's reward is 1.5 for a response
/// equal to its row's `solution`, else 1.0, and the function checks each `bonus` against its
/// row's prompt.
#[test]
fn a_prompt_files_columns_reach_the_python_reward_function() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..10)
        .flat_map(|a| (0..10).map(move |b| (a, b)))
        .map(|(a, b)| {
            let row =
                json!({"prompt": format!("{a}+{b}="), "solution": (a + b).to_string(), "bonus": a});
            format!("{row}\n")
        })
        .collect();
    std::fs::write(dir.path().join("prompts.jsonl"), rows).unwrap();
    let (_server, url) = python_service(dir.path(), "by_columns");
    let recipe = recipe().replace(
        "[data]\n",
        "[data]\ntask = \"file\"\npath = \"prompts.jsonl\"\nanswer_field = \"solution\"\n",
    );
    let r = train(
        dir.path(),
        &format!("{recipe}{}", http_reward(&url)),
        &[
            "--set",
            "rl.log_samples=16",
            "--set",
            "supervision.max_restarts=0",
        ],
    );
    assert!(r.out.status.success(), "{}", stderr(&r));
    let samples = std::fs::read_to_string(dir.path().join("runs/h/samples.jsonl")).unwrap();
    let mut right = 0;
    for line in samples.lines() {
        let s: Value = serde_json::from_str(line).unwrap();
        let first = s["completion"]
            .as_str()
            .unwrap()
            .split('\n')
            .next()
            .unwrap()
            .trim();
        let correct = first == s["answer"].as_str().unwrap();
        right += usize::from(correct);
        let want = if correct { 1.5 } else { 1.0 };
        assert_eq!(s["reward"].as_f64(), Some(want), "{s}");
    }
    assert_eq!(samples.lines().count(), 3 * 16);
    assert!(right > 0, "the warm-up gets some sums right:\n{samples}");
}

/// `reward.kind = "python"` with `function` of [`PYTHON_REWARDS`] (written into `dir`) and
/// the test client settings of [`http_reward`] but the URL.
fn python_kind(dir: &Path, function: &str) -> String {
    std::fs::write(dir.join("rewards.py"), PYTHON_REWARDS).unwrap();
    let client = http_reward("").replace("url = \"\"\n", "");
    format!(
        "{}{}\n[reward.python]\nfile = \"rewards.py\"\nfunctions = [\"{function}\"]\n",
        recipe(),
        client.replace("kind = \"http\"", "kind = \"python\"")
    )
}

#[test]
fn reward_kind_python_starts_the_server_and_trains_like_the_built_in_reward() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), &python_kind(dir.path(), "exact"), &[]);
    assert_trained_like(local(), &run);
}

#[test]
fn reward_kind_python_names_a_missing_function_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(
        dir.path(),
        &python_kind(dir.path(), "no_such_function"),
        &[],
    );
    let err = stderr(&run);
    assert_eq!(run.out.status.code(), Some(2), "{err}");
    for want in ["reward.python", "defines no function 'no_such_function'"] {
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }
    assert!(run.metrics.is_empty());
}

#[test]
fn check_names_bad_reward_settings() {
    let dir = tempfile::tempdir().unwrap();
    for (reward, key, says) in [
        (
            "[reward]\nkind = \"verifiers\"\n[[reward.verifiers]]\nkind = \"judge\"\n",
            "reward.verifiers",
            "judge",
        ),
        (
            "[reward]\nkind = \"verifiers\"\n[[reward.verifiers]]\nkind = \"regex\"\npattern = \"a(\"\n",
            "reward.verifiers[0].pattern",
            "a(",
        ),
        (
            "[reward]\nkind = \"http\"\n[reward.http]\nurl = \"file:///tmp/x\"\n",
            "reward.http.url",
            "http://",
        ),
        (
            "[reward]\nkind = \"http\"\n[reward.http]\nurl = \"http://h/s\"\ntimeout_s = 0\n",
            "reward.http.timeout_s",
            "seconds",
        ),
        (
            "[reward]\nkind = \"python\"\n[reward.python]\nfile = \"nowhere.py\"\nfunctions = [\"f\"]\n",
            "reward.python.file",
            "nowhere.py",
        ),
        (
            "[reward]\nkind = \"python\"\n",
            "reward.python",
            "file and functions",
        ),
        (
            "[reward]\nkind = \"python\"\n[reward.python]\nfile = \"r.toml\"\nfunctions = [\"f\"]\n[reward.http]\nurl = \"http://h/\"\n",
            "reward.http.url",
            "leave it out",
        ),
    ] {
        std::fs::write(dir.path().join("r.toml"), format!("{}{reward}", recipe())).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
            .args(["train", "--check", "r.toml"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{reward}: {err}");
        assert!(err.contains(key) && err.contains(says), "{reward}: {err}");
    }
}

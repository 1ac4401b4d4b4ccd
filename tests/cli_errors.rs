//! The `oxalign` binary's answer to bad input: one clear message on stderr, exit code 2, never a
//! panic. Covers missing folders, unknown model types, malformed JSONL, out-of-range ids, shape
//! mismatches, bad options and wrong model kinds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn oxalign(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .output()
        .expect("the oxalign binary runs")
}

/// Runs `oxalign`, asserts exit code 2, no panic, nothing on stdout and every `needle` in
/// stderr; returns stderr.
fn fails(args: &[&str], needles: &[&str]) -> String {
    let out = oxalign(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(2),
        "oxalign {args:?}: stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout on error");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}: {stderr}");
    }
    stderr
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A tiny model folder (llama, byte tokenizer) plus a valid input file.
struct Fixture {
    dir: tempfile::TempDir,
    model: PathBuf,
    input: PathBuf,
}

fn fixture(head: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let out = oxalign(&[
        "init-model",
        "--family",
        "llama",
        "--preset",
        "tiny",
        "--head",
        head,
        "--out",
        s(&model),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"text\": \"hello\"}\n").unwrap();
    Fixture { dir, model, input }
}

fn edit_config(model: &Path, from: &str, to: &str) {
    let path = model.join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "config.json has {from}");
    std::fs::write(&path, text.replace(from, to)).unwrap();
}

#[test]
fn missing_model_folder() {
    let f = fixture("lm");
    let missing = f.dir.path().join("no-such-model");
    for cmd in ["logprobs", "generate", "score", "tokenize"] {
        fails(
            &[cmd, "--model", s(&missing), "--input", s(&f.input)],
            &["model folder", "no-such-model", "does not exist"],
        );
    }
}

#[test]
fn missing_weights_file() {
    let f = fixture("lm");
    std::fs::remove_file(f.model.join("model.safetensors")).unwrap();
    fails(
        &["logprobs", "--model", s(&f.model), "--input", s(&f.input)],
        &["model.safetensors", "not found"],
    );
}

#[test]
fn unknown_model_type() {
    let f = fixture("lm");
    edit_config(
        &f.model,
        "\"model_type\": \"llama\"",
        "\"model_type\": \"gpt9\"",
    );
    for cmd in ["logprobs", "generate"] {
        fails(
            &[cmd, "--model", s(&f.model), "--input", s(&f.input)],
            &[
                "config.json",
                "unsupported model_type \"gpt9\"",
                "llama, qwen2, qwen3, mistral",
            ],
        );
    }
}

#[test]
fn malformed_jsonl_lines() {
    let f = fixture("lm");
    let bad = f.dir.path().join("bad.jsonl");
    let cases: [(&str, &[&str]); 6] = [
        (
            "{\"text\": \"a\"}\n{oops\n",
            &["bad.jsonl:2:", "not valid JSON"],
        ),
        (
            "{\"text\": \"a\"}\n\n{\"prompt\": \"x\"}\n",
            &[
                "bad.jsonl:3:",
                "\"prompt\"",
                "expected a JSON object with \"text\"",
            ],
        ),
        (
            "[1, 2]\n",
            &["bad.jsonl:1:", "found an array", "expected a JSON object"],
        ),
        (
            "{\"input_ids\": [1, \"b\"]}\n",
            &["bad.jsonl:1:", "\"input_ids\"[1]", "non-negative integer"],
        ),
        (
            "{\"text\": 5}\n",
            &["bad.jsonl:1:", "\"text\" must be a string"],
        ),
        ("\n\n", &["bad.jsonl", "no records"]),
    ];
    for (content, needles) in cases {
        std::fs::write(&bad, content).unwrap();
        for cmd in ["logprobs", "generate", "score"] {
            fails(&[cmd, "--model", s(&f.model), "--input", s(&bad)], needles);
        }
    }
    fails(
        &[
            "logprobs",
            "--model",
            s(&f.model),
            "--input",
            s(&f.dir.path().join("nope.jsonl")),
        ],
        &["cannot read input file", "nope.jsonl"],
    );
}

#[test]
fn token_id_out_of_range() {
    let f = fixture("lm");
    let bad = f.dir.path().join("ids.jsonl");
    std::fs::write(
        &bad,
        "{\"input_ids\": [1, 2]}\n{\"input_ids\": [3, 260, 4]}\n",
    )
    .unwrap();
    for cmd in ["logprobs", "generate"] {
        fails(
            &[cmd, "--model", s(&f.model), "--input", s(&bad)],
            &["ids.jsonl:2:", "token id 260", "vocab_size is 260"],
        );
    }
}

#[test]
fn mismatched_tensor_shape() {
    let f = fixture("lm");
    edit_config(
        &f.model,
        "\"intermediate_size\": 352",
        "\"intermediate_size\": 400",
    );
    fails(
        &["logprobs", "--model", s(&f.model), "--input", s(&f.input)],
        &[
            "model.layers.0.mlp.gate_proj.weight",
            "[352, 128]",
            "expected [400, 128]",
        ],
    );
}

#[test]
fn lm_folder_is_not_a_reward_model() {
    let f = fixture("lm");
    fails(
        &["score", "--model", s(&f.model), "--input", s(&f.input)],
        &["score.weight", "missing", "--head reward"],
    );
}

#[test]
fn text_input_without_tokenizer() {
    let f = fixture("lm");
    std::fs::remove_file(f.model.join("tokenizer.json")).unwrap();
    fails(
        &["logprobs", "--model", s(&f.model), "--input", s(&f.input)],
        &["in.jsonl:1:", "no tokenizer.json", "input_ids"],
    );
}

#[test]
fn broken_tokenizer_config() {
    let f = fixture("lm");
    std::fs::write(
        f.model.join("tokenizer_config.json"),
        "{\"eos_token\": \"<|nope|>\"}",
    )
    .unwrap();
    fails(
        &["generate", "--model", s(&f.model), "--input", s(&f.input)],
        &[
            "tokenizer_config.json",
            "eos_token",
            "<|nope|>",
            "not in the tokenizer's vocabulary",
        ],
    );
}

#[test]
fn bad_generation_options() {
    let f = fixture("lm");
    let base = ["generate", "--model", s(&f.model), "--input", s(&f.input)];
    let with = |extra: &[&'static str]| -> Vec<String> {
        base.iter().chain(extra).map(|x| x.to_string()).collect()
    };
    let run = |extra: &[&'static str], needles: &[&str]| {
        let args = with(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, needles);
    };
    run(&["--temperature", "-1"], &["temperature must be >= 0"]);
    run(&["--top-p", "0"], &["top_p must be in (0, 1]"]);
    run(&["--max-new-tokens", "many"], &["--max-new-tokens"]);
    run(&["--device", "tpu"], &["--device tpu"]);
}

#[test]
fn init_model_errors() {
    let f = fixture("lm");
    // Refuses to overwrite a model.
    fails(
        &[
            "init-model",
            "--family",
            "llama",
            "--preset",
            "tiny",
            "--out",
            s(&f.model),
        ],
        &["already holds a model", "--force"],
    );
    let out = f.dir.path().join("new");
    fails(
        &[
            "init-model",
            "--family",
            "gpt",
            "--preset",
            "tiny",
            "--out",
            s(&out),
        ],
        &[
            "unknown model family \"gpt\"",
            "llama, qwen2, qwen3, mistral",
        ],
    );
    fails(
        &[
            "init-model",
            "--family",
            "llama",
            "--preset",
            "huge",
            "--out",
            s(&out),
        ],
        &["unknown model preset \"huge\"", "tiny, small"],
    );
    fails(
        &[
            "init-model",
            "--family",
            "llama",
            "--preset",
            "tiny",
            "--out",
            s(&out),
            "--tokenizer",
            s(&f.dir.path().join("nowhere")),
        ],
        &["--tokenizer", "nowhere", "no such file or folder"],
    );
    assert!(!out.exists(), "a failed init-model leaves no folder behind");
    let broken = f.dir.path().join("broken-tok");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    fails(
        &[
            "init-model",
            "--family",
            "llama",
            "--preset",
            "tiny",
            "--out",
            s(&out),
            "--tokenizer",
            s(&broken),
        ],
        &["tokenizer.json", "not a tokenizer"],
    );
}

#[test]
fn chat_flag_without_template() {
    let f = fixture("lm");
    let config = f.model.join("tokenizer_config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&config, json.to_string()).unwrap();
    fails(
        &[
            "generate",
            "--model",
            s(&f.model),
            "--input",
            s(&f.input),
            "--chat",
        ],
        &["--chat needs a chat template"],
    );
}

/// Writes a JSONL file of `lines` into the fixture folder.
fn input_file(fx: &Fixture, name: &str, lines: &[String]) -> PathBuf {
    let p = fx.dir.path().join(name);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

#[test]
fn a_line_over_the_size_limit_is_refused_before_it_is_read() {
    let fx = fixture("lm");
    let huge = format!("{{\"text\": \"{}\"}}", "1".repeat(11 << 20));
    let input = input_file(&fx, "huge.jsonl", &["{\"text\": \"1+1=\"}".into(), huge]);
    for cmd in ["generate", "logprobs", "tokenize"] {
        fails(
            &[cmd, "--model", s(&fx.model), "--input", s(&input)],
            &["huge.jsonl:2", "10 MiB"],
        );
    }
}

#[test]
fn lengths_past_the_context_are_refused_or_truncated() {
    let fx = fixture("lm");
    edit_config(
        &fx.model,
        "\"max_position_embeddings\": 2048",
        "\"max_position_embeddings\": 16",
    );
    let long: Vec<String> = (0..20).map(|i| (10 + i).to_string()).collect();
    let ids = format!("{{\"input_ids\": [{}]}}", long.join(", "));
    let input = input_file(&fx, "long.jsonl", &[ids]);
    fails(
        &["logprobs", "--model", s(&fx.model), "--input", s(&input)],
        &["long.jsonl:1", "20 tokens", "16", "max_position_embeddings"],
    );
    let short = input_file(
        &fx,
        "short.jsonl",
        &["{\"input_ids\": [1, 2, 3, 4]}".into()],
    );
    let gen = [
        "generate",
        "--model",
        s(&fx.model),
        "--input",
        s(&short),
        "--max-new-tokens",
        "100",
        "--ignore-eos",
    ];
    fails(
        &gen,
        &["short.jsonl:1", "--max-new-tokens 100", "16", "--truncate"],
    );
    let out = oxalign(&[&gen[..], &["--truncate"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["completion_ids"].as_array().unwrap().len(), 12);
    assert_eq!(line["finish_reason"], "length");
    let out = oxalign(&[
        "generate",
        "--model",
        s(&fx.model),
        "--input",
        s(&input),
        "--max-new-tokens",
        "4",
        "--truncate",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["prompt_ids"].as_array().unwrap().len(), 15);
    assert_eq!(line["completion_ids"].as_array().unwrap().len(), 1);
}

//! End-to-end runs of the `oxalign` binary on tiny random models: `init-model` for both
//! families and heads, then `logprobs`, `generate`, `score` and `tokenize` on them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

fn oxalign(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .output()
        .expect("the oxalign binary runs")
}

/// Runs `oxalign` and asserts success; returns stdout.
fn ok(args: &[&str]) -> String {
    let out = oxalign(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "oxalign {args:?} failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("each output line is JSON"))
        .collect()
}

fn write_jsonl(path: &Path, records: &[Value]) {
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

fn init(dir: &Path, name: &str, family: &str, head: &str, seed: &str) -> PathBuf {
    let out = dir.join(name);
    ok(&[
        "init-model",
        "--family",
        family,
        "--preset",
        "tiny",
        "--head",
        head,
        "--seed",
        seed,
        "--out",
        out.to_str().unwrap(),
    ]);
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn init_model_writes_an_hf_folder_and_is_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    for family in ["llama", "qwen2", "gemma2", "gemma3_text"] {
        let a = init(dir.path(), &format!("{family}-a"), family, "lm", "7");
        let b = init(dir.path(), &format!("{family}-b"), family, "lm", "7");
        let c = init(dir.path(), &format!("{family}-c"), family, "lm", "8");
        for f in [
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            assert!(a.join(f).is_file(), "{family}: {f} missing");
        }
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(a.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["model_type"], family);
        // tiny: vocab = the byte tokenizer's 260 ids; eos = <|endoftext|> and <|im_end|>.
        assert_eq!(config["vocab_size"], 260);
        assert_eq!(config["eos_token_id"], json!([256, 259]));
        assert_eq!(config["pad_token_id"], 257);
        let weights = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
        assert_eq!(
            weights(&a),
            weights(&b),
            "{family}: same seed, same weights"
        );
        assert_ne!(
            weights(&a),
            weights(&c),
            "{family}: other seed, other weights"
        );
    }
}

#[test]
fn init_model_copies_a_tokenizer_folder() {
    let dir = tempfile::tempdir().unwrap();
    let src = init(dir.path(), "src", "llama", "lm", "0");
    let out = dir.path().join("copy");
    ok(&[
        "init-model",
        "--family",
        "qwen2",
        "--preset",
        "tiny",
        "--tokenizer",
        s(&src),
        "--out",
        s(&out),
    ]);
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(src.join(f)).unwrap(),
            std::fs::read(out.join(f)).unwrap(),
            "{f} copied as is"
        );
    }
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["vocab_size"], 260);
    // The source folder's generation_config.json contributes <|im_end|> as a stop id.
    assert_eq!(config["eos_token_id"], json!([256, 259]));
}

#[test]
fn logprobs_for_text_ids_and_chats_in_both_families() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"text": "hello world"}),
            json!({"input_ids": [1, 2, 3, 4, 5, 6, 7]}),
            json!({"text": "x"}),
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            json!({"input_ids": [10, 20]}),
        ],
    );
    for family in ["llama", "qwen2"] {
        let model = init(dir.path(), family, family, "lm", "1");
        let out = lines(&ok(&[
            "logprobs",
            "--model",
            s(&model),
            "--input",
            s(&input),
        ]));
        assert_eq!(out.len(), 5);
        assert_eq!(
            ids(&out[0]["input_ids"]),
            b"hello world".map(u64::from).to_vec()
        );
        assert_eq!(ids(&out[1]["input_ids"]), vec![1, 2, 3, 4, 5, 6, 7]);
        let chat: Vec<u64> = "<|im_start|>user\nhi<|im_end|>\n"
            .replace("<|im_start|>", "\u{0}")
            .replace("<|im_end|>", "\u{1}")
            .bytes()
            .map(|b| match b {
                0 => 258,
                1 => 259,
                b => u64::from(b),
            })
            .collect();
        assert_eq!(ids(&out[3]["input_ids"]), chat);
        for rec in &out {
            let n = rec["input_ids"].as_array().unwrap().len();
            let lp = rec["logprobs"].as_array().unwrap();
            assert_eq!(lp.len(), n - 1, "T-1 log-probs");
            for v in lp {
                let v = v.as_f64().unwrap();
                // A random 260-way model sits near log(1/260) = -5.56 nats.
                assert!(v < 0.0 && v > -12.0, "{family}: log-prob {v}");
            }
        }
        // Batching must not change the numbers: one line at a time gives the same values.
        let single = dir.path().join("single.jsonl");
        write_jsonl(&single, &[json!({"input_ids": [1, 2, 3, 4, 5, 6, 7]})]);
        let alone = lines(&ok(&[
            "logprobs",
            "--model",
            s(&model),
            "--input",
            s(&single),
            "--batch-size",
            "1",
        ]));
        let batched = out[1]["logprobs"].as_array().unwrap();
        for (a, b) in alone[0]["logprobs"].as_array().unwrap().iter().zip(batched) {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() < 1e-4, "{family}: batched {b} vs alone {a}");
        }
    }
}

#[test]
fn logprobs_writes_to_output_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = init(dir.path(), "m", "llama", "lm", "2");
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    write_jsonl(&input, &[json!({"input_ids": [5, 6, 7]})]);
    let stdout = ok(&[
        "logprobs",
        "--model",
        s(&model),
        "--input",
        s(&input),
        "--output",
        s(&output),
    ]);
    assert!(stdout.is_empty());
    let out = lines(&std::fs::read_to_string(&output).unwrap());
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["logprobs"].as_array().unwrap().len(), 2);
}

#[test]
fn generate_greedy_is_deterministic_and_consistent_with_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"text": "Once upon a time"}),
            json!({"input_ids": [72, 105]}),
            json!({"text": "hi"}),
        ],
    );
    for family in ["llama", "qwen2", "gemma2", "gemma3_text"] {
        let model = init(dir.path(), family, family, "lm", "3");
        let args = [
            "generate",
            "--model",
            s(&model),
            "--input",
            s(&input),
            "--temperature",
            "0",
            "--max-new-tokens",
            "6",
            "--ignore-eos",
        ];
        let first = ok(&args);
        assert_eq!(first, ok(&args), "{family}: greedy output repeats exactly");
        let out = lines(&first);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0]["prompt"], "Once upon a time");
        for rec in &out {
            assert_eq!(rec["completion_ids"].as_array().unwrap().len(), 6);
            assert_eq!(rec["logprobs"].as_array().unwrap().len(), 6);
            assert_eq!(rec["finish_reason"], "length");
            assert!(rec["completion"].is_string());
        }
        // Greedy in a batch equals greedy alone, and the reported log-probs equal
        // `oxalign logprobs` on prompt + completion.
        let alone_in = dir.path().join("alone.jsonl");
        write_jsonl(&alone_in, &[json!({"input_ids": [72, 105]})]);
        let alone = lines(&ok(&[
            "generate",
            "--model",
            s(&model),
            "--input",
            s(&alone_in),
            "--temperature",
            "0",
            "--max-new-tokens",
            "6",
            "--ignore-eos",
        ]));
        assert_eq!(alone[0]["completion_ids"], out[1]["completion_ids"]);
        let mut full = vec![72u64, 105];
        full.extend(ids(&out[1]["completion_ids"]));
        let full_in = dir.path().join("full.jsonl");
        write_jsonl(&full_in, &[json!({ "input_ids": full })]);
        let lp = lines(&ok(&[
            "logprobs",
            "--model",
            s(&model),
            "--input",
            s(&full_in),
        ]));
        let lp = lp[0]["logprobs"].as_array().unwrap();
        for (g, l) in out[1]["logprobs"].as_array().unwrap().iter().zip(&lp[1..]) {
            let (g, l) = (g.as_f64().unwrap(), l.as_f64().unwrap());
            assert!(
                (g - l).abs() < 1e-3,
                "{family}: generate {g} vs logprobs {l}"
            );
        }
    }
}

#[test]
fn sampling_is_seeded_and_chat_mode_wraps_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = init(dir.path(), "m", "qwen2", "lm", "4");
    let input = dir.path().join("in.jsonl");
    write_jsonl(&input, &[json!({"text": "hi"}), json!({"text": "yo"})]);
    let run = |seed: &str, batch: &str| {
        ok(&[
            "generate",
            "--model",
            s(&model),
            "--input",
            s(&input),
            "--chat",
            "--seed",
            seed,
            "--max-new-tokens",
            "8",
            "--temperature",
            "1.0",
            "--top-p",
            "0.9",
            "--top-k",
            "50",
            "--batch-size",
            batch,
        ])
    };
    let a = run("11", "2");
    let completions = |text: &str| -> Vec<Value> {
        lines(text)
            .iter()
            .map(|r| r["completion_ids"].clone())
            .collect()
    };
    // Same seed, any batch size: same samples (log-probs may differ in the last float bit).
    assert_eq!(
        a,
        run("11", "2"),
        "same seed and batch size: identical output"
    );
    assert_eq!(completions(&a), completions(&run("11", "1")));
    assert_ne!(
        completions(&a),
        completions(&run("12", "2")),
        "another seed samples differently"
    );
    let out = lines(&a);
    assert_eq!(
        out[0]["prompt"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    for rec in &out {
        let n = rec["completion_ids"].as_array().unwrap().len();
        assert!((1..=8).contains(&n));
        if rec["finish_reason"] == "stop" {
            let last = *ids(&rec["completion_ids"]).last().unwrap();
            assert!(
                last == 256 || last == 259,
                "stopped on a stop id, got {last}"
            );
        }
    }
}

/// `oxalign args…` with `stdin` on its standard input.
fn with_stdin(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the oxalign binary runs");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

/// Issue 29: `--input -` reads the prompts from stdin and `--prompt TEXT` (repeatable, with
/// --chat a user message) gives them on the command line, with the same output as a file;
/// exactly one of --input and --prompt is required (a clap error, exit 2).
#[test]
fn generate_reads_stdin_and_prompts_given_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = init(dir.path(), "m", "qwen2", "lm", "5");
    let input = dir.path().join("in.jsonl");
    write_jsonl(&input, &[json!({"text": "hi"}), json!({"text": "yo"})]);
    let common = [
        "generate",
        "--model",
        s(&model),
        "--chat",
        "--temperature",
        "0",
        "--max-new-tokens",
        "4",
    ];
    fn with<'a>(common: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [common, extra].concat()
    }
    let from_file = ok(&with(&common, &["--input", s(&input)]));
    let text = std::fs::read_to_string(&input).unwrap();
    let out = with_stdin(&with(&common, &["--input", "-"]), &text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--input -: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), from_file);
    let prompts = ok(&with(&common, &["--prompt", "hi", "--prompt", "yo"]));
    assert_eq!(prompts, from_file);
    assert_eq!(
        lines(&prompts)[0]["prompt"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    for extra in [&[][..], &["--input", s(&input), "--prompt", "hi"]] {
        let out = oxalign(&with(&common, extra));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains("--input") && err.contains("--prompt"),
            "{extra:?}: {err}"
        );
    }
}

#[test]
fn score_gives_one_finite_score_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_jsonl(
        &input,
        &[
            json!({"text": "a good answer"}),
            json!({"input_ids": [1, 2, 3]}),
            json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
        ],
    );
    for family in ["llama", "qwen2"] {
        let model = init(dir.path(), family, family, "reward", "5");
        let out = lines(&ok(&["score", "--model", s(&model), "--input", s(&input)]));
        assert_eq!(out.len(), 3);
        let scores: Vec<f64> = out.iter().map(|r| r["score"].as_f64().unwrap()).collect();
        assert!(scores.iter().all(|x| x.is_finite()), "{scores:?}");
        assert_ne!(scores[0], scores[1]);
        // Same line alone in a batch of one: same score.
        let one = lines(&ok(&[
            "score",
            "--model",
            s(&model),
            "--input",
            s(&input),
            "--batch-size",
            "1",
        ]));
        for (a, b) in one.iter().zip(&out) {
            let (a, b) = (a["score"].as_f64().unwrap(), b["score"].as_f64().unwrap());
            assert!((a - b).abs() < 1e-4, "{family}: {a} vs {b}");
        }
    }
}

#[test]
fn tokenize_round_trips_unicode() {
    let dir = tempfile::tempdir().unwrap();
    let model = init(dir.path(), "m", "llama", "lm", "0");
    let input = dir.path().join("in.jsonl");
    let text = "naïve café — 日本語 🦀\n\t<|im_end|>";
    write_jsonl(&input, &[json!({ "text": text })]);
    let out = lines(&ok(&[
        "tokenize",
        "--model",
        s(&model),
        "--input",
        s(&input),
    ]));
    assert_eq!(out[0]["text"], text);
    let got = ids(&out[0]["input_ids"]);
    assert_eq!(*got.last().unwrap(), 259, "special tokens are single ids");
    assert_eq!(got.len(), text.len() - "<|im_end|>".len() + 1);
}

#[test]
fn init_model_writes_the_moe_families_and_they_generate() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    write_jsonl(&input, &[json!({"text": "Once upon a time"})]);
    for (family, arch) in [
        ("qwen3_moe", "Qwen3MoeForCausalLM"),
        ("qwen2_moe", "Qwen2MoeForCausalLM"),
        ("mixtral", "MixtralForCausalLM"),
    ] {
        let model = init(dir.path(), family, family, "lm", "5");
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["model_type"], family);
        assert_eq!(cfg["architectures"][0], arch);
        assert_eq!(cfg["num_experts_per_tok"], 2);
        let args = [
            "generate",
            "--model",
            s(&model),
            "--input",
            s(&input),
            "--temperature",
            "0",
            "--max-new-tokens",
            "5",
            "--ignore-eos",
        ];
        let out = lines(&ok(&args));
        assert_eq!(
            out[0]["completion_ids"].as_array().unwrap().len(),
            5,
            "{family}"
        );
    }
}

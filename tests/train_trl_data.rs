//! A TRL user's data files work unchanged (issue 29): SFT from `{"prompt", "completion"}`,
//! conversational prompt-completion and `{"text"}` files; a GRPO prompts file whose answers
//! are in `solution` is refused at `--check` and at startup (not trained at reward 0) until
//! `data.answer_field` names the column; `--check` reads the data and says when a file is
//! in another schema, and a bad row far into a file by its line; a model folder whose chat
//! template is in `chat_template.jinja` (transformers 5) keeps it through SFT, DPO and RL
//! checkpoints. Tiny models, a few steps each.

mod cli_support;
use cli_support::{ok, oxalign};
use serde_json::{json, Value};
use std::path::Path;

/// Runs `oxalign`, asserts exit code 2 and no panic; stderr.
fn refused(dir: &Path, args: &[&str]) -> String {
    let out = oxalign(dir, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "oxalign {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Writes `rows` as JSONL to `dir/name`.
fn jsonl(dir: &Path, name: &str, rows: &[Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.join(name), text).unwrap();
}

/// An SFT recipe `name.toml` on `data`: a fresh tiny model, 2 steps of 2 rows.
fn sft_recipe(dir: &Path, name: &str, data: &str) -> String {
    let recipe = format!(
        "[run]\nname = \"{name}\"\nkind = \"sft\"\n[data]\ntask = \"file\"\npath = \"{data}\"\n\
         [sft]\nsteps = 2\nbatch_size = 2\nlr = 1e-3\n"
    );
    let file = format!("{name}.toml");
    std::fs::write(dir.join(&file), recipe).unwrap();
    file
}

/// The held-out-free SFT run's loss of each step, from metrics.jsonl.
fn losses(dir: &Path, run: &str) -> Vec<f64> {
    let text = std::fs::read_to_string(dir.join("runs").join(run).join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|m| m["loss"].as_f64())
        .collect()
}

#[test]
fn sft_trains_from_trl_prompt_completion_conversational_and_text_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sums: Vec<(String, String)> = (1..=4)
        .map(|i| (format!("{i}+{i}="), (2 * i).to_string()))
        .collect();
    let standard: Vec<Value> = sums
        .iter()
        .map(|(p, c)| json!({"prompt": p, "completion": c}))
        .collect();
    let chat: Vec<Value> = sums
        .iter()
        .map(|(p, c)| {
            json!({"prompt": [{"role": "user", "content": p}],
                   "completion": [{"role": "assistant", "content": c}]})
        })
        .collect();
    let text: Vec<Value> = sums
        .iter()
        .map(|(p, c)| json!({"text": format!("{p}{c}")}))
        .collect();
    for (name, rows) in [("standard", standard), ("chat", chat), ("text", text)] {
        let data = format!("{name}.jsonl");
        jsonl(dir, &data, &rows);
        let recipe = sft_recipe(dir, name, &data);
        let check = ok(dir, &["train", &recipe, "--check"]);
        assert!(check.contains("(4 rows checked)"), "{name}: {check}");
        ok(dir, &["train", &recipe, "--quiet"]);
        let l = losses(dir, name);
        assert_eq!(l.len(), 2, "{name}: two SFT steps, got {l:?}");
        assert!(l.iter().all(|x| x.is_finite() && *x > 0.0), "{name}: {l:?}");
        assert!(dir
            .join("runs")
            .join(name)
            .join("final/config.json")
            .is_file());
    }
}

#[test]
fn a_grpo_file_with_its_answers_in_solution_is_refused_until_answer_field_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rows: Vec<Value> = (1..=4)
        .map(|i| json!({"prompt": [{"role": "user", "content": format!("{i}+{i}=")}], "solution": (2 * i).to_string()}))
        .collect();
    jsonl(dir, "prompts.jsonl", &rows);
    let recipe =
        "[run]\nname = \"grpo\"\nsteps = 2\n[data]\ntask = \"file\"\npath = \"prompts.jsonl\"\n\
                  [rl]\nalgorithm = \"grpo\"\nprompts_per_step = 2\nsamples_per_prompt = 2\n\
                  minibatch_size = 4\nmax_new_tokens = 3\n";
    std::fs::write(dir.join("r.toml"), recipe).unwrap();
    for args in [
        &["train", "r.toml", "--check"][..],
        &["train", "r.toml", "--quiet"],
    ] {
        let err = refused(dir, args);
        for want in [
            "prompts.jsonl: no row has `answer`",
            "the first row has `prompt`, `solution`",
            "data.answer_field = \"solution\"",
        ] {
            assert!(err.contains(want), "{args:?}: {want:?} missing in: {err}");
        }
    }
    let steps = std::fs::read_to_string(dir.join("runs/grpo/metrics.jsonl")).unwrap_or_default();
    assert_eq!(
        steps.lines().count(),
        0,
        "no step ran on a file without answers"
    );

    let named = ["--set", "data.answer_field=\"solution\""];
    let check = ok(dir, &["train", "r.toml", "--check", named[0], named[1]]);
    assert!(check.contains("4 data rows checked"), "{check}");
    ok(dir, &["train", "r.toml", "--quiet", named[0], named[1]]);
    let metrics = std::fs::read_to_string(dir.join("runs/grpo/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2);

    // Only some rows without the answer: the run goes on, with one warning giving the count.
    let mut partial = rows.clone();
    partial[0].as_object_mut().unwrap().remove("solution");
    jsonl(dir, "prompts.jsonl", &partial);
    let text = ok(dir, &["train", "r.toml", "--check", named[0], named[1]]);
    assert!(text.contains("1 of 4 rows have no `solution`"), "{text}");
}

/// Issue 29: GRPO whose reward never tells a group's samples apart (an untrained model never
/// gives the answer) records `zero_variance_groups` = 1 every step and, at the fifth such
/// step, warns once that nothing is being learned and why.
#[test]
fn grpo_warns_when_no_group_has_a_reward_signal_for_five_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rows: Vec<Value> = (1..=4)
        .map(|i| json!({"prompt": format!("{i}+{i}="), "solution": format!("{}", 1000 + i)}))
        .collect();
    jsonl(dir, "prompts.jsonl", &rows);
    let recipe = "[run]\nname = \"flat\"\nsteps = 6\n[data]\ntask = \"file\"\n\
                  path = \"prompts.jsonl\"\nanswer_field = \"solution\"\n[rl]\n\
                  algorithm = \"grpo\"\nprompts_per_step = 2\nsamples_per_prompt = 2\n\
                  minibatch_size = 4\nmax_new_tokens = 2\n";
    std::fs::write(dir.join("r.toml"), recipe).unwrap();
    let out = ok(dir, &["train", "r.toml", "--quiet"]);
    let warnings: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("nothing is being learned"))
        .collect();
    assert_eq!(warnings.len(), 1, "{out}");
    assert!(
        warnings[0].starts_with("warning: steps 1-5:")
            && warnings[0].contains("all rewards equal to 0"),
        "{out}"
    );
    let text = std::fs::read_to_string(dir.join("runs/flat/metrics.jsonl")).unwrap();
    for line in text.lines() {
        let m: Value = serde_json::from_str(line).unwrap();
        assert_eq!(m["zero_variance_groups"], 1.0, "{m}");
    }
    assert_eq!(text.lines().count(), 6);
}

#[test]
fn check_reads_the_data_and_names_a_file_in_another_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rows: Vec<Value> = (0..20)
        .map(|i| json!({"question": format!("{i}+1="), "answer": (i + 1).to_string()}))
        .collect();
    jsonl(dir, "qa.jsonl", &rows);
    let recipe = sft_recipe(dir, "qa", "qa.jsonl");
    let err = refused(dir, &["train", &recipe, "--check"]);
    for want in [
        "qa.jsonl: line 1",
        "none of the first 16 rows matches",
        "schema does not match",
        "\"completion\"",
    ] {
        assert!(err.contains(want), "{want:?} missing in: {err}");
    }
    assert!(!err.contains("to skip and count"), "no skip hint: {err}");

    // One bad row among good ones: the skip hint stays.
    let mut mixed: Vec<Value> = (0..3)
        .map(|i| json!({"prompt": format!("{i}+1="), "completion": (i + 1).to_string()}))
        .collect();
    mixed[1] = json!({"prompt": "x", "completion": "y", "response": "z"});
    jsonl(dir, "qa.jsonl", &mixed);
    let err = refused(dir, &["train", &recipe, "--check"]);
    assert!(
        err.contains("qa.jsonl: line 2") && err.contains("not both"),
        "{err}"
    );
    assert!(err.contains("data.on_bad_row = \"skip\""), "{err}");
    assert!(!dir.join("runs/qa").exists(), "--check made a run folder");
}

#[test]
fn check_names_a_bad_row_far_into_the_file_and_counts_the_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut rows: Vec<Value> = (0..1200)
        .map(|i| json!({"prompt": format!("{i}+1="), "completion": (i + 1).to_string()}))
        .collect();
    jsonl(dir, "big.jsonl", &rows);
    let recipe = sft_recipe(dir, "big", "big.jsonl");
    let check = ok(dir, &["train", &recipe, "--check"]);
    assert!(check.contains("(1000 of 1200 rows checked)"), "{check}");

    rows[499] = json!({"prompt": "500+1="});
    jsonl(dir, "big.jsonl", &rows);
    let err = refused(dir, &["train", &recipe, "--check"]);
    for want in [
        "big.jsonl: line 500",
        "no `completion` (or its alias `response`)",
        "expected {\"prompt\": string, \"completion\": string}",
        "{\"text\": string}",
        "data.on_bad_row = \"skip\"",
    ] {
        assert!(err.contains(want), "{want:?} missing in: {err}");
    }
    let skip = ["--set", "data.on_bad_row=\"skip\""];
    let check = ok(dir, &["train", &recipe, "--check", skip[0], skip[1]]);
    assert!(
        check.contains("1000 of 1200 rows checked, 1 would be skipped"),
        "{check}"
    );
    assert!(!dir.join("runs/big").exists(), "--check made a run folder");
}

/// A ChatML template as transformers 5 saves it, in `chat_template.jinja`, marked so a
/// copy of another template would not pass for it.
const JINJA: &str = "{#- oxalign test template -#}\n{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\n";

/// A tiny Llama in `dir/model` whose chat template is only in `chat_template.jinja`.
fn model_with_jinja_template(dir: &Path) {
    let args = ["init-model", "--family", "llama", "--preset", "tiny"];
    ok(dir, &[&args[..], &["--out", "model"]].concat());
    let cfg_path = dir.join("model/tokenizer_config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    std::fs::write(dir.join("model/chat_template.jinja"), JINJA).unwrap();
}

/// Asserts `folder` (under `dir`) carries the template with the same bytes.
fn assert_template(dir: &Path, folder: &str) {
    let got = std::fs::read(dir.join(folder).join("chat_template.jinja"));
    let got = got.unwrap_or_else(|e| panic!("{folder}/chat_template.jinja: {e}"));
    assert_eq!(got, JINJA.as_bytes(), "{folder}");
    assert!(
        dir.join(folder).join("tokenizer_config.json").is_file(),
        "{folder}"
    );
}

/// Conversational rows: `n` sums as SFT prompt-completion, preference and prompt rows.
fn chat_rows(n: u64) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let user = |i: u64| json!([{"role": "user", "content": format!("{i}+{i}=")}]);
    let said = |t: String| json!([{"role": "assistant", "content": t}]);
    let sft = (1..=n)
        .map(|i| json!({"prompt": user(i), "completion": said((2 * i).to_string())}))
        .collect();
    let prefs = (1..=n)
        .map(|i| {
            json!({"prompt": user(i), "chosen": said((2 * i).to_string()),
                   "rejected": said((2 * i + 1).to_string())})
        })
        .collect();
    let prompts = (1..=n)
        .map(|i| json!({"prompt": user(i), "answer": (2 * i).to_string()}))
        .collect();
    (sft, prefs, prompts)
}

#[test]
fn a_chat_template_in_chat_template_jinja_survives_sft_dpo_and_rl_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    model_with_jinja_template(dir);
    let (sft, prefs, prompts) = chat_rows(4);
    jsonl(dir, "sft.jsonl", &sft);
    jsonl(dir, "prefs.jsonl", &prefs);
    jsonl(dir, "prompts.jsonl", &prompts);
    let stage = |name: &str, model: &str, data: &str, rest: &str| {
        let recipe = format!(
            "[run]\nname = \"{name}\"\n{rest}\n[model]\npath = \"{model}\"\n\
             [data]\ntask = \"file\"\npath = \"{data}\"\n"
        );
        std::fs::write(dir.join(format!("{name}.toml")), recipe).unwrap();
        ok(dir, &["train", &format!("{name}.toml"), "--quiet"]);
    };
    let sft_rest = "kind = \"sft\"\n[sft]\nsteps = 2\nbatch_size = 2\nlr = 1e-3";
    stage("sft", "model", "sft.jsonl", sft_rest);
    assert_template(dir, "runs/sft/final");

    // The next stage loads the SFT output and renders chat rows with its template.
    let dpo_rest = "kind = \"dpo\"\n[dpo]\nsteps = 1\nbatch_size = 2\nwarmup_steps = 0";
    stage("dpo", "runs/sft/final", "prefs.jsonl", dpo_rest);
    assert_template(dir, "runs/dpo/final");

    let rl_rest = "steps = 1\n[rl]\nalgorithm = \"grpo\"\nprompts_per_step = 2\n\
                   samples_per_prompt = 2\nminibatch_size = 4\nmax_new_tokens = 3";
    stage("rl", "runs/dpo/final", "prompts.jsonl", rl_rest);
    assert_template(dir, "runs/rl/checkpoints/step_000001/policy");
    assert_template(dir, "runs/rl/final");
}

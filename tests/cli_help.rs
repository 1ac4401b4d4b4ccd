//! `oxalign --help` and every subcommand's `--help` print usage and exit 0.

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .output()
        .expect("the oxalign binary runs");
    assert!(out.status.success(), "oxalign {args:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn top_level_help_lists_subcommands() {
    let text = help(&["--help"]);
    for sub in [
        "init-model",
        "logprobs",
        "merge-lora",
        "generate",
        "score",
        "tokenize",
        "data",
        "worker",
        "launch",
    ] {
        assert!(text.contains(sub), "--help lacks {sub}: {text}");
    }
}

/// Issue 29: the top level and `train` name every run kind and the RL algorithms.
#[test]
fn help_names_the_run_kinds_and_the_algorithms() {
    let top = help(&["--help"]);
    for want in [
        "SFT",
        "reward-model",
        "DPO",
        "run.kind",
        "Dr. GRPO",
        "distillation",
    ] {
        assert!(top.contains(want), "--help lacks {want}: {top}");
    }
    let short = help(&["train", "-h"]);
    for want in ["SFT", "reward model", "DPO", "RL", "run.kind"] {
        assert!(short.contains(want), "train -h lacks {want}: {short}");
    }
    let long = help(&["train", "--help"]);
    for want in [
        "\"sft\"",
        "\"rm\"",
        "\"dpo\"",
        "\"rl\"",
        "ppo",
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "distill",
        "DAPO",
        "GSPO",
        "CISPO",
    ] {
        assert!(long.contains(want), "train --help lacks {want}: {long}");
    }
}

#[test]
fn data_arithmetic_has_help() {
    let text = help(&["data", "arithmetic", "--help"]);
    for f in [
        "--out",
        "--seed",
        "--max-operand",
        "--eval-size",
        "preferences",
    ] {
        assert!(text.contains(f), "data arithmetic --help lacks {f}: {text}");
    }
}

#[test]
fn every_subcommand_has_help() {
    let cases: [(&str, &[&str]); 6] = [
        (
            "merge-lora",
            &["--adapter", "--base", "--out", "--force", "PEFT"],
        ),
        (
            "init-model",
            &[
                "--family",
                "--preset",
                "--out",
                "--tokenizer",
                "--seed",
                "--head",
            ],
        ),
        ("logprobs", &["--model", "--input", "--output", "nats"]),
        (
            "generate",
            &[
                "--max-new-tokens",
                "--temperature",
                "--top-p",
                "--top-k",
                "--seed",
                "--chat",
            ],
        ),
        ("score", &["--model", "--input", "\"score\""]),
        ("tokenize", &["--model", "--input", "--chat"]),
    ];
    for (sub, flags) in cases {
        let text = help(&[sub, "--help"]);
        assert!(text.contains("Usage: oxalign"), "{sub}: {text}");
        for f in flags {
            assert!(text.contains(f), "{sub} --help lacks {f}: {text}");
        }
    }
}

#[test]
fn missing_subcommand_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .output()
        .expect("the oxalign binary runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

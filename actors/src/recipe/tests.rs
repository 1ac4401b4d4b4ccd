//! Recipe parsing: defaults, overrides, and the messages for bad keys and values.

use super::*;
use oxalign_rlhf::losses::{LossAggKind, RolloutCorrectionKind};
use std::path::Path;

fn parse(text: &str, sets: &[&str]) -> Result<Recipe, RecipeError> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Recipe::parse(text, Path::new("r.toml"), &sets)
}

#[test]
fn empty_recipe_is_all_defaults() {
    assert_eq!(parse("", &[]).unwrap(), Recipe::default());
}

#[test]
fn unknown_key_names_file_key_and_expected() {
    let e = parse("[rl]\nclip_epsilon = 0.1\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("r.toml"), "{e}");
    assert!(e.contains("rl"), "{e}");
    assert!(e.contains("clip_epsilon"), "{e}");
    assert!(e.contains("clip_eps"), "should list the expected keys: {e}");
}

#[test]
fn wrong_type_names_key_and_type() {
    let e = parse("[rl]\nlr = \"fast\"\n", &[]).unwrap_err().to_string();
    assert!(e.contains("rl.lr"), "{e}");
    assert!(e.contains("f64") || e.contains("float"), "{e}");
}

#[test]
fn unknown_enum_value_lists_choices() {
    let e = parse("[rl]\nalgorithm = \"ppx\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rl.algorithm") && e.contains("grpo"), "{e}");
}

/// Every enum key that deserializes into a library type takes the spellings of
/// docs/RECIPES.md, writes them back unchanged into the resolved recipe, and names the key
/// and every choice for a value it does not know.
#[test]
fn library_enum_values_keep_their_spelling_and_unknown_ones_list_the_choices() {
    let verifier = "[reward]\nkind = \"verifiers\"\n[[reward.verifiers]]\nkind = \"exact_match\"\n";
    let cases: [(&str, &str, &[&str]); 8] = [
        ("[rl]\n", "kl_estimator", &["k1", "k2", "k3"]),
        ("[rl]\n", "kl_mode", &["reward", "loss"]),
        (
            "[rl]\n",
            "loss_agg",
            &[
                "token_mean",
                "seq_mean_token_sum",
                "seq_mean_token_mean",
                "seq_mean_token_sum_norm",
            ],
        ),
        ("[rl]\n", "policy_loss", &["ppo", "gspo", "cispo"]),
        (
            "[rl]\n",
            "rollout_correction",
            &["none", "token_tis", "seq_mask", "icepop"],
        ),
        ("[rl]\n", "truncated", &["terminal", "bootstrap"]),
        (
            "[run]\nkind = \"dpo\"\n[dpo]\n",
            "loss",
            &["sigmoid", "ipo"],
        ),
        (
            verifier,
            "extract",
            &["first_line", "boxed", "last_number", "regex"],
        ),
    ];
    for (table, key, values) in cases {
        for v in values {
            let r = parse(&format!("{table}{key} = \"{v}\"\n"), &[]).unwrap();
            let written = r.to_toml();
            assert!(
                written.contains(&format!("\n{key} = \"{v}\"\n")),
                "{key} = {v:?} written as:\n{written}"
            );
        }
        let e = parse(&format!("{table}{key} = \"nope\"\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(key) && e.contains("unknown variant `nope`"),
            "{e}"
        );
        for v in values {
            assert!(
                e.contains(&format!("`{v}`")),
                "{key}: {v} missing from: {e}"
            );
        }
    }
    let e = parse("", &["rl.loss_agg=\"sum\""]).unwrap_err().to_string();
    assert!(
        e.contains("rl.loss_agg") && e.contains("`token_mean`"),
        "{e}"
    );
}

#[test]
fn syntax_error_names_file_and_line() {
    let e = parse("[rl\nlr = 1\n", &[]).unwrap_err().to_string();
    assert!(e.contains("r.toml") && e.contains("line 1"), "{e}");
}

#[test]
fn overrides_apply_and_are_typed() {
    let r = parse(
        "[rl]\nlr = 1e-3\n",
        &["rl.lr=5e-4", "run.name=abc", "rl.algorithm=grpo"],
    )
    .unwrap();
    assert_eq!(r.rl.lr, 5e-4);
    assert_eq!(r.run.name, "abc");
    assert_eq!(r.rl.algorithm, Algorithm::Grpo);
    let e = parse("", &["rl.nope=1"]).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
    let e = parse("", &["rl.lr"]).unwrap_err().to_string();
    assert!(e.contains("key.path=value"), "{e}");
}

#[test]
fn resolved_recipe_round_trips() {
    let r = parse("[run]\nname = \"x\"\nsteps = 3\n", &[]).unwrap();
    let again = parse(&r.to_toml(), &[]).unwrap();
    assert_eq!(r, again);
}

#[test]
fn validate_rejects_missing_model_folder_and_cuda_without_gpu() {
    let r = parse("[model]\npath = \"/no/such/model\"\n", &[]).unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(
        e.contains("model.path") && e.contains("/no/such/model"),
        "{e}"
    );

    let r = parse("[placement]\npolicy = \"cuda:0\"\n", &[]).unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(e.contains("placement.policy") && e.contains("cuda"), "{e}");

    let r = parse("[placement]\ncritic = \"cpu:0,cpu:0\"\n", &[]).unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(e.contains("placement.critic") && e.contains("twice"), "{e}");
}

/// A role on a node names that node's devices: the recipe check parses them without opening
/// them (a controller on a login node need not have the node's GPUs; the worker opens
/// them), while devices in this process must open.
#[test]
fn a_nodes_gpus_are_parsed_not_opened() {
    let cluster = "[cluster]\nnodes = { node1 = \"127.0.0.1:7000\" }\n";
    let r = parse(
        &format!("[placement]\nreference = \"node1:cuda:0,cuda:1\"\n{cluster}"),
        &[],
    )
    .unwrap();
    validate(&r, Path::new("r.toml")).unwrap();
    let r = parse(
        &format!("[placement]\nreference = \"node1:cuda:0,cuda:0\"\n{cluster}"),
        &[],
    )
    .unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(
        e.contains("placement.reference") && e.contains("twice"),
        "{e}"
    );
    if !cfg!(feature = "cuda") {
        let r = parse("[placement]\nreference = \"cuda:0\"\n", &[]).unwrap();
        let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
        assert!(
            e.contains("placement.reference") && e.contains("cuda"),
            "{e}"
        );
    }
}

#[test]
fn validate_checks_batch_arithmetic_and_groups() {
    let r = parse("[rl]\nprompts_per_step = 10\nminibatch_size = 4\n", &[]).unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(e.contains("rl.minibatch_size"), "{e}");
    let r = parse("[rl]\nalgorithm = \"grpo\"\nminibatch_size = 32\n", &[]).unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(e.contains("rl.samples_per_prompt"), "{e}");
    assert!(validate(&Recipe::default(), Path::new("r.toml")).is_ok());
}

#[test]
fn clip_eps_high_is_a_positive_upper_clip() {
    let r = parse("[rl]\nclip_eps_high = 0.28\n", &[]).unwrap();
    assert_eq!(r.rl.clip_eps_high, Some(0.28));
    assert!(validate(&r, Path::new("r.toml")).is_ok());
    let r = parse("[rl]\nclip_eps_high = -0.1\n", &[]).unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(e.contains("rl.clip_eps_high"), "{e}");
}

#[test]
fn supervision_and_faults_parse_validate_and_round_trip() {
    let text = "[supervision]\ncall_timeout_s = 5\n\n[[faults]]\nrole = \"critic\"\nphase = \"critic_train\"\nstep = 2\nkind = \"hang\"\n";
    let r = parse(text, &[]).unwrap();
    assert_eq!(r.supervision.call_timeout_s, 5.0);
    assert_eq!(r.supervision.max_restarts, 3);
    assert_eq!(r.faults[0].kind, FaultKind::Hang);
    validate(&r, Path::new("r.toml")).unwrap();
    assert_eq!(
        parse(&r.to_toml(), &[]).unwrap(),
        r,
        "recipe.toml reads back"
    );
    assert!(!Recipe::default().to_toml().contains("faults"));

    let grpo = parse(text, &["rl.algorithm=\"grpo\"", "rl.samples_per_prompt=2"]).unwrap();
    let e = validate(&grpo, Path::new("r.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("faults[0].role") && e.contains("no critic"),
        "{e}"
    );
    let slow = parse("", &["supervision.call_timeout_s=0"]).unwrap();
    let e = validate(&slow, Path::new("r.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("supervision.call_timeout_s"), "{e}");
    let e = parse(
        "[[faults]]\nrole = \"policy\"\nphase = \"generate\"\nstep = 1\nkind = \"crash\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("faults") && e.contains("panic"), "{e}");
}

#[test]
fn dr_grpo_defaults_to_its_constant_normaliser() {
    let r = parse("[rl]\nalgorithm = \"dr_grpo\"\n", &[]).unwrap();
    assert_eq!(r.rl.loss_agg(), LossAggKind::SeqMeanTokenSumNorm);
    let r = parse(
        "[rl]\nalgorithm = \"dr_grpo\"\nloss_agg = \"token_mean\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(r.rl.loss_agg(), LossAggKind::TokenMean);
    assert_eq!(
        parse("", &[]).unwrap().rl.loss_agg(),
        LossAggKind::TokenMean
    );
}

#[test]
fn gspo_defaults_to_its_sequence_level_average() {
    let r = parse("[rl]\npolicy_loss = \"gspo\"\n", &[]).unwrap();
    assert_eq!(r.rl.loss_agg(), LossAggKind::SeqMeanTokenMean);
    let r = parse(
        "[rl]\npolicy_loss = \"gspo\"\nloss_agg = \"token_mean\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(r.rl.loss_agg(), LossAggKind::TokenMean);
}

/// Each combination that would fail at run time or silently do nothing is refused by
/// `--check`, naming the key.
#[test]
fn check_refuses_inconsistent_rl_options() {
    let grpo = "[rl]\nalgorithm = \"grpo\"\nsamples_per_prompt = 4\nminibatch_size = 32\n";
    for (extra, key) in [
        ("truncated = \"bootstrap\"\n", "rl.truncated"),
        ("overlong_buffer = 0\n", "rl.overlong_buffer"),
        ("overlong_buffer = 17\n", "rl.overlong_buffer"),
        (
            "overlong_buffer = 4\noverlong_penalty = -1.0\n",
            "rl.overlong_penalty",
        ),
        ("temperature = 0.0\n", "rl.temperature"),
        ("temperature = 0.0\ntop_k = 5\n", "rl.top_k"),
        ("kl_coef = 0.0\nkl_target = 6.0\n", "rl.kl_target"),
    ] {
        let r = parse(&format!("{grpo}{extra}"), &[]).unwrap();
        let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
    let ppo = "[rl]\ntruncated = \"bootstrap\"\novershoot = 1\n";
    assert!(parse(ppo, &[]).is_err(), "unknown keys stay refused");
    let r = parse("[rl]\ntruncated = \"bootstrap\"\n", &[]).unwrap();
    validate(&r, Path::new("r.toml")).unwrap();
    let r = parse(
        "[rl]\ntruncated = \"bootstrap\"\noverlong_buffer = 4\n",
        &[],
    )
    .unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(e.contains("rl.overlong_buffer"), "{e}");
    let r = parse(&format!("{grpo}overlong_buffer = 4\n"), &[]).unwrap();
    validate(&r, Path::new("r.toml")).unwrap();
}

#[test]
fn k1_as_a_loss_warns() {
    let r = parse("[rl]\nkl_mode = \"loss\"\n", &[]).unwrap();
    let w = warnings(&r);
    assert!(
        w.len() == 1 && w[0].contains("k1") && w[0].contains("k2"),
        "{w:?}"
    );
    let r = parse("[rl]\nkl_mode = \"loss\"\nkl_estimator = \"k3\"\n", &[]).unwrap();
    assert!(warnings(&r).is_empty());
}

/// Dynamic sampling, the rollout corrections and distillation: each combination that would
/// fail or silently do nothing is refused, naming the key; `rl.tis_cap` alone still means
/// token TIS.
#[test]
fn check_refuses_inconsistent_sampling_correction_and_distillation_options() {
    let grpo = "[rl]\nalgorithm = \"grpo\"\nsamples_per_prompt = 4\nminibatch_size = 32\n";
    let int8 = "[engine]\nquant = \"int8\"\n";
    for (text, key) in [
        (
            "[rl]\ndynamic_sampling = true\n".to_string(),
            "rl.dynamic_sampling",
        ),
        (
            format!("{grpo}dynamic_sampling_max_rounds = 2\n"),
            "rl.dynamic_sampling_max_rounds",
        ),
        (
            format!("{grpo}dynamic_sampling = true\ndynamic_sampling_max_rounds = 0\n"),
            "rl.dynamic_sampling_max_rounds",
        ),
        (format!("{grpo}tis_cap = 2.0\n"), "rl.rollout_correction"),
        (
            format!("{grpo}rollout_correction = \"token_tis\"\n{int8}"),
            "rl.tis_cap",
        ),
        (
            format!("{grpo}rollout_correction = \"icepop\"\ntis_cap = 2.0\n{int8}"),
            "rl.tis_cap",
        ),
        (
            format!("{grpo}rollout_mask_high = 3.0\n{int8}"),
            "rl.rollout_mask_low",
        ),
        (
            format!("{grpo}rollout_correction = \"seq_mask\"\nrollout_mask_low = 1.5\n{int8}"),
            "rl.rollout_mask_low",
        ),
        (
            format!("{grpo}rollout_correction = \"icepop\"\nrollout_mask_high = 0.9\n{int8}"),
            "rl.rollout_mask_high",
        ),
        (
            "[rl]\nalgorithm = \"distill\"\nkl_coef = 0.0\n".to_string(),
            "model.teacher_path",
        ),
        (
            format!("{grpo}distill_reward_coef = 1.0\n"),
            "rl.distill_reward_coef",
        ),
    ] {
        let r = parse(&text, &[]).unwrap();
        let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
    for ok in [
        format!("{grpo}dynamic_sampling = true\n"),
        format!("{grpo}tis_cap = 2.0\n{int8}"),
        format!("{grpo}rollout_correction = \"seq_mask\"\n{int8}"),
        format!("{grpo}tis_cap = 2.0\n[engine]\nquant = \"bf16\"\n"),
    ] {
        let r = parse(&ok, &[]).unwrap();
        validate(&r, Path::new("r.toml")).unwrap();
    }
    let r = parse(&format!("{grpo}tis_cap = 2.0\n{int8}"), &[]).unwrap();
    assert_eq!(r.rl.rollout_correction(), RolloutCorrectionKind::TokenTis);
    let r = parse(&format!("{grpo}rollout_correction = \"icepop\"\n"), &[]).unwrap();
    assert_eq!(r.rl.rollout_mask_band(), (0.5, 5.0));
    // A distillation run's reward-side KL penalty would never apply.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    let teacher = dir.path().display().to_string();
    let text = format!(
        "[model]\nteacher_path = {teacher:?}\n[rl]\nalgorithm = \"distill\"\nkl_coef = 0.05\n"
    );
    let e = validate(&parse(&text, &[]).unwrap(), Path::new("r.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rl.kl_coef"), "{e}");
}

/// `rl.max_staleness`: 0 to MAX_STALENESS; stale batches correct with token TIS (cap 2) by
/// default, and any rollout correction applies to them even with an f32 engine.
#[test]
fn stale_batches_default_to_token_tis_and_the_lag_is_bounded() {
    let grpo = "[rl]\nalgorithm = \"grpo\"\nsamples_per_prompt = 4\nminibatch_size = 32\n";
    let r = parse(&format!("{grpo}max_staleness = 1\n"), &[]).unwrap();
    validate(&r, Path::new("r.toml")).unwrap();
    assert_eq!(r.rl.rollout_correction(), RolloutCorrectionKind::TokenTis);
    assert_eq!(r.rl.tis_cap_in_force(), Some(STALE_TIS_CAP));
    for ok in [
        format!("{grpo}max_staleness = 2\nrollout_correction = \"icepop\"\n"),
        format!("{grpo}max_staleness = 1\ntis_cap = 5.0\n"),
    ] {
        let r = parse(&ok, &[]).unwrap();
        validate(&r, Path::new("r.toml")).unwrap();
    }
    // Without a per-token π_old/π_behav weight a stale batch would train as on-policy.
    for refused in ["none", "seq_mask"] {
        let text = format!("{grpo}max_staleness = 1\nrollout_correction = \"{refused}\"\n");
        let e = validate(&parse(&text, &[]).unwrap(), Path::new("r.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rl.rollout_correction") && e.contains("on-policy"),
            "{e}"
        );
    }
    let r = parse(&format!("{grpo}max_staleness = 1\ntis_cap = 5.0\n"), &[]).unwrap();
    assert_eq!(r.rl.tis_cap_in_force(), Some(5.0));
    let on_policy = parse(grpo, &[]).unwrap();
    assert_eq!(on_policy.rl.tis_cap_in_force(), None);
    let text = format!("{grpo}max_staleness = {}\n", MAX_STALENESS + 1);
    let e = validate(&parse(&text, &[]).unwrap(), Path::new("r.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rl.max_staleness"), "{e}");
}

/// `rl.routing_replay`: a mixture-of-experts policy in an RL run; a dense policy (by
/// `model.init_family` or a folder's config.json) and non-RL runs are refused by name.
#[test]
fn routing_replay_needs_a_mixture_of_experts_policy_in_an_rl_run() {
    let on = "[rl]\nrouting_replay = true\n";
    let moe = format!("[model]\ninit_family = \"qwen3_moe\"\n{on}");
    validate(&parse(&moe, &[]).unwrap(), Path::new("r.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dense = oxalign_models::ModelConfig::preset(
        oxalign_models::Family::Qwen2,
        oxalign_models::Preset::Tiny,
        64,
    );
    dense
        .save(&dir.path().join("config.json"), "Qwen2ForCausalLM")
        .unwrap();
    let folder = format!(
        "[model]\npath = {:?}\n{on}",
        dir.path().display().to_string()
    );
    let data = dir.path().join("sft.jsonl").display().to_string();
    std::fs::write(&data, "{\"prompt\": \"1+1=\", \"response\": \"2\"}\n").unwrap();
    for (text, want) in [
        (format!("[model]\ninit_family = \"qwen2\"\n{on}"), "dense"),
        (folder, "dense"),
        (
            format!("[run]\nkind = \"sft\"\n[sft]\nsteps = 5\n[data]\npath = {data:?}\n{moe}"),
            "run.kind",
        ),
    ] {
        // A non-RL run does not read `[rl]`: refused as the recipe is parsed.
        let e = match parse(&text, &[]) {
            Ok(r) => validate(&r, Path::new("r.toml")).unwrap_err(),
            Err(e) => e,
        };
        let e = e.to_string();
        assert!(e.contains("rl.routing_replay") && e.contains(want), "{e}");
    }
}

/// `model.router_aux_loss_coef`: finite and not negative, on a mixture-of-experts policy.
#[test]
fn the_router_aux_loss_coef_needs_routers_and_a_finite_weight() {
    let moe = "[model]\ninit_family = \"qwen3_moe\"\nrouter_aux_loss_coef = 0.01\n";
    let r = parse(moe, &[]).unwrap();
    validate(&r, Path::new("r.toml")).unwrap();
    assert_eq!(r.model.router_aux_loss_coef, Some(0.01));
    for (text, want) in [
        (
            "[model]\ninit_family = \"qwen2\"\nrouter_aux_loss_coef = 0.01\n",
            "dense",
        ),
        (
            "[model]\ninit_family = \"mixtral\"\nrouter_aux_loss_coef = -1.0\n",
            ">= 0",
        ),
        (
            "[model]\ninit_family = \"mixtral\"\nrouter_aux_loss_coef = nan\n",
            ">= 0",
        ),
    ] {
        let e = validate(&parse(text, &[]).unwrap(), Path::new("r.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model.router_aux_loss_coef") && e.contains(want),
            "{e}"
        );
    }
}

/// `rl.trainer_precision = "fake_int8"` needs the CPU int8 engine.
#[test]
fn a_fake_int8_trainer_needs_the_cpu_int8_engine() {
    let on = "[rl]\ntrainer_precision = \"fake_int8\"\n";
    let ok = format!("[engine]\nquant = \"int8\"\n{on}");
    let r = parse(&ok, &[]).unwrap();
    validate(&r, Path::new("r.toml")).unwrap();
    assert_eq!(r.rl.trainer_precision, oxalign_models::Precision::FakeInt8);
    for (text, want) in [
        (on.to_string(), "engine.quant"),
        (format!("[engine]\nquant = \"q4\"\n{on}"), "engine.quant"),
    ] {
        let e = validate(&parse(&text, &[]).unwrap(), Path::new("r.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rl.trainer_precision") && e.contains(want),
            "{e}"
        );
    }
}

/// `model.precision` sets every trainer's numbers (both spellings of bf16 mixed read);
/// `rl.trainer_precision` overrides it for the policy; `fake_int8` is the policy's alone.
#[test]
fn model_precision_sets_every_trainer_and_refuses_fake_int8() {
    use oxalign_models::Precision;
    for spelling in ["bf16_mixed", "bf16-mixed"] {
        let r = parse(&format!("[model]\nprecision = \"{spelling}\"\n"), &[]).unwrap();
        validate(&r, Path::new("r.toml")).unwrap();
        assert_eq!(r.model.precision, Precision::Bf16Mixed);
        assert_eq!(r.policy_precision(), Precision::Bf16Mixed);
    }
    let r = parse("[rl]\ntrainer_precision = \"bf16_mixed\"\n", &[]).unwrap();
    validate(&r, Path::new("r.toml")).unwrap();
    assert_eq!(
        (r.model.precision, r.policy_precision()),
        (Precision::F32, Precision::Bf16Mixed)
    );
    let r = parse("", &["model.precision=bf16_mixed"]).unwrap();
    assert_eq!(r.model.precision, Precision::Bf16Mixed);
    let bad = parse("[model]\nprecision = \"fake_int8\"\n", &[]).unwrap();
    let e = validate(&bad, Path::new("r.toml")).unwrap_err().to_string();
    assert!(
        e.contains("model.precision") && e.contains("rl.trainer_precision"),
        "{e}"
    );
    let e = parse("[model]\nprecision = \"fp8\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("bf16_mixed"), "{e}");
}

#[test]
fn sft_examples_belong_to_the_warm_up_before_rl() {
    let ok = parse("[sft]\nsteps = 10\nexamples = 32\n", &[]).unwrap();
    validate(&ok, Path::new("r.toml")).unwrap();
    assert_eq!(ok.sft.examples, 32);
    let no_warm_up = parse("[sft]\nexamples = 32\n", &[]).unwrap();
    let e = validate(&no_warm_up, Path::new("r.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sft.examples") && e.contains("sft.steps = 0"),
        "{e}"
    );
}

#[test]
fn an_engine_placement_is_checked() {
    let ok = parse("[placement]\nengine = \"cpu\"\n", &[]).unwrap();
    validate(&ok, Path::new("r.toml")).unwrap();
    // Without the key nothing changes in the resolved recipe.
    assert!(!Recipe::default().to_toml().contains("engine = "));
    for (text, says) in [
        ("[placement]\nengine = \"node3:cpu\"\n", "node3"),
        (
            "[placement]\nengine = \"cpu\"\n[rl]\nrouting_replay = true\n",
            "routing_replay",
        ),
        (
            "[cluster]\nrefit_bucket_mb = 0\n",
            "cluster.refit_bucket_mb",
        ),
        (
            "[cluster]\nmax_message_mb = 64\nrefit_bucket_mb = 64\n",
            "below cluster.max_message_mb",
        ),
    ] {
        let r = parse(text, &[]).unwrap();
        let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
}

#[test]
fn a_call_timeout_beyond_a_duration_is_refused_not_a_panic() {
    let r = parse("", &["supervision.call_timeout_s=1e300"]).unwrap();
    let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
    assert!(
        e.contains("supervision.call_timeout_s") && e.contains("1e9"),
        "{e}"
    );
    assert_eq!(
        r.supervision.call_timeout(),
        std::time::Duration::from_secs_f64(MAX_CALL_TIMEOUT_S)
    );
}

/// `data.answer_field` names a column; it is neither empty nor the prompt's own column.
#[test]
fn the_answer_field_must_name_a_column_other_than_the_prompt() {
    let r = parse("[data]\nanswer_field = \"solution\"\n", &[]).unwrap();
    assert_eq!(r.data.answer_field, "solution");
    assert_eq!(Recipe::default().data.answer_field, "answer");
    validate(&r, Path::new("r.toml")).unwrap();
    for bad in ["\"\"", "\"prompt\"", "\"messages\""] {
        let r = parse("", &[&format!("data.answer_field={bad}")]).unwrap();
        let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
        assert!(
            e.contains("data.answer_field") && e.contains("reference answer"),
            "{e}"
        );
    }
    let e = parse("[data]\nanswer_column = \"solution\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("answer_column"), "{e}");
}

/// `model.gradient_checkpointing` is accepted for replicated CPU training (LoRA included)
/// and refused, naming the key and why, where the recompute does not apply.
#[test]
fn gradient_checkpointing_is_refused_where_the_recompute_does_not_apply() {
    let on = "[model]\ngradient_checkpointing = true\n";
    for ok in [on.to_string(), format!("{on}[lora]\nr = 4\n")] {
        let r = parse(&ok, &[]).unwrap();
        validate(&r, Path::new("r.toml")).unwrap();
    }
    for (extra, why) in [
        ("[placement]\nsharding = \"sharded\"\n", "sharded"),
        ("[lora]\ndropout = 0.1\n", "lora.dropout"),
    ] {
        let r = parse(&format!("{on}{extra}"), &[]).unwrap();
        let e = validate(&r, Path::new("r.toml")).unwrap_err().to_string();
        assert!(
            e.contains("model.gradient_checkpointing") && e.contains(why),
            "{e}"
        );
    }
}

//! The parts of a recipe a run kind never reads: `[rl]`, `[reward]` and `[engine]` in an
//! `sft`, `rm` or `dpo` run (but the few keys those runs do read), `[sft]` in an `rm` run,
//! `[rm]` and `[dpo]` outside their kinds, `[[faults]]` (they fire inside RL steps only).
//!
//! A key set there, in the file or by `--set`, would be accepted and silently do nothing,
//! so it is refused, naming the key, the run kind and what reads it. "Set" means written
//! (the TOML tree before it is typed) to a value other than the key's default: a resolved
//! `runs/<name>/recipe.toml`, which writes every key at its default, stays a valid recipe.

use super::{Recipe, RecipeError, RunKind};
use std::path::Path;

/// A top-level part of the recipe that a run kind does not read.
struct Unread {
    /// Its top-level key: a section (`rl`) or `faults`.
    part: &'static str,
    /// Its keys the run kind reads all the same.
    still_read: &'static [&'static str],
    /// What reads it.
    reader: &'static str,
}

const RL: &str = "run.kind = \"rl\"";
const SFT: &str = "run.kind = \"sft\" and the SFT warm-up of run.kind = \"rl\"";
const FAULTS: &str = "the RL steps of run.kind = \"rl\" (faults fire inside RL steps only)";

/// Keys of `[rl]` that every policy or reward-model trainer reads (the gradient clip).
const RL_OFFLINE: &[&str] = &["max_grad_norm"];
/// Keys of `[rl]` that the policy trainer of `sft` and `dpo` runs reads.
const RL_POLICY: &[&str] = &["max_grad_norm", "trainer_precision"];
/// Keys of `[engine]` that DPO's reference reads (it scores with the engine's budgets).
const ENGINE_SCORING: &[&str] = &["block_size", "kv_memory_mb", "max_batched_tokens"];

const fn unread(
    part: &'static str,
    still_read: &'static [&'static str],
    reader: &'static str,
) -> Unread {
    Unread {
        part,
        still_read,
        reader,
    }
}

const RM: Unread = unread("rm", &[], "run.kind = \"rm\"");
const DPO: Unread = unread("dpo", &[], "run.kind = \"dpo\"");
const REWARD: Unread = unread("reward", &[], RL);
const ENGINE: Unread = unread("engine", &[], RL);
const FAULT_LIST: Unread = unread("faults", &[], FAULTS);

const UNREAD_BY_RL: &[Unread] = &[RM, DPO];
const UNREAD_BY_SFT: &[Unread] = &[
    unread("rl", RL_POLICY, RL),
    REWARD,
    ENGINE,
    RM,
    DPO,
    FAULT_LIST,
];
const UNREAD_BY_RM: &[Unread] = &[
    unread("rl", RL_OFFLINE, RL),
    REWARD,
    ENGINE,
    unread("sft", &[], SFT),
    DPO,
    FAULT_LIST,
];
const UNREAD_BY_DPO: &[Unread] = &[
    unread("rl", RL_POLICY, RL),
    REWARD,
    unread("engine", ENGINE_SCORING, RL),
    unread("sft", &["packing"], SFT),
    RM,
    FAULT_LIST,
];

/// What `kind` does not read.
fn unread_by(kind: RunKind) -> &'static [Unread] {
    match kind {
        RunKind::Rl => UNREAD_BY_RL,
        RunKind::Sft => UNREAD_BY_SFT,
        RunKind::Rm => UNREAD_BY_RM,
        RunKind::Dpo => UNREAD_BY_DPO,
    }
}

/// Refuses the first key that `tree` (the recipe as written, `--set` overrides applied) sets
/// in a part `recipe.run.kind` does not read, to a value other than its default.
pub(super) fn check(tree: &toml::Table, recipe: &Recipe, path: &Path) -> Result<(), RecipeError> {
    let typed = toml::Value::try_from(recipe).ok();
    let defaults = toml::Value::try_from(Recipe::default()).ok();
    let at = |tree: &Option<toml::Value>, keys: &[&str]| {
        keys.iter()
            .try_fold(tree.as_ref()?, |v, k| v.get(k))
            .cloned()
    };
    let kind = recipe.run.kind;
    for u in unread_by(kind) {
        let written: Vec<Vec<&str>> = match tree.get(u.part) {
            None => continue,
            Some(toml::Value::Table(t)) => t.keys().map(|k| vec![u.part, k.as_str()]).collect(),
            Some(_) => vec![vec![u.part]],
        };
        for keys in written {
            let still_read = keys.get(1).is_some_and(|k| u.still_read.contains(k));
            if still_read || at(&typed, &keys) == at(&defaults, &keys) {
                continue;
            }
            return Err(refusal(path, &keys.join("."), kind, u));
        }
    }
    Ok(())
}

/// The error for `key` of `u`, set in a `kind` run.
fn refusal(path: &Path, key: &str, kind: RunKind, u: &Unread) -> RecipeError {
    let kind = toml::Value::try_from(kind)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let part = match u.part {
        "faults" => "[[faults]]".to_string(),
        p => format!("[{p}]"),
    };
    let but = match u.still_read {
        [] => String::new(),
        keys => {
            let keys: Vec<String> = keys.iter().map(|k| format!("{}.{k}", u.part)).collect();
            format!(" (only {})", keys.join(", "))
        }
    };
    RecipeError::Invalid {
        path: path.to_path_buf(),
        key: key.to_string(),
        message: format!(
            "run.kind = {kind} does not read {part}{but}, so this setting would be ignored; \
             {} reads it: remove the key, or set run.kind to the run that reads it",
            u.reader
        ),
    }
}

#[cfg(test)]
mod tests {
    use crate::recipe::{Recipe, RecipeError};
    use std::path::Path;

    fn parse(text: &str, sets: &[&str]) -> Result<Recipe, RecipeError> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Recipe::parse(text, Path::new("r.toml"), &sets)
    }

    fn refused(text: &str, sets: &[&str]) -> String {
        let e = parse(text, sets).unwrap_err();
        assert!(matches!(e, RecipeError::Invalid { .. }), "{e}");
        e.to_string()
    }

    #[test]
    fn a_key_of_a_section_the_run_kind_does_not_read_is_refused_by_name() {
        let sft = "[run]\nkind = \"sft\"\n";
        let e = refused(sft, &["rl.lr=2e-5"]);
        assert!(e.starts_with("r.toml: key `rl.lr`"), "{e}");
        assert!(e.contains("run.kind = \"sft\" does not read [rl]"), "{e}");
        assert!(
            e.contains("(only rl.max_grad_norm, rl.trainer_precision)"),
            "{e}"
        );
        assert!(e.contains("run.kind = \"rl\" reads it"), "{e}");
        for (text, key) in [
            (format!("{sft}[reward]\nkind = \"model\"\n"), "reward.kind"),
            (format!("{sft}[engine]\nmax_running = 3\n"), "engine.max_running"),
            (format!("{sft}[dpo]\nbeta = 0.5\n"), "dpo.beta"),
            ("[run]\nkind = \"rm\"\n[sft]\nlr = 0.5\n".into(), "sft.lr"),
            ("[rm]\nsteps = 3\n".into(), "rm.steps"),
            (
                format!("{sft}[[faults]]\nrole = \"policy\"\nphase = \"policy_train\"\nstep = 1\nkind = \"error\"\n"),
                "faults",
            ),
        ] {
            let e = refused(&text, &[]);
            assert!(e.contains(&format!("key `{key}`")), "{key}: {e}");
        }
    }

    #[test]
    fn keys_the_kind_still_reads_defaults_and_resolved_recipes_pass() {
        let dpo = "[run]\nkind = \"dpo\"\n[rl]\nmax_grad_norm = 0.5\ntrainer_precision = \"bf16_mixed\"\n\
                   [engine]\nkv_memory_mb = 64\n[sft]\npacking = true\n";
        parse(dpo, &[]).unwrap();
        let e = refused(dpo, &["engine.quant=\"int8\""]);
        assert!(
            e.contains("(only engine.block_size, engine.kv_memory_mb"),
            "{e}"
        );
        // Written at its default: nothing is lost, so it passes.
        parse("[run]\nkind = \"sft\"\n[rl]\nalgorithm = \"ppo\"\n", &[]).unwrap();
        for kind in ["rl", "sft", "rm", "dpo"] {
            let r = parse(&format!("[run]\nkind = \"{kind}\"\n"), &[]).unwrap();
            let resolved = parse(&r.to_toml(), &[]).unwrap();
            assert_eq!(resolved, r, "{kind}");
        }
    }
}

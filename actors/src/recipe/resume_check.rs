//! What a resumed run may change in its recipe. A resume continues a computation, so every
//! key that decides what the run computes (seed, data, model, batch shapes, algorithm,
//! learning rates, placement...) must equal the run's stored `recipe.toml`. Only the keys in
//! [`RESUMABLE_KEYS`] may differ, and only when `--allow-change KEY` names them.

use super::{Recipe, RecipeError};
use std::collections::BTreeMap;

/// Keys that can change on resume without changing what any step computes (how long the run
/// is, how often it is saved, how it is supervised, which faults are injected, how worker
/// nodes are reached, and how the reward service is reached; its URL is not among them). Each still
/// has to be named with `--allow-change`.
pub const RESUMABLE_KEYS: &[&str] = &[
    "run.steps",
    "run.checkpoint_every",
    "run.keep_checkpoints",
    "sft.checkpoint_every",
    "supervision.call_timeout_s",
    "supervision.max_restarts",
    "supervision.restart_window",
    "faults",
    "log.tensorboard",
    "log.completions_every",
    "cluster.connect_timeout_s",
    "cluster.max_message_mb",
    "cluster.tls_cert",
    "cluster.tls_key",
    "cluster.tls_ca",
    "cluster.insecure",
    "cluster.cookie_env",
    "reward.http.timeout_s",
    "reward.http.max_retries",
    "reward.http.backoff_min_s",
    "reward.http.backoff_max_s",
    "reward.http.retry_budget_s",
    "reward.http.rows_per_request",
    "reward.http.concurrency",
    "reward.http.breaker_failures",
    "reward.http.breaker_cooldown_s",
];

/// True for a key of [`RESUMABLE_KEYS`], or a node's address (`cluster.nodes.<name>`: the
/// worker may come back elsewhere; which role runs on which node is `placement`, fixed).
fn resumable(key: &str) -> bool {
    RESUMABLE_KEYS.contains(&key) || key.starts_with("cluster.nodes.")
}

/// Keys a resume sets itself (the run continues in its own folder).
const LOCATION_KEYS: &[&str] = &["run.name", "run.out_dir"];

fn flatten(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, child) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, child, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

fn flat(recipe: &Recipe) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(v) = toml::Value::try_from(recipe) {
        flatten("", &v, &mut out);
    }
    out
}

/// Dotted keys whose values differ between `old` and `new`, as `(key, old, new)`; an unset
/// optional key reads `(unset)`. The run's location keys are not compared.
pub fn changed_keys(old: &Recipe, new: &Recipe) -> Vec<(String, String, String)> {
    let (a, b) = (flat(old), flat(new));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let unset = || "(unset)".to_string();
    keys.into_iter()
        .filter(|k| !LOCATION_KEYS.contains(&k.as_str()))
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let old = a.get(k).cloned().unwrap_or_else(unset);
            let new = b.get(k).cloned().unwrap_or_else(unset);
            (k.clone(), old, new)
        })
        .collect()
}

/// Refuses a resume whose recipe differs from the stored one `old` (read from `stored`, a
/// path used in messages) in a key that is not both in [`RESUMABLE_KEYS`] and in `allowed`.
/// Naming a key in `allowed` that is not resumable is refused too.
pub fn check_resume(
    old: &Recipe,
    new: &Recipe,
    stored: &std::path::Path,
    allowed: &[String],
) -> Result<(), RecipeError> {
    if let Some(bad) = allowed.iter().find(|k| !resumable(k)) {
        return Err(RecipeError::Resume {
            message: format!(
                "--allow-change {bad}: only {} and cluster.nodes.<node> may change when a run resumes; other keys change what the run computes, so start a new run (--set run.name=NEW) instead",
                RESUMABLE_KEYS.join(", ")
            ),
        });
    }
    let changed = changed_keys(old, new);
    let describe = |keys: &[&(String, String, String)]| {
        keys.iter()
            .map(|(k, o, n)| format!("{k} ({o} -> {n})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let fixed: Vec<_> = changed.iter().filter(|(k, _, _)| !resumable(k)).collect();
    if !fixed.is_empty() {
        return Err(RecipeError::Resume {
            message: format!(
                "--resume: the recipe changes keys that decide what the run computes: {}; resume with the recipe the run was started with ({}), or start a new run (--set run.name=NEW)",
                describe(&fixed),
                stored.display()
            ),
        });
    }
    let unallowed: Vec<_> = changed
        .iter()
        .filter(|(k, _, _)| !allowed.contains(k))
        .collect();
    if !unallowed.is_empty() {
        let flags: Vec<String> = unallowed
            .iter()
            .map(|(k, _, _)| format!("--allow-change {k}"))
            .collect();
        return Err(RecipeError::Resume {
            message: format!(
                "--resume: the recipe differs from {} in {}; to continue with the new value, add {}",
                stored.display(),
                describe(&unallowed),
                flags.join(" ")
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn recipe(overrides: &[&str]) -> Recipe {
        let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Recipe::parse("", Path::new("r.toml"), &o).unwrap()
    }

    #[test]
    fn changed_keys_are_named_and_only_resumable_ones_can_be_allowed() {
        let old = recipe(&[]);
        let stored = Path::new("runs/x/recipe.toml");
        check_resume(&old, &recipe(&["run.name=other"]), stored, &[]).unwrap();

        let new = recipe(&["rl.lr=2e-5", "run.seed=7"]);
        let err = check_resume(&old, &new, stored, &["run.steps".into()]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("rl.lr") && msg.contains("run.seed"), "{msg}");

        let longer = recipe(&["run.steps=40"]);
        let err = check_resume(&old, &longer, stored, &[]).unwrap_err();
        assert!(
            err.to_string().contains("--allow-change run.steps"),
            "{err}"
        );
        check_resume(&old, &longer, stored, &["run.steps".into()]).unwrap();

        let err = check_resume(&old, &old, stored, &["rl.lr".into()]).unwrap_err();
        assert!(err.to_string().contains("--allow-change rl.lr"), "{err}");

        let tis = recipe(&["rl.tis_cap=2.0"]);
        let changed = changed_keys(&old, &tis);
        assert_eq!(
            changed,
            vec![("rl.tis_cap".into(), "(unset)".into(), "2.0".into())]
        );
    }

    #[test]
    fn a_node_may_come_back_at_another_address_but_roles_stay_where_they_were() {
        let stored = Path::new("runs/x/recipe.toml");
        let old = recipe(&[
            "cluster.nodes.node1=127.0.0.1:7101",
            "placement.policy=node1:cpu",
        ]);
        let moved = recipe(&[
            "cluster.nodes.node1=127.0.0.1:7201",
            "placement.policy=node1:cpu",
        ]);
        let key = "cluster.nodes.node1".to_string();
        check_resume(&old, &moved, stored, std::slice::from_ref(&key)).unwrap();
        let err = check_resume(&old, &moved, stored, &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("--allow-change cluster.nodes.node1"),
            "{err}"
        );
        let local = recipe(&["cluster.nodes.node1=127.0.0.1:7101"]);
        let err = check_resume(&old, &local, stored, &[key]).unwrap_err();
        assert!(err.to_string().contains("placement.policy"), "{err}");
    }
}

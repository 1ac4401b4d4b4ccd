//! Renders a monitor snapshot in the Prometheus text exposition format (version 0.0.4) for
//! `/metrics`. It keeps no counters of its own: every value comes from the snapshot.
//!
//! Written here rather than with `prometheus-client`: that crate's model is a registry of
//! live metric objects updated as events happen, while the monitor already holds the state
//! and a scrape only has to print it (about 40 lines of formatting; label escaping per the
//! format's rules, tested below). Mirroring the snapshot into a registry on every scrape would
//! add a dependency and a second copy of the state for no gain.

use std::collections::BTreeMap;
use std::fmt::Write;

use oxalign_actors::monitor::{metric, ActorStatus, MonitorSnapshot};

/// `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Standard step metrics exported as their own gauge: (metric name, gauge name, help).
const NAMED_GAUGES: &[(&str, &str, &str)] = &[
    (
        metric::REWARD_MEAN,
        "oxalign_reward_mean",
        "Mean sequence reward of the latest step.",
    ),
    (
        metric::REWARD_STD,
        "oxalign_reward_std",
        "Standard deviation of the sequence rewards of the latest step.",
    ),
    (
        metric::KL,
        "oxalign_kl",
        "Mean KL(policy || reference) of the latest step, in nats.",
    ),
    (
        metric::POLICY_LOSS,
        "oxalign_policy_loss",
        "Policy loss of the latest step.",
    ),
    (
        metric::VALUE_LOSS,
        "oxalign_value_loss",
        "Critic value loss of the latest step.",
    ),
    (
        metric::ENTROPY,
        "oxalign_entropy",
        "Mean per-token policy entropy of the latest step, in nats.",
    ),
    (
        metric::TOKENS_PER_SEC,
        "oxalign_tokens_per_second",
        "Generated tokens per second in the latest step.",
    ),
    (
        metric::STEP_SECONDS,
        "oxalign_step_seconds",
        "Wall-clock duration of the latest step, in seconds.",
    ),
];

/// Writes a float the way Prometheus parses it (`NaN`, `+Inf`, `-Inf`, else shortest
/// round-trip form, exponent allowed).
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v:?}")
    }
}

/// Escapes a label value (`\`, `"`, newline).
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    // HELP text escapes only `\` and newline
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One metric family: its `# HELP` and `# TYPE` lines, then one sample per
/// `(labels, value)`, where `labels` is the `{...}` part or empty.
fn family(
    out: &mut String,
    (name, kind, help): (&str, &str, &str),
    samples: impl IntoIterator<Item = (String, String)>,
) {
    header(out, name, kind, help);
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// `{actor="<name>"}`.
fn actor_label(name: &str) -> String {
    format!("{{actor=\"{}\"}}", label(name))
}

/// Renders `snap`; `now_unix_ms` is used for heartbeat ages.
pub fn render(snap: &MonitorSnapshot, now_unix_ms: u64) -> String {
    let mut out = String::new();
    run_families(&mut out, snap);
    metric_families(&mut out, snap);
    checkpoint_families(&mut out, snap);
    actor_families(&mut out, snap, now_unix_ms);
    out
}

/// The run's name and whether it has ended.
fn run_families(out: &mut String, snap: &MonitorSnapshot) {
    let info = (
        "oxalign_run_info",
        "gauge",
        "Always 1; labels name the run.",
    );
    let run = snap.run.as_ref();
    let labels = run.map(|r| (format!("{{run=\"{}\"}}", label(&r.name)), "1".to_string()));
    family(out, info, labels);
    let finished = (
        "oxalign_run_finished",
        "gauge",
        "1 once the run has ended, else 0.",
    );
    let value = u8::from(snap.finished.is_some()).to_string();
    family(out, finished, [(String::new(), value)]);
}

/// The latest step, the standard step metrics as gauges of their own, and the latest
/// value of every step metric by name.
fn metric_families(out: &mut String, snap: &MonitorSnapshot) {
    // latest reported value of every metric, and the step it came from
    let mut latest: BTreeMap<&str, f64> = BTreeMap::new();
    for m in &snap.metrics {
        for (k, v) in &m.values {
            latest.insert(k.as_str(), *v);
        }
    }
    let step = (
        "oxalign_step",
        "gauge",
        "Latest training step that reported metrics.",
    );
    let latest_step = snap
        .latest_metrics()
        .map(|m| (String::new(), m.step.to_string()));
    family(out, step, latest_step);
    for (key, name, help) in NAMED_GAUGES {
        let value = latest.get(key).map(|v| (String::new(), float(*v)));
        family(out, (name, "gauge", help), value);
    }
    let every = (
        "oxalign_metric",
        "gauge",
        "Latest value of every step metric, by name (see metrics.jsonl).",
    );
    let samples = latest
        .iter()
        .map(|(k, v)| (format!("{{name=\"{}\"}}", label(k)), float(*v)));
    family(out, every, samples);
}

/// How many checkpoints were written, and the latest one's step.
fn checkpoint_families(out: &mut String, snap: &MonitorSnapshot) {
    let count = (
        "oxalign_checkpoints",
        "gauge",
        "Number of checkpoints written.",
    );
    family(
        out,
        count,
        [(String::new(), snap.checkpoints.len().to_string())],
    );
    let last = (
        "oxalign_last_checkpoint_step",
        "gauge",
        "Step of the latest checkpoint.",
    );
    let step = snap
        .checkpoints
        .last()
        .map(|c| (String::new(), c.step.to_string()));
    family(out, last, step);
}

/// Each actor's status, restarts, queue depth, throughput and heartbeat age.
fn actor_families(out: &mut String, snap: &MonitorSnapshot, now_unix_ms: u64) {
    let actors = &snap.actors;
    let status = (
        "oxalign_actor_status",
        "gauge",
        "1 for the actor's current status, 0 for the others.",
    );
    let samples = actors.iter().flat_map(|a| {
        ActorStatus::ALL.into_iter().map(move |s| {
            let labels = format!("{{actor=\"{}\",status=\"{}\"}}", label(&a.name), s.as_str());
            (labels, u8::from(a.status == s).to_string())
        })
    });
    family(out, status, samples);
    let restarts = (
        "oxalign_actor_restarts_total",
        "counter",
        "Times the actor was restarted by its supervisor.",
    );
    let samples = actors
        .iter()
        .map(|a| (actor_label(&a.name), a.restarts.to_string()));
    family(out, restarts, samples);
    let queue = (
        "oxalign_actor_queue_depth",
        "gauge",
        "Requests waiting in the actor's inbound queue.",
    );
    let samples = actors
        .iter()
        .map(|a| (actor_label(&a.name), a.queue_depth.to_string()));
    family(out, queue, samples);
    let rate = (
        "oxalign_actor_items_per_second",
        "gauge",
        "Actor throughput, items per second.",
    );
    let samples = actors
        .iter()
        .map(|a| (actor_label(&a.name), float(a.items_per_sec)));
    family(out, rate, samples);
    let age = (
        "oxalign_actor_heartbeat_age_seconds",
        "gauge",
        "Seconds since the actor's last heartbeat.",
    );
    let samples = actors
        .iter()
        .filter(|a| a.last_heartbeat_unix_ms > 0)
        .map(|a| {
            let secs = now_unix_ms.saturating_sub(a.last_heartbeat_unix_ms) as f64 / 1000.0;
            (actor_label(&a.name), float(secs))
        });
    family(out, age, samples);
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxalign_actors::monitor::{
        ActorInfo, MonitorEvent, MonitorLimits, MonitorState, StepMetrics,
    };

    #[test]
    fn renders_types_values_and_escaped_labels() {
        let mut st = MonitorState::new(MonitorLimits::default());
        let mut a = ActorInfo::new("we\"ird\\name", "policy", vec![]);
        a.last_heartbeat_unix_ms = 1_000;
        st.apply(&MonitorEvent::Actor(a));
        st.apply(&MonitorEvent::Metrics(
            StepMetrics::new(4)
                .with("kl", 1e-7)
                .with("entropy", f64::NAN)
                .with("x", f64::INFINITY),
        ));
        let text = render(&st.snapshot(), 3_500);
        assert!(text.contains("oxalign_step 4\n"), "{text}");
        assert!(text.contains("oxalign_kl 1e-7\n"), "{text}");
        assert!(text.contains("oxalign_entropy NaN\n"), "{text}");
        assert!(text.contains("oxalign_metric{name=\"x\"} +Inf\n"), "{text}");
        assert!(
            text.contains("oxalign_actor_status{actor=\"we\\\"ird\\\\name\",status=\"idle\"} 1\n")
        );
        assert!(
            text.contains("oxalign_actor_heartbeat_age_seconds{actor=\"we\\\"ird\\\\name\"} 2.5\n")
        );
        assert!(text.contains("# TYPE oxalign_actor_restarts_total counter\n"));
        // no metric without its TYPE line before it
        let mut typed = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(typed.contains(name), "{name} has no TYPE line");
            }
        }
    }
}

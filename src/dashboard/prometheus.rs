//! Renders a monitor snapshot in the Prometheus text exposition format (version 0.0.4) for
//! `/metrics`. It keeps no counters of its own: every value comes from the snapshot.

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

/// Renders `snap`; `now_unix_ms` is used for heartbeat ages.
pub fn render(snap: &MonitorSnapshot, now_unix_ms: u64) -> String {
    let mut out = String::new();

    header(
        &mut out,
        "oxalign_run_info",
        "gauge",
        "Always 1; labels name the run.",
    );
    if let Some(run) = &snap.run {
        let _ = writeln!(out, "oxalign_run_info{{run=\"{}\"}} 1", label(&run.name));
    }
    header(
        &mut out,
        "oxalign_run_finished",
        "gauge",
        "1 once the run has ended, else 0.",
    );
    let _ = writeln!(
        out,
        "oxalign_run_finished {}",
        u8::from(snap.finished.is_some())
    );

    // latest reported value of every metric, and the step it came from
    let mut latest: BTreeMap<&str, f64> = BTreeMap::new();
    for m in &snap.metrics {
        for (k, v) in &m.values {
            latest.insert(k.as_str(), *v);
        }
    }
    header(
        &mut out,
        "oxalign_step",
        "gauge",
        "Latest training step that reported metrics.",
    );
    if let Some(m) = snap.latest_metrics() {
        let _ = writeln!(out, "oxalign_step {}", m.step);
    }
    for (key, name, help) in NAMED_GAUGES {
        header(&mut out, name, "gauge", help);
        if let Some(v) = latest.get(key) {
            let _ = writeln!(out, "{name} {}", float(*v));
        }
    }
    header(
        &mut out,
        "oxalign_metric",
        "gauge",
        "Latest value of every step metric, by name (see metrics.jsonl).",
    );
    for (k, v) in &latest {
        let _ = writeln!(out, "oxalign_metric{{name=\"{}\"}} {}", label(k), float(*v));
    }

    header(
        &mut out,
        "oxalign_checkpoints",
        "gauge",
        "Number of checkpoints written.",
    );
    let _ = writeln!(out, "oxalign_checkpoints {}", snap.checkpoints.len());
    header(
        &mut out,
        "oxalign_last_checkpoint_step",
        "gauge",
        "Step of the latest checkpoint.",
    );
    if let Some(c) = snap.checkpoints.last() {
        let _ = writeln!(out, "oxalign_last_checkpoint_step {}", c.step);
    }

    header(
        &mut out,
        "oxalign_actor_status",
        "gauge",
        "1 for the actor's current status, 0 for the others.",
    );
    for a in &snap.actors {
        for s in ActorStatus::ALL {
            let _ = writeln!(
                out,
                "oxalign_actor_status{{actor=\"{}\",status=\"{}\"}} {}",
                label(&a.name),
                s.as_str(),
                u8::from(a.status == s)
            );
        }
    }
    header(
        &mut out,
        "oxalign_actor_restarts_total",
        "counter",
        "Times the actor was restarted by its supervisor.",
    );
    for a in &snap.actors {
        let _ = writeln!(
            out,
            "oxalign_actor_restarts_total{{actor=\"{}\"}} {}",
            label(&a.name),
            a.restarts
        );
    }
    header(
        &mut out,
        "oxalign_actor_queue_depth",
        "gauge",
        "Requests waiting in the actor's inbound queue.",
    );
    for a in &snap.actors {
        let _ = writeln!(
            out,
            "oxalign_actor_queue_depth{{actor=\"{}\"}} {}",
            label(&a.name),
            a.queue_depth
        );
    }
    header(
        &mut out,
        "oxalign_actor_items_per_second",
        "gauge",
        "Actor throughput, items per second.",
    );
    for a in &snap.actors {
        let _ = writeln!(
            out,
            "oxalign_actor_items_per_second{{actor=\"{}\"}} {}",
            label(&a.name),
            float(a.items_per_sec)
        );
    }
    header(
        &mut out,
        "oxalign_actor_heartbeat_age_seconds",
        "gauge",
        "Seconds since the actor's last heartbeat.",
    );
    for a in snap.actors.iter().filter(|a| a.last_heartbeat_unix_ms > 0) {
        let age = now_unix_ms.saturating_sub(a.last_heartbeat_unix_ms) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "oxalign_actor_heartbeat_age_seconds{{actor=\"{}\"}} {}",
            label(&a.name),
            float(age)
        );
    }
    out
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

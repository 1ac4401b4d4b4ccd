//! The dashboard server over real HTTP on 127.0.0.1: state JSON, Prometheus text, token
//! and host checks, the live SSE stream, and replay of a run directory.

mod dashboard_support;

use std::collections::HashMap;
use std::net::SocketAddr;

use dashboard_support::*;
use oxalign::dashboard::{self, DashboardError, DashboardSource};
use oxalign_actors::monitor::{
    unix_ms_now, ActorUpdate, Monitor, MonitorConfig, MonitorEvent, MonitorHandle, RunFinished,
    RunOutcome, StepMetrics,
};

fn loopback0() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let path = path.to_string();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        http_get(addr, &path, &h)
    })
    .await
    .unwrap()
}

/// A monitor with three reported steps.
async fn monitor_with_steps() -> (MonitorHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (monitor, _join) = Monitor::spawn(MonitorConfig::with_run_dir(dir.path().join("run")))
        .await
        .unwrap();
    let t0 = unix_ms_now() - 10_000;
    report_run_start(&monitor, "server-test", t0);
    for step in 0..3 {
        report_step(&monitor, step, t0 + 1000 * step);
    }
    monitor.report(ActorUpdate::restarting("critic"));
    report_checkpoint(&monitor, &dir.path().join("run"), 2, t0 + 3000);
    (monitor, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_metrics_healthz_and_page() {
    let (monitor, _dir) = monitor_with_steps().await;
    let server = dashboard::serve_live(loopback0(), None, monitor.clone())
        .await
        .unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0);

    let state = get(addr, "/api/state", &[]).await;
    assert_eq!(state.status, 200);
    assert!(state.headers["content-type"].starts_with("application/json"));
    let v: serde_json::Value = serde_json::from_str(&state.body).unwrap();
    assert_eq!(v["mode"], "live");
    assert_eq!(v["monitor_running"], true);
    assert_eq!(v["run"]["name"], "server-test");
    assert_eq!(v["run"]["recipe_toml"], RECIPE);
    let actors: Vec<&str> = v["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        actors,
        ["controller", "policy", "reference", "reward", "critic"]
    );
    assert_eq!(v["actors"][4]["status"], "restarting");
    assert_eq!(v["actors"][4]["restarts"], 1);
    assert_eq!(v["metrics"].as_array().unwrap().len(), 3);
    assert_eq!(v["metrics"][2]["step"], 2);
    assert!((v["metrics"][2]["reward_mean"].as_f64().unwrap() - 0.4).abs() < 1e-12);
    assert_eq!(v["checkpoints"][0]["step"], 2);
    assert_eq!(v["spans"].as_array().unwrap().len(), 3 * 8); // 8 spans per step

    let metrics = get(addr, "/metrics", &[]).await;
    assert_eq!(metrics.status, 200);
    assert!(metrics.headers["content-type"].starts_with("text/plain; version=0.0.4"));
    // parse the exposition: every sample belongs to a family with HELP and TYPE lines
    let mut help = HashMap::new();
    let mut kind = HashMap::new();
    let mut samples: HashMap<String, f64> = HashMap::new();
    for line in metrics.body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap();
            help.insert(name.to_string(), text.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').unwrap();
            assert!(["gauge", "counter"].contains(&t), "{line}");
            kind.insert(name.to_string(), t.to_string());
        } else if !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let family = series.split('{').next().unwrap();
            assert!(kind.contains_key(family), "no TYPE before {line}");
            assert!(help.contains_key(family), "no HELP before {line}");
            samples.insert(series.to_string(), value.parse().unwrap());
        }
    }
    assert_eq!(samples["oxalign_step"], 2.0);
    assert!((samples["oxalign_reward_mean"] - 0.4).abs() < 1e-12);
    assert!((samples["oxalign_kl"] - 0.02).abs() < 1e-12);
    assert_eq!(
        samples["oxalign_actor_status{actor=\"policy\",status=\"working\"}"],
        1.0
    );
    assert_eq!(
        samples["oxalign_actor_status{actor=\"policy\",status=\"idle\"}"],
        0.0
    );
    assert_eq!(
        samples["oxalign_actor_status{actor=\"critic\",status=\"restarting\"}"],
        1.0
    );
    assert_eq!(
        samples["oxalign_actor_restarts_total{actor=\"critic\"}"],
        1.0
    );
    assert_eq!(samples["oxalign_actor_queue_depth{actor=\"policy\"}"], 0.0);
    assert_eq!(samples["oxalign_checkpoints"], 1.0);
    assert_eq!(kind["oxalign_actor_restarts_total"], "counter");
    assert_eq!(samples["oxalign_metric{name=\"clip_frac\"}"], 0.1);

    let health = get(addr, "/healthz", &[]).await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));

    let page = get(addr, "/", &[]).await;
    assert_eq!(page.status, 200);
    assert!(page.headers["content-type"].starts_with("text/html"));
    assert!(page.headers["content-security-policy"].contains("connect-src 'self'"));
    assert!(page.body.contains("id=\"actors\"") && page.body.contains("/api/events"));
    assert_eq!(get(addr, "/nope", &[]).await.status, 404);

    // a page served to a name that is not loopback (DNS rebinding) is refused
    let rebound = get(addr, "/api/state", &[("Host", "attacker.example:8265")]).await;
    assert_eq!(rebound.status, 403);

    server.shutdown().await.unwrap();
    monitor.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_required_on_every_route() {
    let (monitor, _dir) = monitor_with_steps().await;
    let token = "s3cret-T0ken";
    let server = dashboard::serve_live(loopback0(), Some(token.into()), monitor.clone())
        .await
        .unwrap();
    let addr = server.local_addr();
    assert_eq!(server.url(), format!("http://{addr}/?token={token}"));
    let bearer = format!("Bearer {token}");
    for path in ["/", "/api/state", "/metrics", "/healthz", "/api/events"] {
        let none = get(addr, path, &[]).await;
        assert_eq!(none.status, 401, "{path} without a token");
        assert!(none.headers["www-authenticate"].starts_with("Bearer"));
        let wrong = get(addr, path, &[("Authorization", "Bearer s3cret-T0kem")]).await;
        assert_eq!(wrong.status, 401, "{path} with a wrong token");
        let wrong_q = get(addr, &format!("{path}?token=s3cret"), &[]).await;
        assert_eq!(wrong_q.status, 401, "{path} with a token prefix");
        if path == "/api/events" {
            let (status, _) = SseReader::open(addr, path, &[("Authorization", &bearer)]);
            assert_eq!(status, 200);
            let (status, _) = SseReader::open(addr, &format!("{path}?token={token}"), &[]);
            assert_eq!(status, 200);
        } else {
            assert_eq!(
                get(addr, path, &[("Authorization", &bearer)]).await.status,
                200,
                "{path}"
            );
            let q = get(addr, &format!("{path}?token={token}"), &[]).await;
            assert_eq!(q.status, 200, "{path} with ?token=");
        }
    }
    server.shutdown().await.unwrap();
    monitor.shutdown().await.unwrap();
}

#[tokio::test]
async fn unsafe_binds_and_bad_tokens_are_refused() {
    let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let err = dashboard::serve_live(any, None, MonitorHandle::disabled())
        .await
        .unwrap_err();
    assert!(matches!(err, DashboardError::TokenRequired { .. }), "{err}");
    assert!(err.to_string().contains("--token"), "{err}");
    let v6: SocketAddr = "[::]:0".parse().unwrap();
    assert!(matches!(
        dashboard::serve_live(v6, None, MonitorHandle::disabled()).await,
        Err(DashboardError::TokenRequired { .. })
    ));
    for bad in ["", "has space", "tab\there"] {
        let err = dashboard::serve_live(loopback0(), Some(bad.into()), MonitorHandle::disabled())
            .await
            .unwrap_err();
        assert!(matches!(err, DashboardError::BadToken), "{bad:?}: {err}");
    }
    let missing = dashboard::spawn(
        loopback0(),
        None,
        DashboardSource::Replay("/definitely/not/a/run".into()),
    )
    .await
    .unwrap_err();
    assert!(
        missing.to_string().contains("/definitely/not/a/run"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_sends_snapshot_then_live_events_then_end() {
    let (monitor, _dir) = monitor_with_steps().await;
    let server = dashboard::serve_live(loopback0(), None, monitor.clone())
        .await
        .unwrap();
    let addr = server.local_addr();
    let (status, mut sse) =
        tokio::task::spawn_blocking(move || SseReader::open(addr, "/api/events", &[]))
            .await
            .unwrap();
    assert_eq!(status, 200);
    let (first, sse_back) = tokio::task::spawn_blocking(move || (sse.next_event(), sse))
        .await
        .unwrap();
    sse = sse_back;
    let first = first.expect("a snapshot event");
    assert_eq!(first.event, "snapshot");
    let snap: serde_json::Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(snap["metrics"].as_array().unwrap().len(), 3);

    // events reported after subscribing arrive in order, as MonitorEvent JSON
    monitor.report(StepMetrics::new(3).with("kl", 0.5));
    monitor.report(ActorUpdate::failed("reward", "reward server timed out"));
    monitor.report(RunFinished {
        outcome: RunOutcome::Failed,
        steps_completed: 3,
        finished_unix_ms: unix_ms_now(),
        message: Some("reward server timed out".into()),
    });
    monitor.shutdown().await.unwrap();
    let events = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        while let Some(e) = sse.next_event() {
            out.push(e);
        }
        out
    })
    .await
    .unwrap();
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["monitor", "monitor", "monitor", "end"]);
    let parsed: Vec<MonitorEvent> = events[..3]
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    assert!(
        matches!(&parsed[0], MonitorEvent::Metrics(m) if m.step == 3 && m.get("kl") == Some(0.5))
    );
    assert!(matches!(&parsed[1], MonitorEvent::ActorUpdate(u) if u.actor == "reward"));
    assert!(matches!(&parsed[2], MonitorEvent::Finished(f) if f.outcome == RunOutcome::Failed));

    // once the monitor has stopped, the server still answers with its final state
    let state = get(addr, "/api/state", &[]).await;
    let v: serde_json::Value = serde_json::from_str(&state.body).unwrap();
    assert_eq!(v["monitor_running"], false);
    assert_eq!(v["metrics"].as_array().unwrap().len(), 4);
    assert_eq!(v["finished"]["outcome"], "failed");
    assert_eq!(v["actors"][3]["status"], "failed");
    // and a new page stream gets that state, then `end`
    let events = tokio::task::spawn_blocking(move || {
        let (_, mut sse) = SseReader::open(addr, "/api/events", &[]);
        std::iter::from_fn(|| sse.next_event())
            .map(|e| e.event)
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(events, ["snapshot", "end"]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_serves_a_finished_run_directory() {
    let (monitor, dir) = monitor_with_steps().await;
    monitor.report(RunFinished {
        outcome: RunOutcome::Completed,
        steps_completed: 3,
        finished_unix_ms: unix_ms_now(),
        message: None,
    });
    std::fs::create_dir_all(dir.path().join("run/checkpoints/step_2")).unwrap();
    let live = monitor.snapshot().await.unwrap();
    monitor.shutdown().await.unwrap();

    let server = dashboard::spawn(
        loopback0(),
        None,
        DashboardSource::Replay(dir.path().join("run")),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let v: serde_json::Value =
        serde_json::from_str(&get(addr, "/api/state", &[]).await.body).unwrap();
    assert_eq!(v["mode"], "replay");
    assert_eq!(v["run"]["name"], "server-test");
    assert_eq!(v["finished"]["outcome"], "completed");
    assert_eq!(v["metrics"].as_array().unwrap().len(), live.metrics.len());
    assert_eq!(v["spans"].as_array().unwrap().len(), live.spans.len());
    assert_eq!(v["actors"][4]["status"], "restarting");
    assert_eq!(v["checkpoints"][0]["step"], 2);
    // replay: a snapshot, then the stream ends
    let events = tokio::task::spawn_blocking(move || {
        let (_, mut sse) = SseReader::open(addr, "/api/events", &[]);
        let mut out = Vec::new();
        while let Some(e) = sse.next_event() {
            out.push(e.event);
        }
        out
    })
    .await
    .unwrap();
    assert_eq!(events, ["snapshot", "end"]);
    let metrics = get(addr, "/metrics", &[]).await.body;
    assert!(metrics.contains("oxalign_run_finished 1\n"), "{metrics}");
    server.shutdown().await.unwrap();
}

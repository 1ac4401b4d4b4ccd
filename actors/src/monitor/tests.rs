//! Tests of the monitor actor end to end: events in, state and run-directory files out,
//! and the replay loader reading those files back. Unit tests of each type sit in its file.

use std::fs;
use std::path::Path;

use super::*;

fn actor(name: &str, role: &str, device: &str) -> ActorInfo {
    ActorInfo::new(name, role, vec![device.to_string()])
}

/// The events one PPO step produces, stamped at `t0` ms.
fn step_events(step: u64, t0: u64) -> Vec<MonitorEvent> {
    let mut ev = vec![
        ActorUpdate::working("policy", format!("generate step {step}")).into(),
        Span::new("policy", phase::GENERATE, step, t0, t0 + 400).into(),
        Span::new(
            "reference",
            phase::REFERENCE_LOGPROBS,
            step,
            t0 + 400,
            t0 + 500,
        )
        .into(),
        Span::new("reward", phase::REWARD, step, t0 + 400, t0 + 450).into(),
        Span::new("critic", phase::VALUES, step, t0 + 400, t0 + 480).into(),
        Span::new("policy", phase::POLICY_TRAIN, step, t0 + 500, t0 + 900).into(),
        ActorUpdate::idle("policy").into(),
    ];
    ev.push(
        StepMetrics {
            step,
            unix_ms: t0 + 1000,
            values: Default::default(),
        }
        .with(metric::REWARD_MEAN, 0.1 * step as f64)
        .with(metric::REWARD_STD, 0.05)
        .with(metric::KL, 0.01 * step as f64)
        .with(metric::POLICY_LOSS, -0.3)
        .into(),
    );
    ev
}

fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn events_update_state_and_write_the_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run1");
    let (monitor, join) = Monitor::spawn(MonitorConfig::with_run_dir(&run_dir))
        .await
        .unwrap();

    monitor.report(RunInfo {
        name: "run1".into(),
        recipe_toml: "[algo]\nname = \"ppo\"\n".into(),
        started_unix_ms: 1_000,
    });
    for (name, dev) in [
        ("controller", "cpu"),
        ("policy", "cpu:0"),
        ("reference", "cpu:1"),
        ("reward", "cpu:1"),
        ("critic", "cpu:0"),
    ] {
        monitor.report(actor(name, name, dev));
    }
    for step in 0..3 {
        for e in step_events(step, 10_000 + step * 1000) {
            monitor.report(e);
        }
    }
    monitor.report(CheckpointInfo {
        step: 2,
        path: run_dir.join("checkpoints/step_2").display().to_string(),
        unix_ms: 13_500,
    });
    monitor.report(ActorUpdate::restarting("critic"));

    let snap = monitor.snapshot().await.unwrap();
    assert_eq!(snap.run.as_ref().unwrap().name, "run1");
    let names: Vec<&str> = snap.actors.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(
        names,
        ["controller", "policy", "reference", "reward", "critic"]
    );
    assert_eq!(snap.actor("policy").unwrap().status, ActorStatus::Idle);
    let critic = snap.actor("critic").unwrap();
    assert_eq!(
        (critic.status, critic.restarts),
        (ActorStatus::Restarting, 1)
    );
    assert_eq!(snap.metrics.len(), 3);
    assert_eq!(snap.latest_metrics().unwrap().get(metric::KL), Some(0.02));
    assert_eq!(snap.spans.len(), 15);
    assert_eq!(snap.checkpoints.len(), 1);

    // the files are written as events arrive, before any shutdown
    let metrics = read_lines(&run_dir.join(files::METRICS));
    assert_eq!(metrics.len(), 3);
    assert_eq!(metrics[1]["step"], 1);
    assert_eq!(metrics[1]["reward_mean"], 0.1);
    let timeline = read_lines(&run_dir.join(files::TIMELINE));
    assert_eq!(timeline.len(), 15);
    assert_eq!(timeline[0]["phase"], "generate");
    assert_eq!(
        fs::read_to_string(run_dir.join(files::RECIPE)).unwrap(),
        "[algo]\nname = \"ppo\"\n"
    );
    let actors: Vec<ActorInfo> =
        serde_json::from_str(&fs::read_to_string(run_dir.join(files::ACTORS)).unwrap()).unwrap();
    assert_eq!(actors.len(), 5);
    assert_eq!(actors[4].status, ActorStatus::Restarting);

    monitor.report(RunFinished {
        outcome: RunOutcome::Completed,
        steps_completed: 3,
        finished_unix_ms: 14_000,
        message: None,
    });
    monitor.shutdown().await.unwrap();
    join.await.unwrap();
    let record: RunRecord =
        serde_json::from_str(&fs::read_to_string(run_dir.join(files::RUN)).unwrap()).unwrap();
    assert_eq!(record.finished.unwrap().steps_completed, 3);
    // reporting after shutdown is a silent no-op, and queries say so
    monitor.report(StepMetrics::new(9));
    assert!(matches!(
        monitor.snapshot().await,
        Err(MonitorError::NotRunning)
    ));
}

#[tokio::test]
async fn replay_loader_round_trips_a_finished_run() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run2");
    let (monitor, _join) = Monitor::spawn(MonitorConfig::with_run_dir(&run_dir))
        .await
        .unwrap();
    monitor.report(RunInfo {
        name: "run2".into(),
        recipe_toml: "seed = 1\n".into(),
        started_unix_ms: 500,
    });
    for name in ["controller", "policy", "reference", "reward", "critic"] {
        monitor.report(actor(name, name, "cpu"));
    }
    for step in 0..4 {
        for e in step_events(step, 1_000 * (step + 1)) {
            monitor.report(e);
        }
    }
    monitor.report(StepMetrics::new(3).with(metric::ENTROPY, f64::NAN));
    for step in [2u64, 3] {
        monitor.report(sample_step(step));
    }
    monitor.report(RunFinished {
        outcome: RunOutcome::Completed,
        steps_completed: 4,
        finished_unix_ms: 9_000,
        message: Some("done".into()),
    });
    for step in [2u64, 4] {
        fs::create_dir_all(run_dir.join(format!("checkpoints/step_{step:06}"))).unwrap();
    }
    fs::create_dir_all(run_dir.join("checkpoints/latest")).unwrap();
    let live = monitor.snapshot().await.unwrap();
    monitor.shutdown().await.unwrap();

    let replayed = load_run_dir(&run_dir, MonitorLimits::default()).unwrap();
    assert_eq!(replayed.run, live.run);
    assert_eq!(replayed.finished, live.finished);
    assert_eq!(replayed.actors, live.actors);
    assert_eq!(replayed.spans, live.spans);
    assert_eq!(replayed.metrics.len(), live.metrics.len());
    for (a, b) in replayed.metrics.iter().zip(&live.metrics) {
        assert_eq!((a.step, a.unix_ms), (b.step, b.unix_ms));
        assert_eq!(a.get(metric::REWARD_MEAN), b.get(metric::REWARD_MEAN));
    }
    // the second report for step 3 merged on both sides, NaN survived as NaN
    assert!(replayed.metrics[3].get(metric::ENTROPY).unwrap().is_nan());
    assert_eq!(replayed.metrics[3].get(metric::KL), Some(0.03));
    let ckpt: Vec<u64> = replayed.checkpoints.iter().map(|c| c.step).collect();
    assert_eq!(ckpt, [2, 4]);
    assert!(replayed.checkpoints[0].path.ends_with("step_000002"));
    // samples.jsonl: every step's lines on disk, the latest step's on the dashboard
    assert_eq!(read_lines(&run_dir.join(files::SAMPLES)).len(), 4);
    assert_eq!(replayed.samples, Some(sample_step(3)));
    assert_eq!(live.samples, Some(sample_step(3)));
}

/// Two logged samples of RL step `step`.
fn sample_step(step: u64) -> StepSamples {
    let record = |completion: &str, reward: f64| SampleRecord {
        step,
        prompt: "2+2=".into(),
        completion: completion.into(),
        reward,
        answer: Some("4".into()),
        finish_reason: "stop".into(),
        episode: None,
    };
    StepSamples {
        step,
        samples: vec![record("4", 1.0), record("5", 0.0)],
    }
}

#[tokio::test]
async fn replay_without_optional_files_and_with_a_torn_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("bare-run");
    fs::create_dir_all(&run_dir).unwrap();
    let span = |actor: &str, step: u64| {
        serde_json::to_string(&Span::new(
            actor,
            phase::GENERATE,
            step,
            100 + step,
            200 + step,
        ))
        .unwrap()
    };
    fs::write(
        run_dir.join(files::TIMELINE),
        format!(
            "{}\n{}\n{{\"actor\":\"pol",
            span("policy-1", 0),
            span("reward", 0)
        ),
    )
    .unwrap();
    let snap = load_run_dir(&run_dir, MonitorLimits::default()).unwrap();
    assert_eq!(snap.run.as_ref().unwrap().name, "bare-run");
    assert_eq!(snap.run.as_ref().unwrap().started_unix_ms, 100);
    let roles: Vec<(&str, &str)> = snap
        .actors
        .iter()
        .map(|a| (a.name.as_str(), a.role.as_str()))
        .collect();
    assert_eq!(roles, [("policy-1", "policy"), ("reward", "reward")]);
    assert_eq!(snap.spans.len(), 2);
    assert!(snap.metrics.is_empty());
}

#[test]
fn replay_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_run_dir(dir.path(), MonitorLimits::default()).unwrap_err();
    assert!(matches!(err, MonitorError::NotARunDir { .. }), "{err}");
    assert!(err.to_string().contains("metrics.jsonl"), "{err}");

    fs::write(
        dir.path().join(files::METRICS),
        "{\"step\":0,\"kl\":0.1}\n{\"kl\":0.2}\n",
    )
    .unwrap();
    let err = load_run_dir(dir.path(), MonitorLimits::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("metrics.jsonl line 2"), "{msg}");
    assert!(msg.contains("step"), "{msg}");

    let missing = load_run_dir(&dir.path().join("nope"), MonitorLimits::default()).unwrap_err();
    assert!(missing.to_string().contains("nope"), "{missing}");
}

#[tokio::test]
async fn subscribers_get_a_consistent_snapshot_then_every_later_event() {
    let (monitor, _join) = Monitor::spawn(MonitorConfig::in_memory()).await.unwrap();
    monitor.report(actor("policy", "policy", "cpu"));
    monitor.report(StepMetrics::new(0).with(metric::KL, 0.5));
    let (snap, mut rx) = monitor.subscribe().await.unwrap();
    assert_eq!(snap.metrics.len(), 1);
    assert_eq!(snap.actors.len(), 1);

    monitor.report(StepMetrics::new(1).with(metric::KL, 0.25));
    {
        let _timer = monitor.time("policy", phase::REFIT, 1);
    }
    match rx.recv().await.unwrap() {
        MonitorEvent::Metrics(m) => assert_eq!((m.step, m.get(metric::KL)), (1, Some(0.25))),
        other => panic!("expected metrics, got {other:?}"),
    }
    match rx.recv().await.unwrap() {
        MonitorEvent::Span(s) => {
            assert_eq!(
                (s.actor.as_str(), s.phase.as_str(), s.step),
                ("policy", "refit", 1)
            );
            assert!(s.end_unix_ms >= s.start_unix_ms);
        }
        other => panic!("expected a span, got {other:?}"),
    }
    monitor.shutdown().await.unwrap();
    // the stream ends when the monitor stops
    assert!(rx.recv().await.is_err());
}

#[tokio::test]
async fn resume_starts_from_the_logged_state_and_keeps_appending() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("resumed");
    let (first, _j) = Monitor::spawn(MonitorConfig::with_run_dir(&run_dir))
        .await
        .unwrap();
    for step in 0..2 {
        for e in step_events(step, 1000 * (step + 1)) {
            first.report(e);
        }
    }
    first.shutdown().await.unwrap();

    let config = MonitorConfig {
        resume: true,
        ..MonitorConfig::with_run_dir(&run_dir)
    };
    let (second, _j) = Monitor::spawn(config).await.unwrap();
    assert_eq!(second.snapshot().await.unwrap().metrics.len(), 2);
    for e in step_events(2, 3000) {
        second.report(e);
    }
    let snap = second.snapshot().await.unwrap();
    assert_eq!(snap.metrics.len(), 3);
    second.shutdown().await.unwrap();
    assert_eq!(read_lines(&run_dir.join(files::METRICS)).len(), 3);
}

#[test]
fn disabled_handle_drops_events() {
    let h = MonitorHandle::disabled();
    assert!(!h.is_enabled());
    h.report(StepMetrics::new(0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(matches!(
        rt.block_on(h.snapshot()),
        Err(MonitorError::NotRunning)
    ));
}

#[test]
fn events_serialise_with_a_type_tag() {
    let e: MonitorEvent = ActorUpdate::working("critic", "values step 4").into();
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["type"], "actor_update");
    assert_eq!(v["data"]["status"], "working");
    let back: MonitorEvent = serde_json::from_value(v).unwrap();
    assert_eq!(back, e);
    let m: MonitorEvent = StepMetrics::new(2).with(metric::KL, 0.1).into();
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["data"]["kl"].as_f64()),
        (Some("metrics"), Some(0.1))
    );
}

#[tokio::test]
async fn sync_returns_after_every_earlier_event_is_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, join) = Monitor::spawn(MonitorConfig::with_run_dir(dir.path()))
        .await
        .unwrap();
    // Reported from another clone, as the controller and the roles do, then a barrier.
    let reporter = handle.clone();
    for step in 1..=50 {
        for e in step_events(step, 1_000 * step) {
            reporter.report(e);
        }
    }
    handle.sync().await.unwrap();
    let text = fs::read_to_string(dir.path().join(files::METRICS)).unwrap();
    let steps: Vec<u64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, (1..=50).collect::<Vec<_>>());
    // A handle without a monitor has nothing to sync.
    MonitorHandle::disabled().sync().await.unwrap();
    handle.shutdown().await.unwrap();
    join.await.unwrap();
}

//! The dashboard in a real browser: headless Chromium loads the page from a server fed by a
//! real `Monitor` (events sent the way the training loop sends them) and the rendered DOM
//! must show every role actor with its status and the reward chart's points. Needs
//! /usr/bin/chromium (install with .ci/install-browser.sh); fails with that hint without it.

mod dashboard_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dashboard_support::*;
use oxalign::dashboard::{self, DashboardSource};
use oxalign_actors::monitor::{
    unix_ms_now, ActorUpdate, Monitor, MonitorConfig, RunFinished, RunOutcome,
};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(90);

fn chromium() -> &'static str {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: the dashboard browser test needs Debian's chromium. \
         Install it with `.ci/install-browser.sh` (CI runs it before the tests)."
    );
    CHROMIUM
}

/// Runs headless Chromium with `extra` arguments on `url`; returns stdout. Killed (and the
/// test failed) if it runs past `CHROMIUM_TIMEOUT`.
fn run_chromium(profile: &Path, extra: &[String], url: &str) -> String {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(extra)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let started = Instant::now();
    let child = cmd.spawn().expect("start chromium");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(CHROMIUM_TIMEOUT) {
        Ok(out) => {
            let out = out.expect("wait for chromium");
            eprintln!(
                "chromium took {:.1}s, exit {:?}",
                started.elapsed().as_secs_f64(),
                out.status.code()
            );
            assert!(
                out.status.success(),
                "chromium failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
        Err(_) => {
            // SIGKILL the browser we started (by its pid) so the test does not hang
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("chromium did not finish within {CHROMIUM_TIMEOUT:?}");
        }
    }
}

/// The start tag of the first element whose start tag contains `needle`.
fn start_tag<'a>(dom: &'a str, needle: &str) -> Option<&'a str> {
    let at = dom.find(needle)?;
    let open = dom[..at].rfind('<')?;
    let close = at + dom[at..].find('>')?;
    Some(&dom[open..=close])
}

/// The value of attribute `name` in a start tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let from = tag.find(&key)? + key.len();
    Some(&tag[from..from + tag[from..].find('"')?])
}

fn screenshot_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("dashboard-browser.png")
}

/// Waits until `done` holds, polling every 50 ms for up to `limit`.
fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn browser_shows_live_actors_statuses_and_reward_chart() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let run_dir = tempfile::tempdir().unwrap();
    let profile = tempfile::tempdir().unwrap();
    let t0 = unix_ms_now() - 8_000;

    // a run in progress: 5 steps done before the browser opens the page
    let (monitor, server) = rt.block_on(async {
        let (monitor, _join) = Monitor::spawn(MonitorConfig::with_run_dir(run_dir.path()))
            .await
            .unwrap();
        report_run_start(&monitor, "browser-test", t0);
        for step in 0..5 {
            report_step(&monitor, step, t0 + 1000 * step);
        }
        report_checkpoint(&monitor, run_dir.path(), 4, t0 + 5_000);
        monitor.snapshot().await.unwrap(); // all of the above applied
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = dashboard::serve_live(addr, None, monitor.clone())
            .await
            .unwrap();
        (monitor, server)
    });
    let url = server.url();

    // Chromium's virtual time stands still while a request is open, so --dump-dom returns
    // only once the live event stream has closed: the page must show what arrived over it.
    let browser = {
        let profile = profile.path().to_path_buf();
        let url = url.clone();
        std::thread::spawn(move || run_chromium(&profile, &["--dump-dom".to_string()], &url))
    };
    wait_until(
        Duration::from_secs(60),
        "the page to open its event stream",
        || server.event_streams() >= 1 || browser.is_finished(),
    );
    assert!(
        !browser.is_finished(),
        "chromium exited before opening the event stream"
    );

    // what the loop reports while the page is open: 3 more steps, a checkpoint, a
    // failing reward model, a critic restart, and the end of the run
    for step in 5..8 {
        report_step(&monitor, step, t0 + 1000 * step);
    }
    report_checkpoint(&monitor, run_dir.path(), 7, t0 + 8_000);
    monitor.report(ActorUpdate::working("policy", "generate step 8").with_queue_depth(2));
    monitor.report(ActorUpdate::restarting("critic"));
    monitor.report(ActorUpdate::failed("reward", "reward model OOM"));
    monitor.report(RunFinished {
        outcome: RunOutcome::Failed,
        steps_completed: 8,
        finished_unix_ms: unix_ms_now(),
        message: Some("reward model OOM".into()),
    });
    rt.block_on(monitor.shutdown()).unwrap(); // closes the page's stream with `end`
    let dom = browser.join().expect("chromium thread");
    std::fs::write(screenshot_path().with_extension("html"), &dom).unwrap();

    let expected = [
        ("controller", "working"),
        ("policy", "working"),
        ("reference", "idle"),
        ("reward", "failed"),
        ("critic", "restarting"),
    ];
    for (actor, status) in expected {
        let tag = start_tag(&dom, &format!("data-actor=\"{actor}\""))
            .unwrap_or_else(|| panic!("no card for actor {actor} in the DOM:\n{dom}"));
        assert_eq!(attr(tag, "data-status"), Some(status), "{actor}: {tag}");
        assert_eq!(attr(tag, "data-role"), Some(actor), "{actor}: {tag}");
    }
    let chart = start_tag(&dom, "id=\"chart-reward\"").expect("a reward chart");
    let points: usize = attr(chart, "data-points").unwrap().parse().unwrap();
    assert_eq!(
        points, 8,
        "5 steps from the snapshot + 3 from the live stream: {chart}"
    );
    let chart = start_tag(&dom, "id=\"chart-accuracy\"").expect("an accuracy chart");
    assert_eq!(
        attr(chart, "data-points"),
        Some("2"),
        "held-out accuracy of steps 3 and 7: {chart}"
    );
    let timeline = start_tag(&dom, "id=\"timeline\"").expect("a timeline");
    let spans: usize = attr(timeline, "data-spans").unwrap().parse().unwrap();
    assert_eq!(spans, 4 * 8, "the last 4 steps, 8 spans each: {timeline}");
    assert!(
        dom.contains("reward model OOM"),
        "failed actor's error shown"
    );
    assert!(dom.contains("kl_coef"), "recipe shown");
    let ckpt = start_tag(&dom, "id=\"checkpoints\"").unwrap();
    assert_eq!(attr(ckpt, "data-count"), Some("2"));
    let status = start_tag(&dom, "id=\"run-status\"").unwrap();
    assert_eq!(attr(status, "data-state"), Some("failed"), "{status}");
    let conn = start_tag(&dom, "id=\"conn\"").unwrap();
    assert_eq!(attr(conn, "data-state"), Some("ended"), "{conn}");

    // the final state stays served after the monitor stopped: take a screenshot of it
    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        profile.path(),
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1400,1000".to_string(),
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "screenshot at {}",
        shot.display()
    );
    // and the whole page, for a person to look at
    let full = shot.with_file_name("dashboard-browser-full.png");
    run_chromium(
        profile.path(),
        &[
            format!("--screenshot={}", full.display()),
            "--window-size=1400,2300".to_string(),
        ],
        &url,
    );
    eprintln!("screenshots: {} and {}", shot.display(), full.display());

    rt.block_on(server.shutdown()).unwrap();
}

#[test]
fn browser_needs_the_token_and_replays_a_finished_run() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let run_dir = tempfile::tempdir().unwrap();
    let profile = tempfile::tempdir().unwrap();
    let server = rt.block_on(async {
        let (monitor, _join) = Monitor::spawn(MonitorConfig::with_run_dir(run_dir.path()))
            .await
            .unwrap();
        let t0 = unix_ms_now() - 6_000;
        report_run_start(&monitor, "replayed-run", t0);
        for step in 0..6 {
            report_step(&monitor, step, t0 + 1000 * step);
        }
        monitor.report(RunFinished {
            outcome: RunOutcome::Completed,
            steps_completed: 6,
            finished_unix_ms: t0 + 6_000,
            message: None,
        });
        monitor.shutdown().await.unwrap();
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let source = DashboardSource::Replay(run_dir.path().to_path_buf());
        dashboard::spawn(addr, Some("browser-T0ken".into()), source)
            .await
            .unwrap()
    });
    let base = format!("http://{}/", server.local_addr());

    // without the token the browser gets the 401 text, and no dashboard
    let denied = run_chromium(profile.path(), &["--dump-dom".to_string()], &base);
    assert!(denied.contains("401 Unauthorized"), "{denied}");
    assert!(!denied.contains("data-actor"), "{denied}");

    // with ?token= the page loads and passes the token on to the API
    let dom = run_chromium(profile.path(), &["--dump-dom".to_string()], &server.url());
    // the last-known actor table (actors.json) as the run left it
    let expected = [
        ("controller", "working"),
        ("policy", "working"),
        ("reference", "idle"),
        ("reward", "idle"),
        ("critic", "idle"),
    ];
    for (actor, status) in expected {
        let tag = start_tag(&dom, &format!("data-actor=\"{actor}\""))
            .unwrap_or_else(|| panic!("no card for {actor}:\n{dom}"));
        assert_eq!(attr(tag, "data-status"), Some(status), "{tag}");
    }
    let chart = start_tag(&dom, "id=\"chart-reward\"").unwrap();
    assert_eq!(attr(chart, "data-points"), Some("6"), "{chart}");
    let conn = start_tag(&dom, "id=\"conn\"").unwrap();
    assert_eq!(attr(conn, "data-state"), Some("replay"), "{conn}");
    let status = start_tag(&dom, "id=\"run-status\"").unwrap();
    assert_eq!(attr(status, "data-state"), Some("completed"), "{status}");
    assert!(dom.contains("replayed-run"));
    rt.block_on(server.shutdown()).unwrap();
}

/// Starts `oxalign train r.toml --quiet --dashboard 127.0.0.1:0 EXTRA` in `dir` and reads
/// its stderr up to the line starting with `announce`. Returns the child, the rest of that
/// line, and a thread that drains (and returns) the rest of stderr.
fn train_with_dashboard(
    dir: &Path,
    extra: &[&str],
    announce: &str,
) -> (
    std::process::Child,
    String,
    std::thread::JoinHandle<Vec<String>>,
) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(["train", "r.toml", "--quiet", "--dashboard", "127.0.0.1:0"])
        .args(extra)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oxalign train");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let rest = loop {
        let Some(line) = lines.next() else {
            panic!("oxalign train ended before printing {announce:?}:\n{seen:#?}")
        };
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix(announce) {
            break rest.trim().to_string();
        }
        seen.push(line);
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    (child, rest, drain)
}

/// A real `oxalign train --dashboard` run: Chromium connects while it trains and the DOM,
/// dumped when the run ends and the event stream closes, shows every actor of the run and
/// the reward points of its steps.
#[test]
fn browser_follows_a_live_training_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("r.toml"),
        "[run]\nname = \"live\"\nsteps = 8\n[data]\nmax_operand = 9\neval_size = 10\n\
         [sft]\nsteps = 10\nbatch_size = 16\n[rl]\nprompts_per_step = 16\nminibatch_size = 16\nmax_new_tokens = 3\n",
    )
    .unwrap();
    let (mut child, url, drain) = train_with_dashboard(dir.path(), &[], "dashboard: ");
    let profile = tempfile::tempdir().unwrap();
    let dom = run_chromium(profile.path(), &["--dump-dom".to_string()], &url);
    let status = child.wait().unwrap();
    let log = drain.join().unwrap().join("\n");
    assert!(status.success(), "oxalign train failed:\n{log}");
    std::fs::write(
        screenshot_path().with_file_name("dashboard-live-run.html"),
        &dom,
    )
    .unwrap();

    for actor in ["controller", "policy", "reference", "reward", "critic"] {
        let tag = start_tag(&dom, &format!("data-actor=\"{actor}\""))
            .unwrap_or_else(|| panic!("no card for actor {actor} in the DOM:\n{dom}"));
        let status = attr(tag, "data-status").unwrap_or("");
        assert!(
            ["idle", "working", "failed", "restarting"].contains(&status),
            "{actor}: {tag}"
        );
    }
    let chart = start_tag(&dom, "id=\"chart-reward\"").expect("a reward chart");
    let points: usize = attr(chart, "data-points").unwrap().parse().unwrap();
    assert!(points >= 1, "no reward point on the chart: {chart}");
}

/// An SFT run with `--dashboard-keep`: the dashboard outlives the run, and its charts are
/// the SFT run's own (training and held-out loss, gradient norm, learning rate), the RL
/// charts hidden. Ctrl-C then stops `oxalign train`, which exits 0.
#[test]
fn an_sft_run_kept_on_the_dashboard_charts_its_loss() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..40)
        .map(|i| format!("{{\"prompt\": \"{i}+1=\", \"response\": \"{}\"}}\n", i + 1))
        .collect();
    std::fs::write(dir.path().join("sft.jsonl"), rows).unwrap();
    std::fs::write(
        dir.path().join("r.toml"),
        "[run]\nname = \"kept\"\nkind = \"sft\"\n[model]\ninit_family = \"llama\"\ninit_preset = \"tiny\"\n\
         [data]\ntask = \"file\"\npath = \"sft.jsonl\"\neval_fraction = 0.25\n\
         [sft]\nsteps = 6\nbatch_size = 4\neval_every = 3\n",
    )
    .unwrap();
    let (mut child, url, drain) = train_with_dashboard(
        dir.path(),
        &["--dashboard-keep"],
        "the run ended; the dashboard stays up at ",
    );
    let url = url.trim_end_matches(" until Ctrl-C").to_string();
    let profile = tempfile::tempdir().unwrap();
    let dom = run_chromium(profile.path(), &["--dump-dom".to_string()], &url);
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let rest = drain.join().unwrap().join("\n");
    assert!(
        status.success(),
        "oxalign train after Ctrl-C: {status}\n{rest}"
    );

    let chart = |id: &str| {
        start_tag(&dom, &format!("id=\"chart-{id}\""))
            .unwrap_or_else(|| panic!("no {id} chart:\n{dom}"))
    };
    let loss = chart("loss");
    assert_eq!(attr(loss, "data-metric"), Some("loss"), "{loss}");
    assert_eq!(
        attr(loss, "data-points"),
        Some("6"),
        "one point per step: {loss}"
    );
    assert!(!loss.contains("hidden"), "{loss}");
    for id in ["gradnorm", "lr"] {
        assert_eq!(attr(chart(id), "data-points"), Some("6"), "{}", chart(id));
    }
    assert!(
        dom.contains("data-key=\"eval_loss\""),
        "the held-out loss is drawn"
    );
    for id in ["reward", "kl", "entropy", "margin"] {
        assert!(
            chart(id).contains("hidden"),
            "an SFT run has no {id}: {}",
            chart(id)
        );
    }
    let status = start_tag(&dom, "id=\"run-status\"").unwrap();
    assert_eq!(attr(status, "data-state"), Some("completed"), "{status}");
}

/// A multi-turn run (`[env]`, the calculator) kept on the dashboard: Chromium shows the
/// Episodes chart with one point per RL step (turns and tool calls per episode) and the
/// failure chart beside it.
#[test]
fn an_episode_run_charts_turns_and_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..8)
        .map(|i| {
            let call = format!(
                "<tool_call>{{\"name\":\"calculator\",\"arguments\":{{\"expression\":\"{i}*7\"}}}}</tool_call><|im_end|>"
            );
            let row = serde_json::json!({
                "messages": [{"role": "user", "content": format!("{i}*7")}],
                "answer": call,
            });
            format!("{row}\n")
        })
        .collect();
    std::fs::write(dir.path().join("prompts.jsonl"), rows).unwrap();
    std::fs::write(
        dir.path().join("r.toml"),
        "[run]\nname = \"ep\"\nsteps = 2\n[model]\ninit_family = \"llama\"\ninit_preset = \"tiny\"\n\
         [data]\ntask = \"file\"\npath = \"prompts.jsonl\"\neval_fraction = 0.0\n\
         [sft]\nsteps = 40\nbatch_size = 8\nlr = 3e-3\nwarmup_steps = 2\nexamples = 8\n\
         [rl]\nalgorithm = \"grpo\"\nprompts_per_step = 4\nsamples_per_prompt = 2\nminibatch_size = 8\n\
         max_new_tokens = 80\ntemperature = 0.3\n[env]\nmax_turns = 2\nmax_tokens = 200\n",
    )
    .unwrap();
    let (mut child, url, drain) = train_with_dashboard(
        dir.path(),
        &["--dashboard-keep"],
        "the run ended; the dashboard stays up at ",
    );
    let url = url.trim_end_matches(" until Ctrl-C").to_string();
    let profile = tempfile::tempdir().unwrap();
    let dom = run_chromium(profile.path(), &["--dump-dom".to_string()], &url);
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let rest = drain.join().unwrap().join("\n");
    assert!(
        status.success(),
        "oxalign train after Ctrl-C: {status}\n{rest}"
    );
    let chart = |id: &str| {
        start_tag(&dom, &format!("id=\"chart-{id}\""))
            .unwrap_or_else(|| panic!("no {id} chart:\n{dom}"))
    };
    let episodes = chart("episodes");
    assert_eq!(
        attr(episodes, "data-metric"),
        Some("episode_turns_mean"),
        "{episodes}"
    );
    assert_eq!(attr(episodes, "data-points"), Some("2"), "{episodes}");
    assert!(!episodes.contains("hidden"), "{episodes}");
    assert!(
        dom.contains("data-key=\"episode_tool_calls_mean\""),
        "tool calls are drawn"
    );
    assert!(!chart("episode-failures").contains("hidden"));
}

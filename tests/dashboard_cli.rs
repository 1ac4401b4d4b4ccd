//! `oxalign dashboard RUN_DIR` end to end: the binary replays a run directory written by a
//! real `Monitor`, prints its URL, and serves it; bad arguments exit 2 with a clear message.

mod dashboard_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use dashboard_support::*;
use oxalign_actors::monitor::{unix_ms_now, Monitor, MonitorConfig, RunFinished, RunOutcome};

const BIN: &str = env!("CARGO_BIN_EXE_oxalign");

/// Kills the child when dropped, so a failing assertion leaves no server running.
struct Running(Child);
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_run(dir: &std::path::Path) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (monitor, _join) = Monitor::spawn(MonitorConfig::with_run_dir(dir))
            .await
            .unwrap();
        let t0 = unix_ms_now() - 5_000;
        report_run_start(&monitor, "cli-replay", t0);
        for step in 0..4 {
            report_step(&monitor, step, t0 + 1000 * step);
        }
        monitor.report(RunFinished {
            outcome: RunOutcome::Completed,
            steps_completed: 4,
            finished_unix_ms: t0 + 4_500,
            message: None,
        });
        monitor.shutdown().await.unwrap();
    });
    std::fs::create_dir_all(dir.join("checkpoints/step_3")).unwrap();
}

#[test]
fn dashboard_command_replays_a_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("cli-replay");
    write_run(&run_dir);

    let child = Command::new(BIN)
        .args([
            "dashboard",
            run_dir.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
            "--token",
            "t0k",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start oxalign dashboard");
    let mut child = Running(child);
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim();
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not a URL: {url:?}"));
    let (host, query) = rest.split_once('/').unwrap();
    assert_eq!(query, "?token=t0k");
    let addr: SocketAddr = host.parse().unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0);

    assert_eq!(http_get(addr, "/api/state", &[]).status, 401);
    let state = http_get(addr, "/api/state?token=t0k", &[]);
    assert_eq!(state.status, 200);
    let v: serde_json::Value = serde_json::from_str(&state.body).unwrap();
    assert_eq!(v["mode"], "replay");
    assert_eq!(v["run"]["name"], "cli-replay");
    assert_eq!(v["run"]["recipe_toml"], RECIPE);
    assert_eq!(v["metrics"].as_array().unwrap().len(), 4);
    assert_eq!(v["actors"].as_array().unwrap().len(), 5);
    assert_eq!(v["checkpoints"][0]["step"], 3);
    let metrics = http_get(addr, "/metrics", &[("Authorization", "Bearer t0k")]);
    assert!(
        metrics.body.contains("oxalign_step 3\n"),
        "{}",
        metrics.body
    );
    let page = http_get(addr, "/?token=t0k", &[]);
    assert!(page.status == 200 && page.body.contains("<title>"));
}

fn run_expecting_user_error(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("run oxalign");
    assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn dashboard_command_rejects_bad_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("r");
    write_run(&run_dir);
    let dir = run_dir.to_str().unwrap();

    let err = run_expecting_user_error(&["dashboard", dir, "--addr", "0.0.0.0:0"]);
    assert!(err.contains("--token"), "{err}");
    let err = run_expecting_user_error(&["dashboard", "/no/such/run", "--addr", "127.0.0.1:0"]);
    assert!(err.contains("/no/such/run"), "{err}");
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = run_expecting_user_error(&[
        "dashboard",
        empty.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
    ]);
    assert!(err.contains("not an oxalign run directory"), "{err}");
    let err =
        run_expecting_user_error(&["dashboard", dir, "--addr", "127.0.0.1:0", "--token", "a b"]);
    assert!(err.contains("token"), "{err}");
    // clap rejects a malformed address before anything starts
    let err = run_expecting_user_error(&["dashboard", dir, "--listen", "localhost"]);
    assert!(err.contains("--listen"), "{err}");
}

/// A live `oxalign train --dashboard` run with at most 128 open descriptors: 200 half-sent
/// requests from 127.0.0.1, sent while it trains and never finished, neither take the dashboard from
/// another peer (127.0.0.2 is answered) nor the descriptors the run needs (it completes).
#[test]
fn a_flood_of_half_sent_requests_leaves_the_run_training_and_the_dashboard_serving() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("r.toml"),
        "[run]\nname = \"flood\"\nsteps = 24\ncheckpoint_every = 2\nkeep_checkpoints = 2\n\
         [data]\nmax_operand = 9\neval_size = 10\n[sft]\nsteps = 10\nbatch_size = 16\n\
         [rl]\nprompts_per_step = 16\nminibatch_size = 16\nmax_new_tokens = 3\n",
    )
    .unwrap();
    let child = Command::new("sh")
        .args(["-c", "ulimit -n 128 && exec \"$0\" \"$@\""])
        .arg(BIN)
        .args(["train", "r.toml", "--quiet", "--dashboard", "127.0.0.1:0"])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oxalign train");
    let mut child = Running(child);
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("oxalign train ended before printing the dashboard address")
            .unwrap();
        if let Some(u) = line.strip_prefix("dashboard: ") {
            break u.trim().to_string();
        }
    };
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let host = url
        .strip_prefix("http://")
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let addr: SocketAddr = host.parse().unwrap();
    let mut flood = Vec::new();
    for _ in 0..200 {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.write_all(b"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\n");
            flood.push(s);
        }
    }
    let other = http_get_from([127, 0, 0, 2].into(), addr, "/healthz", &[]);
    assert_eq!(other.status, 200, "{other:?}");
    let status = child.0.wait().unwrap();
    let log = drain.join().unwrap().join("\n");
    assert!(status.success(), "the run died:\n{log}");
    drop(flood);
}

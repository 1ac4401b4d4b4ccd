//! Shared helpers of the dashboard tests: a tiny raw HTTP/1.1 client over `TcpStream`
//! (no HTTP client crate is a dependency), an SSE reader, and a scripted training run fed
//! into a real `Monitor` the way the controller and role actors report.
#![allow(dead_code)] // each test file uses a different subset

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use oxalign_actors::monitor::{
    metric, phase, ActorInfo, ActorUpdate, CheckpointInfo, MonitorHandle, RunInfo, Span,
    StepMetrics,
};

/// One HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

fn decode_chunked(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = std::str::from_utf8(&raw[..eol]).unwrap_or("0");
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        raw = &raw[eol + 2..];
        if size == 0 || raw.len() < size {
            out.extend_from_slice(&raw[..size.min(raw.len())]);
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[(size + 2).min(raw.len())..];
    }
}

/// Sends `GET path` with extra `headers` (blocking; run it off the async runtime with
/// `spawn_blocking`, or from a plain thread) and reads the whole response.
pub fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let stream = TcpStream::connect(addr).expect("connect to the dashboard");
    get_on(stream, addr, path, headers)
}

/// As [`http_get`], from the local address `from` (e.g. `127.0.0.2`, another loopback
/// peer than the default `127.0.0.1`).
pub fn http_get_from(
    from: std::net::IpAddr,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(from, 0))?;
            socket.connect(addr).await?.into_std()
        })
        .expect("connect to the dashboard");
    stream.set_nonblocking(false).unwrap();
    get_on(stream, addr, path, headers)
}

/// Sends `GET path` on `stream` and reads the whole response.
fn get_on(
    mut stream: TcpStream,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read the response");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body_raw = &raw[split + 4..];
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        decode_chunked(body_raw)
    } else {
        body_raw.to_vec()
    };
    Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// An open `/api/events` stream, read event by event.
pub struct SseReader {
    stream: TcpStream,
    buf: String,
}

/// One server-sent event: its `event:` name and joined `data:` lines.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

impl SseReader {
    /// Opens `path` as an HTTP/1.0 request, so the body is close-delimited, not chunked.
    pub fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, Self) {
        let mut stream = TcpStream::connect(addr).expect("connect to the dashboard");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut req =
            format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        stream.write_all(req.as_bytes()).unwrap();
        let mut reader = SseReader {
            stream,
            buf: String::new(),
        };
        let head = reader.read_until("\r\n\r\n").expect("a response head");
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status line");
        (status, reader)
    }

    fn read_until(&mut self, delim: &str) -> Option<String> {
        loop {
            if let Some(i) = self.buf.find(delim) {
                let out = self.buf[..i].to_string();
                self.buf.drain(..i + delim.len());
                return Some(out);
            }
            let mut chunk = [0u8; 8192];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.push_str(&String::from_utf8_lossy(&chunk[..n])),
            }
        }
    }

    /// The next event that has a `data:` field (comments and keep-alives skipped), or
    /// `None` when the stream ended.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            let block = self.read_until("\n\n")?;
            let mut event = String::from("message");
            let mut data: Vec<&str> = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim_start().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if !data.is_empty() {
                return Some(SseEvent {
                    event,
                    data: data.join("\n"),
                });
            }
        }
    }
}

/// The five actors of a PPO run, with devices.
pub const ROLES: [(&str, &str); 5] = [
    ("controller", "cpu"),
    ("policy", "cuda:0"),
    ("reference", "cuda:1"),
    ("reward", "cuda:1"),
    ("critic", "cuda:0"),
];

/// Recipe text reported in `RunInfo`.
pub const RECIPE: &str =
    "# resolved recipe\n[algo]\nname = \"ppo\"\nkl_coef = 0.05\n\n[rollout]\nbatch_size = 8\n";

/// Reports a run start and registers the five actors, as the controller does at start-up.
pub fn report_run_start(monitor: &MonitorHandle, name: &str, t0: u64) {
    monitor.report(RunInfo {
        name: name.to_string(),
        recipe_toml: RECIPE.to_string(),
        started_unix_ms: t0,
    });
    for (role, device) in ROLES {
        monitor.report(ActorInfo::new(role, role, vec![device.to_string()]));
    }
}

/// Reports one PPO step the way the loop will: status changes, one span per phase and
/// actor, then the step's metrics. Spans start at `t0` ms (one step lasts 1 s).
pub fn report_step(monitor: &MonitorHandle, step: u64, t0: u64) {
    let s = step as f64;
    monitor.report(ActorUpdate::working("controller", format!("step {step}")));
    monitor.report(
        ActorUpdate::working("policy", format!("generate step {step}")).with_queue_depth(1),
    );
    monitor.report(Span::new("policy", phase::GENERATE, step, t0, t0 + 400));
    for (actor, ph, end) in [
        ("reference", phase::REFERENCE_LOGPROBS, 520),
        ("reward", phase::REWARD, 470),
        ("critic", phase::VALUES, 500),
    ] {
        monitor.report(
            ActorUpdate::working(actor, format!("{ph} step {step}")).with_items_per_sec(64.0),
        );
        monitor.report(Span::new(actor, ph, step, t0 + 410, t0 + end));
        monitor.report(ActorUpdate::idle(actor));
    }
    monitor.report(Span::new(
        "controller",
        phase::ADVANTAGES,
        step,
        t0 + 520,
        t0 + 540,
    ));
    monitor.report(
        ActorUpdate::working("policy", format!("policy_train step {step}")).with_queue_depth(0),
    );
    monitor.report(Span::new(
        "policy",
        phase::POLICY_TRAIN,
        step,
        t0 + 540,
        t0 + 880,
    ));
    monitor.report(Span::new(
        "critic",
        phase::CRITIC_TRAIN,
        step,
        t0 + 540,
        t0 + 760,
    ));
    monitor.report(Span::new("policy", phase::REFIT, step, t0 + 880, t0 + 950));
    let mut metrics = StepMetrics::new(step);
    if step % 4 == 3 {
        // Held-out accuracy, measured every few steps (`rl.eval_every`).
        metrics = metrics
            .with("heldout_greedy", 0.3 + 0.05 * s)
            .with("heldout_sampled", 0.2 + 0.05 * s);
    }
    monitor.report(
        metrics
            .with(metric::REWARD_MEAN, 0.2 + 0.1 * s)
            .with(metric::REWARD_STD, 0.3 - 0.02 * s)
            .with(metric::KL, 0.01 * s)
            .with(metric::POLICY_LOSS, -0.05 + 0.01 * s)
            .with(metric::VALUE_LOSS, 0.8 / (1.0 + s))
            .with(metric::ENTROPY, 2.0 - 0.1 * s)
            .with(metric::CLIP_FRAC, 0.1)
            .with(metric::RESPONSE_LEN, 40.0 + s)
            .with(metric::TOKENS_PER_SEC, 900.0 + 10.0 * s)
            .with(metric::STEP_SECONDS, 0.95)
            .with("time_generate", 0.4)
            .with("time_policy_train", 0.34),
    );
}

/// Reports a checkpoint of `step` under `dir`.
pub fn report_checkpoint(monitor: &MonitorHandle, dir: &std::path::Path, step: u64, at: u64) {
    monitor.report(CheckpointInfo {
        step,
        path: dir
            .join(format!("checkpoints/step_{step}"))
            .display()
            .to_string(),
        unix_ms: at,
    });
}

//! The HTTP reward client against local test servers on 127.0.0.1 (port 0): chunks posted
//! concurrently up to the limit and reassembled in order, 500s retried until they succeed,
//! and every failure (a service slower than the timeout, 500s past the retry budget,
//! dropped connections, malformed JSON, the wrong number of rewards, NaN, an open circuit
//! breaker) an error naming the URL, the attempts and the last failure, never a reward; a
//! redirect is not followed (the rows go nowhere else) and an answer past the size limit is
//! refused without being read to its end.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use oxalign_actors::roles::reward::http::{HttpReward, HttpRewardConfig, HttpRewardError};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests seen, and the most in flight at once.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

type Shared = Arc<Seen>;

/// Serves `app` on 127.0.0.1 at a free port; returns its URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/score")
}

/// A route whose handler answers request number `k` (0-based) with `answer(k, body)`.
async fn server<F>(answer: F) -> (String, Shared)
where
    F: Fn(usize, Value) -> (StatusCode, String) + Send + Sync + 'static,
{
    let seen = Shared::default();
    let answer = Arc::new(answer);
    let s = seen.clone();
    let app = Router::new().route(
        "/score",
        post(move |Json(body): Json<Value>| {
            let (s, answer) = (s.clone(), answer.clone());
            async move {
                let k = s.requests.fetch_add(1, Ordering::SeqCst);
                answer(k, body)
            }
        }),
    );
    (serve(app).await, seen)
}

fn config(url: &str) -> HttpRewardConfig {
    HttpRewardConfig {
        url: url.to_string(),
        timeout: Duration::from_secs(5),
        max_retries: 2,
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        retry_budget: Duration::from_secs(10),
        rows_per_request: 64,
        concurrency: 4,
        breaker_failures: 100,
        breaker_cooldown: Duration::from_secs(30),
    }
}

fn rows(n: usize) -> (Vec<String>, Vec<String>, Vec<Option<String>>) {
    let prompts = (0..n).map(|i| format!("{i}+0=")).collect();
    let responses = (0..n).map(|i| i.to_string()).collect();
    // Every third row has a wrong reference; the last has none.
    let answers = (0..n)
        .map(|i| {
            (i + 1 < n).then(|| {
                if i % 3 == 0 {
                    "x".into()
                } else {
                    i.to_string()
                }
            })
        })
        .collect();
    (prompts, responses, answers)
}

async fn score(cfg: HttpRewardConfig, n: usize) -> Result<Vec<f64>, HttpRewardError> {
    let (p, r, a) = rows(n);
    HttpReward::new(cfg).unwrap().score(&p, &r, &a, &[]).await
}

/// Exact match of each response with its answer: 1 or 0.
fn exact_match(body: &Value) -> Vec<f64> {
    let (r, a) = (
        body["responses"].as_array().unwrap(),
        body["answers"].as_array().unwrap(),
    );
    r.iter()
        .zip(a)
        .map(|(r, a)| f64::from(u8::from(r == a)))
        .collect()
}

fn ok(rewards: Vec<f64>) -> (StatusCode, String) {
    (StatusCode::OK, json!({ "rewards": rewards }).to_string())
}

fn failed(e: &HttpRewardError) -> (u32, String) {
    match e {
        HttpRewardError::Failed { attempts, last, .. } => (*attempts, last.clone()),
        other => panic!("expected a failed request, got {other}"),
    }
}

#[tokio::test]
async fn chunks_go_concurrently_up_to_the_limit_and_come_back_in_order() {
    let seen = Shared::default();
    let s = seen.clone();
    let app = Router::new().route(
        "/score",
        post(
            move |State(s): State<Shared>, Json(body): Json<Value>| async move {
                s.requests.fetch_add(1, Ordering::SeqCst);
                let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                s.max_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(60)).await;
                s.in_flight.fetch_sub(1, Ordering::SeqCst);
                Json(json!({ "rewards": exact_match(&body) }))
            },
        )
        .with_state(s),
    );
    let url = serve(app).await;
    let cfg = HttpRewardConfig {
        rows_per_request: 3,
        concurrency: 2,
        ..config(&url)
    };
    let got = score(cfg, 10).await.unwrap();
    let want: Vec<f64> = (0..10)
        .map(|i| f64::from(u8::from(i % 3 != 0 && i != 9)))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        seen.requests.load(Ordering::SeqCst),
        4,
        "ceil(10 / 3) requests"
    );
    assert_eq!(
        seen.max_in_flight.load(Ordering::SeqCst),
        2,
        "at most 2 at once"
    );
}

#[tokio::test]
async fn server_errors_are_retried_until_they_succeed() {
    let (url, seen) = server(|k, body| {
        if k < 2 {
            (StatusCode::INTERNAL_SERVER_ERROR, "warming up".into())
        } else {
            ok(exact_match(&body))
        }
    })
    .await;
    let got = score(config(&url), 3).await.unwrap();
    assert_eq!(got, vec![0.0, 1.0, 0.0]);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 3, "two retries");
}

#[tokio::test]
async fn server_errors_past_the_retries_fail_with_the_status_and_body() {
    let (url, seen) = server(|_, _| (StatusCode::SERVICE_UNAVAILABLE, "overloaded".into())).await;
    let e = score(config(&url), 2).await.unwrap_err();
    let (attempts, last) = failed(&e);
    assert_eq!(attempts, 3, "{e}");
    assert!(last.contains("503") && last.contains("overloaded"), "{e}");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 3);
    let msg = e.to_string();
    assert!(msg.contains(&url) && msg.contains("3 attempt(s)"), "{msg}");
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let (url, seen) = server(|_, _| (StatusCode::BAD_REQUEST, "no such field".into())).await;
    let e = score(config(&url), 2).await.unwrap_err();
    let (attempts, last) = failed(&e);
    assert_eq!(
        (attempts, seen.requests.load(Ordering::SeqCst)),
        (1, 1),
        "{e}"
    );
    assert!(
        last.contains("400") && last.contains("no such field"),
        "{e}"
    );
}

#[tokio::test]
async fn a_service_slower_than_the_timeout_fails_after_the_retries() {
    let app = Router::new().route(
        "/score",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Json(json!({ "rewards": [1.0] }))
        }),
    );
    let url = serve(app).await;
    let cfg = HttpRewardConfig {
        timeout: Duration::from_millis(200),
        max_retries: 1,
        ..config(&url)
    };
    let started = Instant::now();
    let e = score(cfg, 1).await.unwrap_err();
    let (attempts, last) = failed(&e);
    assert_eq!(attempts, 2, "{e}");
    assert!(last.contains("timed out"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "each attempt is cut at 0.2 s"
    );
}

#[tokio::test]
async fn dropped_connections_are_retried_then_fail() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/score", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            // Read the request, then hang up without a response.
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut buf).await;
            drop(sock);
        }
    });
    let e = score(config(&url), 2).await.unwrap_err();
    let (attempts, _) = failed(&e);
    assert_eq!(attempts, 3, "dropped connections are transient: {e}");
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    assert!(e.to_string().contains(&url), "{e}");
}

#[tokio::test]
async fn an_unreachable_service_fails_naming_the_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/score");
    let e = score(config(&url), 1).await.unwrap_err();
    let (attempts, last) = failed(&e);
    assert_eq!(attempts, 3, "{e}");
    assert!(last.to_lowercase().contains("connect"), "{e}");
}

#[tokio::test]
async fn malformed_wrong_length_and_nan_responses_are_bad_responses() {
    for (body, says) in [
        ("this is not json", "expected {\"rewards\""),
        (r#"{"rewards": [1.0]}"#, "expected 2 rewards"),
        (r#"{"rewards": [1.0, NaN]}"#, "NaN"),
        (r#"{"rewards": [1.0, null]}"#, "row 1 is null"),
        (r#"{"scores": [1.0, 0.0]}"#, "rewards"),
    ] {
        let (url, seen) = server(move |_, _| (StatusCode::OK, body.to_string())).await;
        let e = score(config(&url), 2).await.unwrap_err();
        assert!(
            matches!(e, HttpRewardError::BadResponse { .. }),
            "{body}: {e}"
        );
        let msg = e.to_string();
        assert!(msg.contains(says) && msg.contains(&url), "{body}: {msg}");
        assert_eq!(
            seen.requests.load(Ordering::SeqCst),
            1,
            "{body}: not retried"
        );
    }
}

#[tokio::test]
async fn the_open_breaker_fails_fast_without_sending() {
    let (url, seen) = server(|_, _| (StatusCode::INTERNAL_SERVER_ERROR, String::new())).await;
    let cfg = HttpRewardConfig {
        max_retries: 5,
        breaker_failures: 2,
        ..config(&url)
    };
    let (p, r, a) = rows(1);
    let client = HttpReward::new(cfg).unwrap();
    let e = client.score(&p, &r, &a, &[]).await.unwrap_err();
    let (attempts, last) = failed(&e);
    assert_eq!(attempts, 3, "two failures, then the open breaker: {e}");
    assert!(last.contains("circuit breaker open after 2"), "{e}");
    assert!(
        last.contains("HTTP 500"),
        "names the failure that opened it: {e}"
    );
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    // Still open: the next batch fails at once, sending nothing.
    let started = Instant::now();
    let e = client.score(&p, &r, &a, &[]).await.unwrap_err();
    assert!(failed(&e).1.contains("circuit breaker open"), "{e}");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[test]
fn a_url_that_is_not_http_is_a_config_error() {
    for url in ["ftp://host/score", "localhost:8000", "http://"] {
        let e = HttpReward::new(config(url)).err().expect("refused");
        assert!(e.is_config() && e.to_string().contains(url), "{url}: {e}");
    }
}

#[tokio::test]
async fn a_redirect_is_an_error_naming_the_location_and_is_never_followed() {
    let elsewhere = Shared::default();
    let e2 = elsewhere.clone();
    let app = Router::new()
        .route(
            "/score",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [(axum::http::header::LOCATION, "/elsewhere")],
                )
            }),
        )
        .route(
            "/elsewhere",
            post(move |Json(body): Json<Value>| {
                let e2 = e2.clone();
                async move {
                    e2.requests.fetch_add(1, Ordering::SeqCst);
                    ok(vec![1.0; body["responses"].as_array().unwrap().len()])
                }
            }),
        );
    let url = serve(app).await;
    let e = score(config(&url), 3).await.unwrap_err();
    assert_eq!(
        elsewhere.requests.load(Ordering::SeqCst),
        0,
        "the rows were posted to the redirect's target"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&url) && msg.contains("307") && msg.contains("/elsewhere"),
        "{msg}"
    );
    assert!(
        e.is_config(),
        "a redirecting URL is the user's setting: {msg}"
    );
}

/// A raw server on 127.0.0.1 answering its first request with 200 and `total` bytes of
/// body, streamed in 64 KiB chunks (announced by `Content-Length` when `announce`, else
/// ended by closing); the task returns how many body bytes it could write before the client
/// hung up.
async fn huge_answer(total: usize, announce: bool) -> (String, tokio::task::JoinHandle<usize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/score", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return 0,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let length = if announce {
            format!("content-length: {total}\r\n")
        } else {
            "connection: close\r\n".to_string()
        };
        let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{length}\r\n");
        sock.write_all(answer.as_bytes()).await.unwrap();
        let chunk = vec![b' '; 64 << 10];
        let mut written = 0;
        while written < total {
            match sock.write(&chunk[..chunk.len().min(total - written)]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => written += n,
            }
        }
        written
    });
    (url, task)
}

#[tokio::test]
async fn an_answer_past_the_size_limit_is_refused_unread() {
    const HUNDRED_MB: usize = 100 << 20;
    for announce in [true, false] {
        let (url, server) = huge_answer(HUNDRED_MB, announce).await;
        let e = score(config(&url), 2).await.unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&url) && msg.contains("over the limit of 8388608 bytes"),
            "announce {announce}: {msg}"
        );
        let written = tokio::time::timeout(Duration::from_secs(120), server)
            .await
            .expect("the client still reads")
            .unwrap();
        assert!(
            written < HUNDRED_MB / 2,
            "announce {announce}: the client read {written} bytes"
        );
    }
}

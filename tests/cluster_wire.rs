//! The worker's door: a connection without the cookie is refused; an oversized frame header,
//! bytes that are no frame and a frame that does not decode each close only their own
//! connection, and the worker goes on serving; a request whose safetensors part is truncated
//! or holds a tensor of the wrong dtype is answered with an error naming what is wrong, and
//! the worker goes on serving; a worker beyond loopback will not start without a cookie; a
//! worker reports its devices and those its roles hold.

mod cluster_support;

use cluster_support::Worker;
use oxalign_actors::cluster::{ClusterError, Connection, Endpoint, Response, WireCause, WireError};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn endpoint(addr: &str, cookie: Option<&str>) -> Endpoint {
    Endpoint {
        node: "n".into(),
        addr: addr.into(),
        cookie: cookie.map(str::to_string),
        max_frame: 1 << 20,
        patience: Duration::from_secs(5),
    }
}

fn open(addr: &str, cookie: Option<&str>) -> Result<Connection, ClusterError> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(Connection::open(&endpoint(addr, cookie)))
}

#[test]
fn a_connection_without_the_cookie_is_refused() {
    let w = Worker::start("127.0.0.1:0", Some("s3cret"));
    for cookie in [None, Some("wrong")] {
        match open(&w.addr, cookie) {
            Err(ClusterError::Refused { reason, .. }) => {
                assert!(reason.contains("cookie"), "{reason}")
            }
            Err(e) => panic!("{cookie:?}: expected a refusal, got {e}"),
            Ok(_) => panic!("{cookie:?}: the worker let it in"),
        }
    }
    assert!(open(&w.addr, Some("s3cret")).is_ok());
}

/// Sends `bytes` on a fresh connection and reads until the worker closes it.
fn send_and_expect_close(addr: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(bytes);
    let mut sink = Vec::new();
    // The worker closes (EOF or reset), it does not hang or answer with a role.
    let _ = s.read_to_end(&mut sink);
    assert!(sink.len() < 1024, "answered {} bytes", sink.len());
}

#[test]
fn oversized_and_garbage_frames_do_not_crash_a_worker() {
    let mut w = Worker::start("127.0.0.1:0", Some("s3cret"));
    let oversized = [0xff, 0xff, 0xff, 0xff, 1];
    send_and_expect_close(&w.addr, &oversized);
    send_and_expect_close(&w.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let bad_flag = [3, 0, 0, 0, 7, 1, 2, 3];
    send_and_expect_close(&w.addr, &bad_flag);
    let not_msgpack = [4, 0, 0, 0, 1, 0xc1, 0xc1, 0xc1, 0xc1];
    send_and_expect_close(&w.addr, &not_msgpack);
    // Past the handshake: an oversized frame and one that is no request.
    for after in [&oversized[..], &not_msgpack[..]] {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            use oxalign_actors::cluster::{
                encode, read_message, write_message, Hello, Limits, PROTOCOL,
            };
            let mut s = tokio::net::TcpStream::connect(&w.addr).await.unwrap();
            let hello = Hello {
                protocol: PROTOCOL.into(),
                cookie: "s3cret".into(),
            };
            write_message(&mut s, &encode(&hello).unwrap(), 1 << 20)
                .await
                .unwrap();
            let welcome = read_message(&mut s, Limits::with_frame(1 << 20))
                .await
                .unwrap();
            assert!(welcome.is_some());
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(after).await.unwrap();
            let mut sink = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut sink));
            assert!(
                read.await.is_ok(),
                "the worker did not close the connection"
            );
        });
    }
    assert!(w.alive(), "the worker died");
    assert!(
        open(&w.addr, Some("s3cret")).is_ok(),
        "the worker stopped serving"
    );
}

#[test]
fn a_worker_beyond_loopback_needs_a_cookie() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(["worker", "--listen", "0.0.0.0:0"])
        .env_remove("OXALIGN_COOKIE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("needs a cookie"), "{err}");
}

/// Sends `request` (its bytes cut or patched by `spoil`) as the first call on a fresh
/// connection and returns the worker's answer.
fn answer_to_spoiled(addr: &str, spoil: impl FnOnce(Vec<u8>) -> Vec<u8>) -> Response {
    use oxalign_actors::batch::Sequences;
    use oxalign_actors::cluster::{
        decode_response, encode, encode_request, read_message, write_message, Hello, Limits,
        Request, PROTOCOL,
    };
    let seqs = Sequences {
        pairs: vec![(vec![1, 2, 3], vec![4, 5])],
        pad_id: 0,
        routing: None,
        observations: None,
    };
    let bytes = spoil(encode_request(1, Request::Values(seqs)).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let hello = Hello {
            protocol: PROTOCOL.into(),
            cookie: "s3cret".into(),
        };
        let limits = Limits::with_frame(1 << 20);
        write_message(&mut s, &encode(&hello).unwrap(), 1 << 20)
            .await
            .unwrap();
        assert!(read_message(&mut s, limits).await.unwrap().is_some());
        write_message(&mut s, &bytes, 1 << 20).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(20), read_message(&mut s, limits));
        let answer = answer.await.expect("no answer").unwrap().expect("closed");
        let env = decode_response(&answer).unwrap();
        assert_eq!(env.id, 1);
        env.body
    })
}

/// The message of a refused call.
fn refusal(r: Response) -> String {
    match r {
        Response::Failed(WireError {
            cause: WireCause::Other { message, bad_input },
            ..
        }) => {
            assert!(bad_input, "{message}");
            message
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_malformed_tensor_blob_is_refused_and_the_worker_goes_on() {
    let mut w = Worker::start("127.0.0.1:0", Some("s3cret"));
    let truncated = refusal(answer_to_spoiled(&w.addr, |mut b| {
        b.truncate(b.len() - 5);
        b
    }));
    assert!(
        truncated.contains("values") && truncated.contains("not a safetensors buffer"),
        "{truncated}"
    );
    let retyped = refusal(answer_to_spoiled(&w.addr, |b| {
        let at = b.windows(4).position(|x| x == b"\"U8\"").unwrap();
        let mut b = b.clone();
        b[at + 1] = b'I';
        b
    }));
    assert!(
        retyped.contains("tensor seqs.")
            && retyped.contains("expected dtype U8, U16 or U32, got I8"),
        "{retyped}"
    );
    assert!(w.alive(), "the worker died");
    assert!(
        open(&w.addr, Some("s3cret")).is_ok(),
        "the worker stopped serving"
    );
}

/// The worker's inventory, asked on `conn`.
async fn inventory(conn: &Connection) -> oxalign_actors::cluster::Inventory {
    use oxalign_actors::cluster::Request;
    match conn.call(Request::Inventory, Duration::from_secs(20)).await {
        Some(Ok(Response::Inventory(i))) => i,
        other => panic!("expected an inventory, got {other:?}"),
    }
}

/// `(role, device)` of each hold.
fn holds(i: &oxalign_actors::cluster::Inventory) -> Vec<(String, String)> {
    i.held
        .iter()
        .map(|h| (h.role.clone(), h.device.to_string()))
        .collect()
}

/// Spawns a reward role on `cpu:0,cpu:1` over `conn`.
async fn spawn_reward(conn: &Connection) {
    use oxalign_actors::cluster::{Request, RoleKind, SpawnSpec};
    let recipe = format!(
        "{}\n[placement]\nreward = \"cpu:0,cpu:1\"\n",
        cluster_support::recipe(1, None)
    );
    let spec = SpawnSpec {
        kind: RoleKind::Reward,
        recipe_toml: recipe,
        weights: None,
        critic: None,
        nccl_ids: Vec::new(),
    };
    match conn
        .call(Request::Spawn(Box::new(spec)), Duration::from_secs(60))
        .await
    {
        Some(Ok(Response::Spawned(devices))) => assert_eq!(devices, ["cpu:0", "cpu:1"]),
        other => panic!("expected the reward built, got {other:?}"),
    }
}

/// A worker tells what devices it has (its CPU, and no GPU in a CPU-only build) and which
/// its roles hold: a role's devices from its spawn until it is stopped or its connection
/// goes away. An inventory request is answered before a spawn and after it.
#[test]
fn a_worker_reports_its_devices_and_what_its_roles_hold() {
    use oxalign_actors::cluster::Request;
    use oxalign_kernels::device::DeviceSpec;
    let w = Worker::start("127.0.0.1:0", None);
    let ep = endpoint(&w.addr, None);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let probe = Connection::open(&ep).await.unwrap();
        let first = inventory(&probe).await;
        assert_eq!(first.devices[0], DeviceSpec::cpu(0), "{first:?}");
        assert!(
            first.devices[1..].iter().all(DeviceSpec::is_cuda),
            "{first:?}"
        );
        #[cfg(not(feature = "cuda"))]
        assert_eq!(first.devices, [DeviceSpec::cpu(0)]);
        assert!(first.held.is_empty(), "{first:?}");

        let role = Connection::open(&ep).await.unwrap();
        assert_eq!(inventory(&role).await, first, "before the spawn");
        spawn_reward(&role).await;
        let both = [
            ("reward".to_string(), "cpu:0".to_string()),
            ("reward".to_string(), "cpu:1".to_string()),
        ];
        assert_eq!(holds(&inventory(&probe).await), both);
        assert_eq!(holds(&inventory(&role).await), both, "after the spawn");
        match role
            .call(Request::Stop(1000), Duration::from_secs(30))
            .await
        {
            Some(Ok(Response::Done)) => {}
            other => panic!("expected the reward stopped, got {other:?}"),
        }
        // Released before the stop is answered.
        assert!(inventory(&probe).await.held.is_empty());

        // A connection that goes away without a stop releases its role's devices too.
        let gone = Connection::open(&ep).await.unwrap();
        spawn_reward(&gone).await;
        assert_eq!(holds(&inventory(&probe).await).len(), 2);
        drop(gone);
        let start = std::time::Instant::now();
        while !inventory(&probe).await.held.is_empty() {
            assert!(start.elapsed() < Duration::from_secs(40), "still held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Connects to `addr` and passes the handshake with `cookie`.
async fn greeted(addr: &str, cookie: &str) -> tokio::net::TcpStream {
    use oxalign_actors::cluster::{encode, read_message, write_message, Hello, Limits, PROTOCOL};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let hello = Hello {
        protocol: PROTOCOL.into(),
        cookie: cookie.into(),
    };
    write_message(&mut s, &encode(&hello).unwrap(), 1 << 20)
        .await
        .unwrap();
    let welcome = read_message(&mut s, Limits::with_frame(1 << 20)).await;
    assert!(welcome.unwrap().is_some(), "no welcome");
    s
}

/// A line of `/proc/PID/status`, in bytes (`VmHWM`: the peak resident memory).
fn proc_status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

/// A worker limited to 64 open descriptors, flooded with 200 connections that never finish
/// their handshake, goes on serving the controller connected before the flood and lets a
/// new one in after it: it neither exits on a failed accept nor spends its descriptors.
#[test]
fn a_flood_past_the_descriptor_limit_leaves_the_worker_serving_its_controller() {
    use tokio::io::AsyncWriteExt;
    let mut w = Worker::start_with_nofile("127.0.0.1:0", Some("s3cret"), 64);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let flood = rt.block_on(async {
        let controller = Connection::open(&endpoint(&w.addr, Some("s3cret")))
            .await
            .unwrap();
        inventory(&controller).await;
        let mut flood = Vec::new();
        for _ in 0..200 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(&w.addr).await {
                let _ = s.write_all(&[9, 0]).await; // half a frame header
                flood.push(s);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        inventory(&controller).await;
        flood
    });
    assert!(w.alive(), "the worker died in the flood");
    drop(flood);
    // The flood's places come back as the worker sees those connections end.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while let Err(e) = open(&w.addr, Some("s3cret")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker stopped serving: {e}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(w.alive(), "the worker died");
}

/// Half-sent frames on a worker without a cookie (loopback): 32 connections each announcing
/// a 16 MiB frame and sending one byte of it cost the worker about what they sent, not the
/// 512 MiB announced.
#[test]
fn half_sent_frames_cost_the_worker_what_was_sent_not_what_was_announced() {
    use tokio::io::AsyncWriteExt;
    let w = Worker::start("127.0.0.1:0", None);
    let before = proc_status_bytes(w.pid(), "VmHWM:");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut held = Vec::new();
        for _ in 0..32 {
            let mut s = greeted(&w.addr, "").await;
            let mut partial = (16u32 << 20).to_le_bytes().to_vec();
            partial.extend_from_slice(&[0, 7]);
            s.write_all(&partial).await.unwrap();
            held.push(s);
        }
        // Every connection got its welcome, so the worker is reading their frames.
        let probe = Connection::open(&endpoint(&w.addr, None)).await.unwrap();
        inventory(&probe).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let grown = proc_status_bytes(w.pid(), "VmHWM:").saturating_sub(before);
        assert!(grown < 128 << 20, "the worker grew by {} MiB", grown >> 20);
        drop(held);
    });
}

//! A worker against hostile and mistaken clients, each followed by its real controller being
//! served: a wrong cookie is refused; with TLS, a plaintext client, a client without a
//! certificate and one whose certificate another CA signed are refused; an oversized frame
//! announcement, bytes that are no session and a slowloris connection are closed; a flood
//! past the descriptor limit and half-sent frames cost the worker nothing lasting; a request
//! whose safetensors part is truncated or holds a tensor of the wrong dtype is answered with
//! an error naming what is wrong; a worker beyond loopback will not start without a cookie
//! and TLS; a worker reports its devices and those its roles hold.
//!
//! The controller's node lives on the runtime that first opened a connection, so every test
//! here runs on one runtime shared by the whole file.

mod cluster_support;

use cluster_support::Worker;
use oxalign_actors::cluster::{
    make_cluster_certs, ClusterError, Connection, Endpoint, HostMessage, Inventory, Request,
    Response, Tls, TlsFiles, WireCause, WireError, HOST_GROUP,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
});

fn endpoint(addr: &str, cookie: Option<&str>, tls: Option<Tls>) -> Endpoint {
    Endpoint {
        node: "n".into(),
        addr: addr.into(),
        cookie: cookie.map(str::to_string),
        max_frame: 1 << 20,
        patience: Duration::from_secs(5),
        tls,
    }
}

fn open(addr: &str, cookie: Option<&str>) -> Result<Connection, ClusterError> {
    RT.block_on(Connection::open(&endpoint(addr, cookie, None)))
}

/// The worker's inventory, asked on `conn`.
async fn inventory(conn: &Connection) -> Inventory {
    match conn.call(Request::Inventory, Duration::from_secs(20)).await {
        Some(Ok(Response::Inventory(i))) => i,
        other => panic!("expected an inventory, got {other:?}"),
    }
}

/// Asserts the worker is alive and answers a controller with `cookie` (and `tls`).
fn assert_serving(w: &mut Worker, cookie: Option<&str>, tls: Option<Tls>) {
    assert!(w.alive(), "the worker died");
    RT.block_on(async {
        let conn = Connection::open(&endpoint(&w.addr, cookie, tls))
            .await
            .expect("the worker stopped serving its controller");
        inventory(&conn).await;
    });
}

#[test]
fn a_wrong_cookie_is_refused_and_the_worker_serves_its_controller() {
    let mut w = Worker::start("127.0.0.1:0", Some("s3cret"));
    for cookie in [None, Some("wrong")] {
        match open(&w.addr, cookie) {
            Err(ClusterError::Refused { reason, .. }) => {
                assert!(reason.contains("cookie"), "{reason}")
            }
            Err(e) => panic!("{cookie:?}: expected a refusal, got {e}"),
            Ok(_) => panic!("{cookie:?}: the worker let it in"),
        }
    }
    assert_serving(&mut w, Some("s3cret"), None);
}

/// Writes a cluster's TLS files for loopback into `dir`.
fn certs(dir: &Path) -> TlsFiles {
    let made = make_cluster_certs(&["127.0.0.1".to_string()], 1).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let files = TlsFiles {
        cert: dir.join("member.pem"),
        key: dir.join("member-key.pem"),
        ca: dir.join("ca.pem"),
    };
    std::fs::write(&files.cert, made.member_pem).unwrap();
    std::fs::write(&files.key, made.member_key_pem).unwrap();
    std::fs::write(&files.ca, made.ca_pem).unwrap();
    files
}

fn tls_worker(files: &TlsFiles) -> Worker {
    let [cert, key, ca] = [&files.cert, &files.key, &files.ca].map(|p| p.to_str().unwrap());
    Worker::start_args(
        "127.0.0.1:0",
        Some("s3cret"),
        &["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca],
    )
}

/// A TLS client that trusts `ca` but presents no certificate: the worker ends the
/// connection before any session byte is exchanged.
async fn without_a_certificate(addr: &str, ca: &Path) {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    // TLS 1.3 finishes the client's side before the server checks the client: the refusal
    // arrives as an alert (an error) or the end of the stream on the first read.
    let Ok(mut s) = connector.connect(name, tcp).await else {
        return;
    };
    let _ = s.write_all(&[0, 0, 0, 0, 0, 0, 0, 1, 0]).await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf)).await;
    match read.expect("the worker kept a client without a certificate open") {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("the worker answered {n} bytes to a client without a certificate"),
    }
}

#[test]
fn tls_refuses_plaintext_unknown_and_missing_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ours = certs(&dir.path().join("ours"));
    let theirs = certs(&dir.path().join("theirs"));
    let mut w = tls_worker(&ours);
    let (ours_tls, theirs_tls) = (Tls::load(&ours).unwrap(), Tls::load(&theirs).unwrap());
    RT.block_on(async {
        let plain = Connection::open(&endpoint(&w.addr, Some("s3cret"), None)).await;
        match plain {
            Err(ClusterError::Refused { .. } | ClusterError::Lost { .. }) => {}
            Err(e) => panic!("plaintext: expected a refusal, got {e}"),
            Ok(_) => panic!("plaintext: the worker let it in"),
        }
        let other_ca = Connection::open(&endpoint(&w.addr, Some("s3cret"), Some(theirs_tls))).await;
        match other_ca {
            Err(ClusterError::Refused { reason, .. }) => {
                assert!(reason.contains("TLS"), "{reason}")
            }
            Err(e) => panic!("another CA: expected a refusal, got {e}"),
            Ok(_) => panic!("another CA: the worker let it in"),
        }
        without_a_certificate(&w.addr, &ours.ca).await;
    });
    // The right certificate with the wrong cookie is still refused.
    let wrong = RT.block_on(Connection::open(&endpoint(
        &w.addr,
        Some("wrong"),
        Some(ours_tls.clone()),
    )));
    assert!(
        matches!(wrong, Err(ClusterError::Refused { .. })),
        "{:?}",
        wrong.err()
    );
    assert_serving(&mut w, Some("s3cret"), Some(ours_tls));
}

/// Sends `bytes` on a fresh connection and reads until the worker closes it (within 20 s).
fn send_and_expect_close(addr: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(bytes);
    let start = Instant::now();
    let mut sink = Vec::new();
    // The worker closes (EOF or reset), it does not hang or answer with a role.
    let _ = s.read_to_end(&mut sink);
    assert!(
        start.elapsed() < Duration::from_secs(19),
        "not closed: {bytes:?}"
    );
    assert!(sink.len() < 1024, "answered {} bytes", sink.len());
}

#[test]
fn oversized_announcements_and_garbage_close_only_their_connection() {
    let mut w = Worker::start("127.0.0.1:0", Some("s3cret"));
    // A session frame is a u64 big-endian length and a protobuf payload.
    send_and_expect_close(&w.addr, &u64::MAX.to_be_bytes());
    send_and_expect_close(&w.addr, &(2u64 << 20).to_be_bytes());
    send_and_expect_close(&w.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let not_protobuf = [0, 0, 0, 0, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff];
    send_and_expect_close(&w.addr, &not_protobuf);
    assert_serving(&mut w, Some("s3cret"), None);
}

/// A client that dribbles a byte a second never finishes its handshake and is closed
/// within the worker's handshake time (10 s), while the controller is served meanwhile.
#[test]
fn a_slowloris_connection_is_closed_and_the_controller_served() {
    let mut w = Worker::start("127.0.0.1:0", Some("s3cret"));
    let mut s = TcpStream::connect(&w.addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let start = Instant::now();
    let mut closed = false;
    for byte in [0u8, 0, 0, 0, 0, 0, 0, 200].iter().cycle().take(40) {
        if s.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        if start.elapsed() < Duration::from_secs(2) {
            assert_serving(&mut w, Some("s3cret"), None);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        closed,
        "a slowloris connection stayed open {:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert_serving(&mut w, Some("s3cret"), None);
}

#[test]
fn a_worker_beyond_loopback_needs_a_cookie_and_tls() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_oxalign"))
            .args(["worker", "--listen", "0.0.0.0:0"])
            .args(args)
            .env_remove("OXALIGN_COOKIE")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&[]);
    assert!(err.contains("needs a cookie"), "{err}");
    let err = run(&["--cookie", "s3cret"]);
    assert!(
        err.contains("needs TLS") && err.contains("oxalign cluster certs"),
        "{err}"
    );
}

/// Calls the role host of the worker at `addr` with raw request bytes.
fn raw_call(addr: &str, bytes: Vec<u8>) -> Response {
    use oxalign_actors::cluster::decode_response;
    RT.block_on(async {
        let conn = Connection::open(&endpoint(addr, Some("s3cret"), None))
            .await
            .unwrap();
        inventory(&conn).await;
        let hosts = ractor::pg::get_members(&HOST_GROUP.to_string());
        let host = hosts
            .iter()
            .find(|h| !h.get_id().is_local())
            .expect("no host");
        let host = ractor::ActorRef::<HostMessage>::from(host.clone());
        let answer = host
            .call(
                |port| HostMessage::Call(bytes, port),
                Some(Duration::from_secs(20)),
            )
            .await
            .unwrap();
        let ractor::rpc::CallResult::Success(answer) = answer else {
            panic!("no answer");
        };
        decode_response(&answer).unwrap().body
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
    use oxalign_actors::batch::Sequences;
    use oxalign_actors::cluster::encode_request;
    let mut w = Worker::start("127.0.0.1:0", Some("s3cret"));
    let seqs = Sequences {
        pairs: vec![(vec![1, 2, 3], vec![4, 5])],
        pad_id: 0,
        routing: None,
        observations: None,
    };
    let good = encode_request(1, Request::Values(seqs)).unwrap();
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 5);
    let truncated = refusal(raw_call(&w.addr, truncated));
    assert!(
        truncated.contains("values") && truncated.contains("not a safetensors buffer"),
        "{truncated}"
    );
    let at = good.windows(4).position(|x| x == b"\"U8\"").unwrap();
    let mut retyped = good.clone();
    retyped[at + 1] = b'I';
    let retyped = refusal(raw_call(&w.addr, retyped));
    assert!(
        retyped.contains("tensor seqs.")
            && retyped.contains("expected dtype U8, U16 or U32, got I8"),
        "{retyped}"
    );
    assert_serving(&mut w, Some("s3cret"), None);
}

/// `(role, device)` of each hold.
fn holds(i: &Inventory) -> Vec<(String, String)> {
    i.held
        .iter()
        .map(|h| (h.role.clone(), h.device.to_string()))
        .collect()
}

/// Spawns a reward role on `cpu:0,cpu:1` over `conn`.
async fn spawn_reward(conn: &Connection) {
    use oxalign_actors::cluster::{RoleKind, SpawnSpec};
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
        owner: conn.owner().to_string(),
        events: conn.events_group(),
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
/// is dropped. An inventory request is answered before a spawn and after it.
#[test]
fn a_worker_reports_its_devices_and_what_its_roles_hold() {
    use oxalign_kernels::device::DeviceSpec;
    let w = Worker::start("127.0.0.1:0", None);
    let ep = endpoint(&w.addr, None, None);
    RT.block_on(async {
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

        // A connection dropped without a stop releases its role's devices too.
        let gone = Connection::open(&ep).await.unwrap();
        spawn_reward(&gone).await;
        assert_eq!(holds(&inventory(&probe).await).len(), 2);
        drop(gone);
        let start = Instant::now();
        while !inventory(&probe).await.held.is_empty() {
            assert!(start.elapsed() < Duration::from_secs(40), "still held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
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
    let flood = RT.block_on(async {
        let controller = Connection::open(&endpoint(&w.addr, Some("s3cret"), None))
            .await
            .unwrap();
        inventory(&controller).await;
        let mut flood = Vec::new();
        for _ in 0..200 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(&w.addr).await {
                let _ = s.write_all(&[0, 0]).await; // a quarter of a frame header
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
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = open(&w.addr, Some("s3cret")) {
        assert!(Instant::now() < deadline, "the worker stopped serving: {e}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(w.alive(), "the worker died");
}

/// Half-sent frames: 32 connections each announcing a 1 MiB frame (the most a peer may
/// announce before it is authenticated) and sending two bytes of it cost the worker about
/// what they sent, not the 32 MiB announced.
#[test]
fn half_sent_frames_cost_the_worker_what_was_sent_not_what_was_announced() {
    use tokio::io::AsyncWriteExt;
    let mut w = Worker::start("127.0.0.1:0", None);
    let before = proc_status_bytes(w.pid(), "VmHWM:");
    RT.block_on(async {
        let mut held = Vec::new();
        for _ in 0..32 {
            let mut s = tokio::net::TcpStream::connect(&w.addr).await.unwrap();
            let mut partial = (1u64 << 20).to_be_bytes().to_vec();
            partial.extend_from_slice(&[0x0a, 7]);
            s.write_all(&partial).await.unwrap();
            held.push(s);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let grown = proc_status_bytes(w.pid(), "VmHWM:").saturating_sub(before);
        assert!(grown < 16 << 20, "the worker grew by {} MiB", grown >> 20);
        drop(held);
    });
    assert_serving(&mut w, None, None);
}

/// `oxalign cluster certs` writes the four files (keys readable by their owner only) and
/// the recipe lines, refuses a host that no certificate can name, and never overwrites.
#[test]
fn cluster_certs_writes_once_and_refuses_bad_hosts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let certs = |hosts: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_oxalign"))
            .args(["cluster", "certs", "--out", "c", "--hosts", hosts])
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let bad = certs("node1,$(reboot)");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("$(reboot)") && err.contains("not a host name"),
        "{err}"
    );
    assert!(!dir.path().join("c").exists(), "nothing written");

    let made = certs("node1,10.0.0.6");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let lines = String::from_utf8(made.stdout).unwrap();
    assert!(
        lines.contains("tls_key = ") && lines.contains("member-key.pem"),
        "{lines}"
    );
    for key in ["member-key.pem", "ca-key.pem"] {
        let meta = std::fs::metadata(dir.path().join("c").join(key)).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o077,
            0,
            "{key} is readable by others"
        );
    }
    let c = dir.path().join("c");
    let files = TlsFiles {
        cert: c.join("member.pem"),
        key: c.join("member-key.pem"),
        ca: c.join("ca.pem"),
    };
    Tls::load(&files).expect("the files load as a cluster member's TLS");
    let before = std::fs::read(c.join("member-key.pem")).unwrap();
    let again = certs("node1");
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(
        std::fs::read(c.join("member-key.pem")).unwrap(),
        before,
        "overwritten"
    );
}

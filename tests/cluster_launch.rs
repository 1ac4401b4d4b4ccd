//! `oxalign launch`: the commands it prints start a working multi-process run (run here as
//! printed, on 127.0.0.1); a node beyond loopback gets an ssh line; a bad host list exits 2;
//! `--start` runs the workers (node2 through a stand-in for ssh) and the controller, and a
//! worker whose ssh fails or that never answers exits 2 with the command to retry; a host
//! that is no host name (a shell payload) exits 2 naming its line and runs nothing, and paths
//! with spaces, quotes or `$` are quoted in what is printed and run.

mod child_support;
mod cluster_support;

use child_support::spawn_announced;
use cluster_support::*;
use std::process::{Command, Output, Stdio};

fn launch(dir: &std::path::Path, args: &[&str], cookie: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxalign"));
    cmd.arg("launch")
        .args(args)
        .current_dir(dir)
        .env_remove("OXALIGN_COOKIE");
    if let Some(c) = cookie {
        cmd.env("OXALIGN_COOKIE", c);
    }
    cmd.output().unwrap()
}

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `recipe(3, ..)` with its placement, without `[cluster]` (the host list gives the nodes).
fn placed_recipe() -> String {
    let r = recipe(3, Some(("A", "B")));
    let cut = r.find("[cluster]").unwrap();
    r[..cut].to_string()
}

#[test]
fn the_printed_commands_run_the_three_process_training() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), placed_recipe()).unwrap();
    let (a, b) = (free_port(), free_port());
    let hosts = format!("# name address\nnode1 {a}\nnode2 {b}   # scoring\n");
    std::fs::write(dir.path().join("hosts"), hosts).unwrap();
    let out = launch(dir.path(), &["r.toml", "--hosts", "hosts"], None);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 3, "two workers and the controller: {text}");
    let run = |line: &str| {
        let words: Vec<&str> = line.trim_end_matches(" &").split_whitespace().collect();
        assert_eq!(words[0], "oxalign", "{line}");
        let mut c = Command::new(env!("CARGO_BIN_EXE_oxalign"));
        c.args(&words[1..])
            .current_dir(dir.path())
            .env_remove("OXALIGN_COOKIE");
        c
    };
    let mut workers = Vec::new();
    for line in &lines[..2] {
        assert!(
            line.ends_with(" &") && line.contains("worker --listen"),
            "{line}"
        );
        let (w, first) = spawn_announced(run(line).stderr(Stdio::null()));
        assert!(first.starts_with("listening on "), "{first}");
        workers.push(w);
    }
    assert!(
        lines[2].starts_with("oxalign train r.toml --set cluster.nodes.node1="),
        "{}",
        lines[2]
    );
    let out = run(lines[2]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("cluster traffic"),
        "the roles ran on the workers: {stdout}"
    );
}

#[test]
fn a_node_beyond_loopback_is_started_over_ssh() {
    let dir = tempfile::tempdir().unwrap();
    let insecure = placed_recipe() + "\n[cluster]\ninsecure = true\n";
    std::fs::write(dir.path().join("r.toml"), insecure).unwrap();
    std::fs::write(
        dir.path().join("hosts"),
        "node1 127.0.0.1:7101\nnode2 10.9.8.7:7101\n",
    )
    .unwrap();
    let out = launch(dir.path(), &["r.toml", "--hosts", "hosts"], None);
    assert_eq!(out.status.code(), Some(2), "no cookie: {}", stderr(&out));
    assert!(
        stderr(&out).contains("cluster.cookie_env"),
        "{}",
        stderr(&out)
    );
    let out = launch(dir.path(), &["r.toml", "--hosts", "hosts"], Some("s3cret"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("oxalign worker --listen 127.0.0.1:7101 &"),
        "{text}"
    );
    assert!(
        text.contains("ssh -o SendEnv=OXALIGN_COOKIE 10.9.8.7 'cd ")
            && text.contains("&& oxalign worker --listen 10.9.8.7:7101 --insecure' &"),
        "{text}"
    );
    assert!(
        !text.contains("s3cret"),
        "the cookie is never printed: {text}"
    );
}

#[test]
fn a_bad_host_list_exits_with_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), placed_recipe()).unwrap();
    for (hosts, says) in [
        (
            "node1 127.0.0.1:7101 extra\n",
            "hosts:1: expected `NAME HOST:PORT`",
        ),
        ("node1 127.0.0.1\n", "hosts:1"),
        ("node1 127.0.0.1:7101\n", "placement.reference"),
    ] {
        std::fs::write(dir.path().join("hosts"), hosts).unwrap();
        let out = launch(dir.path(), &["r.toml", "--hosts", "hosts"], None);
        assert_eq!(out.status.code(), Some(2), "{hosts:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{hosts:?}: {}", stderr(&out));
    }
}

/// A stand-in for ssh: logs its arguments to `$SSH_LOG` and runs `body` (in which `$last`
/// is the remote command) here.
fn fake_ssh(dir: &std::path::Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    let script = format!("#!/bin/sh\necho \"$@\" >> \"$SSH_LOG\"\nfor last; do :; done\n{body}\n");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// `oxalign launch r.toml --hosts hosts --start ARGS` in `dir` with `ssh` as the ssh
/// program, `oxalign` on the PATH (as on a node) and a cookie.
fn launch_start(dir: &std::path::Path, ssh: &str, args: &[&str]) -> Output {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_oxalign"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(bin)
        .args(["launch", "r.toml", "--hosts", "hosts", "--start"])
        .args(args)
        .current_dir(dir)
        .env("OXALIGN_COOKIE", "s3cret")
        .env("OXALIGN_SSH", ssh)
        .env("SSH_LOG", dir.join("ssh.log"))
        .env("PATH", path)
        .output()
        .unwrap()
}

/// node1 on 127.0.0.1 (started here) and node2 on `[::ffff:127.0.0.1]`, an IPv4-mapped
/// address: this machine, but not loopback by name, so its worker goes through ssh.
fn start_hosts(dir: &std::path::Path) -> (String, String) {
    let a = free_port();
    let port = free_port().rsplit_once(':').unwrap().1.to_string();
    let b = format!("[::ffff:127.0.0.1]:{port}");
    // Beyond loopback by name, so the sessions run over TLS with the cluster's certificates.
    let certs = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args([
            "cluster",
            "certs",
            "--out",
            "certs",
            "--hosts",
            "::ffff:127.0.0.1",
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(certs.status.success(), "{}", stderr(&certs));
    let tls = String::from_utf8(certs.stdout).unwrap();
    assert!(tls.starts_with("[cluster]\ntls_cert = "), "{tls}");
    std::fs::write(dir.join("r.toml"), placed_recipe() + "\n" + &tls).unwrap();
    std::fs::write(dir.join("hosts"), format!("node1 {a}\nnode2 {b}\n")).unwrap();
    (a, b)
}

#[test]
fn launch_start_runs_the_workers_over_ssh_and_the_controller() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = start_hosts(dir.path());
    let ssh = fake_ssh(dir.path(), "ssh", "exec sh -c \"$last\"");
    let out = launch_start(dir.path(), &ssh, &["--set", "run.steps=2"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("launch: 2 workers answer"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cluster traffic"), "{stdout}");
    assert_eq!(metrics(dir.path()).len(), 2, "two RL steps");
    let log = std::fs::read_to_string(dir.path().join("ssh.log")).unwrap();
    assert_eq!(log.lines().count(), 1, "ssh only for node2: {log}");
    assert!(
        log.starts_with("-tt -o SendEnv=OXALIGN_COOKIE ::ffff:127.0.0.1 cd ")
            && log.contains(&format!("&& exec oxalign worker --listen '{b}'")),
        "{log}"
    );
    // The workers were stopped with the run: both ports are free again.
    for addr in [&a, &b] {
        assert!(
            std::net::TcpListener::bind(addr.as_str()).is_ok(),
            "{addr} still held"
        );
    }
}

#[test]
fn a_worker_that_fails_or_never_answers_exits_2_with_the_command() {
    let dir = tempfile::tempdir().unwrap();
    start_hosts(dir.path());
    let refused = fake_ssh(
        dir.path(),
        "ssh-refused",
        "echo 'ssh: connect: refused' >&2\nexit 255",
    );
    let out = launch_start(dir.path(), &refused, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("node node2") && err.contains("exited with status 255"),
        "{err}"
    );
    assert!(
        err.contains("start it by hand with `") && err.contains("exec oxalign worker"),
        "{err}"
    );
    let silent = fake_ssh(dir.path(), "ssh-silent", "exec sleep 30");
    let set = ["--set", "cluster.connect_timeout_s=1"];
    let started = std::time::Instant::now();
    let out = launch_start(dir.path(), &silent, &set);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no worker answered within 1 s"), "{err}");
    assert!(
        started.elapsed().as_secs() < 20,
        "waited {:?}",
        started.elapsed()
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_host_that_is_a_shell_payload_is_refused_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), placed_recipe()).unwrap();
    let marker = dir.path().join("pwned");
    let hosts = format!(
        "node1 h$(touch${{IFS}}{}).x:7101\nnode2 {}\n",
        marker.display(),
        free_port()
    );
    std::fs::write(dir.path().join("hosts"), hosts).unwrap();
    let ssh = fake_ssh(dir.path(), "ssh", "exec sh -c \"$last\"");
    for start in [true, false] {
        let out = if start {
            launch_start(dir.path(), &ssh, &["--set", "cluster.connect_timeout_s=5"])
        } else {
            launch(dir.path(), &["r.toml", "--hosts", "hosts"], Some("s3cret"))
        };
        let err = stderr(&out);
        assert!(!marker.exists(), "--start {start}: the payload ran");
        assert_eq!(out.status.code(), Some(2), "--start {start}: {err}");
        assert!(
            err.contains("hosts:1") && err.contains("is not a host name"),
            "--start {start}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Runs `line` (a printed command, its trailing ` &` cut) in sh with `ssh` and `oxalign`
/// replaced by functions: ssh runs its remote command here, oxalign prints its working
/// directory and then each argument on its own line.
fn run_printed(line: &str, dir: &std::path::Path) -> Vec<String> {
    let stand_ins = "ssh() { shift 3; eval \"$1\"; }\noxalign() { pwd; printf '%s\\n' \"$@\"; }\n";
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{stand_ins}{}", line.trim_end_matches(" &")))
        .current_dir(dir)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{line}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn paths_with_spaces_quotes_and_dollars_are_quoted_in_the_printed_commands() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run $HOME it's");
    std::fs::create_dir(&dir).unwrap();
    let insecure = placed_recipe() + "\n[cluster]\ninsecure = true\n";
    std::fs::write(dir.join("r $x.toml"), insecure).unwrap();
    let a = free_port();
    std::fs::write(
        dir.join("hosts"),
        format!("node1 {a}\nnode2 10.9.8.7:7101\n"),
    )
    .unwrap();
    let out = launch(&dir, &["r $x.toml", "--hosts", "hosts"], Some("s3cret"));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 3, "{text}");
    let here = dir.display().to_string();
    assert_eq!(
        run_printed(lines[1], tmp.path()),
        [
            here.as_str(),
            "worker",
            "--listen",
            "10.9.8.7:7101",
            "--insecure"
        ],
        "{}",
        lines[1]
    );
    let train = run_printed(lines[2], &dir);
    assert_eq!(
        train[..3],
        [here.as_str(), "train", "r $x.toml"],
        "{}",
        lines[2]
    );
}

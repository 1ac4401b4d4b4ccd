//! `oxalign launch`: the commands it prints start a working multi-process run (run here as
//! printed, on 127.0.0.1); a node beyond loopback gets an ssh line; a bad host list exits 2.

mod cluster_support;

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
        let mut w = run(line)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut first = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(w.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(first.starts_with("listening on "), "{first}");
        workers.push(KillOnDrop(w));
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

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_node_beyond_loopback_is_started_over_ssh() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), placed_recipe()).unwrap();
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
            && text.contains("&& oxalign worker --listen 10.9.8.7:7101' &"),
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

//! Roles on other processes: a controller and two `oxalign worker`s on 127.0.0.1 — node1
//! holding the policy, node2 the reference, reward and critic — train exactly as one
//! process does; a SIGKILLed node2 is noticed at once, its roles are restarted when a new
//! worker joins at its address, and the run ends with the same metrics; a node that never
//! comes back fails the run with the `--resume` command, as do spares that cannot take its
//! roles (each named with why); inside a Slurm allocation the nodes
//! come from `SLURM_JOB_NODELIST`; recipe mistakes exit with 2. The remote roles' status,
//! throughput and spans reach the controller's monitor.

mod cluster_support;

use cluster_support::*;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

#[test]
fn three_processes_train_exactly_as_one() {
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &recipe(3, None));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    let (n1, n2) = (
        Worker::start("127.0.0.1:0", None),
        Worker::start("127.0.0.1:0", None),
    );
    let three = tempfile::tempdir().unwrap();
    let out = train(three.path(), &recipe(3, Some((&n1.addr, &n2.addr))));
    assert!(out.status.success(), "three processes: {}", stderr(&out));
    assert_same_run(one.path(), three.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cluster traffic: "), "{stdout}");
    // The controller's monitor shows where each role runs.
    let actors = std::fs::read_to_string(three.path().join("runs/c/actors.json")).unwrap();
    for placed in ["node1/cpu:0", "node2/cpu:0"] {
        assert!(actors.contains(placed), "{placed} not in {actors}");
    }
    // What the remote roles reported on their workers (busy, then idle with a throughput)
    // reached the controller's monitor, as a local role's reports do.
    let actors: Vec<serde_json::Value> = serde_json::from_str(&actors).unwrap();
    for role in ["policy", "reference", "reward", "critic"] {
        let a = actors.iter().find(|a| a["name"] == role).unwrap();
        assert!(a["items_per_sec"].as_f64().unwrap() > 0.0, "{role}: {a}");
        assert_eq!(a["status"], "idle", "{role}: {a}");
    }
    let timeline = std::fs::read_to_string(three.path().join("runs/c/timeline.jsonl")).unwrap();
    for span in ["\"reference_logprobs\"", "\"values\"", "\"critic_train\""] {
        assert!(timeline.contains(span), "no {span} span: {timeline}");
    }
}

/// Waits until the run in `dir` has reported `n` RL steps (or `limit` passes).
fn wait_for_steps(dir: &std::path::Path, n: usize, limit: Duration) {
    let start = Instant::now();
    while metrics(dir).len() < n {
        assert!(start.elapsed() < limit, "no {n} steps within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_killed_scoring_node_is_restarted_when_a_new_worker_joins() {
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &recipe(8, None));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    let n1 = Worker::start("127.0.0.1:0", None);
    let n2 = Worker::start("127.0.0.1:0", None);
    let addr2 = n2.addr.clone();
    let dir = tempfile::tempdir().unwrap();
    let run = spawn_train(dir.path(), &recipe(8, Some((&n1.addr, &addr2))));
    wait_for_steps(dir.path(), 2, Duration::from_secs(120));
    let killed_at = metrics(dir.path()).len();
    n2.kill();
    std::thread::sleep(Duration::from_millis(300));
    let _n2b = Worker::start(&addr2, None);
    let out = run.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "the run failed: {err}");
    assert!(killed_at < 8, "the kill came after the last step");
    // Noticed from the closed connection, not by waiting out the 60 s call timeout.
    assert!(err.contains("the connection was lost"), "{err}");
    // The session's end reached the controller as such, naming the node.
    assert!(
        err.contains(&format!("node node2 ({addr2}): its session ended")),
        "{err}"
    );
    assert!(
        err.contains("restarting reference, reward, critic")
            || err.contains("restarting policy, reference, reward, critic"),
        "{err}"
    );
    assert_same_run(one.path(), dir.path());
    let restarts: f64 = metrics(dir.path())
        .iter()
        .map(|m| m["restarts"].as_f64().unwrap())
        .sum();
    assert_eq!(restarts, 1.0, "one restart, reported on the failed step");
}

/// Two-node recipe `r` with a 1 s connect timeout and `spares` (name, address) added to
/// `[cluster] nodes` and listed, in order, in `cluster.spare_nodes`.
fn with_spares(r: &str, spares: &[(&str, &str)]) -> String {
    let nodes: String = spares
        .iter()
        .map(|(name, addr)| format!(", {name} = \"{addr}\""))
        .collect();
    let names: Vec<String> = spares.iter().map(|(name, _)| format!("{name:?}")).collect();
    r.replace(
        " }\nconnect_timeout_s = 20\n",
        &format!(
            "{nodes} }}\nconnect_timeout_s = 1\nspare_nodes = [{}]\n",
            names.join(", ")
        ),
    )
}

/// Runs recipe `r` in `dir`, kills node2's worker `n2` once 2 steps are done, and returns
/// the run's output.
fn kill_node2_after_two_steps(dir: &Path, r: &str, n2: Worker) -> Output {
    let run = spawn_train(dir, r);
    wait_for_steps(dir, 2, Duration::from_secs(120));
    n2.kill();
    run.wait_with_output().unwrap()
}

/// With `cluster.spare_nodes`, the roles of a node that never comes back move to a spare:
/// the run finishes with the same metrics as one process.
#[test]
fn a_dead_nodes_roles_move_to_a_spare_node() {
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &recipe(8, None));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    let n1 = Worker::start("127.0.0.1:0", None);
    let n2 = Worker::start("127.0.0.1:0", None);
    let n3 = Worker::start("127.0.0.1:0", None);
    let dir = tempfile::tempdir().unwrap();
    let r = with_spares(
        &recipe(8, Some((&n1.addr, &n2.addr))),
        &[("node3", &n3.addr)],
    );
    let out = kill_node2_after_two_steps(dir.path(), &r, n2);
    let err = stderr(&out);
    assert!(out.status.success(), "the run failed: {err}");
    assert!(err.contains("it runs on the spare node3"), "{err}");
    assert_same_run(one.path(), dir.path());
}

/// A spare that cannot take a role is passed over, named with why: here a stand-in worker
/// that offers no CPU (a real worker always offers its CPU; a GPU-only inventory is how a
/// CPU-only build can show a spare lacking the role's devices) and a spare with no worker.
/// With none left, the run fails with the `--resume` command, and no role was built on the
/// stand-in (it was only asked for its inventory).
#[test]
fn spares_that_cannot_take_the_roles_fail_the_run_with_the_resume_command() {
    use cluster_support::fake_worker::FakeWorker;
    use oxalign_actors::cluster::Inventory;
    use oxalign_kernels::device::DeviceSpec;
    let n1 = Worker::start("127.0.0.1:0", None);
    let n2 = Worker::start("127.0.0.1:0", None);
    let gpu_only = FakeWorker::start(Inventory {
        devices: vec![DeviceSpec::cuda(0)],
        held: vec![],
    });
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = free.local_addr().unwrap().to_string();
    drop(free);
    let dir = tempfile::tempdir().unwrap();
    let spares = [("node3", gpu_only.addr.as_str()), ("node4", &nobody)];
    let r = with_spares(&recipe(8, Some((&n1.addr, &n2.addr))), &spares);
    let out = kill_node2_after_two_steps(dir.path(), &r, n2);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no spare node can host the "), "{err}");
    assert!(
        err.contains("spare node3: lacks cpu:0 (wants cpu:0; has cuda:0)"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "spare node4: node node4 ({nobody}): no worker accepted"
        )),
        "{err}"
    );
    assert!(err.contains("--resume"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let seen = gpu_only.seen();
    assert!(
        !seen.is_empty() && seen.iter().all(|k| k == "inventory"),
        "{seen:?}"
    );
}

#[test]
fn a_node_that_never_comes_back_fails_with_the_resume_command() {
    let n1 = Worker::start("127.0.0.1:0", None);
    let n2 = Worker::start("127.0.0.1:0", None);
    let dir = tempfile::tempdir().unwrap();
    let r = recipe(8, Some((&n1.addr, &n2.addr)))
        .replace("connect_timeout_s = 20", "connect_timeout_s = 1");
    let out = kill_node2_after_two_steps(dir.path(), &r, n2);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no worker accepted within"), "{err}");
    assert!(err.contains("--resume"), "{err}");
}

#[test]
fn recipe_mistakes_about_nodes_exit_with_2() {
    let dir = tempfile::tempdir().unwrap();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unused = free.local_addr().unwrap().to_string();
    drop(free);
    let base = recipe(1, Some((&unused, &unused)));
    let cases = [
        (
            base.replace("reference = \"node2:cpu\"", "reference = \"node3:cpu\""),
            "placement.reference",
            "node3",
        ),
        (
            base.replace(&format!("node1 = \"{unused}\""), "node1 = \"127.0.0.1\""),
            "cluster.nodes.node1",
            "host:port",
        ),
        (
            base.replace(
                &format!("node1 = \"{unused}\""),
                "node1 = \"10.1.2.3:7101\"",
            ),
            "cluster.cookie_env",
            "OXALIGN_COOKIE",
        ),
        (
            base.replace("connect_timeout_s = 20", "connect_timeout_s = 0.5"),
            &unused,
            "no worker accepted",
        ),
        (
            base.replace(
                "connect_timeout_s = 20",
                "connect_timeout_s = 20\nspare_nodes = [\"node9\"]",
            ),
            "cluster.spare_nodes",
            "node9",
        ),
    ];
    for (r, key, says) in cases {
        let out = train(dir.path(), &r);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert!(
            err.contains(key) && err.contains(says),
            "{key}, {says}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn inside_a_slurm_allocation_the_nodes_come_from_its_host_list() {
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &recipe(3, None));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    // Two loopback hosts, one port: as `srun oxalign worker` on two machines.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let _n1 = Worker::start(&format!("127.0.0.1:{port}"), None);
    let _n2 = Worker::start(&format!("127.0.0.2:{port}"), None);
    let r = recipe(3, Some(("unused", "unused")));
    let r = format!(
        "{}[cluster]\nslurm = true\nport = {port}\n",
        &r[..r.find("[cluster]").unwrap()]
    );
    let dir = tempfile::tempdir().unwrap();
    let env = [("SLURM_JOB_NODELIST", "127.0.0.[1-2]")];
    let out = spawn_train_env(dir.path(), &r, &env)
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_run(one.path(), dir.path());
    let actors = std::fs::read_to_string(dir.path().join("runs/c/actors.json")).unwrap();
    assert!(actors.contains("node2/cpu:0"), "{actors}");
    let out = spawn_train_env(dir.path(), &r, &[])
        .wait_with_output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "outside an allocation: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("SLURM_JOB_NODELIST"),
        "{}",
        stderr(&out)
    );
}

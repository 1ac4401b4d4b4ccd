//! The rollout engine as a role of its own (`placement.engine`): on its own `oxalign worker`
//! process on 127.0.0.1, or in the controller's process apart from the policy, a run trains
//! exactly as the one-process run of the same recipe and seed, with the trainer's weights
//! sent as checksummed buckets at every refit (reported as `refit_bytes` and on the
//! `cluster traffic` line); pipelined generation (`rl.max_staleness`) too; and what an engine
//! role does not support exits with 2 naming the key.

mod cluster_support;

use cluster_support::*;

/// The recipe with the engine placed at `engine`, and `node1` at `addr` when given; `extra`
/// appended to `[rl]`.
fn engine_recipe(steps: u64, engine: &str, addr: Option<&str>, extra: &str) -> String {
    let mut r = base_recipe().replace("STEPS", &steps.to_string()).replace(
        "max_new_tokens = 3",
        &format!("max_new_tokens = 3\n{extra}"),
    );
    r.push_str(&format!("\n[placement]\nengine = \"{engine}\"\n"));
    if let Some(a) = addr {
        r.push_str(&format!(
            "\n[cluster]\nnodes = {{ node1 = \"{a}\" }}\nconnect_timeout_s = 20\nrefit_bucket_mb = 1\n"
        ));
    }
    r
}

/// The one-process recipe with `extra` in `[rl]`.
fn plain(steps: u64, extra: &str) -> String {
    base_recipe().replace("STEPS", &steps.to_string()).replace(
        "max_new_tokens = 3",
        &format!("max_new_tokens = 3\n{extra}"),
    )
}

/// Asserts every step of `dir`'s run sent refit buckets.
fn assert_refit_moved(dir: &std::path::Path) {
    for m in metrics(dir) {
        let bytes = m["refit_bytes"].as_f64().unwrap_or(0.0);
        assert!(bytes > 100_000.0, "step {}: refit_bytes {bytes}", m["step"]);
        assert!(m["refit_buckets"].as_f64().unwrap_or(0.0) >= 1.0, "{m}");
        assert!(
            m["refit_transfer_seconds"].as_f64().unwrap_or(-1.0) >= 0.0,
            "{m}"
        );
    }
}

#[test]
fn an_engine_on_its_own_worker_trains_exactly_as_one_process() {
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &plain(3, ""));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    // Without placement.engine nothing about the refit transfer is reported.
    assert!(metrics(one.path())[0].get("refit_bytes").is_none());

    let n1 = Worker::start("127.0.0.1:0", None);
    let two = tempfile::tempdir().unwrap();
    // 1 MiB buckets: the tiny model's ~3.5 MB of weights travel in several.
    let out = train(
        two.path(),
        &engine_recipe(3, "node1:cpu", Some(&n1.addr), ""),
    );
    assert!(out.status.success(), "engine on a worker: {}", stderr(&out));
    assert_same_run(one.path(), two.path());
    assert_refit_moved(two.path());
    assert!(metrics(two.path())[0]["refit_buckets"].as_f64().unwrap() >= 2.0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("refit to the engine role: "), "{stdout}");
    let actors = std::fs::read_to_string(two.path().join("runs/c/actors.json")).unwrap();
    assert!(actors.contains("node1/cpu:0"), "{actors}");
    // The buckets went through the run folder's spool, and none is left there.
    let spool = two.path().join("runs/c/refit-spool");
    assert_eq!(
        std::fs::read_dir(&spool).unwrap().count(),
        0,
        "{spool:?} not emptied"
    );
    let traffic = stdout
        .lines()
        .find(|l| l.contains("cluster traffic"))
        .unwrap();
    let sent: u64 = traffic.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(
        sent < 3_000_000,
        "the weights went over the session: {traffic}"
    );

    // The engine role in this process, apart from the policy: the same run again.
    let local = tempfile::tempdir().unwrap();
    let out = train(local.path(), &engine_recipe(3, "cpu", None, ""));
    assert!(out.status.success(), "local engine role: {}", stderr(&out));
    assert_same_run(one.path(), local.path());
    assert_refit_moved(local.path());
}

#[test]
fn pipelined_generation_with_an_engine_on_a_worker_matches_one_process() {
    let stale = "max_staleness = 1";
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &plain(3, stale));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    let n1 = Worker::start("127.0.0.1:0", None);
    let two = tempfile::tempdir().unwrap();
    let out = train(
        two.path(),
        &engine_recipe(3, "node1:cpu", Some(&n1.addr), stale),
    );
    assert!(out.status.success(), "engine on a worker: {}", stderr(&out));
    assert_same_run(one.path(), two.path());
    assert_refit_moved(two.path());
}

#[test]
fn what_an_engine_role_does_not_support_exits_with_2() {
    let dir = tempfile::tempdir().unwrap();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unused = free.local_addr().unwrap().to_string();
    drop(free);
    let on_node = engine_recipe(1, "node1:cpu", Some(&unused), "");
    let cases = [
        (
            engine_recipe(1, "node7:cpu", Some(&unused), ""),
            "placement.engine",
            "node7",
        ),
        (
            engine_recipe(1, "cpu", None, "routing_replay = true"),
            "placement.engine",
            "rl.routing_replay",
        ),
        (
            on_node.replace("refit_bucket_mb = 1", "refit_bucket_mb = 1024"),
            "cluster.refit_bucket_mb",
            "max_message_mb",
        ),
        (
            on_node.replace(
                "engine = \"node1:cpu\"",
                "engine = \"node1:cpu\"\npolicy = \"node1:cpu\"",
            ),
            "placement.engine",
            "placement.policy",
        ),
        (
            engine_recipe(1, "cpu:0,cpu:1", None, "").replace(
                "[placement]",
                "[placement]\nexpert_parallel = 2\npolicy = \"cpu:0,cpu:1\"",
            ),
            "placement.engine",
            "expert_parallel",
        ),
        (
            engine_recipe(1, "gpu:0", None, ""),
            "placement.engine",
            "gpu:0",
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
fn a_failed_refit_rebuilds_the_engine_role_with_the_policy_and_replays_exactly() {
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &plain(4, ""));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    let n1 = Worker::start("127.0.0.1:0", None);
    let dir = tempfile::tempdir().unwrap();
    let fault = "\n[[faults]]\nrole = \"policy\"\nphase = \"refit\"\nstep = 3\nkind = \"error\"\n";
    let r = engine_recipe(4, "node1:cpu", Some(&n1.addr), "") + fault;
    let out = train(dir.path(), &r);
    let err = stderr(&out);
    assert!(
        out.status.success(),
        "engine on a worker, a refit fault: {err}"
    );
    assert!(err.contains("restarting policy"), "{err}");
    assert_same_run(one.path(), dir.path());
    let m = metrics(dir.path());
    assert_eq!(m[2]["restarts"], 1.0, "{:?}", m[2]);
}

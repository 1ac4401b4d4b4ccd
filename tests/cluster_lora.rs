//! Issue 30, item 6: LoRA with roles on `oxalign worker` processes (127.0.0.1). With the
//! engine on a worker, each refit sends only the adapters (the engine role holds the same
//! frozen base and merges them itself, verified by the trainer's probe), and the run is the
//! one-process LoRA run of the same recipe and seed, step for step; with the policy on a
//! worker too; and LoRA over two data-parallel replicas follows one replica.

mod cluster_support;

use cluster_support::*;

/// The tiny PPO recipe with LoRA (rank 4 on every linear layer) and `placement`.
fn lora_recipe(placement: &str, addr: Option<&str>) -> String {
    let mut r = base_recipe().replace("STEPS", "3");
    r.push_str("\n[lora]\nr = 4\nalpha = 8\n");
    if !placement.is_empty() {
        r.push_str(&format!("\n[placement]\n{placement}\n"));
    }
    if let Some(a) = addr {
        r.push_str(&format!(
            "\n[cluster]\nnodes = {{ node1 = \"{a}\" }}\nconnect_timeout_s = 20\n"
        ));
    }
    r
}

/// The LoRA run in one process, on one replica: what the placed runs are compared with.
fn one_process_run() -> tempfile::TempDir {
    let one = tempfile::tempdir().unwrap();
    let out = train(one.path(), &lora_recipe("", None));
    assert!(out.status.success(), "single process: {}", stderr(&out));
    one
}

/// Size of the final model's weights file: what a refit of every weight would send.
fn full_weights_bytes(dir: &std::path::Path) -> f64 {
    let sft = dir.join("runs/c/final/model.safetensors");
    std::fs::metadata(&sft)
        .unwrap_or_else(|e| panic!("{sft:?}: {e}"))
        .len() as f64
}

#[test]
fn a_lora_engine_on_a_worker_takes_only_the_adapters_and_trains_as_one_process() {
    let one = one_process_run();

    let n1 = Worker::start("127.0.0.1:0", None);
    let two = tempfile::tempdir().unwrap();
    let recipe = lora_recipe("engine = \"node1:cpu\"", Some(&n1.addr));
    let out = train(two.path(), &recipe);
    assert!(out.status.success(), "engine on a worker: {}", stderr(&out));
    assert_same_run(one.path(), two.path());
    let full = full_weights_bytes(two.path());
    for m in metrics(two.path()) {
        let bytes = m["refit_bytes"].as_f64().unwrap_or(0.0);
        // Rank-4 adapters of the tiny model are a few percent of its weights.
        assert!(
            bytes > 0.0 && bytes < 0.15 * full,
            "step {}: refit_bytes {bytes} of {full} full",
            m["step"]
        );
    }
    // The engine role in this process, apart from the policy: adapters only, the same run.
    let local = tempfile::tempdir().unwrap();
    let out = train(local.path(), &lora_recipe("engine = \"cpu\"", None));
    assert!(out.status.success(), "local engine role: {}", stderr(&out));
    assert_same_run(one.path(), local.path());
    assert_eq!(
        metrics(local.path())[0]["refit_bytes"],
        metrics(two.path())[0]["refit_bytes"]
    );
}

#[test]
fn a_lora_policy_on_a_worker_trains_as_one_process() {
    let one = one_process_run();

    let n1 = Worker::start("127.0.0.1:0", None);
    let two = tempfile::tempdir().unwrap();
    let out = train(
        two.path(),
        &lora_recipe("policy = \"node1:cpu\"", Some(&n1.addr)),
    );
    assert!(out.status.success(), "policy on a worker: {}", stderr(&out));
    // The same samples and rewards; the reference's log-probs differ in the last bits: in
    // one process the reference is the policy's own frozen base (the LoRA forward with the
    // adapters off), with the policy on a worker a reference role of its own scores the
    // same weights loaded from the reference folder.
    assert_close_run(one.path(), two.path(), 1e-4);
}

/// Every exact metric of the two runs equal within `tol` relative (to at least 0.1), step by
/// step.
fn assert_close_run(a: &std::path::Path, b: &std::path::Path, tol: f64) {
    assert_close(a, b, EXACT, tol);
}

/// Metrics `keys` of the two runs equal within `tol` relative (to at least 0.1), step by step.
fn assert_close(a: &std::path::Path, b: &std::path::Path, keys: &[&str], tol: f64) {
    let (x, y) = (metrics(a), metrics(b));
    assert_eq!(x.len(), y.len(), "each step exactly once");
    for (l, r) in x.iter().zip(&y) {
        for k in keys {
            let (u, v) = (l[k].as_f64().unwrap(), r[k].as_f64().unwrap());
            let close = (u - v).abs() <= tol * u.abs().max(v.abs()).max(0.1);
            assert!(close, "step {}: {k} {u} against {v}", l["step"]);
        }
    }
}

/// LoRA over data-parallel replicas (`placement.policy` and `critic` on two CPU devices):
/// each replica trains the same adapters on its share of the batch, their gradients are
/// averaged, so the run follows the one-replica run to f32 rounding: the same samples and
/// rewards, the same KL and gradient norms. (The reported losses are means of each
/// replica's token mean, as without LoRA, so they are not compared.)
#[test]
fn lora_over_two_data_parallel_replicas_trains_as_one() {
    let one = one_process_run();
    let two = tempfile::tempdir().unwrap();
    let placement = "policy = \"cpu:0,cpu:1\"\ncritic = \"cpu:0,cpu:1\"";
    let out = train(two.path(), &lora_recipe(placement, None));
    assert!(out.status.success(), "two replicas: {}", stderr(&out));
    let actors = std::fs::read_to_string(two.path().join("runs/c/actors.json")).unwrap();
    assert!(actors.contains("cpu:1"), "{actors}");
    let keys = ["reward_mean", "accuracy", "kl", "grad_norm", "response_len"];
    assert_close(one.path(), two.path(), &keys, 1e-4);
}

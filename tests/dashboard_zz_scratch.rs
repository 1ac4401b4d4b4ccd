mod dashboard_support;
use dashboard_support::*;
use oxalign_actors::monitor::{unix_ms_now, ActorUpdate, Monitor, MonitorConfig};
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn scratch_server() {
    let (monitor, _join) = Monitor::spawn(MonitorConfig::in_memory()).await.unwrap();
    let t0 = unix_ms_now() - 8_000;
    report_run_start(&monitor, "scratch", t0);
    for step in 0..5 { report_step(&monitor, step, t0 + 1000 * step); }
    monitor.report(ActorUpdate::failed("reward", "reward model OOM"));
    let server = oxalign::dashboard::serve_live("127.0.0.1:18265".parse().unwrap(), None, monitor.clone()).await.unwrap();
    println!("URL {}", server.url());
    for step in 5..200 { tokio::time::sleep(std::time::Duration::from_millis(1000)).await; report_step(&monitor, step, unix_ms_now()); }
}

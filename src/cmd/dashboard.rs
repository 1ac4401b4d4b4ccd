//! `oxalign dashboard RUN_DIR`: serves the dashboard of a finished (or crashed) run from its
//! logs, for replay. It only reads the run directory; a live run's dashboard is started by
//! `oxalign train --dashboard ADDR` instead.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use oxalign::dashboard::{self, DashboardSource};

use crate::user_error::IntoUserError;

/// Arguments of `oxalign dashboard`.
#[derive(Debug, Parser)]
#[command(
    about = "Serve the dashboard of a run from its logs (replay)",
    long_about = "Serve the dashboard of a run from its logs (replay): metrics.jsonl, \
timeline.jsonl, recipe.toml, run.json, actors.json and checkpoints/step_N/ in RUN_DIR. \
Prints the URL, then serves until Ctrl-C. Routes: / (page), /api/state, /api/events, \
/metrics (Prometheus), /healthz."
)]
pub struct Args {
    /// The run directory (as written by `oxalign train`).
    pub run_dir: PathBuf,
    /// Address to listen on; a non-loopback address (e.g. 0.0.0.0:8265) needs --token.
    /// `--listen`, as `oxalign worker` spells it; `--addr` is the older name.
    #[arg(long = "listen", visible_alias = "addr", default_value = dashboard::DEFAULT_ADDR, value_name = "ADDR")]
    pub addr: SocketAddr,
    /// Token every request must carry (`Authorization: Bearer TOKEN` or `?token=TOKEN`).
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
}

/// Runs `oxalign dashboard`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let source = DashboardSource::Replay(args.run_dir.clone());
        let server = dashboard::spawn(args.addr, args.token, source)
            .await
            .user_err("")?;
        // stdout carries exactly one line, the URL (scripts and tests read it)
        println!("{}", server.url());
        std::io::stdout().flush().ok();
        eprintln!(
            "serving the dashboard of {} (replay); press Ctrl-C to stop",
            args.run_dir.display()
        );
        server
            .run_until_ctrl_c()
            .await
            .context("the dashboard server failed")
    })
}

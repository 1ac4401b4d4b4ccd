//! `oxalign worker --listen ADDR`: a `ractor_cluster` node that hosts role actors for a
//! controller whose recipe places roles on it (`[cluster] nodes`,
//! `placement.<role> = "node1:cpu"`). It prints the address it listens on, then serves until
//! killed. The transport, its security and the hosting live in `oxalign_actors::cluster`.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;

use oxalign_actors::cluster::{self, Tls, TlsFiles, WorkerConfig};
use oxalign_actors::recipe::DEFAULT_COOKIE_ENV;

use crate::user_error::{user_error, IntoUserError};

/// Where a worker listens inside a Slurm job when `--listen` is not given.
const SLURM_LISTEN: &str = "0.0.0.0:7101";

/// Arguments of `oxalign worker`.
#[derive(Debug, Parser)]
#[command(
    about = "Host role actors for a controller on another process or node",
    long_about = "Host role actors for a controller on another process or node. The controller's \
recipe lists this worker under [cluster] nodes (e.g. node1 = \"10.0.0.5:7101\") and places roles \
on it (placement.policy = \"node1:cpu\"). Every session must prove it knows the cookie (--cookie, \
or the OXALIGN_COOKIE environment variable) by challenge-response; the cookie never travels. Beyond \
loopback a cookie is required, and mutual TLS (--tls-cert, --tls-key, --tls-ca; make them with \
`oxalign cluster certs`) unless --insecure says the network is trusted. Model folders and \
checkpoints are read and written at the paths the controller names, so the run folder must be on a \
filesystem both see. Prints `listening on ADDR`, then serves until killed."
)]
pub struct Args {
    /// Address to listen on, host:port (port 0 picks a free one). Inside a Slurm job
    /// (`srun oxalign worker`) it defaults to 0.0.0.0:7101, the port `[cluster] slurm = true`
    /// expects.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Cookie every connection must present (default: $OXALIGN_COOKIE).
    #[arg(long, value_name = "COOKIE")]
    pub cookie: Option<String>,
    /// Largest message accepted, MiB (a peer announcing a bigger one is cut off); the
    /// controller's `cluster.max_message_mb` must not exceed it.
    #[arg(long, default_value_t = 1024, value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub max_message_mb: u32,
    /// This node's certificate chain (PEM), for mutual TLS.
    #[arg(long, value_name = "PEM", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, value_name = "PEM", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM): a peer must present a certificate it signed.
    #[arg(long, value_name = "PEM", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// Serve without TLS beyond loopback: anyone who can see the traffic reads the batches.
    #[arg(long, conflicts_with = "tls_cert")]
    pub insecure: bool,
}

/// Runs `oxalign worker`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let cookie = args
        .cookie
        .or_else(|| std::env::var(DEFAULT_COOKIE_ENV).ok())
        .filter(|c| !c.is_empty());
    let listen = match args.listen {
        Some(l) => l,
        None if std::env::var_os("SLURM_JOB_ID").is_some() => SLURM_LISTEN.to_string(),
        None => {
            return user_error(
                "--listen ADDR is required outside a Slurm job (e.g. --listen 127.0.0.1:7101)",
            )
        }
    };
    let tls = match (args.tls_cert, args.tls_key, args.tls_ca) {
        (Some(cert), Some(key), Some(ca)) => {
            Some(Tls::load(&TlsFiles { cert, key, ca }).user_err("")?)
        }
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = cluster::bind(&listen, cookie.as_deref(), tls.is_some(), args.insecure)
            .await
            .user_err("")?;
        let addr = listener.local_addr().context("reading the bound address")?;
        // stdout carries exactly one line, the address (scripts and tests read it)
        println!("listening on {addr}");
        std::io::stdout().flush().ok();
        let cfg = WorkerConfig {
            cookie,
            max_frame: (args.max_message_mb as usize) << 20,
            tls,
        };
        cluster::serve(listener, cfg).await.context("serving")
    })
}

//! `oxalign cluster certs --out DIR --hosts H1,H2`: makes a cluster's TLS files
//! (`oxalign_actors::cluster::make_cluster_certs`) and prints the recipe lines that use them.
//! It never overwrites a file: a key already in DIR stays as it is.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use oxalign_actors::cluster::make_cluster_certs;

use crate::user_error::{user_error, IntoUserError};

/// Arguments of `oxalign cluster`.
#[derive(Debug, Parser)]
#[command(about = "Set up a cluster of workers (certificates for mutual TLS)")]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub action: Action,
}

/// What `oxalign cluster` can do.
#[derive(Debug, Subcommand)]
pub enum Action {
    /// Make a CA and the certificate every member of the cluster presents.
    #[command(
        long_about = "Make the TLS files of a cluster in DIR: ca.pem (the cluster's CA, \
tls_ca), member.pem and member-key.pem (the certificate and key the controller and every worker \
present, tls_cert and tls_key; it names every host given with --hosts, and loopback) and \
ca-key.pem (the CA's key, needed only to make certificates again: keep it off the nodes). Keys \
are written readable by their owner only. Put DIR where every node can read it (the run folder's \
filesystem), give the workers --tls-cert, --tls-key and --tls-ca (`oxalign launch` does), and \
the controller the three recipe keys this prints. A file already in DIR is never overwritten."
    )]
    Certs(CertsArgs),
}

/// Arguments of `oxalign cluster certs`.
#[derive(Debug, Parser)]
pub struct CertsArgs {
    /// The folder to write into (made if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The hosts the controller dials, as in `[cluster] nodes` (comma-separated names or IPs).
    #[arg(long, value_name = "H1,H2", value_delimiter = ',', required = true)]
    pub hosts: Vec<String>,
    /// How long the certificates are valid, days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
}

/// Runs `oxalign cluster`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.action {
        Action::Certs(a) => certs(a),
    }
}

fn certs(args: CertsArgs) -> anyhow::Result<()> {
    let names = ["ca.pem", "ca-key.pem", "member.pem", "member-key.pem"];
    for name in names {
        let path = args.out.join(name);
        if path.exists() {
            return user_error(format!(
                "{} already exists: expected a folder without the cluster's TLS files (remove \
                 them to make new ones, or pick another --out)",
                path.display()
            ));
        }
    }
    let made = make_cluster_certs(&args.hosts, args.days).user_err("--hosts")?;
    std::fs::create_dir_all(&args.out)
        .user_err(format!("cannot make the folder {}", args.out.display()))?;
    let texts = [
        (&made.ca_pem, false),
        (&made.ca_key_pem, true),
        (&made.member_pem, false),
        (&made.member_key_pem, true),
    ];
    for (name, (text, secret)) in names.into_iter().zip(texts) {
        write_new(&args.out.join(name), text, secret)?;
    }
    let dir = std::path::absolute(&args.out).unwrap_or(args.out.clone());
    let mut out = std::io::stdout().lock();
    writeln!(out, "[cluster]")?;
    for (key, name) in [
        ("tls_cert", "member.pem"),
        ("tls_key", "member-key.pem"),
        ("tls_ca", "ca.pem"),
    ] {
        let path = dir.join(name).display().to_string();
        writeln!(out, "{key} = {}", toml_string(&path))?;
    }
    Ok(())
}

/// Writes `text` to a file that must not exist yet; `secret` ones readable by the owner only.
fn write_new(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `s` as a TOML basic string (a JSON string's escapes are all TOML's too).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

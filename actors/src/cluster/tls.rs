//! Mutual TLS between the controller and its workers (rustls, with the ring provider): each
//! side presents a certificate signed by the cluster's CA and accepts only a peer whose
//! certificate that CA signed. A worker checks the controller's client certificate; the
//! controller checks that the worker's certificate names the host it dialled. The files are
//! PEM (`oxalign cluster certs` makes a CA and one certificate per host).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The PEM files of one cluster member.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    /// This member's certificate (chain).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signed every member's certificate.
    pub ca: PathBuf,
}

/// TLS could not be set up from the files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{what} {path}: {message}")]
    File {
        /// `"certificate"`, `"private key"` or `"CA certificate"`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the certificates or key.
    #[error("TLS setup: {0}")]
    Config(String),
    /// The host the controller dials is not a DNS name or IP address.
    #[error("{0:?} is not a host name a certificate can name")]
    ServerName(String),
}

/// Both ends' TLS settings of one cluster member.
#[derive(Clone)]
pub struct Tls {
    /// As a worker: present our certificate, require the peer's.
    pub server: Arc<ServerConfig>,
    /// As a controller: present our certificate, check the worker's.
    pub client: Arc<ClientConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls { .. }")
    }
}

impl Tls {
    /// Reads the PEM files and builds both configurations.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let chain = certificates(&files.cert, "certificate")?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::File {
            what: "private key",
            path: files.key.clone(),
            message: format!("{e} (expected a PEM private key)"),
        })?;
        let mut roots = RootCertStore::empty();
        for ca in certificates(&files.ca, "CA certificate")? {
            roots.add(ca).map_err(|e| TlsError::File {
                what: "CA certificate",
                path: files.ca.clone(),
                message: e.to_string(),
            })?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = |e: rustls::Error| TlsError::Config(e.to_string());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(config)?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(config)?;
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// The name a worker's certificate must carry when it is dialled at `host`.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_string()).map_err(|_| TlsError::ServerName(host.into()))
}

/// Every certificate in PEM file `path`; none is an error.
fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |message: String| TlsError::File {
        what,
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in it (expected PEM)".into()));
    }
    Ok(certs)
}

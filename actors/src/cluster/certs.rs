//! A cluster's certificates, made with rcgen (`oxalign cluster certs`): a CA of its own and
//! one member certificate, signed by it, that the controller and every worker present. The
//! member certificate names every host the controller dials (and loopback), and is good for
//! both ends of mutual TLS (server and client authentication). ECDSA P-256 keys.
//!
//! What it protects: a peer without a certificate this CA signed cannot open a session (TLS
//! refuses it before the cookie's challenge), and nobody on the network can read or alter
//! the traffic. Whoever holds the member key and the cookie can have a worker build roles;
//! the CA key is needed only to make new certificates and need not be on any node.

use crate::recipe::valid_host;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use time::OffsetDateTime;

/// The PEM texts of a new cluster's certificates.
pub struct ClusterCerts {
    /// The CA certificate (`tls_ca` everywhere).
    pub ca_pem: String,
    /// The CA's private key (keep it off the nodes).
    pub ca_key_pem: String,
    /// The member certificate (`tls_cert` everywhere).
    pub member_pem: String,
    /// The member certificate's private key (`tls_key` everywhere).
    pub member_key_pem: String,
}

/// The certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A host is neither an RFC 1123 name nor an IP literal.
    #[error("{0:?} is not a host name or IP address a certificate can name")]
    Host(String),
    /// No host was given.
    #[error("no host given: expected the hosts the controller dials, e.g. node1,node2")]
    NoHost,
    /// rcgen failed.
    #[error("making the certificates: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// Makes a CA and a member certificate valid for `days` days that names `hosts`,
/// `localhost`, `127.0.0.1` and `::1`.
pub fn make_cluster_certs(hosts: &[String], days: u32) -> Result<ClusterCerts, CertError> {
    if hosts.is_empty() {
        return Err(CertError::NoHost);
    }
    let mut sans = Vec::new();
    for host in hosts
        .iter()
        .map(String::as_str)
        .chain(["localhost", "127.0.0.1", "::1"])
    {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if !valid_host(bare) {
            return Err(CertError::Host(host.into()));
        }
        let san = match bare.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(bare.to_string().try_into()?),
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    let (not_before, not_after) = validity(days);

    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "oxalign cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca.not_before, ca.not_after) = (not_before, not_after);
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;

    let mut member = CertificateParams::default();
    member
        .distinguished_name
        .push(DnType::CommonName, "oxalign cluster member");
    member.subject_alt_names = sans;
    member.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    member.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    (member.not_before, member.not_after) = (not_before, not_after);
    let member_key = KeyPair::generate()?;
    let issuer = Issuer::new(ca, ca_key);
    let member_cert = member.signed_by(&member_key, &issuer)?;
    Ok(ClusterCerts {
        ca_pem: ca_cert.pem(),
        ca_key_pem: issuer.key().serialize_pem(),
        member_pem: member_cert.pem(),
        member_key_pem: member_key.serialize_pem(),
    })
}

/// From an hour ago (clocks differ between nodes) to `days` days from now.
fn validity(days: u32) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (
        now - time::Duration::hours(1),
        now + time::Duration::days(days.into()),
    )
}

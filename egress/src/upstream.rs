//! Connections out of the host: names resolved by the host for allowed
//! entries only, every resolved address checked against the entry's
//! classes (a public name that resolves to a private address is refused),
//! TLS by rustls with the system roots plus an optional CA file.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::policy::{AddressClass, class_of};

/// Why an upstream could not be reached; the code goes to the event.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("upstream_unresolved: {0}")]
    Unresolved(String),
    #[error("upstream_address_refused: {0} resolves to a restricted address")]
    Refused(String),
    #[error("upstream_unreachable: {0}")]
    Unreachable(String),
    #[error("upstream_timeout")]
    Timeout,
    #[error("upstream_tls_failed: {0}")]
    Tls(String),
}

impl ConnectError {
    pub fn code(&self) -> &'static str {
        match self {
            ConnectError::Unresolved(_) => "upstream_unresolved",
            ConnectError::Refused(_) => "upstream_address_refused",
            ConnectError::Unreachable(_) => "upstream_unreachable",
            ConnectError::Timeout => "upstream_timeout",
            ConnectError::Tls(_) => "upstream_tls_failed",
        }
    }
}

/// The TLS client configuration: system roots, plus `ca_file` when set.
pub fn tls_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped; an empty store only
    // makes every public upstream fail, never succeed wrongly.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("caFile {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("caFile {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("caFile {}: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Resolves `host:port` and connects to the first allowed address.
pub async fn connect_tcp(
    host: &str,
    port: u16,
    allow: &[AddressClass],
    timeout: Duration,
) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<SocketAddr> =
        tokio::time::timeout(timeout, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| ConnectError::Timeout)?
            .map_err(|e| ConnectError::Unresolved(format!("{host}: {e}")))?
            .collect();
    if addrs.is_empty() {
        return Err(ConnectError::Unresolved(host.to_owned()));
    }
    // Every address must be allowed: a name that also resolves to a
    // restricted address is refused whole, not raced.
    if addrs
        .iter()
        .any(|a| class_of(a.ip()).is_some_and(|c| !allow.contains(&c)))
    {
        return Err(ConnectError::Refused(host.to_owned()));
    }
    let mut last = None;
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some("connect timed out".into()),
        }
    }
    Err(ConnectError::Unreachable(format!(
        "{host}:{port}: {}",
        last.unwrap_or_default()
    )))
}

/// TLS over `tcp`, verifying `host`.
pub async fn connect_tls(
    tcp: TcpStream,
    host: &str,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<TlsStream<TcpStream>, ConnectError> {
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| ConnectError::Tls(format!("{host}: {e}")))?;
    tokio::time::timeout(timeout, TlsConnector::from(config).connect(name, tcp))
        .await
        .map_err(|_| ConnectError::Timeout)?
        .map_err(|e| ConnectError::Tls(e.to_string()))
}

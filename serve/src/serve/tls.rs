//! TLS for `sharedos serve --listen` (rustls, ring): the certificate chain
//! and key read from PEM files at start (docs/SERVE.md, "Tenants").

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::ServeError;

/// The PEM files of a TCP listener's certificate chain and its key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn setup(what: &str, path: &Path, e: impl std::fmt::Display) -> ServeError {
    ServeError::Setup(format!(
        "TLS {what} {}: {e} (give a PEM file: --tls-cert for the chain, --tls-key for its private key)",
        path.display()
    ))
}

/// An acceptor for `files`; a clear error naming the file that is missing,
/// not PEM, empty, or whose key does not match.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, ServeError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| setup("certificate", &files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| setup("certificate", &files.cert, e))?;
    if certs.is_empty() {
        return Err(setup("certificate", &files.cert, "no CERTIFICATE in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| setup("key", &files.key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Setup(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            setup(
                "key",
                &files.key,
                format!("does not fit the certificate: {e}"),
            )
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

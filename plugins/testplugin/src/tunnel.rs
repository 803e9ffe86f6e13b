//! `egress_connect`: an HTTP CONNECT through the egress gateway to a
//! destination, then (given a CA) a TLS handshake end to end with it,
//! trusting that CA only, and an echo through the tunnel. The gateway only
//! copies bytes: the handshake succeeding proves TLS ran end to end.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

/// `{target, caPem?, serverName?, bytes?}` →
/// `{status, tls?, echoed?, error?}`.
pub fn connect(gateway: &str, s: &Value) -> Value {
    let target = s["target"].as_str().unwrap_or_default();
    let mut tcp = match TcpStream::connect(gateway) {
        Ok(c) => c,
        Err(e) => return json!({"error": format!("gateway: {e}")}),
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
    let head = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n");
    if let Err(e) = tcp.write_all(head.as_bytes()) {
        return json!({"error": format!("write: {e}")});
    }
    let status = match response_head(&mut tcp) {
        Ok(head) => head.split_whitespace().nth(1).unwrap_or("none").to_owned(),
        Err(e) => return json!({"error": format!("read: {e}")}),
    };
    let Some(pem) = s["caPem"].as_str().filter(|_| status == "200") else {
        return json!({"status": status});
    };
    let name = s["serverName"].as_str().unwrap_or("localhost");
    let bytes = s["bytes"].as_u64().unwrap_or(4096) as usize;
    match tls_echo(tcp, pem, name, bytes) {
        Ok(echoed) => json!({"status": status, "tls": "ok", "echoed": echoed}),
        Err(e) => json!({"status": status, "tls": "failed", "error": e}),
    }
}

/// The response head, read a byte at a time so nothing after it is taken.
fn response_head(tcp: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        if tcp.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// A TLS client over `tcp` trusting only the CA in `pem`: writes `bytes`
/// bytes and reads them back; the number read back.
fn tls_echo(tcp: TcpStream, pem: &str, name: &str, bytes: usize) -> Result<usize, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("caPem: {e}"))?;
        roots.add(cert).map_err(|e| format!("caPem: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    let conn =
        rustls::ClientConnection::new(Arc::new(config), server).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let payload = vec![b'x'; bytes];
    tls.write_all(&payload)
        .map_err(|e| format!("tls write: {e}"))?;
    let mut back = vec![0u8; bytes];
    let mut got = 0;
    while got < bytes {
        match tls.read(&mut back[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(format!("tls read after {got} bytes: {e}")),
        }
    }
    Ok(got)
}

/// The tunnels `egress_tunnels` opened, held open for the rest of the
/// process's life (the turn's end closes them from the host's side).
static HELD: std::sync::Mutex<Vec<TcpStream>> = std::sync::Mutex::new(Vec::new());

/// `{n, target}`: n CONNECT attempts to `target` one after the other;
/// each answered tunnel is held open, every other attempt closed at once:
/// `{attempts, tunnels, closed, statuses, connectErrors, firstError}`
/// (`closed`: the gateway closed the connection unanswered).
pub fn flood(gateway: &str, s: &Value) -> Value {
    let target = s["target"].as_str().unwrap_or_default();
    let n = s["n"].as_u64().unwrap_or(10_000);
    let head = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n");
    let (mut tunnels, mut closed, mut connect_errors) = (0u64, 0u64, 0u64);
    let mut statuses = serde_json::Map::new();
    let mut first_error = None;
    for _ in 0..n {
        let mut tcp = match TcpStream::connect(gateway) {
            Ok(c) => c,
            Err(e) => {
                connect_errors += 1;
                first_error.get_or_insert_with(|| e.to_string());
                continue;
            }
        };
        let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
        let status = match tcp.write_all(head.as_bytes()) {
            Ok(()) => response_head(&mut tcp)
                .ok()
                .and_then(|h| h.split_whitespace().nth(1).map(str::to_owned)),
            Err(_) => None,
        };
        match status.as_deref() {
            None => closed += 1,
            Some("200") => {
                tunnels += 1;
                HELD.lock().unwrap_or_else(|p| p.into_inner()).push(tcp);
            }
            Some(other) => {
                let count = statuses.get(other).and_then(Value::as_u64).unwrap_or(0);
                statuses.insert(other.to_owned(), json!(count + 1));
            }
        }
    }
    json!({"attempts": n, "tunnels": tunnels, "closed": closed, "statuses": statuses,
           "connectErrors": connect_errors, "firstError": first_error})
}

//! Steps that use the network a sandboxed plugin has: the egress gateway's
//! listener (`SHAREDOS_EGRESS_URL`) and whatever else it tries. Each step
//! returns what it observed as JSON, for the host to check.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::{Value, json};

/// The gateway's `host:port`, from `SHAREDOS_EGRESS_URL`.
pub fn gateway() -> Option<String> {
    let url = std::env::var(sharedos_protocol::EGRESS_URL_ENV).ok()?;
    Some(
        url.strip_prefix("http://")?
            .trim_end_matches('/')
            .to_owned(),
    )
}

fn describe(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?} (os error {n})", e.kind()),
        None => format!("{:?}", e.kind()),
    }
}

/// Connects to each of `targets`, resolves `resolve`, and tries a UDP and
/// a raw socket: `{target: "connected" | error}`.
pub fn probe(s: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for t in s["targets"].as_array().into_iter().flatten() {
        let t = t.as_str().unwrap_or_default();
        let got = match t.parse() {
            Ok(addr) => match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(_) => "connected".to_owned(),
                Err(e) => describe(&e),
            },
            Err(_) => "not an address".to_owned(),
        };
        out.insert(t.to_owned(), json!(got));
    }
    if let Some(name) = s["resolve"].as_str() {
        let got = match (name, 443).to_socket_addrs() {
            Ok(mut a) => format!("resolved {:?}", a.next()),
            Err(e) => format!("{e}"),
        };
        out.insert(format!("resolve {name}"), json!(got));
    }
    let udp = match std::net::UdpSocket::bind("127.0.0.1:0") {
        Ok(_) => "created".to_owned(),
        Err(e) => describe(&e),
    };
    out.insert("udp".into(), json!(udp));
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
    let raw = match socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Icmp,
    ) {
        Ok(_fd) => "created".to_owned(),
        Err(e) => describe(&std::io::Error::from(e)),
    };
    out.insert("raw".into(), json!(raw));
    Value::Object(out)
}

/// Opens up to `n` connections to the gateway and holds them, then closes
/// them all and sends one ordinary request to `path`:
/// `{connected, failed, firstError, status}`.
pub fn flood(n: u64, path: &str) -> Value {
    let Some(gw) = gateway() else {
        return json!({"error": "no SHAREDOS_EGRESS_URL"});
    };
    let (mut held, mut failed, mut first_error) = (Vec::new(), 0u64, None);
    for _ in 0..n {
        match TcpStream::connect(&gw) {
            Ok(c) => held.push(c),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| describe(&e));
            }
        }
    }
    let connected = held.len();
    drop(held);
    let status = request(&gw, path, b"{}").unwrap_or_else(|e| format!("error: {e}"));
    json!({"connected": connected, "failed": failed, "firstError": first_error, "status": status})
}

/// POSTs a chunked body of `bytes` bytes to `path` on the gateway, stopping
/// when a write fails: `{sent, status}`.
pub fn big_body(bytes: u64, path: &str) -> Value {
    let Some(gw) = gateway() else {
        return json!({"error": "no SHAREDOS_EGRESS_URL"});
    };
    let mut c = match TcpStream::connect(&gw) {
        Ok(c) => c,
        Err(e) => return json!({"error": describe(&e)}),
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {gw}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let chunk = vec![b' '; 64 * 1024];
    let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
    let mut sent = 0u64;
    let mut write_error = None;
    if c.write_all(head.as_bytes()).is_ok() {
        while sent < bytes {
            if let Err(e) = c.write_all(&framed) {
                write_error = Some(describe(&e));
                break;
            }
            sent += chunk.len() as u64;
        }
    }
    let _ = c.write_all(b"0\r\n\r\n");
    json!({"sent": sent, "writeError": write_error, "status": status_line(&mut c)})
}

fn request(gw: &str, path: &str, body: &[u8]) -> std::io::Result<String> {
    let mut c = TcpStream::connect(gw)?;
    c.set_read_timeout(Some(Duration::from_secs(30)))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {gw}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes())?;
    c.write_all(body)?;
    Ok(status_line(&mut c))
}

/// The status code of the answer, or what happened instead.
fn status_line(c: &mut TcpStream) -> String {
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    while !got.contains(&b'\n') && got.len() < 64 {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return format!("error: {}", describe(&e)),
        }
    }
    let line = String::from_utf8_lossy(&got);
    line.split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .unwrap_or_else(|| "closed".into())
}

//! A minimal HTTP/1.1 client for the gateway on the sandbox's loopback
//! (plain HTTP: TLS is the host's job) and a server-sent-events reader.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// `http://host:port[/base]`, the gateway's route.
#[derive(Debug, Clone)]
pub struct BaseUrl {
    pub authority: String,
    pub path: String,
}

impl BaseUrl {
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text
            .strip_prefix("http://")
            .ok_or("the base URL must be http://<gateway>/<route> (the host adds TLS)")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err("the base URL has no host".into());
        }
        Ok(Self {
            authority: authority.to_owned(),
            path: path.trim_end_matches('/').to_owned(),
        })
    }
}

/// POSTs JSON and returns the status and the streaming body.
pub async fn post(
    base: &BaseUrl,
    path: &str,
    headers: &[(&str, String)],
    body: &Value,
) -> Result<(u16, Incoming), String> {
    let tcp = tokio::net::TcpStream::connect(&base.authority)
        .await
        .map_err(|e| format!("model_unreachable: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("model_unreachable: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = hyper::Request::post(format!("{}{path}", base.path))
        .header("host", &base.authority)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| format!("model_request_invalid: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("model_unreachable: {e}"))?;
    Ok((resp.status().as_u16(), resp.into_body()))
}

/// The most bytes one event may hold.
const MAX_EVENT: usize = 4 * 1024 * 1024;

/// Reads `data:` payloads of a server-sent-events body, one at a time.
pub struct EventReader {
    body: Incoming,
    buf: Vec<u8>,
    done: bool,
}

impl EventReader {
    pub fn new(body: Incoming) -> Self {
        Self {
            body,
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next `data:` line's text; `None` at the end of the stream.
    pub async fn next_data(&mut self) -> Result<Option<String>, String> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let text = String::from_utf8_lossy(&line);
                if let Some(data) = text.trim_end().strip_prefix("data:") {
                    return Ok(Some(data.trim().to_owned()));
                }
                continue;
            }
            if self.done {
                return Ok(None);
            }
            match self.body.frame().await {
                None => {
                    self.done = true;
                    self.buf.push(b'\n');
                }
                Some(Err(e)) => return Err(format!("model_stream_cut: {e}")),
                Some(Ok(f)) => {
                    if let Some(d) = f.data_ref() {
                        if self.buf.len() + d.len() > MAX_EVENT {
                            return Err("model_stream_invalid: an event is too large".into());
                        }
                        self.buf.extend_from_slice(d);
                    }
                }
            }
        }
    }

    /// The rest of the body as text (an error answer), bounded.
    pub async fn rest(mut self) -> String {
        while !self.done && self.buf.len() < 64 * 1024 {
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Some(d) = f.data_ref() {
                        self.buf.extend_from_slice(d);
                    }
                }
                _ => self.done = true,
            }
        }
        String::from_utf8_lossy(&self.buf)
            .chars()
            .take(2000)
            .collect()
    }
}

//! The harness's end of the stdio transport: a unix socket in the turn's
//! tmp that `sharedos-harness mcp-relay` connects to. Each connection is
//! one MCP session of newline-delimited JSON-RPC; messages are answered
//! concurrently (a slow tool call does not hold up the next), answers are
//! written in the order they are ready. Closing the bridge stops accepting,
//! drops every connection and removes the socket, so a later request to
//! the bridge's address is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::mcp::TurnServer;

/// The most bytes of one message from the CLI.
pub const MAX_LINE_BYTES: usize = 4 << 20;

/// A listening bridge; dropped or closed, it is gone.
pub struct Bridge {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl Bridge {
    /// Binds `path` (mode 0600) and serves `server` on every connection.
    pub fn bind(path: &Path, server: Arc<TurnServer>) -> std::io::Result<Bridge> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let task = tokio::spawn(async move {
            let mut sessions = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => { sessions.spawn(session(stream, server.clone())); }
                        Err(_) => break,
                    },
                    Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                }
            }
        });
        Ok(Bridge {
            path: path.to_path_buf(),
            task,
        })
    }

    /// Stops accepting, drops every session, removes the socket.
    pub fn close(self) {
        drop(self);
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Aborting the task drops the listener and the JoinSet, which
        // aborts every session with it.
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn session(stream: UnixStream, server: Arc<TurnServer>) {
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Value>(64);
    let writer = tokio::spawn(async move {
        while let Some(v) = rx.recv().await {
            let mut line = v.to_string();
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let mut lines = BufReader::new(read);
    let mut calls = JoinSet::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = match (&mut lines)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES {
            let _ = tx
                .send(json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "message too large"}}))
                .await;
            break;
        }
        let text = String::from_utf8_lossy(&buf);
        if text.trim().is_empty() {
            continue;
        }
        let message = match serde_json::from_str::<Value>(text.trim()) {
            Ok(v) => v,
            Err(e) => {
                let _ = tx
                    .send(json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": format!("parse error: {e}")}}))
                    .await;
                continue;
            }
        };
        let (server, tx) = (server.clone(), tx.clone());
        calls.spawn(async move {
            if let Some(answer) = server.handle(message).await {
                let _ = tx.send(answer).await;
            }
        });
        while calls.try_join_next().is_some() {}
    }
    // End of the CLI's input: answer what is in flight, then close.
    while calls.join_next().await.is_some() {}
    drop(tx);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};
    use sharedos_protocol::Identifier;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    async fn ask(stream: &mut tokio::net::UnixStream, msg: Value) -> Value {
        let (r, mut w) = stream.split();
        w.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
        let mut line = String::new();
        BufReader::new(r).read_line(&mut line).await.unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// G98: after the turn, a request to the bridge's address is refused;
    /// before it, unknown methods are -32601 and notifications unanswered.
    #[tokio::test]
    async fn the_bridge_answers_until_closed_then_refuses() {
        let dir = std::env::temp_dir().join(format!("sharedos-bridge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mcp.sock");
        let server = Arc::new(
            TurnServer::new(
                sharedos_testkit::RecordingHost::new(),
                &[],
                false,
                Identifier::new("trace").unwrap(),
                "exec",
            )
            .unwrap(),
        );
        let bridge = Bridge::bind(&path, server).unwrap();
        let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
        let init = ask(
            &mut s,
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "1999-01-01", "_meta": {"x": 1}}}),
        )
        .await;
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
        // A notification gets no answer: the next answer is the ping's.
        s.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
            .await
            .unwrap();
        let probe = ask(
            &mut s,
            json!({"jsonrpc": "2.0", "id": 2, "method": "server/discover"}),
        )
        .await;
        assert_eq!(probe["id"], 2);
        assert_eq!(probe["error"]["code"], -32601);
        let call = ask(
            &mut s,
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "x.y", "arguments": {"a": 1}, "_meta": {"progressToken": 1}}}),
        )
        .await;
        assert_eq!(call["result"]["isError"], false, "{call}");
        bridge.close();
        // The session is gone and the address refuses.
        let mut line = String::new();
        let n = BufReader::new(&mut s)
            .read_line(&mut line)
            .await
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert!(tokio::net::UnixStream::connect(&path).await.is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

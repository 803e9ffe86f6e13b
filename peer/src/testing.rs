//! The other end of a peer for tests (feature `testing`): a scripted end
//! that writes raw lines, hostile ones included, and reads what the peer
//! wrote. The peer's own suite and the host's driver suite both use it.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};

use sharedos_protocol::method::Side;

use crate::{Inbox, Peer, PeerConfig};

/// The raw end facing a [`Peer`] over `tokio::io::duplex`.
pub struct RawEnd {
    lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
    w: WriteHalf<DuplexStream>,
}

impl RawEnd {
    /// Writes `bytes` as they are (no newline added).
    pub async fn write(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).await.unwrap();
    }
    /// Writes `v` as one compact line.
    pub async fn line(&mut self, v: Value) {
        let mut s = serde_json::to_string(&v).unwrap();
        s.push('\n');
        self.write(s.as_bytes()).await;
    }
    /// The next line the peer wrote, parsed; panics after 5 s.
    pub async fn read(&mut self) -> Value {
        let l = tokio::time::timeout(Duration::from_secs(5), self.lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str(&l).unwrap()
    }
    /// Reads and drops every line until the peer closes its end.
    pub async fn drain(&mut self) {
        while self.lines.next_line().await.is_ok_and(|l| l.is_some()) {}
    }
}

/// A peer with `config` whose inbox the test pulls itself (as the turn
/// driver pulls it), and the raw end facing it.
pub fn direct_pair<S: Side>(config: PeerConfig) -> (Peer, Inbox<S>, RawEnd) {
    let (host, plugin) = tokio::io::duplex(4096);
    let (hr, hw) = tokio::io::split(host);
    let (pr, pw) = tokio::io::split(plugin);
    let (peer, inbox) = Peer::spawn(hr, hw, config);
    let end = RawEnd {
        lines: BufReader::new(pr).lines(),
        w: pw,
    };
    (peer, inbox, end)
}

//! The writer task: drains the bounded queue, writing everything queued
//! in one flush, under the write-stall timeout.

use std::sync::Arc;

use futures_util::SinkExt;
use sharedos_protocol::{FrameError, NdjsonCodec};
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;

use crate::config::PeerConfig;
use crate::shared::Shared;
use crate::violation::{Violation, ViolationReason};

pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    mut rx: mpsc::Receiver<String>,
    shared: Arc<Shared>,
    config: PeerConfig,
) {
    // Every sender checks the line limit before queueing (it may change:
    // the SDK learns the host's in `initialize`), so the codec does not.
    let mut framed = FramedWrite::new(writer, NdjsonCodec::new(usize::MAX));
    let _written = shared.written.clone().drop_guard();
    loop {
        let next = tokio::select! {
            biased;
            line = rx.recv() => line,
            // Closing: what is queued still goes out, then the task ends.
            _ = shared.closing.cancelled() => rx.try_recv().ok(),
        };
        let Some(line) = next else {
            return;
        };
        let write = async {
            framed.feed(line).await?;
            // Batch whatever else is queued into one flush.
            while let Ok(more) = rx.try_recv() {
                framed.feed(more).await?;
            }
            SinkExt::<String>::flush(&mut framed).await
        };
        match tokio::time::timeout(config.write_stall_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(FrameError::Io(e))) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                shared.fail(Violation::new(
                    ViolationReason::PluginExited,
                    "the plugin closed its stdin (it exited or closed the pipe)",
                ));
                return;
            }
            Ok(Err(e)) => {
                shared.fail(Violation::new(
                    ViolationReason::Io,
                    format!("writing to the plugin failed: {e}"),
                ));
                return;
            }
            Err(_) => {
                shared.fail(Violation::new(
                    ViolationReason::WriteStall,
                    format!(
                        "the plugin did not read its stdin for {:?}",
                        config.write_stall_timeout
                    ),
                ));
                return;
            }
        }
    }
}

//! The writer task: drains the bounded queue, writing everything queued
//! in one flush, under the write-stall timeout.
//!
//! The queued lines are copied once, each followed by its `\n`, into one
//! buffer the task keeps, and written from there: no codec and no second
//! buffer between the queue and the pipe.

use std::sync::Arc;

use sharedos_protocol::FrameError;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::config::PeerConfig;
use crate::shared::{Line, Shared};
use crate::violation::{Violation, ViolationReason};

/// Above this many buffered bytes the batch is written before more lines
/// are taken from the queue: memory stays near one line plus this,
/// whatever the queue holds.
const BATCH_BYTES: usize = 64 << 10;

pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::Receiver<Line>,
    shared: Arc<Shared>,
    config: PeerConfig,
) {
    // Every sender checks the line limit before queueing (it may change:
    // the SDK learns the host's in `initialize`), so the writer does not.
    let mut batch = Vec::new();
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
        let write = write_queued(&mut writer, &mut rx, &mut batch, line);
        match tokio::time::timeout(config.write_stall_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                shared.fail(Violation::new(
                    ViolationReason::PluginExited,
                    "the plugin closed its stdin (it exited or closed the pipe)",
                ));
                return;
            }
            Ok(Err(e)) => {
                shared.fail(Violation::new(
                    ViolationReason::Io,
                    format!("writing to the plugin failed: {}", FrameError::Io(e)),
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

/// Writes `first` and whatever else is queued, then flushes once.
async fn write_queued<W: AsyncWrite + Unpin>(
    writer: &mut W,
    rx: &mut mpsc::Receiver<Line>,
    batch: &mut Vec<u8>,
    first: Line,
) -> std::io::Result<()> {
    let mut next = Some(first);
    while let Some(line) = next {
        batch.clear();
        batch.extend_from_slice(&line);
        batch.push(b'\n');
        while batch.len() < BATCH_BYTES {
            let Ok(more) = rx.try_recv() else { break };
            batch.extend_from_slice(&more);
            batch.push(b'\n');
        }
        writer.write_all(batch).await?;
        if batch.capacity() > 4 * BATCH_BYTES {
            // One huge line once: do not keep its buffer for good.
            *batch = Vec::new();
        }
        next = rx.try_recv().ok();
    }
    writer.flush().await
}

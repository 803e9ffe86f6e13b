//! The host's end of the report pipe.

use std::io::Read;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::time::{Duration, Instant};

use super::child::SandboxedChild;
use crate::SandboxError;
use crate::report::{HelperMessage, SandboxReport};

/// How long the helper may take to build the sandbox and send its report.
pub(super) const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest report accepted.
const MAX_REPORT: usize = 1 << 20;

/// The host's end of the report pipe: newline-delimited messages, then EOF
/// when the plugin's `execve` closes the helper's close-on-exec copy.
#[derive(Debug)]
pub(super) struct ReportReader {
    pub(super) file: std::fs::File,
    pub(super) buf: Vec<u8>,
    pub(super) deadline: Instant,
}

impl ReportReader {
    /// The next whole line, or `None` at EOF.
    fn next_line(&mut self) -> Result<Option<Vec<u8>>, SandboxError> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(line));
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            let mut pfd = [PollFd::new(self.file.as_fd(), PollFlags::POLLIN)];
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
            match poll(&mut pfd, timeout) {
                Ok(0) => return Err(SandboxError::Timeout(SETUP_TIMEOUT)),
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(SandboxError::io("poll the report pipe")(e.into())),
            }
            let mut chunk = [0u8; 16 << 10];
            let r = self
                .file
                .read(&mut chunk)
                .map_err(SandboxError::io("read the report pipe"))?;
            if r == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                // A last line without its newline.
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            self.buf.extend_from_slice(&chunk[..r]);
            if self.buf.len() > MAX_REPORT {
                return Err(SandboxError::BadReport("report larger than 1 MiB".into()));
            }
        }
    }

    /// The next report, skipping empty lines; `None` at EOF. An error
    /// message from the helper is returned as that error.
    fn next_report(&mut self) -> Result<Option<SandboxReport>, SandboxError> {
        loop {
            let Some(line) = self.next_line()? else {
                return Ok(None);
            };
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            return match serde_json::from_slice::<HelperMessage>(line) {
                Ok(HelperMessage::Report(r)) => Ok(Some(*r)),
                Ok(HelperMessage::Error {
                    stage,
                    message,
                    errno,
                }) => Err(SandboxError::Setup {
                    stage,
                    message,
                    errno,
                }),
                Err(e) => Err(SandboxError::BadReport(e.to_string())),
            };
        }
    }

    /// Read until the helper's report (written right before `execve`).
    pub(super) fn until_report(
        &mut self,
        sc: &mut SandboxedChild,
    ) -> Result<SandboxReport, SandboxError> {
        self.next_report()?.ok_or_else(|| no_report(sc))
    }

    /// After the report: EOF means the `execve` succeeded; an error
    /// message means it failed.
    pub(super) fn until_eof(&mut self) -> Result<(), SandboxError> {
        match self.next_report()? {
            None => Ok(()),
            Some(_) => Err(SandboxError::BadReport("a second report".into())),
        }
    }
}

/// The helper sent no report: why, as far as its exit status tells.
pub(super) fn no_report(sc: &mut SandboxedChild) -> SandboxError {
    let status = sc
        .wait_timeout(Duration::from_secs(5))
        .map(|s| format!("{s}"))
        .unwrap_or_else(|| "still running".into());
    SandboxError::NoReport { status }
}

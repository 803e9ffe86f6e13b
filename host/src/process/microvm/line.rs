//! The protocol port's two relays on the host (the bytes' meaning:
//! `sharedos_chanmux::line`). The runtime holds pipes, as for any
//! plugin: what it writes to the plugin's stdin a thread copies to QEMU's
//! stdin, then [`line::END_OF_INPUT`] when the runtime closes it; what the
//! guest sends a second thread unescapes onto the plugin's stdout until
//! the guest's [`line::END_OF_OUTPUT`]. Then (and only then) the first
//! thread sends [`line::OUTPUT_TAKEN`], the guest init's leave to power
//! off: a virtio port's writes complete in the guest before QEMU has
//! passed them on, and QEMU's exit would drop what it still holds.

use std::io::{self, PipeReader, PipeWriter, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{ChildStdin, ChildStdout};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use sharedos_chanmux::line::{self, Unescape};

const BUF: usize = 64 * 1024;

/// Starts both relays: returns the plugin's stdin (write end) and stdout
/// (read end) as the runtime holds them. Each thread ends with QEMU at
/// the latest.
pub(super) fn relays(qemu_in: ChildStdin, qemu_out: ChildStdout) -> io::Result<(OwnedFd, OwnedFd)> {
    let (stdin_r, stdin_w) = io::pipe()?;
    let (stdout_r, stdout_w) = io::pipe()?;
    // Closed by the output relay when the guest's output has ended (or
    // QEMU's stdout has): the input relay's cue for OUTPUT_TAKEN.
    let (ended_r, ended_w) = io::pipe()?;
    std::thread::Builder::new()
        .name("sharedos-vm-stdout".into())
        .spawn(move || output(qemu_out, stdout_w, ended_w))?;
    std::thread::Builder::new()
        .name("sharedos-vm-stdin".into())
        .spawn(move || input(stdin_r, qemu_in, ended_r))?;
    Ok((OwnedFd::from(stdin_w), OwnedFd::from(stdout_r)))
}

/// The guest's output, unescaped, to the runtime until its end. A runtime
/// that has closed its end no longer gets it, but the end is still read.
fn output(mut qemu: ChildStdout, to_runtime: PipeWriter, ended: PipeWriter) {
    let mut sink = Some(to_runtime);
    let mut unescape = Unescape::default();
    let mut buf = vec![0u8; BUF];
    let mut scratch = Vec::new();
    while !unescape.ended() {
        let n = match qemu.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let bytes = unescape.feed(&buf[..n], &mut scratch);
        if !bytes.is_empty()
            && let Some(s) = sink.as_mut()
            && s.write_all(bytes).is_err()
        {
            sink = None;
        }
    }
    drop(sink);
    drop(ended);
}

/// The runtime's bytes to the guest, [`line::END_OF_INPUT`] at their end,
/// and [`line::OUTPUT_TAKEN`] once the output relay has read the guest's
/// end (with the end of input first if the runtime has not closed yet).
fn input(mut from_runtime: PipeReader, mut qemu: ChildStdin, ended: PipeReader) {
    let mut buf = vec![0u8; BUF];
    let mut open = true;
    loop {
        let (readable, guest_ended) = {
            let mut fds = vec![PollFd::new(ended.as_fd(), PollFlags::POLLIN)];
            if open {
                fds.push(PollFd::new(from_runtime.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => return,
            }
            let woke = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (open && woke(&fds[1]), woke(&fds[0]))
        };
        if guest_ended {
            let tail: &[u8] = if open {
                &[line::END_OF_INPUT, line::OUTPUT_TAKEN]
            } else {
                &[line::OUTPUT_TAKEN]
            };
            let _ = qemu.write_all(tail);
            return;
        }
        if readable {
            let sent = match from_runtime.read(&mut buf) {
                Ok(0) => {
                    open = false;
                    qemu.write_all(&[line::END_OF_INPUT])
                }
                Ok(n) => qemu.write_all(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
                Err(_) => {
                    open = false;
                    qemu.write_all(&[line::END_OF_INPUT])
                }
            };
            if sent.is_err() {
                return;
            }
        }
    }
}

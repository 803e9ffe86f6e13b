//! The egress gateway for a microVM (docs/SECURITY.md, "microVM"): the
//! guest has no network device; its init listens on the gateway's port of
//! the guest's own loopback and carries each connection over a second
//! virtio serial port ([`sharedos_chanmux`]). QEMU connects that port to a unix
//! socket of the run's directory; the host's side of the channel connects
//! each stream to a second unix socket there, the listener the gateway
//! serves for the turn, as it serves a namespace sandbox's.
//!
//! A guest that breaks the channel's protocol (a malformed frame, a flood
//! past its bounds) ends the turn: the host's side says why on the
//! plugin's stderr line and kills QEMU by its pidfd.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The channel's socket in the run's directory (QEMU connects to it).
const CHANNEL: &str = "egress-channel.sock";
/// The gateway's listener in the run's directory.
const GATEWAY: &str = "egress-gateway.sock";
/// How long QEMU may take to connect the channel (it does so before the
/// guest starts, so by the ready line it has).
const CONNECT_BOUND: Duration = Duration::from_secs(5);

/// The run's channel listener and the gateway's listener (for the turn).
pub(super) struct Prepared {
    channel: UnixListener,
    gateway_path: PathBuf,
    pub(super) gateway: OwnedFd,
}

/// Both sockets bound in `dir` (the run's private directory).
pub(super) fn prepare(dir: &Path) -> io::Result<Prepared> {
    let channel = UnixListener::bind(dir.join(CHANNEL))?;
    channel.set_nonblocking(true)?;
    let gateway_path = dir.join(GATEWAY);
    let gateway = OwnedFd::from(UnixListener::bind(&gateway_path)?);
    Ok(Prepared {
        channel,
        gateway_path,
        gateway,
    })
}

/// QEMU's arguments for the channel's port (port 2 of the protocol's
/// virtio-serial device, the guest's [`super::vm::EGRESS_DEVICE`]),
/// connected to the channel's socket.
pub(super) fn qemu_args(dir: &Path) -> Vec<String> {
    vec![
        "-chardev".into(),
        format!("socket,id=egress,path={}", dir.join(CHANNEL).display()),
        "-device".into(),
        "virtserialport,chardev=egress,nr=2".into(),
    ]
}

/// Takes QEMU's connection and serves the channel on a thread of its own
/// until QEMU closes it. `qemu`: a pidfd of QEMU; `stderr`: a write end
/// of the pipe the host reads as the plugin's stderr.
pub(super) fn serve(p: Prepared, qemu: OwnedFd, stderr: OwnedFd) -> io::Result<()> {
    let chan = accept_within(&p.channel, CONNECT_BOUND)?;
    chan.set_nonblocking(false)?;
    let writer = chan.try_clone()?;
    let gateway = p.gateway_path;
    let connect: sharedos_chanmux::Connect<UnixStream> =
        Arc::new(move || UnixStream::connect(&gateway));
    let mux = sharedos_chanmux::Mux::new(writer);
    std::thread::Builder::new()
        .name("microvm-egress".into())
        .spawn(move || {
            if let Err(e) = mux.run(chan, Some(connect)) {
                broken(&e, &qemu, stderr);
            }
        })?;
    Ok(())
}

/// The guest broke the channel: said on the stderr line, QEMU killed.
fn broken(e: &sharedos_chanmux::MuxError, qemu: &OwnedFd, stderr: OwnedFd) {
    let line = format!(
        "sharedos: the microVM's egress channel broke its protocol ({e}); the VM was stopped\n"
    );
    let _ = std::fs::File::from(stderr).write_all(line.as_bytes());
    let _ = rustix::process::pidfd_send_signal(qemu.as_fd(), rustix::process::Signal::KILL);
}

fn accept_within(l: &UnixListener, bound: Duration) -> io::Result<UnixStream> {
    let end = Instant::now() + bound;
    loop {
        match l.accept() {
            Ok((s, _)) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "QEMU did not connect the egress channel",
                ));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    /// A guest writing `bytes` on the channel: what the host's side wrote
    /// on the stderr line, once it stopped QEMU's stand-in (a real
    /// process, killed through its pidfd as QEMU is).
    fn guest_writes(bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let p = prepare(dir.path()).unwrap();
        let mut qemu = std::process::Command::new("sleep")
            .arg("120")
            .spawn()
            .unwrap();
        let pid = rustix::process::Pid::from_child(&qemu);
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        let (mut r, w) = std::io::pipe().unwrap();
        let mut guest = UnixStream::connect(dir.path().join(CHANNEL)).unwrap();
        serve(p, pidfd, OwnedFd::from(w)).unwrap();
        guest.write_all(bytes).unwrap();
        let status = qemu.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        let mut said = String::new();
        r.read_to_string(&mut said).unwrap();
        said
    }

    #[test]
    fn a_malformed_frame_from_the_guest_stops_the_vm_saying_why() {
        let said = guest_writes(&[2, 0, 0, 0, 1, 0xff, 0xff]);
        assert!(
            said.contains("egress channel broke its protocol") && said.contains("65535 bytes"),
            "{said}"
        );
    }

    #[test]
    fn a_guest_flooding_streams_stops_the_vm_saying_why() {
        let mut opens = Vec::new();
        for id in 1..=(sharedos_chanmux::MAX_STREAMS as u32 + 1) {
            sharedos_chanmux::Frame::Open(id).encode(&mut opens);
        }
        let said = guest_writes(&opens);
        assert!(said.contains("more than 64 streams"), "{said}");
    }
}

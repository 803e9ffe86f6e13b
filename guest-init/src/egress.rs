//! The egress gateway inside the guest (docs/SECURITY.md, "microVM"):
//! the guest has no network device. This init brings up `lo`, listens on
//! `127.0.0.1:<port>` (the address `SHAREDOS_EGRESS_URL` names, as in the
//! namespace sandbox) and, in a process of its own (root, not the
//! plugin's uid), carries each accepted connection over a second virtio
//! serial port to the host's gateway ([`sharedos_chanmux`]).

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::os::fd::FromRawFd;

type Res<T> = Result<T, String>;

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// `lo` up (the kernel gives it 127.0.0.1).
pub fn lo_up() -> Res<()> {
    // SAFETY: a plain socket call; the descriptor is closed below.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(os_err("socket"));
    }
    // SAFETY: ifreq is plain data; its name is set below.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: sock is open; req is a valid ifreq naming `lo`; the flags
    // union member is the one SIOC[GS]IFFLAGS use.
    let ok = unsafe {
        libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req) == 0 && {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            libc::ioctl(sock, libc::SIOCSIFFLAGS, &req) == 0
        }
    };
    // SAFETY: sock is open and owned here.
    unsafe { libc::close(sock) };
    if !ok {
        return Err(os_err("bring up lo"));
    }
    Ok(())
}

/// Listens on `127.0.0.1:port` and forks the channel's process, which
/// owns `line` from then on; `lo` is up by then ([`lo_up`]).
pub fn start(port: u16, line: libc::c_int) -> Res<()> {
    let listener =
        TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("listen on {port}: {e}"))?;
    // SAFETY: this init has one thread, so the child may run any code; it
    // never returns into the init's code (it ends in _exit).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork"));
    }
    if pid == 0 {
        serve(listener, line);
        // SAFETY: ends the channel's process.
        unsafe { libc::_exit(0) };
    }
    Ok(())
}

/// The channel's process: accepts connections as streams, reads the
/// host's frames until the line ends or breaks.
fn serve(listener: TcpListener, line: libc::c_int) {
    // SAFETY: line is an open descriptor this process owns from here on.
    let file = unsafe { File::from_raw_fd(line) };
    let Ok(reader) = file.try_clone() else {
        return;
    };
    let mux = sharedos_chanmux::Mux::new(file);
    let acceptor = mux.clone();
    let accepted = std::thread::Builder::new().spawn(move || {
        for conn in listener.incoming() {
            match conn {
                // Past the cap the connection is closed at once (dropped).
                Ok(c) => match acceptor.open(c) {
                    Ok(_) => {}
                    Err(_) => return,
                },
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    });
    if accepted.is_err() {
        return;
    }
    let ended = match mux.run::<TcpStream>(reader, None) {
        Ok(()) => "it ended".to_owned(),
        Err(e) => e.to_string(),
    };
    {
        let line = format!("sharedos-guest-init: the egress channel: {ended}\n");
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/ttyS1")
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    }
}

//! The loopback relay of an engine whose plugin has no network of its own
//! but must reach a host-side listener on its loopback (the gVisor
//! launcher's egress gateway, docs/SECURITY.md "gVisor"):
//!
//! `sharedos __sandbox-exec --loopback-relay [--gate] <port>=<unix socket> ... -- <program> <args>...`
//!
//! runs as the container's first process. It listens on `127.0.0.1:<port>`
//! of the container's own loopback for each pair, with `--gate` waits for
//! one byte on stdin (a container prepared ahead: the host writes it when
//! a turn takes the container; end of file ends it), then starts the program
//! with the same stdio and environment, and carries every connection to
//! the port to a fresh connection to the unix socket (a host socket the
//! engine placed inside). It exits with the program's status; the engine
//! then ends the container and everything left in it.
//!
//! Plain threads and blocking copies: it runs a few connections of one
//! turn, in the container, beside an untrusted program of the same uid (the
//! program can only kill it, which ends its own turn).

use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;

/// The argument of `__sandbox-exec` that selects the relay.
pub const RELAY_ARG: &str = "--loopback-relay";
/// The relay's first argument when it waits for the host's byte.
const GATE_ARG: &str = "--gate";

/// What the relay was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayArgs {
    /// Each loopback port and the unix socket its connections go to.
    pub routes: Vec<(u16, PathBuf)>,
    /// Wait for one byte on stdin before starting the program (a
    /// container prepared ahead of its turn: the host writes it when the
    /// turn takes the container).
    pub gate: bool,
    /// The program and its arguments.
    pub program: Vec<OsString>,
}

/// The arguments after [`RELAY_ARG`]: the command line of a relay for
/// `routes` around `program`.
pub fn relay_args(routes: &[(u16, PathBuf)], gate: bool, program: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = gate.then(|| GATE_ARG.into()).into_iter().collect();
    out.extend(routes.iter().map(|(port, path)| {
        let mut a = OsString::from(format!("{port}="));
        a.push(path);
        a
    }));
    out.push("--".into());
    out.extend(program.iter().cloned());
    out
}

/// Parses what [`relay_args`] wrote.
pub fn parse(args: &[OsString]) -> Result<RelayArgs, String> {
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or("no `--` before the program")?;
    let (mut routes, program) = (&args[..split], &args[split + 1..]);
    if program.is_empty() {
        return Err("no program after `--`".into());
    }
    let gate = routes.first().is_some_and(|a| a == GATE_ARG);
    if gate {
        routes = &routes[1..];
    }
    let routes = routes
        .iter()
        .map(|r| {
            let text = r.to_str().ok_or("a route is not UTF-8")?;
            let (port, path) = text
                .split_once('=')
                .ok_or_else(|| format!("route {text:?} is not <port>=<socket>"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| format!("route {text:?}: {port:?} is not a port"))?;
            if !path.starts_with('/') {
                return Err(format!(
                    "route {text:?}: the socket is not an absolute path"
                ));
            }
            Ok((port, PathBuf::from(path)))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RelayArgs {
        routes,
        gate,
        program: program.to_vec(),
    })
}

/// Runs the relay; never returns. Exit 125 when it cannot listen or start
/// the program (said on stderr), else the program's status (128 + signal
/// for a signalled program).
pub fn relay_main(args: &[OsString]) -> ! {
    let code = match parse(args).and_then(|a| run(&a).map_err(|e| e.to_string())) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sharedos loopback relay: {e}");
            125
        }
    };
    std::process::exit(code)
}

fn run(args: &RelayArgs) -> io::Result<i32> {
    let mut listeners = Vec::with_capacity(args.routes.len());
    for (port, socket) in &args.routes {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, *port))
            .map_err(|e| io::Error::new(e.kind(), format!("listen on 127.0.0.1:{port}: {e}")))?;
        listeners.push((l, socket.clone()));
    }
    if args.gate && !gate_opened()? {
        // The host let the prepared container go unused.
        return Ok(0);
    }
    let mut child = Command::new(&args.program[0])
        .args(&args.program[1..])
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("start {}: {e}", args.program[0].to_string_lossy()),
            )
        })?;
    for (listener, socket) in listeners {
        std::thread::spawn(move || accept_loop(listener, socket));
    }
    let status = child.wait()?;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Reads exactly one byte of stdin (never more: the rest is the
/// program's protocol): `false` at end of file.
fn gate_opened() -> io::Result<bool> {
    use std::os::fd::AsFd;
    let mut byte = [0u8; 1];
    loop {
        match rustix::io::read(io::stdin().as_fd(), &mut byte) {
            Ok(n) => return Ok(n == 1),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("the gate on stdin: {e}"))),
        }
    }
}

fn accept_loop(listener: TcpListener, socket: PathBuf) {
    for conn in listener.incoming() {
        let Ok(tcp) = conn else {
            // EMFILE and the like: back off instead of spinning.
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        };
        let socket = socket.clone();
        std::thread::spawn(move || carry(tcp, &socket));
    }
}

/// One connection both ways until each side has ended its half.
fn carry(tcp: TcpStream, socket: &std::path::Path) {
    let Ok(unix) = UnixStream::connect(socket) else {
        // The gateway is gone (the turn is ending): the client sees a
        // closed connection.
        return;
    };
    let _ = tcp.set_nodelay(true);
    let (Ok(mut tcp_r), Ok(mut unix_w)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(Shutdown::Write);
    });
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    let _ = io::copy(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(Shutdown::Write);
    let _ = up.join();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_round_trips_and_bad_routes_are_named() {
        let routes = vec![(8787, PathBuf::from("/sharedos/egress/gateway.sock"))];
        let program: Vec<OsString> = vec!["/plugin/p".into(), "--x".into(), "--".into()];
        let args = relay_args(&routes, true, &program);
        assert_eq!(
            parse(&args),
            Ok(RelayArgs {
                routes: routes.clone(),
                gate: true,
                program: program.clone()
            })
        );
        let args = relay_args(&routes, false, &program);
        assert!(!parse(&args).unwrap().gate);
        let bad = |v: &[&str]| parse(&v.iter().map(OsString::from).collect::<Vec<_>>());
        assert!(bad(&["8787=/s"]).unwrap_err().contains("`--`"));
        assert!(bad(&["8787=/s", "--"]).unwrap_err().contains("no program"));
        assert!(
            bad(&["x=/s", "--", "p"])
                .unwrap_err()
                .contains("not a port")
        );
        assert!(bad(&["1=s", "--", "p"]).unwrap_err().contains("absolute"));
    }
}

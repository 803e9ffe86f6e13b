//! The stdio side of the MCP bridge: the program the CLI spawns as its MCP
//! server. It connects to the harness's unix socket in the turn's tmp and
//! copies bytes both ways, nothing more: it parses nothing and holds no
//! authority (the harness checks every message). It exits when the CLI
//! closes its stdin, when the harness closes the socket (the turn is over),
//! or on SIGTERM / SIGINT (their default action, which it never changes:
//! a parent that ignores one, as a shell does for a background job, is obeyed).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

/// Relays stdin/stdout to the socket at `path`.
pub fn run(path: &str) -> ExitCode {
    let stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sharedos-harness mcp-relay: cannot reach the harness at {path}: {e}");
            return ExitCode::from(1);
        }
    };
    let Ok(mut upstream) = stream.try_clone() else {
        eprintln!("sharedos-harness mcp-relay: cannot clone the socket");
        return ExitCode::from(1);
    };
    // stdin → socket on a thread; at end of stdin the write half closes,
    // which tells the harness the session is over, and the relay exits.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 16 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if upstream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = upstream.shutdown(std::net::Shutdown::Both);
        std::process::exit(0);
    });
    let mut down = stream;
    let mut stdout = std::io::stdout().lock();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match down.read(&mut buf) {
            Ok(0) | Err(_) => return ExitCode::SUCCESS,
            Ok(n) => {
                if stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return ExitCode::SUCCESS;
                }
            }
        }
    }
}

//! Sockets: host listeners, other families, the kernel's network view
//! (sandbox.md C09–C19). Only loopback and the bait's listeners are
//! targeted. AF_VSOCK is created and closed, never connected.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

/// `socket(2)` only; the fd is closed at once (kept while holding).
fn create_only(attack: &str, what: &str, domain: i32, ty: i32, proto: i32) -> Receipt {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    match sys::owned(fd as i64) {
        Ok(fd) => {
            sys::keep(fd);
            Receipt::succeeded(
                attack,
                format!("succeeded: created {what} ({})", sys::kept_or_closed()),
            )
        }
        Err(e) => Receipt::blocked(
            attack,
            format!("blocked: socket({what}): {}", describe_errno(e)),
        ),
    }
}

pub fn c09_tcp_connect_host(bait: &Bait) -> Receipt {
    const A: &str = "C09-tcp-connect-host-loopback";
    let Some(port) = bait.tcp_port else {
        return create_only(
            A,
            "AF_INET SOCK_STREAM (no tcp_port in the bait)",
            libc::AF_INET,
            libc::SOCK_STREAM,
            0,
        );
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(mut s) => {
            let _ = s.write_all(b"sharedos-adversary C09\n");
            Receipt::succeeded(A, format!("succeeded: connected to {addr}"))
        }
        Err(e) => Receipt::blocked(A, format!("blocked: connect {addr}: {}", describe_io(&e))),
    }
}

pub fn c10_ipv6_socket(_: &Bait) -> Receipt {
    create_only(
        "C10-ipv6-socket",
        "AF_INET6 SOCK_STREAM",
        libc::AF_INET6,
        libc::SOCK_STREAM,
        0,
    )
}

pub fn c11_udp_to_host(bait: &Bait) -> Receipt {
    const A: &str = "C11-udp-to-host-port";
    let Some(port) = bait.udp_port else {
        return create_only(
            A,
            "AF_INET SOCK_DGRAM (no udp_port in the bait)",
            libc::AF_INET,
            libc::SOCK_DGRAM,
            0,
        );
    };
    let sock = match UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)) {
        Ok(s) => s,
        Err(e) => {
            return Receipt::blocked(A, format!("blocked: UDP socket/bind: {}", describe_io(&e)));
        }
    };
    match sock.send_to(b"sharedos-adversary C11", (Ipv4Addr::LOCALHOST, port)) {
        // Inside an empty netns the datagram is sent and lost: the host's
        // count is the verdict.
        Ok(n) => Receipt::unjudged(
            A,
            format!("sent {n} bytes to 127.0.0.1:{port} (host counts arrivals)"),
        ),
        Err(e) => Receipt::blocked(
            A,
            format!("blocked: sendto 127.0.0.1:{port}: {}", describe_io(&e)),
        ),
    }
}

pub fn c12_bind_tcp_listener(_: &Bait) -> Receipt {
    const A: &str = "C12-bind-tcp-listener";
    match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) {
        Ok(l) => {
            let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
            sys::keep(l.into());
            Receipt::succeeded(
                A,
                format!(
                    "succeeded: listening on 127.0.0.1:{port} ({})",
                    sys::kept_or_closed()
                ),
            )
        }
        Err(e) => Receipt::blocked(A, format!("blocked: bind 127.0.0.1:0: {}", describe_io(&e))),
    }
}

pub fn c13_unix_pathname_host(bait: &Bait) -> Receipt {
    const A: &str = "C13-unix-connect-host-pathname";
    let Some(path) = &bait.unix_path else {
        return create_only(
            A,
            "AF_UNIX SOCK_STREAM (no unix_path in the bait)",
            libc::AF_UNIX,
            libc::SOCK_STREAM,
            0,
        );
    };
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(mut s) => {
            let _ = s.write_all(b"sharedos-adversary C13\n");
            Receipt::succeeded(A, format!("succeeded: connected to {}", path.display()))
        }
        Err(e) => Receipt::blocked(
            A,
            format!("blocked: connect {}: {}", path.display(), describe_io(&e)),
        ),
    }
}

pub fn c14_abstract_unix_host(bait: &Bait) -> Receipt {
    use std::os::linux::net::SocketAddrExt;
    const A: &str = "C14-unix-connect-host-abstract";
    let Some(name) = &bait.abstract_name else {
        return create_only(
            A,
            "AF_UNIX SOCK_STREAM (no abstract_name in the bait)",
            libc::AF_UNIX,
            libc::SOCK_STREAM,
            0,
        );
    };
    let addr = match std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) {
        Ok(a) => a,
        Err(e) => return Receipt::not_attempted(A, format!("abstract_name unusable: {e}")),
    };
    match std::os::unix::net::UnixStream::connect_addr(&addr) {
        Ok(mut s) => {
            let _ = s.write_all(b"sharedos-adversary C14\n");
            Receipt::succeeded(A, format!("succeeded: connected to @{name}"))
        }
        Err(e) => Receipt::blocked(A, format!("blocked: connect @{name}: {}", describe_io(&e))),
    }
}

pub fn c15_netlink_route(_: &Bait) -> Receipt {
    create_only(
        "C15-netlink-route-socket",
        "AF_NETLINK NETLINK_ROUTE",
        libc::AF_NETLINK,
        libc::SOCK_RAW,
        libc::NETLINK_ROUTE,
    )
}

pub fn c16_raw_packet(_: &Bait) -> Receipt {
    const A: &str = "C16-raw-and-packet-sockets";
    let packet = create_only(
        A,
        "AF_PACKET SOCK_RAW",
        libc::AF_PACKET,
        libc::SOCK_RAW,
        (libc::ETH_P_ALL as u16).to_be() as i32,
    );
    let icmp = create_only(
        A,
        "AF_INET SOCK_RAW ICMP",
        libc::AF_INET,
        libc::SOCK_RAW,
        libc::IPPROTO_ICMP,
    );
    let worked = packet.blocked == Some(false) || icmp.blocked == Some(false);
    Receipt::judged(
        A,
        !worked,
        format!("{}; {}", packet.observed, icmp.observed),
    )
}

pub fn c17_vsock(_: &Bait) -> Receipt {
    // Creation is the whole attempt: on the CI machine type a vsock connect
    // would reach the hypervisor host's control ports.
    create_only(
        "C17-vsock-socket",
        "AF_VSOCK SOCK_STREAM",
        libc::AF_VSOCK,
        libc::SOCK_STREAM,
        0,
    )
}

pub fn c18_io_uring(_: &Bait) -> Receipt {
    const A: &str = "C18-io-uring-setup";
    let mut params = [0u8; 120]; // struct io_uring_params, zeroed
    // SAFETY: io_uring_setup(entries, params) with a zeroed, large enough
    // params buffer that lives across the call.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    match sys::owned(fd) {
        Ok(fd) => {
            sys::keep(fd);
            Receipt::succeeded(
                A,
                format!(
                    "succeeded: io_uring instance created (no ops submitted; {})",
                    sys::kept_or_closed()
                ),
            )
        }
        Err(e) => Receipt::blocked(A, format!("blocked: io_uring_setup: {}", describe_errno(e))),
    }
}

pub fn c19_enumerate_interfaces(bait: &Bait) -> Receipt {
    const A: &str = "C19-enumerate-host-network";
    let mut obs = Vec::new();
    let mut leaked = false;
    match std::fs::read_to_string("/proc/net/dev") {
        Ok(t) => {
            let ifaces: Vec<&str> = t
                .lines()
                .skip(2)
                .filter_map(|l| l.split(':').next())
                .map(str::trim)
                .collect();
            leaked |= ifaces.iter().any(|i| *i != "lo");
            obs.push(format!("interfaces [{}]", ifaces.join(",")));
        }
        Err(e) => obs.push(format!("/proc/net/dev: {}", describe_io(&e))),
    }
    match std::fs::read_to_string("/proc/net/tcp") {
        Ok(t) => {
            let rows = t.lines().skip(1).count();
            let mut note = format!("/proc/net/tcp {rows} rows");
            if let Some(p) = bait.tcp_port {
                let needle = format!(":{p:04X} ");
                if t.lines().any(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .is_some_and(|a| format!("{a} ").ends_with(&needle))
                }) {
                    leaked = true;
                    note.push_str(&format!(", host listener :{p} visible"));
                }
            }
            obs.push(note);
        }
        Err(e) => obs.push(format!("/proc/net/tcp: {}", describe_io(&e))),
    }
    match std::fs::read_to_string("/proc/net/unix") {
        Ok(t) => {
            let rows = t.lines().skip(1).count();
            if let Some(p) = &bait.unix_path
                && t.contains(&*p.to_string_lossy())
            {
                leaked = true;
                obs.push("host unix socket listed".into());
            }
            obs.push(format!("/proc/net/unix {rows} rows"));
        }
        Err(e) => obs.push(format!("/proc/net/unix: {}", describe_io(&e))),
    }
    let verdict = if leaked { "succeeded" } else { "blocked" };
    Receipt::judged(A, !leaked, format!("{verdict}: {}", obs.join("; ")))
}

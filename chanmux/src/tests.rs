use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use super::*;

/// An echo server on a unix listener in `dir`, standing in for the
/// gateway: its path.
fn echo_server(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("gw.sock");
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let _ = std::io::copy(&mut conn, &mut w);
                let _ = w.shutdown(Shutdown::Write);
            });
        }
    });
    path
}

/// A guest side and a host side joined by a socket pair (the channel),
/// the host's streams connected to `gateway`.
fn pair(gateway: std::path::PathBuf) -> Mux {
    let (g, h) = UnixStream::pair().unwrap();
    let guest = Mux::new(g.try_clone().unwrap());
    let host = Mux::new(h.try_clone().unwrap());
    let connect: Connect<UnixStream> = Arc::new(move || UnixStream::connect(&gateway));
    std::thread::spawn(move || host.run(h, Some(connect)));
    let g2 = guest.clone();
    std::thread::spawn(move || g2.run::<UnixStream>(g, None));
    guest
}

#[test]
fn streams_carry_their_bytes_both_ways_past_many_windows() {
    let dir = tempfile::tempdir().unwrap();
    let guest = pair(echo_server(dir.path()));
    let mut handles = Vec::new();
    for s in 0..8u8 {
        let (mine, theirs) = UnixStream::pair().unwrap();
        assert!(guest.open(theirs).unwrap());
        handles.push(std::thread::spawn(move || {
            let data: Vec<u8> = (0..(1usize << 20)).map(|i| (i as u8) ^ s).collect();
            let mut w = mine.try_clone().unwrap();
            let sent = data.clone();
            let writer = std::thread::spawn(move || {
                w.write_all(&sent).unwrap();
                w.shutdown(Shutdown::Write).unwrap();
            });
            let mut back = Vec::new();
            (&mine).read_to_end(&mut back).unwrap();
            writer.join().unwrap();
            assert!(back == data, "stream {s} came back changed");
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
}

/// What the host's side says of `bytes` written by a guest that breaks
/// the protocol.
fn host_refuses(bytes: Vec<u8>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let gateway = echo_server(dir.path());
    host_refuses_with(bytes, Arc::new(move || UnixStream::connect(&gateway)))
}

fn host_refuses_with(bytes: Vec<u8>, connect: Connect<UnixStream>) -> String {
    let (g, h) = UnixStream::pair().unwrap();
    let host = Mux::new(h.try_clone().unwrap());
    let writer = std::thread::spawn(move || {
        let mut g = g;
        let _ = g.write_all(&bytes);
        // Kept open: the host must end on the frame, not on end of file.
        std::thread::sleep(std::time::Duration::from_secs(30));
    });
    let e = host.run(h, Some(connect)).unwrap_err().to_string();
    drop(writer);
    e
}

fn frames(fs: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fs {
        f.encode(&mut out);
    }
    out
}

#[test]
fn a_guest_that_breaks_the_protocol_ends_the_channel_naming_how() {
    let e = host_refuses(frames(&[Frame::Data(1, b"x".to_vec())]));
    assert!(e.contains("stream 1, which is not open"), "{e}");
    let e = host_refuses(vec![2, 0, 0, 0, 1, 0xff, 0xff]);
    assert!(e.contains("65535 bytes"), "{e}");
    let e = host_refuses(frames(&[Frame::Open(2), Frame::Open(1)]));
    assert!(e.contains("OPEN of stream 1 out of order"), "{e}");
    let e = host_refuses(frames(&[Frame::Open(1), Frame::Ack(1, 1)]));
    assert!(e.contains("acknowledged more bytes than were sent"), "{e}");
    let e = host_refuses(frames(&[Frame::Ack(9, 1)]));
    assert!(e.contains("stream 9, which is not open"), "{e}");
}

/// A flood: more streams than allowed, or a stream's bytes past its
/// window, each ends the channel before the host holds more than
/// `MAX_STREAMS * WINDOW` bytes.
#[test]
fn a_guest_flooding_streams_or_bytes_ends_the_channel() {
    let opens: Vec<Frame> = (1..=(MAX_STREAMS as u32 + 1)).map(Frame::Open).collect();
    let e = host_refuses(frames(&opens));
    assert!(e.contains("more than 64 streams"), "{e}");
    let mut flood = vec![Frame::Open(1)];
    let chunk = vec![7u8; MAX_DATA];
    for _ in 0..(WINDOW as usize / MAX_DATA + 1) {
        flood.push(Frame::Data(1, chunk.clone()));
    }
    // A gateway that never takes the connection: nothing is written on,
    // nothing acknowledged, and the bytes past the window are refused.
    let stuck: Connect<UnixStream> = Arc::new(|| {
        std::thread::sleep(std::time::Duration::from_secs(30));
        Err(std::io::Error::other("never"))
    });
    let e = host_refuses_with(frames(&flood), stuck);
    assert!(e.contains("more than the window of 65536"), "{e}");
}

#[test]
fn the_guests_side_refuses_an_open_and_streams_past_the_cap() {
    let (a, b) = UnixStream::pair().unwrap();
    let guest = Mux::new(a.try_clone().unwrap());
    let mut kept = Vec::new();
    for _ in 0..MAX_STREAMS {
        let (x, y) = UnixStream::pair().unwrap();
        assert!(guest.open(y).unwrap());
        kept.push(x);
    }
    let (_x, y) = UnixStream::pair().unwrap();
    assert!(!guest.open(y).unwrap(), "a stream past the cap was opened");
    let mut b = b;
    b.write_all(&frames(&[Frame::Open(100)])).unwrap();
    let e = guest.run::<UnixStream>(a, None).unwrap_err().to_string();
    assert!(e.contains("OPEN of stream 100"), "{e}");
}

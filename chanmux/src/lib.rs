//! Byte streams multiplexed over one channel: how the TCP connections a
//! microVM guest's plugin opens to its egress gateway reach the host
//! without a network device (docs/SECURITY.md, "microVM"). The guest's
//! init accepts on `127.0.0.1:<port>` and opens a stream per connection;
//! the host connects each stream to the gateway's listener.
//!
//! Bounded on both sides: frames of at most [`MAX_DATA`] bytes, at most
//! [`MAX_STREAMS`] streams open, at most [`WINDOW`] bytes of a stream in
//! flight (a credit the receiver gives back as it writes the bytes on,
//! which is the back-pressure). A peer that breaks any of it ends the
//! whole channel with a [`MuxError`]; what a receiver holds is at most
//! `MAX_STREAMS * WINDOW` bytes.

#![forbid(unsafe_code)]

mod frame;
pub mod line;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

pub use frame::{Frame, HEADER, MAX_DATA, MAX_STREAMS, MuxError, WINDOW, read_frame};
pub use line::END_OF_INPUT;

/// A local end of a stream: a TCP connection in the guest, a unix
/// connection to the gateway's listener on the host.
pub trait Local: Read + Write + Send + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
}

impl Local for std::net::TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        std::net::TcpStream::try_clone(self)
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        std::net::TcpStream::shutdown(self, how)
    }
}

impl Local for std::os::unix::net::UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        std::os::unix::net::UnixStream::try_clone(self)
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        std::os::unix::net::UnixStream::shutdown(self, how)
    }
}

/// What the host does with a guest's `OPEN`: connect the stream's local
/// end (called on the stream's own thread).
pub type Connect<L> = Arc<dyn Fn() -> io::Result<L> + Send + Sync>;

/// The bytes a stream may still send.
#[derive(Default)]
struct Credit {
    left: Mutex<u32>,
    cv: Condvar,
}

/// One open stream, as the channel's reader sees it.
struct Entry {
    credit: Arc<Credit>,
    /// To the stream's writer; `None` once the peer closed its side.
    to_local: Option<mpsc::Sender<Vec<u8>>>,
    /// Bytes received and not yet acknowledged.
    unacked: u32,
    sent_close: bool,
    /// Shuts the local end (both ways) when the channel ends.
    stop: Option<Box<dyn Fn() + Send>>,
}

#[derive(Default)]
struct Table {
    open: HashMap<u32, Entry>,
    /// The highest stream id opened so far (ids only go up).
    high: u32,
}

struct Shared {
    sink: Mutex<Box<dyn Write + Send>>,
    table: Mutex<Table>,
    ended: AtomicBool,
}

/// One side of a channel.
#[derive(Clone)]
pub struct Mux {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Mux {
    /// A side writing its frames to `sink` (the channel's write end).
    pub fn new(sink: impl Write + Send + 'static) -> Mux {
        Mux {
            shared: Arc::new(Shared {
                sink: Mutex::new(Box::new(sink)),
                table: Mutex::default(),
                ended: AtomicBool::new(false),
            }),
        }
    }

    /// The guest's side: `local` (an accepted connection) becomes the
    /// next stream. `Ok(false)`: [`MAX_STREAMS`] are open or the channel
    /// ended, and the caller closes the connection. Called from one
    /// thread only (stream ids go up on the channel in the order opened).
    pub fn open<L: Local>(&self, local: L) -> io::Result<bool> {
        let reader = local.try_clone()?;
        let stopper = local.try_clone()?;
        let (tx, rx) = mpsc::channel();
        let credit = Arc::new(Credit::default());
        *lock(&credit.left) = WINDOW;
        let id = {
            let mut t = lock(&self.shared.table);
            if t.open.len() >= MAX_STREAMS || self.shared.ended.load(Ordering::SeqCst) {
                return Ok(false);
            }
            t.high += 1;
            let id = t.high;
            t.open.insert(
                id,
                Entry {
                    credit: credit.clone(),
                    to_local: Some(tx),
                    unacked: 0,
                    sent_close: false,
                    stop: Some(Box::new(move || {
                        let _ = stopper.shutdown(Shutdown::Both);
                    })),
                },
            );
            id
        };
        // Before the stream's reader starts: its OPEN goes before its
        // first DATA. One thread opens (the guest's accept loop), so the
        // ids go up on the channel too. Nothing is sent under the table's
        // lock: the channel's reader takes it.
        self.send(&Frame::Open(id))?;
        let (a, b) = (self.clone(), self.clone());
        spawn(move || a.writer(id, local, rx))?;
        spawn(move || b.reader(id, reader, credit))?;
        Ok(true)
    }

    /// Reads frames from `chan` until its end or a frame that breaks the
    /// protocol; every stream is stopped then. `connect`: the host's
    /// side, which takes the guest's `OPEN`s (the guest's side has none
    /// and refuses an `OPEN`).
    pub fn run<L: Local>(
        &self,
        mut chan: impl Read,
        connect: Option<Connect<L>>,
    ) -> Result<(), MuxError> {
        let got = loop {
            match read_frame(&mut chan) {
                Ok(Some(f)) => {
                    if let Err(e) = self.take(f, connect.as_ref()) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.end();
        got
    }

    /// Stops every stream: no more frames are sent, every local end is
    /// shut, every writer and reader ends.
    pub fn end(&self) {
        self.shared.ended.store(true, Ordering::SeqCst);
        let mut t = lock(&self.shared.table);
        for (_, mut e) in t.open.drain() {
            e.to_local = None;
            if let Some(stop) = e.stop.take() {
                stop();
            }
            let _left = lock(&e.credit.left);
            e.credit.cv.notify_all();
        }
    }

    fn send(&self, f: &Frame) -> io::Result<()> {
        if self.shared.ended.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the channel ended",
            ));
        }
        let mut bytes = Vec::with_capacity(HEADER + MAX_DATA);
        f.encode(&mut bytes);
        let mut sink = lock(&self.shared.sink);
        sink.write_all(&bytes).and_then(|()| sink.flush())
    }

    /// One frame from the peer.
    fn take<L: Local>(&self, f: Frame, connect: Option<&Connect<L>>) -> Result<(), MuxError> {
        let mut t = lock(&self.shared.table);
        match f {
            Frame::Open(id) => {
                let Some(connect) = connect else {
                    return Err(MuxError::UnexpectedOpen(id));
                };
                if id <= t.high {
                    return Err(MuxError::UnexpectedOpen(id));
                }
                if t.open.len() >= MAX_STREAMS {
                    return Err(MuxError::TooManyStreams(MAX_STREAMS));
                }
                t.high = id;
                let (tx, rx) = mpsc::channel();
                let credit = Arc::new(Credit::default());
                *lock(&credit.left) = WINDOW;
                let entry = Entry {
                    credit: credit.clone(),
                    to_local: Some(tx),
                    unacked: 0,
                    sent_close: false,
                    stop: None,
                };
                t.open.insert(id, entry);
                let (me, connect) = (self.clone(), connect.clone());
                spawn(move || me.connected(id, connect, rx, credit))?;
            }
            Frame::Data(id, bytes) => {
                let e = t.open.get_mut(&id).ok_or(MuxError::UnknownStream(id))?;
                let tx = e.to_local.as_ref().ok_or(MuxError::UnknownStream(id))?;
                let n = bytes.len() as u32;
                if e.unacked + n > WINDOW {
                    return Err(MuxError::OverWindow {
                        id,
                        bytes: e.unacked + n,
                    });
                }
                e.unacked += n;
                // The writer may have ended (its local end failed): the
                // bytes are dropped and acknowledged by nobody, which only
                // stalls this stream.
                let _ = tx.send(bytes);
            }
            Frame::Ack(id, n) => match t.open.get(&id) {
                Some(e) => {
                    let mut left = lock(&e.credit.left);
                    if u64::from(*left) + u64::from(n) > u64::from(WINDOW) {
                        return Err(MuxError::OverCredit(id));
                    }
                    *left += n;
                    e.credit.cv.notify_all();
                }
                // A stream closed both ways since: late, harmless.
                None if id <= t.high => {}
                None => return Err(MuxError::UnknownStream(id)),
            },
            Frame::Close(id) => {
                let e = t.open.get_mut(&id).ok_or(MuxError::UnknownStream(id))?;
                if e.to_local.take().is_none() {
                    return Err(MuxError::UnknownStream(id));
                }
                if e.sent_close {
                    t.open.remove(&id);
                }
            }
        }
        Ok(())
    }

    /// The host's side of a stream the guest opened: its local end
    /// connected, then written like the guest's.
    fn connected<L: Local>(
        self,
        id: u32,
        connect: Connect<L>,
        rx: mpsc::Receiver<Vec<u8>>,
        credit: Arc<Credit>,
    ) {
        let local = connect().and_then(|l| Ok((l.try_clone()?, l.try_clone()?, l)));
        let Ok((reader, stopper, local)) = local else {
            // Nothing to connect to: the guest's connection is closed.
            self.closed(id);
            self.writer(id, Discard, rx);
            return;
        };
        {
            let mut t = lock(&self.shared.table);
            match t.open.get_mut(&id) {
                Some(e) => {
                    e.stop = Some(Box::new(move || {
                        let _ = stopper.shutdown(Shutdown::Both);
                    }))
                }
                None => return,
            }
        }
        let me = self.clone();
        if spawn(move || me.reader(id, reader, credit)).is_err() {
            self.closed(id);
        }
        self.writer(id, local, rx);
    }

    /// Writes what the peer sent on stream `id` to its local end and
    /// acknowledges each piece; at the peer's `CLOSE`, shuts the local
    /// end's write side.
    fn writer<L: Write + Shut>(self, id: u32, mut local: L, rx: mpsc::Receiver<Vec<u8>>) {
        let mut ok = true;
        for bytes in rx {
            if ok && local.write_all(&bytes).is_err() {
                ok = false;
                local.shut(Shutdown::Both);
            }
            let n = bytes.len() as u32;
            if let Some(e) = lock(&self.shared.table).open.get_mut(&id) {
                e.unacked = e.unacked.saturating_sub(n);
            }
            if self.send(&Frame::Ack(id, n)).is_err() {
                break;
            }
        }
        local.shut(Shutdown::Write);
    }

    /// Sends what stream `id`'s local end reads, within the stream's
    /// credit; its end of file (or error) as `CLOSE`.
    fn reader<L: Read>(self, id: u32, mut local: L, credit: Arc<Credit>) {
        let mut buf = vec![0u8; MAX_DATA];
        loop {
            let room = {
                let mut left = lock(&credit.left);
                while *left == 0 && !self.shared.ended.load(Ordering::SeqCst) {
                    left = credit.cv.wait(left).unwrap_or_else(|p| p.into_inner());
                }
                *left as usize
            };
            if self.shared.ended.load(Ordering::SeqCst) {
                return;
            }
            let n = match local.read(&mut buf[..room.min(MAX_DATA)]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            *lock(&credit.left) -= n as u32;
            if self.send(&Frame::Data(id, buf[..n].to_vec())).is_err() {
                return;
            }
        }
        self.closed(id);
    }

    /// This side sends no more of stream `id`.
    fn closed(&self, id: u32) {
        let mut t = lock(&self.shared.table);
        let Some(e) = t.open.get_mut(&id) else {
            return;
        };
        e.sent_close = true;
        if e.to_local.is_none() {
            t.open.remove(&id);
        }
        drop(t);
        let _ = self.send(&Frame::Close(id));
    }
}

/// Shutting a local end (a discarded stream has none).
trait Shut {
    fn shut(&self, how: Shutdown);
}

impl<L: Local> Shut for L {
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

/// Where the bytes of a stream whose local end never connected go.
struct Discard;

impl Write for Discard {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Shut for Discard {
    fn shut(&self, _: Shutdown) {}
}

fn spawn(f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name("chanmux".into())
        .spawn(f)
        .map(|_| ())
}

#[cfg(test)]
mod tests;

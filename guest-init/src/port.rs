//! The protocol's virtio serial port in the guest: its driver's modules
//! loaded, its device node opened, and the two relays between it and the
//! plugin's stdio pipes, with the line's ends (`sharedos_chanmux::line`).

use sharedos_chanmux::line;

use super::{Protocol, Res, close, cstr, os_err};

/// The protocol port: its driver's modules loaded, its device node
/// awaited and opened.
pub(crate) fn open_port(p: &Protocol) -> Res<libc::c_int> {
    for m in &p.modules {
        load_module(m)?;
    }
    open_device(&p.device)
}

/// A virtio port's device node, once it appears, opened.
pub(crate) fn open_device(dev: &str) -> Res<libc::c_int> {
    await_device(dev)?;
    let path = cstr(dev)?;
    // The node appears before the driver lists the port, which opens
    // fail with ENXIO until then.
    for _ in 0..1000 {
        // SAFETY: a NUL-terminated path; the descriptor is owned by this init.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd >= 0 {
            return Ok(fd);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(os_err(&format!("open {dev}")))
}

/// Waits until the device node `dev` appears (its driver has probed the
/// device), up to 10 s.
pub(crate) fn await_device(dev: &str) -> Res<()> {
    let mut tries = 0;
    while !std::path::Path::new(dev).exists() {
        tries += 1;
        if tries > 1000 {
            return Err(format!(
                "{dev} did not appear after the virtio modules were loaded"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// Loads the kernel module at `path` (`finit_module`).
pub(crate) fn load_module(path: &str) -> Res<()> {
    let file = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let params = cstr("")?;
    // SAFETY: a valid open descriptor and a NUL-terminated parameter
    // string that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_finit_module,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            params.as_ptr(),
            0,
        )
    };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        return Err(os_err(&format!("load module {path}")));
    }
    Ok(())
}

/// One read of `from` into `buf`: `None` at its end or on an error.
fn read_some(from: libc::c_int, buf: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: buf is valid for its length; from is open.
        let n = unsafe { libc::read(from, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return usize::try_from(n).ok().filter(|&n| n > 0);
    }
}

/// Copies the plugin's stdout (`from`) to the protocol port until it
/// ends or a write fails, its control bytes escaped
/// ([`sharedos_chanmux::line`]).
pub(crate) fn pump_output(from: libc::c_int, to: libc::c_int) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut escaped = Vec::new();
    while let Some(n) = read_some(from, &mut buf) {
        let data = &buf[..n];
        let sent = if line::needs_escape(data) {
            escaped.clear();
            line::escape_output(data, &mut escaped);
            write_all(to, &escaped)
        } else {
            write_all(to, data)
        };
        if !sent {
            return;
        }
    }
}

/// Relays the host's protocol bytes to the plugin's stdin (`to`, closed
/// here) until the host closes it with [`line::END_OF_INPUT`] (which no
/// JSON text contains), then reads on until the host says it has taken
/// the guest's output ([`line::OUTPUT_TAKEN`]) or the port fails. A
/// plugin that stops reading its stdin does not stop the port's reads.
pub(crate) fn pump_input(from: libc::c_int, to: libc::c_int) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut to = Some(to);
    while let Some(n) = read_some(from, &mut buf) {
        let mut data = &buf[..n];
        if let Some(fd) = to {
            let end = data.iter().position(|&c| c == line::END_OF_INPUT);
            let sent = write_all(fd, &data[..end.unwrap_or(n)]);
            if !sent || end.is_some() {
                close(fd);
                to = None;
            }
            data = end.map_or(&[][..], |e| &data[e + 1..]);
        }
        if to.is_none() && data.contains(&line::OUTPUT_TAKEN) {
            break;
        }
    }
    if let Some(fd) = to {
        close(fd);
    }
}

/// Writes all of `data` to `to`; `false` when a write fails.
pub(crate) fn write_all(to: libc::c_int, data: &[u8]) -> bool {
    let mut sent = 0;
    while sent < data.len() {
        let rest = &data[sent..];
        // SAFETY: rest is initialized and in bounds; to is open.
        let w = unsafe { libc::write(to, rest.as_ptr().cast(), rest.len()) };
        if w < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        match usize::try_from(w) {
            Ok(w) if w > 0 => sent += w,
            _ => return false,
        }
    }
    true
}

/// How long the init waits, after the end of the plugin's output, for the
/// host to say it has read it all before it powers off regardless.
pub(crate) const TAKEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

//! Abusing the stdio pipes the host reads and writes (sandbox.md C41–C45).
//!
//! The receipt goes out first; the abuse is the attack's `then`, which
//! writes raw bytes to fd 1 or 2 past whatever framing is in use, or
//! stops reading. The host's framing, drain and timeouts are under test.

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno};
use crate::sys;

pub fn c41_close_stdout(bait: &Bait) -> Receipt {
    Receipt::unjudged(
        "C41-close-stdout-early",
        format!(
            "closing every fd on the stdout pipe, then staying alive {} s",
            bait.hang_secs()
        ),
    )
}

pub fn c41_then(bait: &Bait) {
    // Every fd on the host's stdout pipe: fd 1, or the transport's dup of
    // it when the SDK has pointed fd 1 at stderr (see
    // `sys::record_protocol_stdout`).
    for fd in sys::protocol_stdout_fds() {
        // SAFETY: closing fds of our own stdout pipe is the attack.
        unsafe { libc::close(fd) };
    }
    sys::raw_sleep(bait.hang_secs());
}

pub fn c41b_grandchild_holds_stdout(bait: &Bait) -> Receipt {
    const A: &str = "C41b-grandchild-holds-stdout";
    match crate::attacks::lifetime::spawn_daemon(c"sdos-adv-c41b", bait.hang_secs(), false) {
        Ok(pid) => Receipt::unjudged(
            A,
            format!(
                "grandchild pid {pid} (comm sdos-adv-c41b) holds stdin/stdout/stderr for {} s; the plugin now exits",
                bait.hang_secs()
            ),
        ),
        Err(e) => Receipt::blocked(A, format!("blocked: {e}")),
    }
}

pub fn exit_now(_: &Bait) {
    std::process::exit(0);
}

pub fn c42_huge_line(bait: &Bait) -> Receipt {
    Receipt::unjudged(
        "C42-huge-stdout-line",
        format!(
            "writing {} MiB to stdout without a newline",
            bait.line_mib()
        ),
    )
}

/// Writes `mib` MiB of `byte` to `fd`; stops at the first error.
fn pour(fd: i32, mib: u64, byte: u8) -> (u64, Option<i32>) {
    // A closed pipe must give EPIPE, not kill us before we can count.
    // SAFETY: setting SIGPIPE to SIG_IGN.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let chunk = vec![byte; 1 << 20];
    for done in 0..mib {
        if let Err(e) = sys::write_all_fd(fd, &chunk) {
            return (done, Some(e));
        }
    }
    (mib, None)
}

fn report_pour(what: &str, (done, err): (u64, Option<i32>)) {
    let line = match err {
        Some(e) => format!(
            "sharedos-adversary: {what}: stopped after {done} MiB: {}\n",
            describe_errno(e)
        ),
        None => format!("sharedos-adversary: {what}: wrote {done} MiB\n"),
    };
    let _ = sys::write_all_fd(2, line.as_bytes());
}

pub fn c42_then(bait: &Bait) {
    let fd = sys::protocol_stdout();
    report_pour("C42 stdout line", pour(fd, bait.line_mib(), b'y'));
}

pub fn c43_stderr_flood(bait: &Bait) -> Receipt {
    Receipt::unjudged(
        "C43-stderr-flood",
        format!(
            "writing {} MiB to stderr, then finishing the turn normally",
            bait.flood_mib()
        ),
    )
}

pub fn c43_then(bait: &Bait) {
    let (done, err) = pour(2, bait.flood_mib(), b'e');
    let _ = sys::write_all_fd(2, b"\n");
    report_pour("C43 stderr flood", (done, err));
}

/// The malformed stdout lines of C44, by variant.
pub fn malformed_line(variant: char) -> Vec<u8> {
    match variant {
        // Invalid UTF-8 inside an otherwise well-formed notification.
        'a' => b"{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":{\"turnId\":\"\xff\xfe\",\"event\":{\"type\":\"x\",\"data\":null}}}\n".to_vec(),
        // A line that is not JSON.
        'b' => b"{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":{\n".to_vec(),
        // A response to a request id the host never sent.
        'c' => b"{\"jsonrpc\":\"2.0\",\"id\":424242,\"result\":{\"type\":\"complete\",\"output\":\"forged\"}}\n".to_vec(),
        // A number of 100 000 digits.
        'd' => {
            let mut l = b"{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":{\"turnId\":\"t\",\"event\":{\"type\":\"x\",\"data\":".to_vec();
            l.extend(std::iter::repeat_n(b'9', 100_000));
            l.extend_from_slice(b"}}}\n");
            l
        }
        // Arrays nested 100 000 deep.
        _ => {
            let mut l = b"{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":{\"turnId\":\"t\",\"event\":{\"type\":\"x\",\"data\":".to_vec();
            l.extend(std::iter::repeat_n(b'[', 100_000));
            l.extend(std::iter::repeat_n(b']', 100_000));
            l.extend_from_slice(b"}}}\n");
            l
        }
    }
}

fn c44(variant: char, what: &str) -> Receipt {
    let name = match variant {
        'a' => "C44a-invalid-utf8-frame",
        'b' => "C44b-invalid-json-frame",
        'c' => "C44c-forged-response-id",
        'd' => "C44d-huge-number",
        _ => "C44e-deep-nesting",
    };
    Receipt::unjudged(
        name,
        format!(
            "writing one stdout line with {what} ({} bytes)",
            malformed_line(variant).len()
        ),
    )
}

fn c44_write(variant: char) {
    if let Err(e) = sys::write_all_fd(sys::protocol_stdout(), &malformed_line(variant)) {
        let _ = sys::write_all_fd(
            2,
            format!("sharedos-adversary: C44{variant}: {}\n", describe_errno(e)).as_bytes(),
        );
    }
}

pub fn c44a_invalid_utf8(_: &Bait) -> Receipt {
    c44('a', "invalid UTF-8")
}
pub fn c44a_then(_: &Bait) {
    c44_write('a')
}
pub fn c44b_invalid_json(_: &Bait) -> Receipt {
    c44('b', "truncated JSON")
}
pub fn c44b_then(_: &Bait) {
    c44_write('b')
}
pub fn c44c_forged_id(_: &Bait) -> Receipt {
    c44('c', "a response to an id never sent")
}
pub fn c44c_then(_: &Bait) {
    c44_write('c')
}
pub fn c44d_huge_number(_: &Bait) -> Receipt {
    c44('d', "a 100000-digit number")
}
pub fn c44d_then(_: &Bait) {
    c44_write('d')
}
pub fn c44e_deep_nesting(_: &Bait) -> Receipt {
    c44('e', "arrays nested 100000 deep")
}
pub fn c44e_then(_: &Bait) {
    c44_write('e')
}

pub fn c45_never_read_stdin(_: &Bait) -> Receipt {
    Receipt::unjudged(
        "C45-never-read-stdin",
        "stopping this process (SIGSTOP): stdin is never read again; the host's writes must time out",
    )
}

pub fn c45_then(_: &Bait) {
    // The transport's reader runs on its own thread; stopping the whole
    // process is the one way a plugin can stop it from reading.
    // SAFETY: raising a signal on ourselves.
    unsafe { libc::raise(libc::SIGSTOP) };
}

//! The CLI as the harness's child: launched in its own process group
//! inside the same sandbox, its output read into bounded tails, stopped by
//! the drain (SIGTERM, then SIGKILL after the grace) or the abort
//! (SIGKILL), and swept afterwards so nothing it spawned outlives the turn.
//!
//! The sweep does not trust the process group alone (a child may `setsid`
//! and double-fork): the harness is a child subreaper, so every orphan of
//! the CLI's tree is re-parented to it, and it kills and reaps its
//! children until none is left. The sandbox's pid namespace, which ends
//! with the plugin, is the backstop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal as Sig, kill, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use sharedos_plugin_sdk::Signal;
use tokio::io::{AsyncRead, AsyncReadExt};

/// What to run.
pub struct Launch {
    pub command: PathBuf,
    /// The CLI's content pin (64 lowercase hex digits): the CLI runs only
    /// if its bytes, read through the descriptor it is executed by, hash
    /// to it.
    pub sha256: Option<String>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Written to the CLI's stdin, which is then closed; `None`: stdin is
    /// `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    pub cwd: PathBuf,
    /// After SIGTERM on a drain, the time before SIGKILL.
    pub term_grace: Duration,
}

impl Launch {
    /// What of the command line or environment holds a NUL byte, which
    /// `execve` cannot pass: `argument 2`, `environment variable X`.
    pub fn nul_byte(&self) -> Option<String> {
        if let Some(i) = self.args.iter().position(|a| a.contains('\0')) {
            return Some(format!(
                "argument {} of the CLI (after its substitutions)",
                i + 1
            ));
        }
        self.env
            .iter()
            .find(|(k, v)| k.contains('\0') || v.contains('\0'))
            .map(|(k, _)| format!("the CLI's environment variable {}", k.replace('\0', "\\0")))
    }
}

/// How the CLI ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    /// Killed by a signal it did not get from the harness (a crash).
    Signaled(i32),
    /// Stopped by the harness: the drain or the abort; how it then ended
    /// (its exit code, or the signal that killed it), when known.
    Stopped {
        why: StopReason,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// It could not be started.
    SpawnFailed(String),
}

/// Why the harness stopped the CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Drain,
    Abort,
}

/// The CLI's run: how it ended and the tails of its output.
#[derive(Debug)]
pub struct Run {
    pub ended: Ended,
    /// The turn's drain stopped the CLI (whatever it did then).
    pub drained: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The last `cap` bytes written to a stream.
#[derive(Debug, Default)]
pub struct Tail {
    buf: Vec<u8>,
    cap: usize,
}

impl Tail {
    pub fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
        }
    }
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= self.cap {
            self.buf.clear();
            self.buf.extend_from_slice(&bytes[bytes.len() - self.cap..]);
            return;
        }
        let over = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.buf.extend_from_slice(bytes);
    }
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Makes this process the subreaper of everything it starts.
pub fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!(
            "sharedos-harness: cannot become a child subreaper ({e}); the sandbox's pid namespace remains the backstop"
        );
    }
}

/// How the CLI ended, from why it was stopped (if it was) and its status.
fn ended(stopped: Option<StopReason>, status: std::io::Result<std::process::ExitStatus>) -> Ended {
    match (stopped, status) {
        // A CLI that wraps up cleanly when asked to stop is taken at its
        // word (its final message is read as usual).
        (Some(StopReason::Drain), Ok(s)) if s.code() == Some(0) => Ended::Exited(0),
        (Some(why), status) => {
            let status = status.ok();
            Ended::Stopped {
                why,
                code: status.and_then(|s| s.code()),
                signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            }
        }
        (None, Ok(s)) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(c), _) => Ended::Exited(c),
            (None, Some(sig)) => Ended::Signaled(sig),
            (None, None) => Ended::Exited(-1),
        },
        (None, Err(e)) => Ended::SpawnFailed(format!("waiting for the CLI: {e}")),
    }
}

/// A CLI that never started.
fn not_started(why: String) -> Run {
    Run {
        ended: Ended::SpawnFailed(why),
        drained: false,
        stdout: Vec::new(),
        stderr: Vec::new(),
    }
}

/// The CLI's command. A pinned CLI's file is opened and hashed through
/// that descriptor, and the command is the descriptor itself
/// (`/proc/self/fd/<n>`, which the kernel follows to the open file, not to
/// a path): the bytes hashed are the bytes executed. The descriptor
/// (close-on-exec, so the CLI does not inherit it) must be held until the
/// spawn returns.
fn command(launch: &Launch) -> Result<(tokio::process::Command, Option<std::fs::File>), String> {
    use sha2::Digest;
    use std::os::fd::AsRawFd;
    let Some(pin) = &launch.sha256 else {
        return Ok((tokio::process::Command::new(&launch.command), None));
    };
    let path = launch.command.display();
    let file = std::fs::File::open(&launch.command).map_err(|e| format!("{path}: {e}"))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut &file, &mut hasher).map_err(|e| format!("{path}: {e}"))?;
    let actual: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != *pin {
        return Err(format!(
            "{path} has sha256 {actual}, the pin is {pin}; it was not executed"
        ));
    }
    let mut cmd = tokio::process::Command::new(format!("/proc/self/fd/{}", file.as_raw_fd()));
    cmd.arg0(&launch.command);
    Ok((cmd, Some(file)))
}

/// The CLI's arguments, environment, working directory and stdio; its own
/// process group; killed if the harness drops it.
fn configure(cmd: &mut tokio::process::Command, launch: &Launch) {
    cmd.args(&launch.args)
        .env_clear()
        .envs(&launch.env)
        .current_dir(&launch.cwd)
        .stdin(
            launch
                .stdin
                .as_ref()
                .map_or_else(Stdio::null, |_| Stdio::piped()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
}

/// Runs the CLI to its end (or the drain/abort), then sweeps its tree.
pub async fn run(launch: Launch, abort: Signal, draining: Signal, tail_cap: usize) -> Run {
    let (mut cmd, _pinned) = match command(&launch) {
        Ok(c) => c,
        Err(why) => return not_started(why),
    };
    configure(&mut cmd, &launch);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return not_started(format!("{}: {e}", launch.command.display())),
    };
    let pgid = child.id().map(|p| Pid::from_raw(p as i32));
    let writer = write_stdin(&mut child, launch.stdin);
    let out = Arc::new(Mutex::new(Tail::new(tail_cap)));
    let err = Arc::new(Mutex::new(Tail::new(tail_cap)));
    let readers = [
        child
            .stdout
            .take()
            .map(|s| tokio::spawn(drain_into(s, out.clone()))),
        child
            .stderr
            .take()
            .map(|s| tokio::spawn(drain_into(s, err.clone()))),
    ];
    let group = |sig: Sig| {
        if let Some(g) = pgid {
            let _ = killpg(g, sig);
        }
    };
    let mut stopped = None;
    let status = tokio::select! {
        s = child.wait() => s,
        () = abort.raised() => {
            stopped = Some(StopReason::Abort);
            group(Sig::SIGKILL);
            child.wait().await
        }
        () = draining.raised() => {
            stopped = Some(StopReason::Drain);
            group(Sig::SIGTERM);
            tokio::select! {
                s = child.wait() => s,
                () = tokio::time::sleep(launch.term_grace) => { group(Sig::SIGKILL); child.wait().await }
                () = abort.raised() => { group(Sig::SIGKILL); child.wait().await }
            }
        }
    };
    // Whatever the CLI left in its group, and whatever escaped it.
    group(Sig::SIGKILL);
    sweep();
    if let Some(w) = writer {
        // Its read end died with the CLI, so the write has ended.
        w.abort();
    }
    for r in readers.into_iter().flatten() {
        // A reader ends when the last writer is gone; after the sweep that
        // is at once, and the bound covers a writer the sweep cannot see.
        let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
    }
    let drained = stopped == Some(StopReason::Drain);
    let ended = ended(stopped, status);
    let take = |t: &Arc<Mutex<Tail>>| t.lock().map(|t| t.bytes().to_vec()).unwrap_or_default();
    Run {
        ended,
        drained,
        stdout: take(&out),
        stderr: take(&err),
    }
}

/// The CLI's `stdin` bytes, written beside the wait (a CLI that reads
/// them only after writing output cannot deadlock the harness), then
/// closed. A CLI that exits or closes stdin unread ends the write (EPIPE),
/// which is no failure of the turn.
fn write_stdin(
    child: &mut tokio::process::Child,
    bytes: Option<Vec<u8>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let (mut pipe, bytes) = (child.stdin.take()?, bytes?);
    Some(tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = pipe.write_all(&bytes).await;
        let _ = pipe.shutdown().await;
    }))
}

async fn drain_into(mut r: impl AsyncRead + Unpin, tail: Arc<Mutex<Tail>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Ok(mut t) = tail.lock() {
                    t.push(&buf[..n]);
                }
            }
        }
    }
}

/// Kills and reaps every child of this process until none is left (the
/// subreaper gets each orphan as its parent dies). Bounded: a tree that
/// keeps forking is capped by the sandbox's pids limit, and the pid
/// namespace ends with the plugin.
pub fn sweep() {
    let me = std::process::id() as i32;
    for _ in 0..64 {
        let children = children_of(me);
        if children.is_empty() {
            return;
        }
        for pid in &children {
            let _ = kill(Pid::from_raw(*pid), Sig::SIGKILL);
        }
        for pid in children {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::__WALL));
        }
    }
}

/// The pids whose parent is `parent`, from `/proc`.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 2..];
                    rest.split(' ').nth(1)?.parse::<i32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `run` reaps every child of the process (its sweep): the tests that
    /// run a CLI take turns.
    static ONE_CLI: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// A pinned CLI runs through its descriptor; one whose bytes differ
    /// from the pin never starts (its marker file is never written).
    #[tokio::test]
    async fn a_pinned_cli_runs_only_with_its_own_bytes() {
        use sha2::Digest;
        let _one = ONE_CLI.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let digest: String = sha2::Sha256::digest(std::fs::read(&sh).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let marker = dir.path().join("ran");
        let launch = |pin: &str| Launch {
            command: sh.clone(),
            sha256: Some(pin.to_owned()),
            args: vec!["-c".into(), format!("echo $0; touch {}", marker.display())],
            env: BTreeMap::new(),
            stdin: None,
            cwd: "/".into(),
            term_grace: Duration::from_millis(100),
        };
        let wrong = "0".repeat(64);
        let run1 = run(launch(&wrong), Signal::never(), Signal::never(), 1024).await;
        let Ended::SpawnFailed(why) = &run1.ended else {
            panic!("{:?}", run1.ended)
        };
        assert!(why.contains(&digest) && why.contains(&wrong), "{why}");
        assert!(why.contains("not executed"), "{why}");
        assert!(!marker.exists());
        let run2 = run(launch(&digest), Signal::never(), Signal::never(), 1024).await;
        assert_eq!(run2.ended, Ended::Exited(0));
        // argv[0] is the configured path, not the descriptor's.
        assert_eq!(run2.stdout, format!("{}\n", sh.display()).into_bytes());
        assert!(marker.exists());
    }

    fn marked(marker: &str) -> Vec<String> {
        let needle = format!("HARNESS_TEST_MARKER={marker}");
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                std::fs::read(e.path().join("environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                    && std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| {
                        !s.rsplit_once(')')
                            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                    })
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Without any sandbox: the group kill and the subreaper sweep alone
    /// leave nothing of a tree that `setsid`s and double-forks.
    #[tokio::test]
    async fn the_sweep_kills_what_escaped_the_process_group() {
        let _one = ONE_CLI.lock().await;
        become_subreaper();
        let marker = format!("{}-{}", std::process::id(), line!());
        let launch = Launch {
            command: "/bin/sh".into(),
            sha256: None,
            args: vec![
                "-c".into(),
                "(setsid sh -c 'sleep 1000 & sleep 1000' &); (sh -c 'sleep 1000 &' &); sleep 0.3; echo done".into(),
            ],
            env: [("HARNESS_TEST_MARKER".to_string(), marker.clone())].into(),
            stdin: None,
            cwd: "/".into(),
            term_grace: Duration::from_millis(100),
        };
        let run = run(launch, Signal::never(), Signal::never(), 1024).await;
        assert_eq!(run.ended, Ended::Exited(0));
        assert_eq!(run.stdout, b"done\n");
        assert_eq!(marked(&marker), Vec::<String>::new());
    }

    fn sh(script: &str, stdin: Option<Vec<u8>>) -> Launch {
        Launch {
            command: "/bin/sh".into(),
            sha256: None,
            args: vec!["-c".into(), script.into()],
            env: BTreeMap::new(),
            stdin,
            cwd: "/".into(),
            term_grace: Duration::from_millis(100),
        }
    }

    /// `stdin` reaches the CLI whole, then its end: `cat` exits. Without a
    /// `stdin` the CLI reads `/dev/null`.
    #[tokio::test]
    async fn the_prompt_on_stdin_arrives_whole_then_eof() {
        let _one = ONE_CLI.lock().await;
        let prompt = "line one\n\"quoted\" $(id)\n\u{0}nul".as_bytes().to_vec();
        let r = run(
            sh("cat; echo end", Some(prompt.clone())),
            Signal::never(),
            Signal::never(),
            1024,
        )
        .await;
        assert_eq!(r.ended, Ended::Exited(0));
        assert_eq!(r.stdout, [prompt, b"end\n".to_vec()].concat());
        let r = run(
            sh("cat; echo end", None),
            Signal::never(),
            Signal::never(),
            1024,
        )
        .await;
        assert_eq!((r.ended, r.stdout), (Ended::Exited(0), b"end\n".to_vec()));
    }

    /// A stdin larger than a pipe holds, to a CLI that never reads it and
    /// exits (or writes much before reading): neither side waits on the
    /// other.
    #[tokio::test]
    async fn a_stdin_the_cli_does_not_read_blocks_nothing() {
        let _one = ONE_CLI.lock().await;
        let big = vec![b'x'; 4 << 20];
        let r = run(
            sh("exit 3", Some(big.clone())),
            Signal::never(),
            Signal::never(),
            64,
        )
        .await;
        assert_eq!(r.ended, Ended::Exited(3));
        let r = run(
            sh("head -c 1000000 /dev/zero; wc -c", Some(big)),
            Signal::never(),
            Signal::never(),
            64,
        )
        .await;
        assert_eq!(r.ended, Ended::Exited(0));
        assert!(
            String::from_utf8_lossy(&r.stdout)
                .trim_end()
                .ends_with("4194304"),
            "{:?}",
            r.stdout
        );
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_only() {
        let mut t = Tail::new(8);
        t.push(b"hello ");
        t.push(b"world");
        assert_eq!(t.bytes(), b"lo world");
        t.push(&[b'x'; 100]);
        assert_eq!(t.bytes(), &[b'x'; 8]);
        t.push(b"ab");
        assert_eq!(t.bytes(), b"xxxxxxab");
    }
}

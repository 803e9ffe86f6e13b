//! Checks of a turn's life: the abort, and a person running the plugin by
//! hand.

use std::time::{Duration, Instant};

use sharedos_protocol::PLUGIN_COOKIE_ENV;

use super::checks::{Battery, Check, DEFAULT_MAX, check};
use super::session::Recv;
use super::turn;

/// How soon a plugin must exit after `turn/abort` and the end of its input.
const ABORT_EXIT: Duration = Duration::from_secs(2);
/// How soon a plugin run by hand must give up.
const BY_HAND_EXIT: Duration = Duration::from_secs(5);

impl Battery<'_> {
    pub fn abort(&self) -> Check {
        let c = check(
            "abort",
            "1, 4.5",
            "on turn/abort stop at once; exit when stdin reaches end-of-file, and start no process that outlives you",
        );
        c.verdict(self.abort_run())
    }

    fn abort_run(&self) -> Result<String, String> {
        let mut s = self.ready(DEFAULT_MAX, 8)?;
        s.send(&turn::turn_run(turn::calls(1, false)))?;
        let end = Instant::now() + self.step;
        let during_call = loop {
            match s.recv(end.saturating_duration_since(Instant::now())) {
                Recv::Message(v) if v["method"] == "host/invokeTool" => break true,
                Recv::Message(v) if v.get("method").is_none() => break false,
                Recv::Message(..) => continue,
                Recv::Invalid(why) => return Err(format!("wrote {why} on stdout")),
                Recv::Eof => {
                    return Err(format!(
                        "closed stdout mid-turn (stderr: {})",
                        s.stderr_tail()
                    ));
                }
                Recv::Timeout => return Err("neither called a tool nor answered turn/run".into()),
            }
        };
        s.send(&turn::notification("turn/abort"))?;
        let sent = Instant::now();
        s.close_stdin();
        let Some(status) = s.wait_exit(ABORT_EXIT) else {
            return Err(format!(
                "still running {} ms after turn/abort and the end of stdin (the host kills it; a plugin should exit)",
                ABORT_EXIT.as_millis()
            ));
        };
        let left = group_members(s.pid());
        if left > 0 {
            return Err(format!(
                "exited, but left {left} process(es) of its group running"
            ));
        }
        Ok(format!(
            "exited {} ms after turn/abort ({}) with {status}, nothing left in its process group",
            sent.elapsed().as_millis(),
            if during_call {
                "a tool call in flight"
            } else {
                "after its outcome"
            }
        ))
    }

    pub fn by_hand(&self) -> Check {
        let c = check(
            "run_by_hand",
            "1",
            "when SHAREDOS_PLUGIN is not set (or stdin is a terminal), print one line to stderr saying this is a sharedos plugin and exit non-zero",
        );
        let mut spec = self.spec.clone();
        spec.env.retain(|(k, _)| k != PLUGIN_COOKIE_ENV);
        let mut s = match self.launch(&spec) {
            Ok(s) => s,
            Err(e) => return c.fail(e),
        };
        let Some(status) = s.wait_exit(BY_HAND_EXIT) else {
            return c.fail(format!(
                "started without {PLUGIN_COOKIE_ENV}, still running after {} s",
                BY_HAND_EXIT.as_secs()
            ));
        };
        let wrote = matches!(
            s.recv(Duration::from_millis(200)),
            Recv::Message(..) | Recv::Invalid(_)
        );
        s.wait_stderr_end(Duration::from_secs(2));
        let tail = s.stderr_tail();
        if status.success() {
            c.fail(format!(
                "started without {PLUGIN_COOKIE_ENV}, exited 0 (stderr: {tail})"
            ))
        } else if wrote {
            c.fail("started without SHAREDOS_PLUGIN, wrote on stdout")
        } else if tail == "(nothing on stderr)" {
            c.fail(format!("exited with {status} but said nothing on stderr"))
        } else {
            c.pass(format!("exited with {status}: {tail}"))
        }
    }
}

/// Processes whose process group is `pgid` (a direct launch leads its own
/// group; a sandboxed one is gone with its pid namespace).
fn group_members(pgid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
        .count()
}

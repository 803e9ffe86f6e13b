//! Settling a harness turn from how the CLI ended (docs/HARNESS.md, "How a
//! turn ends"): the final message, the outcome and its code, the latch.

use serde_json::{Map, Value, json};
use sharedos_protocol::api_names::ApiNameCollision;
use sharedos_protocol::harness::{FinalMessage, JsonTake, StdoutTake};
use sharedos_protocol::{ProtocolError, Reason, RuntimeTurnOutcome};

use crate::cli::{Ended, Run, StopReason};
use crate::latch::FALLBACK_REASON;

/// The most bytes of a final message read from a file.
pub const MAX_FINAL_FILE_BYTES: u64 = 1 << 20;

/// The most characters of an escalated turn's `metadata.finalMessage`.
pub const MAX_FINAL_IN_METADATA: usize = 4096;

/// What the turn learned, besides the CLI's run.
pub struct Facts {
    pub catalog_hash: String,
    pub escalation: Option<String>,
    pub calls_after_escalation: u64,
}

/// Reads the final message: `file` is the rendered path for
/// `from = "file"`.
pub fn final_message(
    how: &FinalMessage,
    run: &Run,
    file: Option<&std::path::Path>,
) -> Option<String> {
    let text = match how {
        FinalMessage::File { .. } => {
            use std::io::Read;
            let f = std::fs::File::open(file?).ok()?;
            let mut s = String::new();
            f.take(MAX_FINAL_FILE_BYTES).read_to_string(&mut s).ok()?;
            s
        }
        FinalMessage::Stdout { take } => {
            let out = String::from_utf8_lossy(&run.stdout).into_owned();
            match take {
                StdoutTake::All => out,
                StdoutTake::LastLine => last_line(&out)?.to_owned(),
            }
        }
        FinalMessage::Json { pointer, take } => {
            let out = String::from_utf8_lossy(&run.stdout).into_owned();
            let at = |text: &str| -> Option<Value> {
                let v: Value = serde_json::from_str(text).ok()?;
                v.pointer(pointer).filter(|v| !v.is_null()).cloned()
            };
            let found = match take {
                JsonTake::LastLine => at(last_line(&out)?)?,
                JsonTake::Document => at(out.trim())?,
                JsonTake::Lines => out
                    .lines()
                    .rev()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .find_map(at)?,
            };
            match found {
                Value::String(s) => s,
                other => other.to_string(),
            }
        }
    };
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

fn last_line(s: &str) -> Option<&str> {
    s.lines().rev().map(str::trim).find(|l| !l.is_empty())
}

/// The CLI's final message when it exited 0 with one; otherwise the
/// error code and message of how it ended.
fn ending(ended: &Ended, message: Option<String>) -> Result<String, (&'static str, String)> {
    match (ended, message) {
        (Ended::Exited(0), Some(m)) => Ok(m),
        (Ended::Exited(0), None) => Err((
            "harness_no_final_message",
            "The CLI exited 0 without a final message.".into(),
        )),
        (Ended::Exited(c), _) => Err((
            "harness_cli_failed",
            format!("The CLI exited with status {c}."),
        )),
        (Ended::Signaled(s), _) => Err((
            "harness_cli_crashed",
            format!("The CLI was killed by {}.", signal_words(*s)),
        )),
        (
            Ended::Stopped {
                why: StopReason::Drain,
                ..
            },
            _,
        ) => Err((
            "harness_cli_stopped",
            "The turn was drained; the CLI was stopped.".into(),
        )),
        (
            Ended::Stopped {
                why: StopReason::Abort,
                ..
            },
            _,
        ) => Err((
            "harness_cli_stopped",
            "The turn was aborted; the CLI was killed.".into(),
        )),
        (Ended::SpawnFailed(why), _) => Err((
            "harness_cli_unavailable",
            format!("The CLI could not be started: {why}"),
        )),
    }
}

/// Signal `sig` by number and name, and, for a signal the kernel sends at
/// an rlimit, that limit and its value here (the CLI inherits the
/// harness's limits): `signal 24 (SIGXCPU: the CPU-time limit,
/// RLIMIT_CPU = 3600 s, was reached)`.
fn signal_words(sig: i32) -> String {
    use nix::sys::resource::{Resource, getrlimit};
    use nix::sys::signal::Signal;
    let Ok(name) = Signal::try_from(sig) else {
        return format!("signal {sig}");
    };
    let limit = match name {
        Signal::SIGXCPU => Some((
            "the CPU-time limit",
            "RLIMIT_CPU",
            Resource::RLIMIT_CPU,
            " s",
        )),
        Signal::SIGXFSZ => Some((
            "the file-size limit",
            "RLIMIT_FSIZE",
            Resource::RLIMIT_FSIZE,
            " bytes",
        )),
        _ => None,
    };
    match limit {
        Some((what, rlimit, resource, unit)) => {
            let value = getrlimit(resource)
                .map(|(soft, _)| format!(" = {soft}{unit}"))
                .unwrap_or_default();
            format!("signal {sig} ({name}: {what}, {rlimit}{value}, was reached)")
        }
        None => format!("signal {sig} ({name})"),
    }
}

/// The outcome of a turn whose catalogue has two tools the CLI would see
/// under one name: the CLI never starts.
pub fn names_collide(collision: &ApiNameCollision) -> RuntimeTurnOutcome {
    let code = "harness_tool_names_collide";
    let mut meta = Map::new();
    meta.insert("toolshare".into(), json!("mcp"));
    meta.insert("harnessOutcome".into(), json!("fail"));
    meta.insert("harnessErrorCode".into(), json!(code));
    RuntimeTurnOutcome::Fail {
        error: ProtocolError::new(code, &collision.to_string(), Some(false)),
        metadata: Some(meta),
    }
}

/// The outcome of a turn whose command line or environment would hold a
/// NUL byte (a prompt can carry one; no `execve` argument can): the CLI
/// never starts, and the code says why instead of "could not be started".
pub fn nul_in_command_line(what: &str) -> RuntimeTurnOutcome {
    let code = "harness_argument_invalid";
    let message = format!(
        "{what} holds a NUL byte, which a command line or an environment cannot carry; the CLI was not started (remove it from the prompt, or give the CLI the prompt on its stdin, `stdin = \"{{prompt}}\"`, or in a file through the spec's files)"
    );
    let mut meta = Map::new();
    meta.insert("toolshare".into(), json!("mcp"));
    meta.insert("harnessOutcome".into(), json!("fail"));
    meta.insert("harnessErrorCode".into(), json!(code));
    RuntimeTurnOutcome::Fail {
        error: ProtocolError::new(code, &message, Some(false)),
        metadata: Some(meta),
    }
}

/// The outcome of the turn.
pub fn outcome(run: &Run, message: Option<String>, facts: Facts) -> RuntimeTurnOutcome {
    let mut meta = Map::new();
    meta.insert("toolshare".into(), json!("mcp"));
    meta.insert("catalogHash".into(), json!(facts.catalog_hash));
    match &run.ended {
        Ended::Exited(c)
        | Ended::Stopped {
            code: Some(c),
            signal: None,
            ..
        } => {
            meta.insert("exitCode".into(), json!(c));
        }
        Ended::Signaled(s)
        | Ended::Stopped {
            signal: Some(s), ..
        } => {
            meta.insert("signal".into(), json!(s));
        }
        _ => {}
    }
    // A CLI the drain stopped says so, even when it then exited 0 and its
    // final message completes the turn.
    if run.drained {
        meta.insert("drained".into(), json!(true));
    }
    // An escalated turn has no output: its final message, if any, goes to
    // the reviewer in the metadata, cut to 4096 characters.
    let said: Option<String> = message
        .as_ref()
        .map(|m| m.chars().take(MAX_FINAL_IN_METADATA).collect());
    let ending = ending(&run.ended, message);
    if let Some(reason) = facts.escalation {
        // A clean exit after the ask counts as complete: the CLI was told
        // the turn is over and may end with or without a message.
        let clean = matches!(run.ended, Ended::Exited(0));
        meta.insert(
            "harnessOutcome".into(),
            json!(if clean { "complete" } else { "fail" }),
        );
        if let (Err((code, _)), false) = (&ending, clean) {
            meta.insert("harnessErrorCode".into(), json!(code));
        }
        meta.insert(
            "callsAfterEscalation".into(),
            json!(facts.calls_after_escalation),
        );
        if let Some(m) = said {
            meta.insert("finalMessage".into(), json!(m));
        }
        let reason = Reason::new(&reason)
            .or_else(|_| Reason::new(FALLBACK_REASON))
            .unwrap_or_else(|_| unreachable!("the fallback reason is valid"));
        return RuntimeTurnOutcome::Escalate {
            reason,
            metadata: Some(meta),
        };
    }
    match ending {
        Ok(text) => {
            meta.insert("harnessOutcome".into(), json!("complete"));
            RuntimeTurnOutcome::Complete {
                output: Value::String(text),
                metadata: Some(meta),
            }
        }
        Err((code, message)) => {
            meta.insert("harnessOutcome".into(), json!("fail"));
            meta.insert("harnessErrorCode".into(), json!(code));
            RuntimeTurnOutcome::Fail {
                error: ProtocolError::new(code, &message, Some(false)),
                metadata: Some(meta),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ended: Ended, stdout: &str) -> Run {
        Run {
            ended,
            drained: false,
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
        }
    }

    fn facts() -> Facts {
        Facts {
            catalog_hash: "h".into(),
            escalation: None,
            calls_after_escalation: 0,
        }
    }

    fn code(o: &RuntimeTurnOutcome) -> String {
        match o {
            RuntimeTurnOutcome::Fail { error, .. } => error.code.as_str().to_owned(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn each_ending_maps_to_its_outcome() {
        let last = FinalMessage::Stdout {
            take: StdoutTake::LastLine,
        };
        let r = run(Ended::Exited(0), "progress\n\nthe answer\n\n");
        let m = final_message(&last, &r, None);
        assert_eq!(m.as_deref(), Some("the answer"));
        assert!(
            matches!(outcome(&r, m, facts()), RuntimeTurnOutcome::Complete { output, .. } if output == "the answer")
        );
        assert_eq!(
            code(&outcome(&run(Ended::Exited(0), ""), None, facts())),
            "harness_no_final_message"
        );
        assert_eq!(
            code(&outcome(
                &run(Ended::Exited(3), "x"),
                Some("x".into()),
                facts()
            )),
            "harness_cli_failed"
        );
        assert_eq!(
            code(&outcome(&run(Ended::Signaled(11), ""), None, facts())),
            "harness_cli_crashed"
        );
        assert_eq!(signal_words(11), "signal 11 (SIGSEGV)");
        let n = nix::sys::signal::Signal::SIGXCPU as i32;
        let xcpu = signal_words(n);
        assert!(
            xcpu.starts_with(&format!(
                "signal {n} (SIGXCPU: the CPU-time limit, RLIMIT_CPU"
            )),
            "{xcpu}"
        );
        assert_eq!(signal_words(99), "signal 99");
        assert_eq!(
            code(&outcome(
                &run(
                    Ended::Stopped {
                        why: StopReason::Abort,
                        code: None,
                        signal: Some(9),
                    },
                    ""
                ),
                None,
                facts()
            )),
            "harness_cli_stopped"
        );
        assert_eq!(
            code(&outcome(
                &run(Ended::SpawnFailed("x".into()), ""),
                None,
                facts()
            )),
            "harness_cli_unavailable"
        );
    }

    #[test]
    fn json_final_messages_take_the_pointer() {
        let how = FinalMessage::Json {
            pointer: "/result".into(),
            take: JsonTake::LastLine,
        };
        let r = run(
            Ended::Exited(0),
            "{\"type\":\"x\"}\n{\"type\":\"result\",\"result\":\"done\"}\n",
        );
        assert_eq!(final_message(&how, &r, None).as_deref(), Some("done"));
        let r = run(Ended::Exited(0), "not json\n");
        assert_eq!(final_message(&how, &r, None), None);
    }

    /// Pretty-printed JSON across lines (Gemini CLI's `--output-format
    /// json`): only `take = "document"` reads it; the last line alone is
    /// `}`.
    #[test]
    fn a_pretty_printed_document_is_read_whole() {
        let stdout = "{\n  \"response\": \"done\",\n  \"stats\": {\"n\": 2}\n}\n";
        let r = run(Ended::Exited(0), stdout);
        let doc = |pointer: &str| FinalMessage::Json {
            pointer: pointer.into(),
            take: JsonTake::Document,
        };
        assert_eq!(
            final_message(&doc("/response"), &r, None).as_deref(),
            Some("done")
        );
        assert_eq!(
            final_message(&doc("/stats"), &r, None).as_deref(),
            Some("{\"n\":2}")
        );
        assert_eq!(final_message(&doc("/missing"), &r, None), None);
        let last = FinalMessage::Json {
            pointer: "/response".into(),
            take: JsonTake::LastLine,
        };
        assert_eq!(final_message(&last, &r, None), None);
        // Text before the document is no document.
        let r = run(Ended::Exited(0), &format!("warning: x\n{stdout}"));
        assert_eq!(final_message(&doc("/response"), &r, None), None);
    }

    /// JSON lines: the last line that parses and has the pointer, skipping
    /// later lines that are not JSON, lack the field or hold null.
    #[test]
    fn json_lines_take_the_last_line_with_the_pointer() {
        let how = FinalMessage::Json {
            pointer: "/part/text".into(),
            take: JsonTake::Lines,
        };
        let r = run(
            Ended::Exited(0),
            "{\"part\":{\"text\":\"first\"}}\n{\"part\":{\"text\":\"second\"}}\n{\"type\":\"step_finish\"}\n{\"part\":{\"text\":null}}\nnot json\n\n",
        );
        assert_eq!(final_message(&how, &r, None).as_deref(), Some("second"));
        let any = FinalMessage::Json {
            pointer: String::new(),
            take: JsonTake::Lines,
        };
        assert_eq!(
            final_message(&any, &r, None).as_deref(),
            Some("{\"part\":{\"text\":null}}")
        );
        let r = run(Ended::Exited(0), "no json at all\n");
        assert_eq!(final_message(&how, &r, None), None);
    }

    #[test]
    fn a_set_latch_escalates_with_the_facts() {
        let f = Facts {
            escalation: Some("why".into()),
            calls_after_escalation: 2,
            ..facts()
        };
        let o = outcome(&run(Ended::Exited(0), ""), None, f);
        let RuntimeTurnOutcome::Escalate { reason, metadata } = o else {
            panic!("{o:?}")
        };
        assert_eq!(reason.as_str(), "why");
        let m = metadata.unwrap();
        assert_eq!(m["harnessOutcome"], "complete");
        assert_eq!(m["callsAfterEscalation"], 2);
        assert!(m.get("harnessErrorCode").is_none());
    }
}

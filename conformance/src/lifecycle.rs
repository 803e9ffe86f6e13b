//! A person running the plugin by hand.

use std::time::Duration;

use sharedos_protocol::PLUGIN_COOKIE_ENV;

use super::checks::{Battery, Check, check};
use super::session::Recv;

/// How soon a plugin run by hand must give up.
const BY_HAND_EXIT: Duration = Duration::from_secs(5);

impl Battery<'_> {
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

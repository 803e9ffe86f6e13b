//! `[serve.retention]` of host.toml: how long ended runs and closed
//! sessions are kept before the sweep deletes them (docs/SERVE.md,
//! "Deletion"). Audit records are never deleted.
//!
//! ```toml
//! [serve.retention]
//! endedRunsDays = 30       # a run ended (or interrupted) this long ago is deleted
//! closedSessionsDays = 90  # a session closed this long ago is deleted with its runs
//! ```

use serde::{Deserialize, Serialize};

/// The longest retention accepted, in days (100 years).
const MAX_DAYS: u32 = 36_500;

/// Retention by age; each absent keeps forever.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetentionSection {
    #[serde(default)]
    pub ended_runs_days: Option<u32>,
    #[serde(default)]
    pub closed_sessions_days: Option<u32>,
}

impl RetentionSection {
    pub(super) fn check(&self) -> Result<(), String> {
        for (key, days) in [
            ("endedRunsDays", self.ended_runs_days),
            ("closedSessionsDays", self.closed_sessions_days),
        ] {
            if let Some(d) = days
                && !(1..=MAX_DAYS).contains(&d)
            {
                return Err(format!(
                    "serve.retention.{key}: must be 1..={MAX_DAYS} days (leave it out to keep forever), got {d}"
                ));
            }
        }
        Ok(())
    }

    /// Whether anything is ever swept.
    pub fn sweeps(&self) -> bool {
        self.ended_runs_days.is_some() || self.closed_sessions_days.is_some()
    }

    /// The cutoffs at `now_ms` (milliseconds since the Unix epoch): ended
    /// runs and closed sessions before them are deleted.
    pub fn cutoffs(&self, now_ms: i64) -> (Option<i64>, Option<i64>) {
        let before = |days: Option<u32>| days.map(|d| now_ms - i64::from(d) * 86_400_000);
        (
            before(self.ended_runs_days),
            before(self.closed_sessions_days),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_out_of_range_are_refused_by_name_and_cutoffs_are_whole_days() {
        for (runs, sessions, key) in [
            (Some(0), None, "endedRunsDays"),
            (None, Some(MAX_DAYS + 1), "closedSessionsDays"),
        ] {
            let r = RetentionSection {
                ended_runs_days: runs,
                closed_sessions_days: sessions,
            };
            let e = r.check().unwrap_err();
            assert!(e.contains(key), "{e}");
        }
        let r = RetentionSection {
            ended_runs_days: Some(7),
            closed_sessions_days: None,
        };
        assert!(r.check().is_ok() && r.sweeps());
        assert_eq!(r.cutoffs(10 * 86_400_000), (Some(3 * 86_400_000), None));
        assert!(!RetentionSection::default().sweeps());
        let parsed: Result<RetentionSection, _> = toml::from_str("endedRunDays = 3");
        assert!(parsed.is_err(), "an unknown key is refused");
    }
}

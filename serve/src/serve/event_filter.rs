//! `GET /v1/runs/{id}/events?types=…`: which event kinds a stream carries
//! (docs/SERVE.md, "Events"). Each entry is an exact kind
//! (`tool.completed`) or a prefix ending in `.*` (`turn.*`); the events
//! left out keep their place in the journal, so the sequences a filtered
//! stream carries are the journal's, with gaps.

use super::listing::{Refusal, percent_decode};

/// The most entries `types` may hold, and the longest one.
pub const MAX_TYPES: usize = 64;
const MAX_TYPE_CHARS: usize = 128;

/// The kinds a stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindFilter {
    exact: Vec<String>,
    /// Each with its trailing `.` (`turn.` for `turn.*`).
    prefixes: Vec<String>,
}

fn refused(message: impl Into<String>) -> Refusal {
    Refusal::Query {
        code: "invalid_types",
        message: message.into(),
    }
}

impl KindFilter {
    /// The filter `types` in `query` names; `None` without one (every
    /// event).
    pub fn from_query(query: Option<&str>) -> Result<Option<Self>, Refusal> {
        let mut given = None;
        for pair in query.unwrap_or_default().split('&') {
            if let Some(value) = pair.strip_prefix("types=") {
                if given.is_some() {
                    return Err(refused(
                        "types is given more than once: list every kind in one",
                    ));
                }
                given = Some(percent_decode(value)?);
            }
        }
        given.map(|text| Self::parse(&text)).transpose()
    }

    fn parse(text: &str) -> Result<Self, Refusal> {
        let entries: Vec<&str> = text.split(',').collect();
        if entries.len() > MAX_TYPES {
            return Err(refused(format!(
                "types lists {} kinds; at most {MAX_TYPES}",
                entries.len()
            )));
        }
        let mut filter = KindFilter {
            exact: Vec::new(),
            prefixes: Vec::new(),
        };
        for entry in entries {
            let (name, prefix) = match entry.strip_suffix(".*") {
                Some(p) => (p, true),
                None => (entry, false),
            };
            let well_formed = !name.is_empty()
                && name.len() <= MAX_TYPE_CHARS
                && !name.starts_with('.')
                && !name.ends_with('.')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !well_formed {
                let shown: String = entry.chars().take(64).collect();
                return Err(refused(format!(
                    "types entry {shown:?} is not an event kind (letters, digits, `.`, `_`, `-`; at most {MAX_TYPE_CHARS}) or a kind prefix ending in `.*`, e.g. types=tool.completed,turn.*"
                )));
            }
            if prefix {
                filter.prefixes.push(format!("{name}."));
            } else {
                filter.exact.push(name.to_owned());
            }
        }
        Ok(filter)
    }

    /// Whether a stream under this filter carries an event of `kind`.
    pub fn admits(&self, kind: &str) -> bool {
        self.exact.iter().any(|k| k == kind) || self.prefixes.iter().any(|p| kind.starts_with(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_kinds_and_prefixes_are_told_apart() {
        let f = KindFilter::parse("tool.completed,turn.*").unwrap();
        assert!(f.admits("tool.completed"));
        assert!(!f.admits("tool.requested"));
        assert!(f.admits("turn.started"));
        assert!(!f.admits("turnover"));
        assert!(!f.admits("turn"));
        for bad in [
            "", "a,,b", "*", ".*", "tool.*.*", "a b", "tool.", ".tool", "a\0",
        ] {
            assert!(KindFilter::parse(bad).is_err(), "{bad:?}");
        }
    }
}

//! Tool names as model APIs accept them. OpenAI's function names and
//! Anthropic's tool names allow only `^[a-zA-Z0-9_-]{1,64}$`; a catalogue
//! name such as `files.write` does not match. Whatever hands the catalogue
//! to a model, or to a client that passes names on to one (the standard
//! runtime's model drivers, the harness's MCP server), offers the name
//! [`api_tool_name`] makes and maps it back with one [`ApiNames`] table.
//!
//! The mapping: `.` becomes `__`, any other character outside the pattern
//! becomes `_`, and a name longer than 64 characters keeps its first 55
//! and ends in `_` and eight hex digits of a hash of the whole name. Two
//! catalogue names that map to the same API name are refused
//! ([`ApiNameCollision`]), so the table maps both ways without loss.

use std::collections::HashMap;

/// The longest name the APIs accept.
pub const API_NAME_MAX: usize = 64;

/// Whether `name` matches `^[a-zA-Z0-9_-]{1,64}$`.
pub fn is_api_tool_name(name: &str) -> bool {
    (1..=API_NAME_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The API name of catalogue tool `name` (see the module's text).
pub fn api_tool_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => out.push(c),
            '.' => out.push_str("__"),
            _ => out.push('_'),
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    if out.len() > API_NAME_MAX {
        // Only ASCII is left, so a byte index is a character boundary.
        out.truncate(API_NAME_MAX - 9);
        out.push_str(&format!("_{:08x}", fnv1a(name.as_bytes())));
    }
    out
}

/// FNV-1a, 32 bits: a stable, dependency-free hash for shortened names.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Two catalogue tools whose API names are the same.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "tools `{first}` and `{second}` both become `{api}`, the only form of their names model APIs \
     accept; rename one of them (or leave one out of the turn's catalogue)"
)]
pub struct ApiNameCollision {
    pub first: String,
    pub second: String,
    pub api: String,
}

/// A catalogue's names both ways: catalogue name to API name and back.
#[derive(Clone, Debug, Default)]
pub struct ApiNames {
    to_api: HashMap<String, String>,
    to_catalogue: HashMap<String, String>,
}

impl ApiNames {
    /// The table of `names` (a name listed twice counts once); refused
    /// when two names map to the same API name.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, ApiNameCollision> {
        let mut table = Self::default();
        for name in names {
            if table.to_api.contains_key(name) {
                continue;
            }
            let api = api_tool_name(name);
            if let Some(first) = table.to_catalogue.get(&api) {
                return Err(ApiNameCollision {
                    first: first.clone(),
                    second: name.to_owned(),
                    api,
                });
            }
            table.to_catalogue.insert(api.clone(), name.to_owned());
            table.to_api.insert(name.to_owned(), api);
        }
        Ok(table)
    }

    /// The API name of catalogue tool `name`, if the catalogue holds it.
    pub fn api(&self, name: &str) -> Option<&str> {
        self.to_api.get(name).map(String::as_str)
    }

    /// The catalogue name API name `api` stands for, if any.
    pub fn catalogue(&self, api: &str) -> Option<&str> {
        self.to_catalogue.get(api).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_names_become_api_names() {
        for (name, api) in [
            ("files.write", "files__write"),
            ("sharedos.escalate", "sharedos__escalate"),
            ("read_file", "read_file"),
            ("a-b.c.d", "a-b__c__d"),
            ("ünï cödé/x", "_n__c_d__x"),
        ] {
            assert_eq!(api_tool_name(name), api, "{name}");
            assert!(is_api_tool_name(api), "{api}");
        }
    }

    #[test]
    fn every_name_maps_into_the_pattern_and_long_ones_stay_apart() {
        let long_a = format!("{}.a", "x".repeat(200));
        let long_b = format!("{}.b", "x".repeat(200));
        for name in [&long_a, &long_b, &"é".repeat(256), &" ".to_owned()] {
            let api = api_tool_name(name);
            assert!(is_api_tool_name(&api), "{name:?} -> {api:?}");
        }
        assert_eq!(api_tool_name(&long_a).len(), API_NAME_MAX);
        assert_ne!(api_tool_name(&long_a), api_tool_name(&long_b));
        assert!(!is_api_tool_name("files.write"));
        assert!(!is_api_tool_name(""));
        assert!(!is_api_tool_name(&"a".repeat(65)));
    }

    #[test]
    fn the_table_maps_both_ways_and_refuses_a_collision() {
        let t = ApiNames::new(["files.write", "files.read", "files.write"]).unwrap();
        assert_eq!(t.api("files.write"), Some("files__write"));
        assert_eq!(t.catalogue("files__read"), Some("files.read"));
        assert_eq!(t.catalogue("files.read"), None);
        assert_eq!(t.api("files.delete"), None);
        let e = ApiNames::new(["ledger.slow", "files.read", "ledger__slow"]).unwrap_err();
        assert_eq!(
            e,
            ApiNameCollision {
                first: "ledger.slow".into(),
                second: "ledger__slow".into(),
                api: "ledger__slow".into(),
            }
        );
        assert!(e.to_string().contains("rename one of them"), "{e}");
    }
}

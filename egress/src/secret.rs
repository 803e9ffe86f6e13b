//! Secrets by reference (`env:NAME`, `file:/path`), resolved in the host
//! only, and a value type that never prints.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a secret comes from. Only the reference is in host.toml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum SecretRef {
    Env(String),
    File(std::path::PathBuf),
}

impl TryFrom<String> for SecretRef {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        if let Some(name) = text.strip_prefix("env:") {
            let ok =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            return if ok {
                Ok(SecretRef::Env(name.to_owned()))
            } else {
                Err(format!("secret env:{name:?}: not a variable name"))
            };
        }
        if let Some(path) = text.strip_prefix("file:") {
            let path = std::path::PathBuf::from(path);
            return if path.is_absolute() {
                Ok(SecretRef::File(path))
            } else {
                Err("secret file:<path>: the path must be absolute".into())
            };
        }
        // The value itself is never echoed: it may be a pasted key.
        Err("secret: write a reference, env:NAME or file:/absolute/path, never the key".into())
    }
}

impl From<SecretRef> for String {
    fn from(r: SecretRef) -> String {
        match r {
            SecretRef::Env(n) => format!("env:{n}"),
            SecretRef::File(p) => format!("file:{}", p.display()),
        }
    }
}

/// A resolved secret. Debug and Display redact; only
/// [`Secret::expose`] gives the value, for the upstream request.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl SecretRef {
    /// Reads the secret from the host's environment or file. The error
    /// names the reference, never a value.
    pub fn resolve(&self) -> Result<Secret, String> {
        let raw = match self {
            SecretRef::Env(name) => std::env::var(name)
                .map_err(|_| format!("secret env:{name}: the variable is not set in the host"))?,
            SecretRef::File(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("secret file:{}: cannot be read: {e}", path.display()))?,
        };
        let value = raw.trim();
        if value.is_empty() {
            return Err(format!("secret {}: is empty", String::from(self.clone())));
        }
        // A key that would break a header line is refused, not sent.
        if value.chars().any(|c| c.is_control()) {
            return Err(format!(
                "secret {}: holds control characters",
                String::from(self.clone())
            ));
        }
        Ok(Secret(value.to_owned()))
    }
}

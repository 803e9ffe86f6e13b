//! `[serve]` of host.toml: what `sharedos serve` alone reads
//! (docs/SERVE.md, docs/STORE.md, "Data at rest").
//!
//! ```toml
//! [serve]
//! allowSharedStore = false   # true: start on a store others may read (not advised)
//! ```

use serde::{Deserialize, Serialize};

/// Options of `sharedos serve`; every one has a default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServeSection {
    /// Start even when the SQLite store, its WAL/SHM or the files root is
    /// readable or writable by group or others, or owned by another user.
    /// Off by default: `serve` refuses such a store, naming the path.
    #[serde(default)]
    pub allow_shared_store: bool,
}

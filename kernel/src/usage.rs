//! Use counters for bounded grants (`maxUses`).
//!
//! A use is taken on execution only (admission, the exact re-authorization
//! of a call), never on discovery or listing. `try_consume` is atomic.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

/// Counts the uses of bounded grants. `try_consume` must be atomic: two
/// concurrent calls on a grant with one use left never both succeed.
#[async_trait]
pub trait UsageStore: Send + Sync {
    /// Takes one use if one is left. `Ok(false)` when exhausted.
    async fn try_consume(&self, grant_id: &str, max_uses: u64) -> Result<bool, String>;
    /// Uses left, without taking one (discovery).
    async fn remaining(&self, grant_id: &str, max_uses: u64) -> Result<u64, String>;
}

/// The embedded usage store: in memory, for one host process.
#[derive(Debug, Default)]
pub struct MemoryUsageStore {
    used: Mutex<HashMap<String, u64>>,
}

impl MemoryUsageStore {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl UsageStore for MemoryUsageStore {
    async fn try_consume(&self, grant_id: &str, max_uses: u64) -> Result<bool, String> {
        let mut used = self
            .used
            .lock()
            .map_err(|_| "usage store lock poisoned".to_owned())?;
        let n = used.entry(grant_id.to_owned()).or_insert(0);
        if *n >= max_uses {
            return Ok(false);
        }
        *n += 1;
        Ok(true)
    }
    async fn remaining(&self, grant_id: &str, max_uses: u64) -> Result<u64, String> {
        let used = self
            .used
            .lock()
            .map_err(|_| "usage store lock poisoned".to_owned())?;
        Ok(max_uses.saturating_sub(used.get(grant_id).copied().unwrap_or(0)))
    }
}

/// A durable usage store: one JSON line (the grant id) per use taken,
/// appended and `fsync`ed before the use counts, so a restart keeps every
/// grant's count. One host process per file.
#[derive(Debug, Clone)]
pub struct JsonlUsageStore {
    inner: Arc<Mutex<(File, HashMap<String, u64>)>>,
}

impl JsonlUsageStore {
    /// Opens (creating) the file and counts the uses it records. A torn
    /// last line (a crash mid-write, never acknowledged) is cut.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let path = path.as_ref();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        crate::audit::repair_tail(&mut file)?;
        let text = std::fs::read_to_string(path)?;
        let mut used = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let id: String = serde_json::from_str(line).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}:{}: {e}", path.display(), i + 1),
                )
            })?;
            *used.entry(id).or_insert(0) += 1;
        }
        Ok(Self {
            inner: Arc::new(Mutex::new((file, used))),
        })
    }
}

#[async_trait]
impl UsageStore for JsonlUsageStore {
    async fn try_consume(&self, grant_id: &str, max_uses: u64) -> Result<bool, String> {
        let inner = Arc::clone(&self.inner);
        let id = grant_id.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut guard = inner
                .lock()
                .map_err(|_| "usage store lock poisoned".to_owned())?;
            let (file, used) = &mut *guard;
            if used.get(&id).copied().unwrap_or(0) >= max_uses {
                return Ok(false);
            }
            let mut line = serde_json::to_vec(&id).map_err(|e| e.to_string())?;
            line.push(b'\n');
            crate::audit::write_line(file, &line).map_err(|e| e.to_string())?;
            *used.entry(id).or_insert(0) += 1;
            Ok(true)
        })
        .await
        .map_err(|e| format!("usage store task: {e}"))?
    }

    async fn remaining(&self, grant_id: &str, max_uses: u64) -> Result<u64, String> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| "usage store lock poisoned".to_owned())?;
        Ok(max_uses.saturating_sub(guard.1.get(grant_id).copied().unwrap_or(0)))
    }
}

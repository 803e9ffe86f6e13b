//! The turn's annotation store: insertion order, last write wins, bounded
//! in keys and bytes (a key's bytes are its length plus its value's
//! serialized length), and charged to the turn's byte ledger.

use std::sync::Mutex;

use serde_json::Value;
use sharedos_protocol::Identifier;

use super::ledger::{ByteLedger, serialized_len, value_held_bytes};
use super::lock;
use crate::limits::RESERVED_EVENT_BYTES;

/// The store's bounds (`ExecutorOptions::max_annotation_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AnnotationBounds {
    pub max_keys: usize,
    pub max_bytes: usize,
}

#[derive(Default)]
struct Store {
    entries: Vec<Annotation>,
    bytes: usize,
    dropped: u64,
}

struct Annotation {
    key: String,
    value: Value,
    /// Its bytes in the store's own bound.
    size: usize,
    /// Its bytes in the turn's ledger.
    held: usize,
}

/// What the plugin stated about its turn (B.4).
pub(crate) struct Annotations {
    store: Mutex<Store>,
    bounds: AnnotationBounds,
}

impl Annotations {
    pub fn new(bounds: AnnotationBounds) -> Self {
        Self {
            store: Mutex::new(Store::default()),
            bounds,
        }
    }

    /// Stores an annotation, the last write to a key winning and the first
    /// fixing its position. A new key past the store's bounds, or a new
    /// value that would take the store or `ledger` past its bytes, is
    /// dropped and counted, with a warning in the log. It is never an
    /// error to the plugin: `annotate` never refuses on the state of the
    /// host (ADR 0007), so a call site needs no guard and stating a fact
    /// cannot become a failed turn. The keys the envelope defines
    /// (`promptHash`, `escalationAsked`) are small and stated early, so in
    /// practice only a plugin that floods the store loses anything, and
    /// what it loses is its own later writes.
    pub fn write(&self, key: &str, value: Value, ledger: &ByteLedger, execution_id: &Identifier) {
        let size = key.len().saturating_add(serialized_len(&value));
        let held = key.len().saturating_add(value_held_bytes(&value));
        let mut store = lock(&self.store);
        let kept = if let Some(i) = store.entries.iter().position(|a| a.key == key) {
            self.replace(&mut store, i, value, size, held, ledger)
        } else if store.entries.len() < self.bounds.max_keys
            && store.bytes.saturating_add(size) <= self.bounds.max_bytes
            && ledger.try_charge(held, RESERVED_EVENT_BYTES)
        {
            store.entries.push(Annotation {
                key: key.to_owned(),
                value,
                size,
                held,
            });
            store.bytes += size;
            true
        } else {
            false
        };
        if !kept {
            store.dropped += 1;
            if store.dropped == 1 {
                tracing::warn!(
                    execution_id = %execution_id,
                    key,
                    keys = store.entries.len(),
                    bytes = store.bytes,
                    "the annotation store of the turn is full; dropping the write"
                );
            }
        }
    }

    /// A new value for the key at `i`: only growth is charged, and the
    /// ledger gets back what shrinks.
    fn replace(
        &self,
        store: &mut Store,
        i: usize,
        value: Value,
        size: usize,
        held: usize,
        ledger: &ByteLedger,
    ) -> bool {
        let total = store.bytes - store.entries[i].size + size;
        let was = store.entries[i].held;
        let fits = total <= self.bounds.max_bytes
            && (held <= was || ledger.try_charge(held - was, RESERVED_EVENT_BYTES));
        if fits {
            ledger.release(was.saturating_sub(held));
            let entry = &mut store.entries[i];
            entry.value = value;
            entry.size = size;
            entry.held = held;
            store.bytes = total;
        }
        fits
    }

    /// The annotations in insertion order.
    pub fn entries(&self) -> Vec<(String, Value)> {
        lock(&self.store)
            .entries
            .iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect()
    }

    /// How many writes the store dropped for its bounds.
    pub fn dropped(&self) -> u64 {
        lock(&self.store).dropped
    }
}

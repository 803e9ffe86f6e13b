//! The lease a host process holds on its host id, and the epoch that
//! fences its writes (docs/STORE.md, "Recovery across machines").
//!
//! A store starts without a lease and fences nothing (the `grants` command,
//! an embedding host, the benches). `acquire_lease` sets it; from then on
//! every run write checks, in its own transaction, that the row of its host
//! id still has the epoch this process took. Expiry only says when others
//! may take over; safety comes from the epoch alone, so a clock that jumps
//! can make a takeover early or late, never let a fenced write through.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::StoreError;
use crate::recovery::RecoveredRun;

/// The lease this process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub host_id: String,
    /// Grows by one at each start under this host id and at each takeover.
    pub epoch: i64,
    /// How long a renewal keeps it alive.
    pub duration: Duration,
}

impl Lease {
    pub(crate) fn fenced(&self) -> StoreError {
        StoreError::Fenced {
            host_id: self.host_id.clone(),
            epoch: self.epoch,
        }
    }

    pub(crate) fn duration_ms(&self) -> i64 {
        duration_ms(self.duration)
    }
}

/// What taking a lease did.
#[derive(Debug, Clone, PartialEq)]
pub struct Acquired {
    pub lease: Lease,
    /// The lease was unexpired when this process took it: another process
    /// may still be running under this host id; it is fenced now.
    pub was_live: bool,
    /// The runs earlier processes under this host id left in flight.
    pub recovered: Vec<RecoveredRun>,
}

/// The lease of one store (shared by its clones).
#[derive(Clone, Default)]
pub(crate) struct LeaseCell(Arc<RwLock<Option<Lease>>>);

impl LeaseCell {
    /// The lease to fence a write with; `None` before `acquire_lease`.
    pub(crate) fn get(&self) -> Option<Lease> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set(&self, lease: Lease) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(lease);
    }

    /// The lease a lease operation needs.
    pub(crate) fn required(&self) -> Result<Lease, StoreError> {
        self.get().ok_or_else(|| {
            StoreError::Unavailable(
                "this store holds no lease: call acquire_lease before renewing or taking over"
                    .into(),
            )
        })
    }
}

pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

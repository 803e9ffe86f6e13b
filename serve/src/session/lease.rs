//! This host's lease, as the sessions see it: held (with its epoch) or
//! lost. A host whose lease was taken over admits no new run; the store
//! refuses every write it would still make for the runs it had
//! (docs/STORE.md, "Recovery across machines").

use std::time::Duration;

use serde::Serialize;
use sharedos_store::{Acquired, StoreError};

use super::{SessionError, Sessions, now};

/// What `/v1/health` reports of the lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseStatus {
    pub host_id: String,
    /// The epoch this process took; `None` before it took one.
    pub epoch: Option<i64>,
    pub duration_ms: Option<u64>,
    /// Why the lease was lost; `None` while it holds.
    pub lost: Option<String>,
}

impl Sessions {
    /// Takes this host id's lease and reconciles the runs earlier
    /// processes under it left in flight (never re-run), in one store
    /// transaction.
    pub async fn acquire_lease(&self, duration: Duration) -> Result<Acquired, SessionError> {
        let acquired = self
            .store
            .acquire_lease(&self.host_id, duration, &now())
            .await?;
        let mut status = self.lock_lease();
        status.epoch = Some(acquired.lease.epoch);
        status.duration_ms = Some(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
        status.lost = None;
        Ok(acquired)
    }

    /// Records that the lease is lost: no run is admitted from now on.
    /// Returns `true` the first time.
    pub fn lose_lease(&self, why: &StoreError) -> bool {
        let mut status = self.lock_lease();
        if status.lost.is_some() {
            return false;
        }
        status.lost = Some(why.to_string());
        true
    }

    pub fn lease_status(&self) -> LeaseStatus {
        let mut status = self.lock_lease().clone();
        status.host_id = self.host_id.clone();
        status
    }

    /// `LeaseLost` once the lease is lost.
    pub(super) fn check_lease(&self) -> Result<(), SessionError> {
        match &self.lock_lease().lost {
            Some(why) => Err(SessionError::LeaseLost(why.clone())),
            None => Ok(()),
        }
    }

    fn lock_lease(&self) -> std::sync::MutexGuard<'_, LeaseStatus> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }
}

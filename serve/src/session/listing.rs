//! Listing the caller scope's sessions and a session's runs, a page at a
//! time (docs/SERVE.md, "Listing sessions and runs"). The scope is the
//! caller's, never a request's filter: a page holds only sessions opened
//! under exactly that scope, and a session of another scope is not found.

use sharedos_store::{Keyset, RunQuery, RunRecord, RunState, SessionQuery, SessionRecord};

use super::{Scope, SessionError, Sessions, request, to_value};

/// A page and where the next one starts (`None` after the last page).
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<Keyset>,
}

/// The filters and the page a listing asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter<S> {
    pub state: Option<S>,
    pub range: sharedos_store::TimeRange,
    pub after: Option<Keyset>,
    pub limit: usize,
}

/// `limit` items and the key of the last one when more follow: the store is
/// asked for one more than the page holds.
fn page<T>(mut items: Vec<T>, limit: usize, key: impl Fn(&T) -> Keyset) -> Page<T> {
    let more = items.len() > limit;
    items.truncate(limit);
    let next = if more { items.last().map(key) } else { None };
    Page { items, next }
}

/// A stored time in milliseconds since the Unix epoch (the order the store
/// pages in).
pub(super) fn millis(at: &str) -> i64 {
    let t = sharedos_protocol::Timestamp::parse(at)
        .map(|t| t.to_offset())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

impl Sessions {
    /// The sessions opened under `scope`, `open` or closed ones only when
    /// asked, in creation order.
    pub async fn list_sessions(
        &self,
        scope: &Scope,
        filter: ListFilter<bool>,
    ) -> Result<Page<SessionRecord>, SessionError> {
        scope.check()?;
        let query = SessionQuery {
            scope: to_value(scope)?,
            open: filter.state,
            created: filter.range,
            after: filter.after,
            limit: filter.limit.saturating_add(1),
        };
        let items = self.store.list_sessions(&query).await?;
        Ok(page(items, filter.limit, |s| Keyset {
            at_ms: millis(&s.created_at),
            id: s.id.clone(),
        }))
    }

    /// The runs of a session `scope` may see, in admission order.
    pub async fn list_runs(
        &self,
        scope: &Scope,
        session_id: &str,
        filter: ListFilter<RunState>,
    ) -> Result<Page<RunRecord>, SessionError> {
        request::check_issued_id("session", session_id)?;
        self.session(scope, session_id).await?;
        let query = RunQuery {
            session_id: session_id.to_owned(),
            state: filter.state,
            admitted: filter.range,
            after: filter.after,
            limit: filter.limit.saturating_add(1),
        };
        let items = self.store.list_runs(&query).await?;
        Ok(page(items, filter.limit, |r| Keyset {
            at_ms: millis(&r.admitted_at),
            id: r.id.clone(),
        }))
    }

    /// Deletes a run `scope` may see that is no longer in flight, with its
    /// journal; its audit records are kept (docs/SERVE.md, "Deletion").
    pub async fn delete_run(&self, scope: &Scope, run_id: &str) -> Result<(), SessionError> {
        self.get_run(scope, run_id).await?;
        self.store.delete_run(run_id).await?;
        Ok(())
    }

    /// Deletes a closed session `scope` may see, with its runs and their
    /// journals; audit records are kept (docs/SERVE.md, "Deletion").
    pub async fn delete_session(&self, scope: &Scope, id: &str) -> Result<(), SessionError> {
        self.session(scope, id).await?;
        self.store.delete_session(id).await?;
        Ok(())
    }

    /// The session and its active run: the id of its earliest-admitted run
    /// still in flight, `None` when none is.
    pub async fn session_with_active_run(
        &self,
        scope: &Scope,
        id: &str,
    ) -> Result<(SessionRecord, Option<String>), SessionError> {
        let session = self.session(scope, id).await?;
        let query = RunQuery {
            session_id: session.id.clone(),
            state: Some(RunState::InFlight),
            admitted: Default::default(),
            after: None,
            limit: 1,
        };
        let active = self.store.list_runs(&query).await?;
        Ok((session, active.into_iter().next().map(|r| r.id)))
    }
}

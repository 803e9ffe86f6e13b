//! The store's one PostgreSQL connection, made again when it is lost: a
//! server restart, or a session the server ended (a host paused inside a
//! transaction past `idle_in_transaction_session_timeout`, an operator's
//! `pg_terminate_backend`). Without it a host whose session ended could
//! write nothing again, and could not even learn that its lease was taken
//! over meanwhile: with it the next renewal reaches the server and is
//! refused by the lease's epoch (`Fenced`).
//!
//! The operation that finds the session gone fails as before
//! (`Unavailable`); the next one connects again. Notifications sent while
//! no session listened are not replayed: their readers also poll the store
//! (docs/STORE.md, "PostgreSQL (several hosts)").

use futures_util::StreamExt;
use tokio::sync::{Mutex, MutexGuard, broadcast};
use tokio_postgres::{AsyncMessage, Client, NoTls};

use super::{CHANNEL, bound_lock_waits, pg, pg_text, unavailable};
use crate::StoreError;

/// The connection string, the session made from it, and where its
/// notifications go.
pub(super) struct Connection {
    config: String,
    client: Mutex<Client>,
    changes: broadcast::Sender<String>,
}

impl Connection {
    /// Connects (with no migration: `PostgresStore::connect` migrates
    /// before it bounds lock waits and listens).
    pub(super) async fn connect(
        config: &str,
        changes: &broadcast::Sender<String>,
    ) -> Result<Client, StoreError> {
        let (client, mut connection) = tokio_postgres::connect(config, NoTls)
            .await
            .map_err(|e| unavailable(format!("cannot connect to PostgreSQL: {}", pg_text(&e))))?;
        let notify = changes.clone();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        let _ = notify.send(n.payload().to_owned());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!("the PostgreSQL connection failed: {e}");
                        break;
                    }
                }
            }
        });
        Ok(client)
    }

    /// `client`, made ready by `connect` (migrated, lock waits bounded,
    /// listening), kept for `lock`.
    pub(super) fn new(config: &str, client: Client, changes: broadcast::Sender<String>) -> Self {
        Self {
            config: config.to_owned(),
            client: Mutex::new(client),
            changes,
        }
    }

    /// A session made ready after its migrations: lock waits bounded,
    /// listening for other hosts' changes.
    pub(super) async fn ready(client: &Client) -> Result<(), StoreError> {
        bound_lock_waits(client).await?;
        client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .map_err(pg)
    }

    /// The session, connected again first when the last one is gone.
    pub(super) async fn lock(&self) -> Result<MutexGuard<'_, Client>, StoreError> {
        let mut client = self.client.lock().await;
        if client.is_closed() {
            let fresh = Self::connect(&self.config, &self.changes).await?;
            Self::ready(&fresh).await?;
            tracing::warn!("the PostgreSQL session was lost; connected again");
            *client = fresh;
        }
        Ok(client)
    }

    /// The notifications of every session this connection makes.
    pub(super) fn changes(&self) -> &broadcast::Sender<String> {
        &self.changes
    }
}
